"""hashing: prove a blob offline by hashing it, the way its name (or a listing) says it was hashed.

Every blob is named by its hash: ``blobs/<sha256>`` for LFS files, ``blobs/<git blob sha1>`` for others. Reading is
4 MiB at a time into one buffer per thread, reused (``readinto``: constant memory, no allocation per read); hashlib
releases the GIL on updates over 2047 bytes, so threads hash in parallel. A final symlink is never followed and a
FIFO or device is never read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import threading
from typing import Protocol

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 4 * 1024 * 1024  # bytes per read: large reads amortise the syscall and the GIL hand-over per update
_buffers = threading.local()  # one reusable read buffer per hashing thread


class HashProgress(Protocol):
    def start(self, total_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


def content_hash(path: str, algorithm: str, on_bytes=None) -> tuple[str, int]:
    """Hash a file without following a final symlink; return (hex digest, bytes read).

    Args:
        path: the file.
        algorithm: ``sha256`` or ``git-sha1`` (``sha1(b"blob <size>\\0" + content)``, git's object id).
        on_bytes: called with the size of every chunk read (progress).

    Raises:
        OSError: unreadable, or a symlink (``O_NOFOLLOW``): nothing outside the cache is ever read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO never blocks
    try:
        # O_NOATIME: hashing is not a use; on relatime mounts it would make every blob look just used to
        # ls/prune. Only the file's owner (or root) may ask for it.
        fd = os.open(path, flags | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        fd = os.open(path, flags)
    return fd_hash(fd, algorithm, on_bytes, path)


def fd_hash(fd: int, algorithm: str, on_bytes=None, shown: str = "") -> tuple[str, int]:
    """Hash the open file ``fd`` (closed here) as :func:`content_hash` does; return (hex digest, bytes read).

    Used for a payload of huggingface_hub 2.4's shared Xet store, opened by
    :func:`hfcache.cache.safefs.open_blob` (no link followed). Raises OSError (EINVAL) when it is not a regular
    file; ``shown`` names it in that error."""
    digests, read = fd_hashes(fd, (algorithm,), on_bytes, shown)
    return digests[algorithm], read


def fd_hashes(fd: int, algorithms: tuple[str, ...], on_bytes=None, shown: str = "") -> tuple[dict[str, str], int]:
    """:func:`fd_hash` with several algorithms over one read of the bytes (``sha256`` and/or ``git-sha1``), so that
    a blob's name and the digest a signature records are of the same bytes (two reads could see two contents).

    Returns:
        ({algorithm: hex digest}, bytes read).

    Raises:
        OSError: EINVAL when ``fd`` is not a regular file (``shown`` names it), or a read error."""
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would never end (or never start)
            raise OSError(errno.EINVAL, "not a regular file", shown)
        size = st.st_size
        hashes = {}
        for algorithm in algorithms:
            h = hashes[algorithm] = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()  # noqa: S324
            if algorithm != "sha256":  # git's object id
                h.update(b"blob %d\0" % size)
        read = 0
        while n := f.readinto(buffer):
            for h in hashes.values():
                h.update(view[:n])
            read += n
            if on_bytes:
                on_bytes(n)
    return {algorithm: h.hexdigest() for algorithm, h in hashes.items()}, read


def algorithm_of(etag: str) -> str | None:
    """``sha256`` for a 64-hex etag, ``git-sha1`` for a 40-hex one, None for any other blob name."""
    if _SHA256.fullmatch(etag):
        return "sha256"
    if _SHA1.fullmatch(etag):
        return "git-sha1"
    return None
