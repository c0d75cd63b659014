"""The record ``verify --fast`` keeps of blobs that hashed right, so that a later ``--fast`` run skips them.

A blob is skipped only while its (device, inode, size, mtime_ns, ctime_ns) and name are those recorded when it last
hashed to its name: any write changes mtime and ctime, and ``touch -d`` can set mtime back but not ctime. What this
cannot catch: bytes changed without going through the file (a disk fault), and a writer who rewrites the record too:
hence the default stays "hash every blob". The record is read and written under :mod:`hfcache.cache.owned_record`'s
rules (honoured only when this euid wrote it).
"""

from __future__ import annotations

import json
import os

from ..cache import owned_record

RECORD = (".locks", "hfcache-verified.json")
MAX_RECORD_BYTES = 64 * 1024 * 1024  # ~600,000 blobs; a larger record is ignored (everything is hashed)
_VERSION = 1

#: (device, inode) -> (size, mtime_ns, ctime_ns, blob name)
Stamps = dict[tuple[int, int], tuple[int, int, int, str]]


def stamp(st: os.stat_result, etag: str) -> tuple[int, int, int, str]:
    """What must be unchanged for a blob to be skipped: (size, mtime_ns, ctime_ns, blob name)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, etag)


def load(cache_dir: str) -> tuple[Stamps, str]:
    """The stamps ``cache_dir``'s record holds (empty when there is none or it is not honoured), and "" or one line
    saying why an existing record was ignored (a symlink, another uid's, writable by others, too large, malformed)."""
    loaded = owned_record.load(cache_dir, RECORD[-1], MAX_RECORD_BYTES)
    if loaded.data is None:
        return {}, loaded.problem or loaded.distrust
    data = loaded.data
    try:
        if data.get("version") != _VERSION:
            return {}, f"format version {data.get('version')!r}, not {_VERSION}"
        return {(int(dev), int(ino)): (int(size), int(mtime), int(ctime), str(etag))
                for dev, ino, size, mtime, ctime, etag in data["blobs"]}, ""
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        return {}, f"malformed ({type(exc).__name__})"


def save(cache_dir: str, stamps: Stamps) -> bool:
    """Replace the record of ``cache_dir`` with ``stamps`` (:func:`hfcache.cache.owned_record.save`: atomic, mode
    0644, never through a ``.locks`` swapped for a link); False when it cannot be written (then there is none)."""
    rows = sorted([dev, ino, *rest] for (dev, ino), rest in stamps.items())
    data = json.dumps({"version": _VERSION, "blobs": rows}, separators=(",", ":")).encode()
    return owned_record.save(cache_dir, RECORD[-1], data)
