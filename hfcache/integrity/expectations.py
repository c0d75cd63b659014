"""expectations: what each snapshot path should hold (size and hash: from a lock, else warm's record, else
huggingface_hub's ``trees/<commit>.json``), and where a snapshot differs from it; real files (a cache written without
symlinks) are queued for verify's hashing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..bounds import loads_json
from ..cache import safefs
from ..cache.content import algorithm_of
from ..cache.published import RecordRefused, read_record
from ..cache.root import repo_folder_name
from ..cache.scan import RepoInfo
from ..errors import CacheError
from ..names import is_etag
from ..records import folder_ids, valid_size
from ..warming.lockfile import Lockfile
from .verify_report import Problem


@dataclass(frozen=True)
class Expected:
    """What a snapshot path should hold: ``etag`` (sha256 or git sha1 hex) and ``size`` in bytes."""

    etag: str
    size: int


#: A ``trees/<commit>.json`` larger than this is not read (the listing of a 100,000-file repo is ~20 MiB).
MAX_TREE_LISTING_BYTES = 64 * 1024 * 1024


def read_tree_listing(cache_dir: str, folder: str, commit: str) -> dict[str, Expected] | None:
    """``trees/<commit>.json`` (huggingface_hub ``_tree_cache.py`` format 1) as path -> Expected, or None: none
    there, a link or FIFO (never followed or opened blocking), past :data:`MAX_TREE_LISTING_BYTES` or
    :data:`hfcache.bounds.MAX_JSON_DEPTH`, or an entry whose etag is not 40/64 hex or whose size is not an integer
    from 0 to :data:`hfcache.records.MAX_FILE_SIZE` (not a listing hfcache trusts)."""
    try:
        raw = safefs.read_small(cache_dir, (folder, "trees", f"{commit}.json"), MAX_TREE_LISTING_BYTES + 1)
        if len(raw) > MAX_TREE_LISTING_BYTES:
            return None
        data = loads_json(raw, f"{folder}/trees/{commit}.json")
        if data.get("format_version") != 1:
            return None
        out = {}
        for path, info in data["files"].items():
            etag = info.get("lfs_sha256") or info["blob_id"]
            size = info.get("lfs_size") or info["size"]
            if not is_etag(etag) or not valid_size(size):  # a list, a number, a float size: not a listing
                return None
            out[path] = Expected(etag=etag, size=size)
        return out
    except (OSError, CacheError, ValueError, KeyError, TypeError, AttributeError):  # not ours
        # (ValueError includes bounds.TooDeep; CacheError: a link or FIFO there)
        return None


def expected_of(cache_dir: str, repo: RepoInfo, commit: str, expectations,
                refused: list[Problem] | None = None) -> tuple[dict[str, Expected] | None, str, tuple[str, ...]]:
    """(path -> Expected, where it comes from, names marked absent) for one revision: the lock's when given, else
    warm's record (:mod:`hfcache.cache.published`), else a ``trees/`` listing. A warm record past its bounds
    (:class:`hfcache.cache.published.RecordRefused`) is a ``record_refused`` error appended to ``refused``."""
    expected = expectations.get((repo.repo_type, repo.repo_id, commit))
    if expected is not None:
        return expected, "lock", ()
    try:
        record = read_record(cache_dir, repo.folder, commit)
    except RecordRefused as exc:
        if refused is not None:
            refused.append(Problem(repo.repo_id, commit, f".locks/{repo.folder}/hfcache/{commit}.json",
                                   "record_refused", exc.message.split(": ", 1)[-1], repo.folder))
        record = None
    if record is not None:
        files = {p: Expected(digest.split(":", 1)[1], size) for p, (size, digest) in record.files.items()}
        return files, "warm record", record.absent
    return read_tree_listing(cache_dir, repo.folder, commit), "trees/ listing", ()


def lost_markers(cache_dir: str, repo: RepoInfo, rev, absent: tuple[str, ...]) -> list[Problem]:
    """Names warm marked absent whose ``.no_exist`` marker is gone, with no file in its place: transformers then
    asks the network for them (and a tokenizer without ``config.json`` fails to load offline: docs/cache-layout.md,
    'Traps the libraries leave')."""
    present = {f.path for f in rev.files}
    found = []
    for name in absent:
        if name in present:
            continue
        marker = os.path.join(cache_dir, repo.folder, ".no_exist", rev.commit_hash, *name.split("/"))
        if not os.path.lexists(marker):
            found.append(Problem(repo.repo_id, rev.commit_hash, name, "file_missing",
                                 "neither the file nor its .no_exist marker (warm marked it absent)", repo.folder))
    return found


def lock_expectations(lock: Lockfile | None) -> dict[tuple[str, str, str], dict[str, Expected]]:
    """(repo_type, repo_id, commit) -> path -> Expected, for both the requested and the canonical id."""
    out: dict[tuple[str, str, str], dict[str, Expected]] = {}
    for repo in lock.repos if lock else ():
        files = {f.path: Expected(f.etag, f.size) for f in repo.files}
        for repo_id in folder_ids(repo.request.repo_id, repo.canonical_id):
            out[(repo.request.repo_type, repo_id, repo.commit_hash)] = files
    return out


def check_expected(repo: RepoInfo, rev, expected: dict[str, Expected] | None, source: str, jobs, owners,
                   cache_dir: str) -> list[Problem]:
    """Compare a snapshot with its expected listing (``source``: lock, warm record, trees/ listing); queue its real
    files for hashing in verify's ``jobs`` and ``owners`` (opened from the cache root there, never by a path)."""
    found: list[Problem] = []

    def add(path: str, kind: str, detail: str) -> None:
        found.append(Problem(repo.repo_id, rev.commit_hash, path, kind, detail, repo.folder))

    for f in rev.files:
        want = expected.get(f.path) if expected else None
        if f.form == "link" and want is not None and (f.etag != want.etag or f.size != want.size):
            add(f.path, "file_mismatch", f"links to blob {f.etag[:16]}… ({f.size} bytes), the {source} expects "
                                         f"{want.etag[:16]}… ({want.size} bytes)")
        elif f.form != "file" or (want is None and f.inode in jobs):
            continue  # a hardlink of a blob (hfcache's form without symlinks): verified by the blob's name
        elif want is None:
            add(f.path, "unverified", "real file with no expected hash (no lock or trees/ listing names it)")
        elif f.size != want.size:
            add(f.path, "file_mismatch", f"{f.size} bytes, the {source} expects {want.size}")
        elif algorithm_of(want.etag) and f.inode is not None:
            jobs.setdefault(f.inode, ((cache_dir, repo.folder, rev.commit_hash, f.path), algorithm_of(want.etag),
                                      want.etag, f.size))
            owners.setdefault(f.inode, []).append((repo, rev.commit_hash, f.path))
    present = {f.path for f in rev.files}
    if source in ("lock", "warm record"):
        for path in sorted(set(expected or ()) - present):
            add(path, "file_missing", f"listed in the {source} but not in the snapshot")
    if expected is not None and source == "lock":
        for path in sorted(present - set(expected)):
            add(path, "file_unlisted", "present but not listed in the lock")
    return found


def lock_repos_missing(lock: Lockfile, cache_dir: str | os.PathLike[str], wanted: set[str] | None) -> list[Problem]:
    """Locked repos whose snapshot is entirely absent from the cache (verify reports them as missing files)."""
    found = []
    for repo in lock.repos:
        for repo_id in sorted(folder_ids(repo.request.repo_id, repo.canonical_id)):
            if wanted is not None and repo_id not in wanted:
                continue
            folder = Path(cache_dir) / repo_folder_name(repo_id, repo.request.repo_type)
            if not os.path.isdir(folder / "snapshots" / repo.commit_hash):  # no PermissionError (Path.is_dir has)
                for f in repo.files:
                    found.append(Problem(repo_id, repo.commit_hash, f.path, "file_missing",
                                         "listed in the lock but its snapshot is not in the cache", folder.name))
    return found
