"""Blob content as the Hub names it, hashed in one place for every room (cache, network and archive bytes).

A blob is named by its hash: the sha256 of the content for LFS (and Xet) files, git's blob sha1 for the others,
``sha1(b"blob <size>\\0" + content)`` (so the size must be known before the first byte). Sources: git's object
format (``git hash-object``), the LFS pointer spec (git-lfs ``docs/spec.md``), huggingface_hub ``file_download.py``.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
from collections.abc import Callable

from ..errors import CacheError
from ..names import is_commit, is_sha256

# hashlib is imported where a hash is made: loading OpenSSL costs ~3 ms of start-up that `warm --lock` on a complete
# cache (stat calls only) never needs.

SHA256, GIT_SHA1 = "sha256", "git-sha1"
#: Bytes per read: large reads amortise the system call and the GIL hand-over of each hashlib update (hashlib
#: releases the GIL for updates over 2047 bytes, so threads hash in parallel).
CHUNK = 4 * 1024 * 1024
_buffers = threading.local()  # one reusable read buffer per hashing thread


class ContentMismatch(CacheError):
    """Bytes that do not hash to the blob name they are stored or announced under (exit 5)."""


def algorithm_of(etag: object) -> str | None:
    """``sha256`` for a 64-hex etag, ``git-sha1`` for a 40-hex one, None for any other value."""
    return SHA256 if is_sha256(etag) else GIT_SHA1 if is_commit(etag) else None


class BlobHash:
    """One incremental hash the way a blob is named: ``BlobHash("sha256")``, ``BlobHash("git-sha1", size)``
    (git's header is fed first), or :meth:`for_etag`.
    Raises ValueError: an unknown algorithm, or ``git-sha1`` without a size."""

    __slots__ = ("algorithm", "etag", "_h")

    def __init__(self, algorithm: str, size: int | None = None) -> None:
        import hashlib

        self.algorithm, self.etag = algorithm, None
        if algorithm == SHA256:
            self._h = hashlib.sha256()
        elif algorithm == GIT_SHA1 and size is not None:
            self._h = hashlib.sha1(b"blob %d\0" % size)  # git's object id, not a security hash
        else:
            raise ValueError(f"cannot hash as {algorithm!r} (size {size})")

    @classmethod
    def for_etag(cls, etag: str, size: int) -> BlobHash:
        """The hash ``etag`` is named by (ValueError when it is no etag)."""
        algorithm = algorithm_of(etag)
        if algorithm is None:
            raise ValueError(f"not a blob name: {etag!r}")
        h = cls(algorithm, size)
        h.etag = etag
        return h

    def update(self, data) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def matches(self) -> bool:
        """Whether the bytes so far hash to the etag this hash was made :meth:`for_etag`."""
        return self.etag is not None and self.hexdigest() == self.etag

    @property
    def prefixed(self) -> str:
        """``sha256:<hex>`` or ``git-sha1:<hex>``: the form locks and records write."""
        return f"{self.algorithm}:{self.hexdigest()}"


def git_blob_sha1(data: bytes) -> str:
    """git's blob id of ``data`` (``git hash-object``)."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The LFS pointer text git stores for an LFS file (git-lfs ``docs/spec.md``): what the Hub's git blob id of an
    LFS file hashes."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def hash_fd(fd: int, algorithms: tuple[str, ...] = (SHA256,), *, on_bytes: Callable[[int], None] | None = None,
            shown: str = "", close: bool = True, offset: int | None = None) -> tuple[dict[str, str], int]:
    """Hash the open regular file ``fd`` to its end with each of ``algorithms``, into one reused buffer per thread.
    git-sha1's size is the file's (``fstat``): with ``offset`` (``pread`` from there, at most that size) a file that
    grows meanwhile is hashed as it was; without it (from the current offset) it hashes wrong, never right.

    Args:
        fd: closed here unless ``close`` is False. algorithms: ``sha256`` and/or ``git-sha1``. on_bytes: called with
            each read's size (progress). shown: the path in errors.

    Returns ({algorithm: hex digest}, bytes read). Raises OSError: EINVAL when not a regular file, or a read error.
    """
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", shown)
        hashes = [BlobHash(a, st.st_size - (offset or 0)) for a in algorithms]
        if (view := getattr(_buffers, "buffer", None)) is None:
            view = _buffers.buffer = memoryview(bytearray(CHUNK))
        read = 0
        while n := (os.readv(fd, [view]) if offset is None else
                    os.preadv(fd, [view[: max(0, st.st_size - offset - read)]], offset + read)):
            chunk = view[:n]
            for h in hashes:
                h.update(chunk)
            read += n
            if on_bytes:
                on_bytes(n)
        return {h.algorithm: h.hexdigest() for h in hashes}, read
    finally:
        if close:
            os.close(fd)


def fd_matches(fd: int, etag: str, size: int | None = None, *, on_bytes: Callable[[int], None] | None = None) -> bool:
    """Whether the open file ``fd`` (closed here) is a regular file (of ``size`` bytes when given) whose bytes hash
    to ``etag``; False for a FIFO, device or another name. Raises OSError for a read error."""
    algorithm = algorithm_of(etag)
    try:
        if algorithm is None or (size is not None and os.fstat(fd).st_size != size):
            return False
        digests, read = hash_fd(fd, (algorithm,), on_bytes=on_bytes, close=False)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)
    return digests[algorithm] == etag and (size is None or read == size)


class HashingReader(io.RawIOBase):
    """A raw binary ``source`` (with ``readinto``, closed with the reader) read through: exactly ``size`` bytes,
    each fed to ``hashes`` (more :class:`BlobHash`, e.g. a signature's sha256) and to the hash of ``etag`` when
    given, checked at the end. ``error`` builds the exception for a short, long or mismatching source from a reason
    (default :class:`ContentMismatch` naming ``shown``)."""

    def __init__(self, source, size: int, *, etag: str | None = None, hashes: tuple[BlobHash, ...] = (),
                 shown: str = "", error: Callable[[str], Exception] | None = None) -> None:
        self._source, self._left, self.name = source, size, shown
        self.named = BlobHash.for_etag(etag, size) if etag else None
        self.etag = etag
        self._hashes = (*hashes, self.named) if self.named else tuple(hashes)
        self._error = error or (lambda why: ContentMismatch(f"{shown}: {why}",
                                                            hint="run `hfcache verify --repair` first"))

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer)
        if self._left == 0:
            if self._source.read(1):
                raise self._error("holds more bytes than its size")
            if self.named is not None and not self.named.matches():
                raise self._error("content does not match its blob name")
            return 0
        n = self._source.readinto(view[: self._left])
        if not n:
            raise self._error(f"ends {self._left} bytes short of its size")
        chunk = view[:n]
        for h in self._hashes:
            h.update(chunk)
        self._left -= n
        return n

    def close(self) -> None:
        try:
            self._source.close()
        finally:
            super().close()


class DigestWriter(io.RawIOBase):
    """Writes through to ``out``, keeping the sha256 and the size of what passed (a tar's or a layer's digest)."""

    def __init__(self, out) -> None:
        import hashlib

        self._out, self.sha256, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha256.update(data)
        self._out.write(data)
        self.size += len(data)
        return len(data)

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of what was written (the OCI form)."""
        return f"sha256:{self.sha256.hexdigest()}"


def sha1_hex(data: bytes) -> str:
    """The plain sha1 of ``data`` (40 hex): ids that only have to look like git's (a folder store's commits, tree
    entries' folder oids), never a blob's name (that is :func:`git_blob_sha1`)."""
    import hashlib

    return hashlib.sha1(data).hexdigest()  # an id, not a security hash
