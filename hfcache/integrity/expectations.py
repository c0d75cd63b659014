"""expectations: what each snapshot path should hold (size and hash: from a lock, else warm's record, else
huggingface_hub's ``trees/<commit>.json``), and where a snapshot differs from it; real files (a cache written without
symlinks) are queued for verify's hashing.
"""

from __future__ import annotations

import os
import stat
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
    :data:`hfcache.bounds.MAX_JSON_DEPTH`, or an entry with a bad etag or size (not a listing hfcache trusts)."""
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
    except (OSError, CacheError, ValueError, KeyError, TypeError, AttributeError):  # ValueError: bounds.TooDeep too
        return None


class RevisionExpectation:
    """What one revision's snapshot should hold, the one rule ``verify``, ``sign``, ``verify --signature`` and
    ``push --sign-key`` judge a snapshot file by (:meth:`of`): a lock's pins when a lock pins the commit (then nothing
    else counts), else per path warm's record, else the ``trees/`` listing (read when a path needs it), else the blob
    name of a link (or of the blob a real file is a hardlink of)."""

    def __init__(self, cache_dir: str, folder: str, commit: str, pinned: dict[str, Expected] | None,
                 recorded: dict[str, Expected] | None, absent: tuple[str, ...] = ()) -> None:
        self.cache_dir, self.folder, self.commit = cache_dir, folder, commit
        self.pinned, self.recorded, self.absent = pinned, recorded, absent
        self._listed: dict[str, Expected] | None = None
        self._read = False

    @property
    def source(self) -> str:
        return "lock" if self.pinned is not None else "warm record" if self.recorded is not None else "trees/ listing"

    def listed(self) -> dict[str, Expected] | None:
        if not self._read:
            self._listed, self._read = read_tree_listing(self.cache_dir, self.folder, self.commit), True
        return self._listed

    def of(self, path: str, blob: str | None = None, size: int = 0) -> tuple[Expected | None, str]:
        """(what ``path`` should hold, where that comes from: ``lock``, ``warm record``, ``trees/ listing``,
        ``blob name``), or (None, the source that has nothing for it). ``blob``: the blob name of a link, or of the
        blob a real file shares its inode with; ``size``: its size."""
        if self.pinned is not None:
            return self.pinned.get(path), "lock"
        for files, source in ((self.recorded, "warm record"), (self.listed(), "trees/ listing")):
            if files and path in files:
                return files[path], source
        return (Expected(blob, size), "blob name") if blob else (None, self.source)

    def missing(self, present: set[str]) -> list[str]:
        """The paths the lock or warm's record lists that ``present`` lacks (a ``trees/`` listing names the whole
        commit, of which a snapshot may hold part)."""
        files = self.pinned if self.pinned is not None else self.recorded
        return sorted(set(files or ()) - present)

    def unlisted(self, present: set[str]) -> list[str]:
        return sorted(present - set(self.pinned)) if self.pinned is not None else []


def expected_of(cache_dir: str, repo: RepoInfo, commit: str, expectations,
                refused: list[Problem] | None = None) -> RevisionExpectation:
    """One revision's :class:`RevisionExpectation` (``expectations``: :func:`lock_expectations`'s). A warm record past
    its bounds (RecordRefused) is a ``record_refused`` error appended to ``refused``, or raised when it is None."""
    pinned = expectations.get((repo.repo_type, repo.repo_id, commit))
    if pinned is not None:
        return RevisionExpectation(cache_dir, repo.folder, commit, pinned, None)
    try:
        record = read_record(cache_dir, repo.folder, commit)
    except RecordRefused as exc:
        if refused is None:
            raise
        refused.append(Problem(repo.repo_id, commit, f".locks/{repo.folder}/hfcache/{commit}.json",
                               "record_refused", exc.message.split(": ", 1)[-1], repo.folder))
        record = None
    if record is None:
        return RevisionExpectation(cache_dir, repo.folder, commit, None, None)
    files = {p: Expected(digest.split(":", 1)[1], size) for p, (size, digest) in record.files.items()}
    return RevisionExpectation(cache_dir, repo.folder, commit, None, files, record.absent)


def blob_inodes(cache_dir: str, folder: str) -> dict[tuple[int, int], str]:
    """(device, inode) -> name of each regular file in the repo's ``blobs/`` (a real snapshot file sharing one is a
    hardlink of that blob, hfcache's form without symlinks); empty when it cannot be listed."""
    found = {}
    try:
        with os.scandir(os.path.join(cache_dir, folder, "blobs")) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and is_etag(entry.name):
                    found[(st.st_dev, st.st_ino)] = entry.name
    except OSError:
        return {}
    return found


def lost_markers(cache_dir: str, repo: RepoInfo, rev, absent: tuple[str, ...]) -> list[Problem]:
    """Names warm marked absent whose ``.no_exist`` marker is gone, with no file in its place: transformers then
    asks the network for them (docs/cache-layout.md, 'Traps the libraries leave')."""
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


def check_expected(repo: RepoInfo, rev, expected: RevisionExpectation, jobs, owners,
                   cache_dir: str) -> list[Problem]:
    """Compare a snapshot with what it should hold (:meth:`RevisionExpectation.of`); queue its real files for
    hashing in verify's ``jobs`` and ``owners`` (opened from the cache root there, never by a path)."""
    found: list[Problem] = []

    def add(path: str, kind: str, detail: str) -> None:
        found.append(Problem(repo.repo_id, rev.commit_hash, path, kind, detail, repo.folder))

    for f in rev.files:
        if f.form not in ("link", "file"):
            continue  # broken, absolute, outside: reported from the scan
        job = jobs.get(f.inode) if f.form == "file" else None
        blob = f.etag if f.form == "link" else job[2] if job and len(job[0]) == 3 else None
        want, source = expected.of(f.path, blob, f.size)
        if want is None or source == "blob name":  # a link's or hardlink's blob is verified by its name
            if want is None and blob is None and f.form == "file":
                add(f.path, "unverified", "real file with no expected hash (no lock, warm record or trees/ listing "
                                          "names it)")
        elif f.form == "link" and (f.etag != want.etag or f.size != want.size):
            add(f.path, "file_mismatch", f"links to blob {f.etag[:16]}… ({f.size} bytes), the {source} expects "
                                         f"{want.etag[:16]}… ({want.size} bytes)")
        elif f.form == "file" and f.size != want.size:
            add(f.path, "file_mismatch", f"{f.size} bytes, the {source} expects {want.size}")
        elif f.form == "file" and algorithm_of(want.etag) and f.inode is not None:
            jobs.setdefault(f.inode, ((cache_dir, repo.folder, rev.commit_hash, f.path), algorithm_of(want.etag),
                                      want.etag, f.size))
            owners.setdefault(f.inode, []).append((repo, rev.commit_hash, f.path))
    present = {f.path for f in rev.files}
    for path in expected.missing(present):
        add(path, "file_missing", f"listed in the {expected.source} but not in the snapshot")
    for path in expected.unlisted(present):
        add(path, "file_unlisted", "present but not listed in the lock")
    return found


def lock_repos_missing(lock: Lockfile, cache_dir: str | os.PathLike[str], wanted: set[str] | None) -> list[Problem]:
    """A ``file_missing`` per file of each locked repo whose snapshot is absent from the cache."""
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
