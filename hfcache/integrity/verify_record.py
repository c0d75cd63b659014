"""The record ``verify --fast`` keeps of blobs that hashed right, so that a later ``--fast`` run skips them.

A blob is skipped only while its (device, inode, size, mtime_ns, ctime_ns) and name are exactly those recorded when it
last hashed to its name. Any write to the file changes its mtime and ctime; ``touch -d`` can set mtime back but not
ctime, which only the kernel sets. What ``--fast`` cannot catch: bytes changed under a live filesystem without going
through the file (a disk or a filesystem fault), and a writer of the cache who rewrites the record too. That is why
the default stays "hash every blob".

The record is ``<cache>/.locks/hfcache-verified.json``: under ``.locks``, which huggingface_hub's cache scan, ``hf
cache`` and ``hfcache ls``/``prune`` ignore as a repo folder. Read and written without following links (a planted
link is ignored on read and refused on write, as :mod:`hfcache.cache.published` does), at most :data:`MAX_RECORD_BYTES`,
atomically (temp file + rename); a cache that cannot be written (a read-only image layer) keeps no record, and
``--fast`` then hashes everything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..cache import safefs
from ..cache.atomic import atomic_write
from ..errors import CacheError

RECORD = (".locks", "hfcache-verified.json")
MAX_RECORD_BYTES = 64 * 1024 * 1024  # ~600,000 blobs; a larger record is ignored (everything is hashed)
_VERSION = 1

#: (device, inode) -> (size, mtime_ns, ctime_ns, blob name)
Stamps = dict[tuple[int, int], tuple[int, int, int, str]]


def stamp(st: os.stat_result, etag: str) -> tuple[int, int, int, str]:
    """What must be unchanged for a blob to be skipped: (size, mtime_ns, ctime_ns, blob name)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, etag)


def load(cache_dir: str) -> Stamps:
    """The record of ``cache_dir``; empty when there is none or it cannot be read or parsed (then all is hashed)."""
    try:
        raw = safefs.read_small(cache_dir, RECORD, MAX_RECORD_BYTES + 1)
        if len(raw) > MAX_RECORD_BYTES:
            return {}
        data = json.loads(raw)
        if data.get("version") != _VERSION:
            return {}
        return {(int(dev), int(ino)): (int(size), int(mtime), int(ctime), str(etag))
                for dev, ino, size, mtime, ctime, etag in data["blobs"]}
    except (OSError, CacheError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def save(cache_dir: str, stamps: Stamps) -> bool:
    """Replace the record of ``cache_dir`` with ``stamps``; False when it cannot be written (then there is none)."""
    rows = sorted([dev, ino, *rest] for (dev, ino), rest in stamps.items())
    data = json.dumps({"version": _VERSION, "blobs": rows}, separators=(",", ":")).encode()
    try:
        safefs.ensure_dirs(cache_dir, RECORD[:-1])
        atomic_write(Path(cache_dir, *RECORD), data)
        return True
    except (OSError, CacheError):
        return False
