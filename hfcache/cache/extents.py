"""The extent record of a partial download: which byte ranges of ``blobs/<etag>.<random>.incomplete`` hold what was
received, so a rerun after SIGKILL, SIGTERM, a full disk or a network failure fetches only the missing ranges.

The record is ``.locks/<repo folder>/<etag>.extents.json`` (beside huggingface_hub's ``<etag>.lock``; ``hf cache``,
``scan_cache_dir`` and hfcache's scans ignore ``.locks``), read and written under
:mod:`hfcache.cache.owned_record`'s rules (through descriptors, trusted only from this euid, bounded). It names the
``.incomplete`` file, its inode and the blob's size: a record about another file, or one a member wrote, is ignored
and the download keeps only the contiguous prefix :func:`hfcache.hub.transfer.trusted_prefix` trusts. A record is
never authority for content: the whole file is hashed against its etag before it is published, and a mismatch
fetches it again from byte 0 (:func:`hfcache.hub.transfer.download_blob`).

Written without ``fsync`` (neither are the bytes it describes): after a process crash both are in the page cache;
after a power loss a record may name bytes that were lost, which the hash check catches.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from . import owned_record

if TYPE_CHECKING:
    from .layout import RepoFolder

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
    record, or it is untrusted, malformed or about another file (module docstring). Never raises for what a cache
    holds."""
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


def save(folder: RepoFolder, etag: str, incomplete: str, fd: int, size: int, extents: list[tuple[int, int]]) -> bool:
    """Replace the record of ``etag`` with ``extents`` of the ``.incomplete`` named ``incomplete`` open at ``fd``
    (merged where they touch, at most :data:`MAX_EXTENTS`); False when it cannot be written (a read-only cache)."""
    merged: list[list[int]] = []
    for start, end in sorted(e for e in extents if e[0] < e[1]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if len(merged) > MAX_EXTENTS:
        return False
    data = {"incomplete": incomplete, "size": size, "ino": os.fstat(fd).st_ino, "extents": merged}
    return owned_record.save(str(folder.cache_dir), record_name(etag), json.dumps(data).encode(),
                             folder=(folder.name,), durable=False)


def remove(folder: RepoFolder, etag: str) -> None:
    """Delete the record of ``etag`` (its download was published or discarded); nothing when there is none."""
    owned_record.remove(str(folder.cache_dir), record_name(etag), folder=(folder.name,))


__all__ = ["MAX_EXTENTS", "SUFFIX", "load", "record_name", "remove", "save"]
