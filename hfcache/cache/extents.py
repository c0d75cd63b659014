"""The extent record of a partial download: which byte ranges of ``blobs/<etag>.<random>.incomplete`` hold what was
received, so a rerun after SIGKILL, SIGTERM, a full disk or a network failure fetches only the missing ranges.

The record is ``.locks/<repo folder>/<etag>.extents.json`` (beside huggingface_hub's ``<etag>.lock``; ``hf cache``,
``scan_cache_dir`` and hfcache's scans ignore ``.locks``), read and written under
:mod:`hfcache.cache.owned_record`'s rules (through descriptors, trusted only from this euid, bounded). It names the
``.incomplete`` file, its inode and the blob's size: a record about another file, or one a member wrote, is ignored
and the download keeps only the contiguous prefix :func:`trusted_prefix` trusts. A record is never authority for
content: the whole file is hashed against its etag before it is published, and a mismatch fetches it again from
byte 0 (:func:`hfcache.hub.transfer.download_blob`). Written without ``fsync`` (neither are the bytes it describes):
after a power loss a record may name bytes that were lost, which the hash check catches.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ..errors import CacheError
from . import owned_record, safefs
from .fsops import create_at, temp_name, unlink_at

if TYPE_CHECKING:
    from .layout import RepoFolder

#: A hole-bounded prefix is trusted down to this grain (>= any filesystem block).
RESUME_GRAIN = 1024 * 1024
#: A record larger than this is not read (1,000 extents take about 30 KiB).
MAX_RECORD_BYTES = 64 * 1024
#: At most this many extents are recorded (parts of one download, each split at most once per stolen slot).
MAX_EXTENTS = 1024
SUFFIX = ".extents.json"


def record_name(etag: str) -> str:
    return f"{etag}{SUFFIX}"


def load(folder: RepoFolder, etag: str, incomplete: str, fd: int, size: int) -> list[tuple[int, int]] | None:
    """The extents ``[(start, end), ...]`` (sorted, disjoint, within the file's length) the record of ``etag`` gives
    for the ``.incomplete`` named ``incomplete`` open at ``fd`` of a blob of ``size`` bytes; None when there is no
    record, or it is untrusted, malformed or about another file. Never raises for what a cache holds."""
    loaded = owned_record.load(str(folder.cache_dir), record_name(etag), MAX_RECORD_BYTES, folder=(folder.name,))
    data = loaded.data if loaded.trusted else None
    if not isinstance(data, dict) or data.get("incomplete") != incomplete or data.get("size") != size:
        return None
    st = os.fstat(fd)
    if data.get("ino") != st.st_ino or not isinstance(data.get("extents"), list) \
            or len(data["extents"]) > MAX_EXTENTS:
        return None
    extents, last = [], 0
    for pair in data["extents"]:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)):
            return None
        start, end = pair
        if not last <= start < end <= min(size, st.st_size):
            return None
        extents.append((start, end))
        last = end
    return extents


def _encode(incomplete: str, size: int, fd: int, extents: list[tuple[int, int]]) -> bytes | None:
    """The record's JSON for ``extents`` (:func:`merged`); None past :data:`MAX_EXTENTS`."""
    spans = merged([e for e in extents if e[0] < e[1]])
    if len(spans) > MAX_EXTENTS:
        return None
    return json.dumps({"incomplete": incomplete, "size": size, "ino": os.fstat(fd).st_ino, "extents": spans}).encode()


class Recorder:
    """Saves the extents of one download of ``etag`` into the ``.incomplete`` named ``incomplete`` (open at ``fd``,
    ``size`` bytes). The first save creates the record (:func:`.owned_record.write_at`'s way) and keeps it open;
    later saves overwrite it in place, padded with spaces to the longest so far: one ``pwrite``, no rename (a rename
    on ext4 took 4 ms, 0.43 s of a 1 GiB warm). A member who replaces the record meanwhile replaces it for good: this
    run writes to its own, unlinked file, and the member's is not trusted (:func:`load`)."""

    def __init__(self, folder: RepoFolder, etag: str, incomplete: str, fd: int, size: int) -> None:
        self.folder, self.name, self.incomplete, self.fd, self.size = folder, record_name(etag), incomplete, fd, size
        self.record_fd, self.length = -1, 0

    def save(self, extents: list[tuple[int, int]]) -> bool:
        """Record ``extents``; False when it cannot be written (a read-only cache, too many extents)."""
        data = _encode(self.incomplete, self.size, self.fd, extents)
        if data is None:
            return False
        try:
            if self.record_fd < 0:
                self.record_fd = self._create(data)
            else:
                os.pwrite(self.record_fd, data.ljust(self.length), 0)
        except (OSError, CacheError):
            return False
        self.length = max(self.length, len(data))
        return True

    def _create(self, data: bytes) -> int:
        locks = safefs.open_dir(self.folder.cache_dir, (owned_record.LOCKS, self.folder.name))
        try:
            tmp = temp_name(self.name)
            fd = create_at(locks, tmp, 0o600)
            try:
                os.fchmod(fd, owned_record.MODE)
                os.pwrite(fd, data, 0)
                os.replace(tmp, self.name, src_dir_fd=locks, dst_dir_fd=locks)
            except BaseException:
                os.close(fd)
                unlink_at(locks, tmp)
                raise
            return fd
        finally:
            os.close(locks)

    def close(self) -> None:
        if self.record_fd >= 0:
            os.close(self.record_fd)
            self.record_fd = -1


def remove(folder: RepoFolder, etag: str) -> None:
    """Delete the record of ``etag`` (its download was published or discarded); nothing when there is none."""
    owned_record.remove(str(folder.cache_dir), record_name(etag), folder=(folder.name,))

def trusted_prefix(fd: int, size: int) -> int:
    """The bytes at the start of a leftover that hold what was received: all when written in order; with holes, up to
    the first hole rounded down to :data:`RESUME_GRAIN` (the block before it may be partly written); 0 past ``size``."""
    length = os.fstat(fd).st_size
    if length == 0 or length > size:
        return 0
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:  # no SEEK_HOLE here: every byte counts as data
        hole = length
    if hole >= length:
        return length
    return max(0, (hole - 1) // RESUME_GRAIN * RESUME_GRAIN)


def merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` sorted, the ones that touch or overlap joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def gaps(done: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The ranges of ``[0, size)`` outside ``done`` (sorted, disjoint)."""
    gaps, last = [], 0
    for start, end in done:
        if start > last:
            gaps.append((last, start))
        last = max(last, end)
    if last < size:
        gaps.append((last, size))
    return gaps


__all__ = ["MAX_EXTENTS", "SUFFIX", "Recorder", "gaps", "load", "merged", "record_name", "remove", "trusted_prefix"]
