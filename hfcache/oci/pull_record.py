"""The record ``hfcache pull`` keeps of the tar layers it imported, so that a later pull skips a layer the cache still
holds (its body is not downloaded).

``<cache>/.locks/hfcache-pulled.json`` maps a layer's diff_id to every entry the layer held (blobs, snapshot entries,
refs, markers, listings: the names import wrote or found present) with each entry's ``lstat`` stamp after the pull:
(file type, device, inode, size, mtime_ns, ctime_ns) and, for a link, its target. A layer is skipped only while every
recorded entry has exactly that stamp (any write changes ctime, which only the kernel sets; a ref moved by
``--move-refs`` is a new inode), and while every commit the layer's ``io.hfcache.commits`` annotation names is among the
snapshots recorded for it. Stamps are taken through folder descriptors opened from the cache root without following
links (:func:`hfcache.cache.safefs.dir_fd`).

The record has the trust rules of every record under ``.locks`` (:mod:`hfcache.cache.owned_record`): honoured only when
it is a regular file with one link, owned by the current effective uid and not writable by group or others; read and
written through a descriptor of ``.locks`` (``O_NOFOLLOW``, bounded size and nesting), written atomically with mode
0644. A record another member wrote is ignored (every layer is downloaded) and this run's replaces it. What it cannot
catch: bytes changed under a live filesystem without going through the file, as for ``--fast``.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable

from ..cache import owned_record, safefs
from ..errors import CacheError

RECORD = (".locks", "hfcache-pulled.json")
MAX_RECORD_BYTES = 64 * 1024 * 1024
_VERSION = 1
_SECTIONS = ("blobs", "snapshots", "refs", ".no_exist", "trees")


def load(cache_dir: str) -> dict[str, dict]:
    """The honoured record: diff_id -> {"entries": {name: stamp}, "commits": [commit, ...]}; {} when there is none,
    or it is not honoured, too large, nested too deep or malformed."""
    loaded = owned_record.load(cache_dir, RECORD[-1], MAX_RECORD_BYTES)
    if not loaded.trusted:
        return {}
    data = loaded.data
    try:
        if data.get("version") != _VERSION:
            return {}
        layers = data["layers"]
        return {str(k): {"entries": {str(n): list(s) for n, s in v["entries"].items()},
                         "commits": [str(c) for c in v["commits"]]} for k, v in layers.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def stamp_of(cache_dir: str, name: str) -> list | None:
    """``[type, dev, ino, size, mtime_ns, ctime_ns, link target]`` of the entry ``name`` (relative to the cache root),
    looked up without following any link; None when it is missing or a folder on the way is not one."""
    parts = name.split("/")
    try:
        with safefs.dir_fd(cache_dir, parts[:-1]) as fd:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            target = os.readlink(parts[-1], dir_fd=fd) if stat.S_ISLNK(st.st_mode) else ""
    except (OSError, CacheError):
        return None
    return [stat.S_IFMT(st.st_mode), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, target]


def still_held(cache_dir: str, record: dict[str, dict], diff_id: str, commits: Iterable[str]) -> bool:
    """Whether the layer ``diff_id`` may be skipped: recorded, every recorded entry unchanged (by stat), and every
    commit of ``commits`` (the layer's annotation) among its recorded snapshots."""
    layer = record.get(diff_id)
    if not layer or not layer["entries"]:
        return False
    if not set(commits) <= set(layer["commits"]):
        return False
    return all(stamp_of(cache_dir, name) == stamp for name, stamp in layer["entries"].items())


def entry_name(name: str) -> str | None:
    """The name a tar entry has in the record (a file, link or hardlink below a repo folder's sections), or None."""
    parts = name.split("/")
    if len(parts) < 3 or parts[1] not in _SECTIONS or parts[-1].endswith(".incomplete"):
        return None
    return name


def save(cache_dir: str, record: dict[str, dict], imported: dict[str, list[str]]) -> bool:
    """Add the layers ``imported`` (diff_id -> entry names) to ``record`` with their stamps now, and write it.

    A layer with an entry that cannot be stamped (gone already) is not recorded, and recorded layers the cache no
    longer holds (an entry changed or removed, e.g. by prune) are dropped, so the record stays as large as what the
    cache holds. Returns False when the record cannot be written (a read-only cache): then there is none and the next
    pull downloads every layer.
    """
    for diff_id in [d for d in record if d not in imported]:
        if not still_held(cache_dir, record, diff_id, ()):
            del record[diff_id]
    for diff_id, names in imported.items():
        stamps = {name: stamp_of(cache_dir, name) for name in names}
        if not names or any(s is None for s in stamps.values()):
            record.pop(diff_id, None)
            continue
        commits = sorted({n.split("/")[2] for n in names if n.split("/")[1] == "snapshots"})
        record[diff_id] = {"entries": stamps, "commits": commits}
    data = json.dumps({"version": _VERSION, "layers": record}, separators=(",", ":"), sort_keys=True).encode()
    if len(data) > MAX_RECORD_BYTES:
        return False
    return owned_record.save(cache_dir, RECORD[-1], data)
