"""export's reading of blobs: each hashed while it is copied, and huggingface_hub 2.4's shared Xet blob store
(``huggingface_hub/utils/_shared_blobs.py``).

A repo blob that is a link of the library's exact shape into the marked store (``../../blobs/<h[:2]>/<h>``,
:mod:`hfcache.cache.shared_store`) is exported as a regular blob holding the payload's bytes, so the export has no
link leaving it and loads offline anywhere; any other shape, or a store part that is a link, FIFO or folder, is
refused (exit 5). Payloads are opened with ``safefs.open_blob`` (a walk from the cache root, nothing else followed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import stat
from pathlib import Path

from ..cache import safefs
from ..cache.shared_store import StoreProblem, payload_stat
from ..cache.safefs_tree import open_regular
from ..errors import CacheError
from ..integrity.hashing import algorithm_of


def with_store_blobs(cache_dir: str, folder: str, rev):
    """``rev`` with each entry whose blob is a link into huggingface_hub 2.4's shared Xet store
    (``utils/_shared_blobs.py``; scan sees a link there as a missing blob) taken as a ``link`` of the payload's
    size: the export carries the payload's bytes as a regular blob (read through ``safefs.open_blob``).

    Raises:
        CacheError (exit 5): the store or the payload is not what the library writes (a link, FIFO, folder).
    """
    files = []
    for f in rev.files:
        xet_hash = safefs.store_link_of(cache_dir, folder, f.etag) if f.form == "broken" and f.etag else None
        if xet_hash is not None:
            try:
                st = payload_stat(cache_dir, xet_hash)
            except StoreProblem as exc:
                raise CacheError(f"{folder}/blobs/{f.etag}: {exc}: nothing exported",
                                 hint="remove it (or re-download the file), then rerun") from None
            except FileNotFoundError:
                st = None  # a dangling store link: stays a broken entry
            if st is not None:
                f = f._replace(form="link", size=st.st_size, inode=(st.st_dev, st.st_ino))
        files.append(f)
    return dataclasses.replace(rev, files=tuple(files))



def open_blob_source(path: str, etag: str):
    """Open the blob ``path`` (``<cache>/<folder>/blobs/<etag>``, as planned) with ``safefs.open_blob``: a
    regular file, or the shared store's payload its library-shaped link names; nothing else is followed.

    Raises:
        CacheError: not a regular file, or a link of another shape (UnsafeLayout).
    """
    blob = Path(path)
    fd = safefs.open_blob(blob.parents[2], blob.parents[1].name, etag)
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise CacheError(f"{path} is not a regular file: nothing exported", hint="remove it, then rerun")
    return f


def open_plain_source(entry):
    """Open the file of the source cache an export entry (an ``Entry`` of kind ``file`` that is not a blob) copies: ``entry.source`` is ``<cache>/<entry.name>``,
    opened from the cache root one folder at a time without following links (safefs.dir_fd) and then
    ``O_NOFOLLOW | O_NONBLOCK``, regular files only (scan planned it as one; this re-checks what is opened), so a
    folder a group member swaps for a link after the plan is refused, never read through.

    Raises:
        CacheError (exit 5): not a regular file now, a folder on the way is a link, or the source is not below a
            cache root as planned.
    """
    suffix = "/" + entry.name
    if not entry.source.endswith(suffix):
        raise CacheError(f"{entry.source}: not the cache file planned for {entry.name}: nothing exported")
    parts = entry.name.split("/")
    with safefs.dir_fd(entry.source[: -len(suffix)], parts[:-1]) as fd:
        return os.fdopen(open_regular(fd, parts[-1], entry.source), "rb")


class SizedReader(io.RawIOBase):
    """Reads exactly ``size`` bytes of the open binary file ``f`` (closed with it): a file that ends sooner or
    goes on longer than the plan said (changed, or swapped for another by a group member after the plan) raises
    CacheError (exit 5) instead of giving tarfile a short read (``OSError: unexpected end of data``, exit 70)."""

    def __init__(self, f, size: int, shown: str) -> None:
        self._f, self._left, self.name = f, size, shown

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer)
        if self._left == 0:
            if self._f.read(1):
                raise self._changed()
            return 0
        n = self._f.readinto(view[: self._left])
        if not n:
            raise self._changed()
        self._left -= n
        return n

    def _changed(self) -> CacheError:
        return CacheError(f"{self.name} changed while it was exported (not the size planned): nothing exported",
                          hint="rerun once nothing writes the cache")

    def close(self) -> None:
        self._f.close()
        super().close()


class HashingReader(io.RawIOBase):
    """Reads a blob and checks, at EOF, that its content hashes to its name (sha256 or git blob sha1)."""

    def __init__(self, path: str, etag: str, size: int) -> None:
        self._f = open_blob_source(path, etag)
        self._etag = etag
        self._size = size
        self._seen = 0
        algorithm = algorithm_of(etag)
        self._h = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1() if algorithm else None  # noqa: S324
        if algorithm == "git-sha1":
            self._h.update(b"blob %d\0" % size)
        self.name = path

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        if n:
            self._seen += n
            if self._h is not None:
                self._h.update(memoryview(buffer)[:n])
        elif self._h is not None and (self._seen != self._size or self._h.hexdigest() != self._etag):
            # a corrupt source cache is a cache problem (exit 5), like a broken snapshot entry in plan_export
            raise CacheError(f"{self.name}: content does not match its blob name (corrupt source cache)",
                             hint="run `hfcache verify --repair` on the source cache first")
        return n

    def close(self) -> None:
        self._f.close()
        super().close()
