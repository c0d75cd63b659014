"""The record ``verify --fast`` keeps of blobs that hashed right, so that a later ``--fast`` run skips them.

A blob is skipped only while its (device, inode, size, mtime_ns, ctime_ns) and name are exactly those recorded when it
last hashed to its name. Any write to the file changes its mtime and ctime; ``touch -d`` can set mtime back but not
ctime, which only the kernel sets. What ``--fast`` cannot catch: bytes changed under a live filesystem without going
through the file (a disk or a filesystem fault), and a writer of the cache who rewrites the record too. That is why
the default stays "hash every blob".

The record is ``<cache>/.locks/hfcache-verified.json``: under ``.locks``, which huggingface_hub's cache scan, ``hf
cache`` and ``hfcache ls``/``prune`` ignore as a repo folder. Read and written without following links (a planted
link is ignored on read and refused on write), through a descriptor of ``.locks`` opened from the cache root (so a
``.locks`` swapped for a link mid-run is never written through), at most :data:`MAX_RECORD_BYTES` and
:data:`hfcache.bounds.MAX_JSON_DEPTH` levels deep, atomically (temp file + rename in that folder); a cache that cannot
be written (a read-only image layer) keeps no record, and ``--fast`` then hashes everything.

The record is authority for its writer only: in a group-shared cache any member can write ``.locks``, and a member who
corrupted a blob could rewrite the record to vouch for it. So it is honoured only when it is a regular file with one
link, owned by the current effective uid and not writable by group or others (``fstat`` of the opened file); it is
written ``0644`` whatever the umask or the cache's sharing. A record another member wrote (or one a member
rewrote) is ignored with a note (:func:`load` returns why), every blob is hashed, and this run's record replaces it.
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
    """The record of ``cache_dir``, and why it was ignored.

    Args:
        cache_dir (str): the cache root.

    Returns:
        tuple[Stamps, str]: the stamps (empty when there is no record or it is not honoured: then every blob is
        hashed), and "" or one line saying why an existing record was ignored (a symlink, not a regular file, owned
        by another uid, writable by group or others, too large, nested too deep, malformed).
    """
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
    """Replace the record of ``cache_dir`` with ``stamps``; False when it cannot be written (then there is none).

    Written relative to a descriptor of ``.locks`` opened from the cache root without following links (created and
    group-shared like every folder when missing): a temp file created ``O_EXCL|O_NOFOLLOW`` with mode 0600, set to
    0644 (:data:`hfcache.cache.owned_record.MODE`) by ``fchmod``, fsync-ed, then renamed over the record in that same folder. Nothing is written
    through a ``.locks`` a member swapped for a link, and no member can open the file for writing on the way.
    """
    rows = sorted([dev, ino, *rest] for (dev, ino), rest in stamps.items())
    data = json.dumps({"version": _VERSION, "blobs": rows}, separators=(",", ":")).encode()
    return owned_record.save(cache_dir, RECORD[-1], data)
