"""The record of the tar layers ``hfcache pull`` imported (``<cache>/.locks/hfcache-pulled.json``: a layer's diff_id
-> the ``lstat`` stamp of every entry it held), so that a later pull skips a layer the cache still holds (the rules:
docs/oci.md "What the cache already holds is not downloaded"; trust: :mod:`hfcache.cache.owned_record`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable

from ..cache import owned_record, safefs
from ..errors import CacheError
from ..move.import_plan import repo_folder_ok
from ..names import is_commit, is_etag

NAME = "hfcache-pulled.json"  # in <cache>/.locks
MAX_RECORD_BYTES = 64 * 1024 * 1024
_VERSION = 1
_SECTIONS = ("blobs", "snapshots", "refs", ".no_exist", "trees")


def load(cache_dir: str) -> dict[str, dict]:
    """The honoured record: diff_id -> {"entries": {name: stamp}, "commits": [commit, ...]}; {} when there is none,
    or it is not honoured, too large or malformed (one bad entry name or commit ignores the whole record)."""
    loaded = owned_record.load(cache_dir, NAME, MAX_RECORD_BYTES)
    if not loaded.trusted:
        return {}
    try:
        if loaded.data.get("version") != _VERSION:
            return {}
        record = {str(k): {"entries": {str(n): list(s) for n, s in v["entries"].items()},
                           "commits": [str(c) for c in v["commits"]]} for k, v in loaded.data["layers"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}
    for layer in record.values():
        if not all(entry_name(name) == name for name in layer["entries"]) or not all(map(is_commit, layer["commits"])):
            return {}
    return record


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
    if not layer or not layer["entries"] or not set(commits) <= set(layer["commits"]):
        return False
    return all(stamp_of(cache_dir, name) == stamp for name, stamp in layer["entries"].items())


def entry_name(name: str) -> str | None:
    """The name a tar entry has in the record (a file, link or hardlink below a repo folder's sections:
    ``<repo folder>/<section>/...``, no empty, ``.`` or ``..`` part, a blob named by its hash), or None."""
    parts = name.split("/")
    if len(parts) < 3 or parts[1] not in _SECTIONS or parts[-1].endswith(".incomplete") \
            or not repo_folder_ok(parts[0]) or any(p in ("", ".", "..") for p in parts) \
            or (parts[1] == "blobs" and (len(parts) != 3 or not is_etag(parts[2]))):
        return None
    return name


def save(cache_dir: str, record: dict[str, dict], imported: dict[str, list[str]]) -> bool:
    """Add the layers ``imported`` (diff_id -> entry names) to ``record`` with their stamps now, and write it; False
    when it cannot be written. Layers with an entry gone (pruned, or already) are dropped."""
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
    return len(data) <= MAX_RECORD_BYTES and owned_record.save(cache_dir, NAME, data)
