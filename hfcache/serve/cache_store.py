"""A Hugging Face hub cache as a store of repos (``hfcache serve --cache-dir``), read-only (what it answers:
docs/serve.md; unreadable parts: docs/shared-caches.md). Ids, revisions and paths are looked up in what a scan found
(memoised ``ttl`` seconds); files are opened through the cache's safe opens.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..bounds import loads_json
from ..cache import safefs
from ..cache.content import git_blob_sha1, lfs_pointer
from ..cache.fsops import walk_tree
from ..cache.scan import RepoInfo, parse_folder_name, scan_repo
from ..cache.shared_store import StoreProblem, payload_stat
from ..names import is_commit, is_sha256, repo_folder_name
from ..records import REPO_TYPES as SERVED_TYPES
from .vocabulary import REPO_NAME_RE, HashMemo, RepoFile, RepoSnapshot, StoreMiss, open_beneath, regular_file

__all__ = ["CacheStore", "unreadable_repos"]

_TREES_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class _Repo:
    """One scanned repo folder: refs that resolve, and each servable snapshot."""

    repo_id: str
    repo_type: str
    refs: dict[str, str]
    snapshots: dict[str, RepoSnapshot]


class CacheStore:
    """Repos of the hub cache ``cache_dir`` (str | Path), answered as the Hub would (read-only); ``ttl``: seconds a
    scan of a repo folder (and of the root, for legacy aliases) is reused. Raises FileNotFoundError: no directory."""

    def __init__(self, cache_dir: str | Path, *, ttl: float = 1.0) -> None:
        self.root = Path(os.path.realpath(cache_dir))
        if not self.root.is_dir():
            raise FileNotFoundError(f"no cache directory at {cache_dir}")
        self.ttl = ttl
        self._memo = HashMemo()
        self._lock = threading.Lock()
        self._repos: dict[str, tuple[float, _Repo | None]] = {}
        self._names: tuple[float, tuple[str, ...]] | None = None
        self._spellings: tuple[tuple[str, ...], dict[tuple[str, str], set[str]]] | None = None

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        """The canonical id a legacy-id folder stands for (:meth:`_alias`), else ``repo_id``."""
        return self._alias(repo_type, repo_id) or repo_id

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision`` (a ref name or a snapshot's full commit). Raises StoreMiss: ``RepoNotFound`` (no
        servable folder), ``RevisionNotFound``."""
        repo = self._repo(repo_type, self.canonical_id(repo_type, repo_id))
        if repo is None:
            raise StoreMiss("RepoNotFound", "Repository not found")
        commit = repo.refs.get(revision) or (revision if revision in repo.snapshots else None)
        if commit is None:
            raise StoreMiss("RevisionNotFound", f"Invalid rev id: {revision}", repo_id=repo.repo_id)
        return repo.snapshots[commit]

    def listing(self, snapshot: RepoSnapshot) -> dict[str, dict] | None:
        """The raw entries of the snapshot's ``trees/<commit>.json`` (path -> ``size``, ``blob_id``, ``lfs_sha256``
        as huggingface_hub ``_tree_cache.py`` writes them; unvalidated), or None when there is none."""
        folder = _folder_name(snapshot.repo_type, snapshot.repo_id)
        return _read_trees(self.root, folder, snapshot.commit) if folder is not None else None

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot | None = None, *, head: bool = False) -> BinaryIO:
        """Open a blob (:func:`hfcache.cache.safefs.open_blob`: a regular file or a link into the shared Xet store) or
        a snapshot file, following no other link. Raises OSError: missing, a link on the way, not a regular file;
        UnsafeLayout: a blob link of another shape."""
        parts = repo_file.local_path.relative_to(self.root).parts
        if len(parts) == 3 and parts[1] == "blobs":
            return regular_file(safefs.open_blob(self.root, parts[0], parts[2]), str(repo_file.local_path))
        return open_beneath(self.root, parts)

    def _repo(self, repo_type: str, repo_id: str) -> _Repo | None:
        folder = _folder_name(repo_type, repo_id)
        if folder is None:
            return None
        now = time.monotonic()
        with self._lock:
            cached = self._repos.get(folder)
        if cached is not None and cached[0] > now:
            return cached[1]
        repo = self._scan(folder, repo_type, repo_id)
        if repo is not None:  # misses are not memoised: requests for random ids must not grow memory
            with self._lock:
                self._repos[folder] = (now + self.ttl, repo)
        return repo

    def _scan(self, folder: str, repo_type: str, repo_id: str) -> _Repo | None:
        path = self.root / folder
        if not os.path.lexists(path):
            return None
        info = scan_repo(path, repo_id, repo_type)
        if info.unsafe:
            return None  # a symlinked part could lead anywhere: the repo is not served (safefs.repo_layout_problems)
        if info.unreadable:  # what this user sees of it is partial: never served as if it were whole
            raise _unreadable(folder, info.unreadable)
        snapshots = {}
        for revision in info.revisions:
            if is_commit(revision.commit_hash):
                snapshot = self._snapshot(info, path, revision)
                if snapshot.files:
                    snapshots[revision.commit_hash] = snapshot
        if not snapshots:
            return None
        refs = {name: value for name, value in info.refs.items() if value in snapshots}
        return _Repo(repo_id=repo_id, repo_type=repo_type, refs=refs, snapshots=snapshots)

    def _snapshot(self, info: RepoInfo, path: Path, revision) -> RepoSnapshot:
        commit = revision.commit_hash
        trees = _read_trees(self.root, info.folder, commit)
        files: dict[str, RepoFile] = {}
        for entry in revision.files:
            size = entry.size if entry.form == "link" else self._store_size(info.folder, entry)
            if size is not None and entry.etag is not None:
                repo_file = _from_blob_name(entry.path, path / "blobs" / entry.etag, entry.etag, size)
            elif entry.form == "file":
                repo_file = self._from_real_file(entry.path, path / "snapshots" / commit / entry.path, trees)
            else:
                repo_file = None  # broken, absolute or escaping link: not served
            if repo_file is not None:
                files[entry.path] = repo_file
        return RepoSnapshot(repo_type=info.repo_type, repo_id=info.repo_id, commit=commit,
                            files=dict(sorted(files.items())), absent=_markers(path / ".no_exist" / commit),
                            listing=frozenset(trees) if trees is not None else None)

    def _store_size(self, folder: str, entry) -> int | None:
        """Payload bytes of an entry whose blob links into huggingface_hub 2.4's shared Xet store
        (``utils/_shared_blobs.py``), else None (not served)."""
        if entry.form != "broken" or entry.etag is None:
            return None
        xet_hash = safefs.store_link_of(self.root, folder, entry.etag)
        if xet_hash is None:
            return None
        try:
            return payload_stat(self.root, xet_hash).st_size
        except (StoreProblem, OSError):
            return None

    def _from_real_file(self, rel: str, local: Path, trees: dict[str, dict] | None) -> RepoFile | None:
        """A real file in ``snapshots/`` (no-symlink cache): hashes from the tree listing, else computed once."""
        try:
            st = os.lstat(local)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        known = (trees or {}).get(rel)
        if known and known.get("size") == st.st_size and isinstance(known.get("blob_id"), str):
            sha256 = known.get("lfs_sha256")
            if isinstance(sha256, str) and is_sha256(sha256):
                return _from_blob_name(rel, local, sha256, st.st_size)
            if is_commit(known["blob_id"]):
                return RepoFile(rel, local, st.st_size, known["blob_id"], None, False, 0)
        try:  # hashed from the descriptor the safe open returned: a name swapped for a link later is never read
            with open_beneath(self.root, local.relative_to(self.root).parts) as opened:
                return self._memo.describe(rel, local, opened=opened)
        except OSError:
            return None

    def _alias(self, repo_type: str, repo_id: str) -> str | None:
        """The canonical id an org-less model folder duplicates, if exactly one ``ORG/<same name>`` holds it."""
        if repo_type != "model" or "/" in repo_id or _folder_name(repo_type, repo_id) is None:
            return None
        try:
            legacy = self._repo(repo_type, repo_id)
        except StoreMiss:  # unreadable: snapshot() answers that, for the id as asked
            return None
        if legacy is None:
            return None
        matches = []
        for name in self._folder_names():
            parsed = parse_folder_name(name)
            if parsed is None or parsed[1] != "model" or parsed[0].split("/")[-1] != repo_id or "/" not in parsed[0]:
                continue
            try:
                canonical = self._repo("model", parsed[0])
            except StoreMiss:
                continue
            if canonical is not None and _covers(canonical, legacy):
                matches.append(parsed[0])
        return matches[0] if len(matches) == 1 else None

    def spelled(self, repo_type: str, repo_id: str) -> str | None:
        """The id of the repo folder whose id equals ``repo_id`` ignoring case (the Hub resolves ids that way), as
        the folder spells it; None when there is none (or several: then none is preferred)."""
        names = self._folder_names()
        with self._lock:
            index = self._spellings if self._spellings is not None and self._spellings[0] is names else None
        if index is None:  # rebuilt when the root's listing is (at most once per ttl)
            table: dict[tuple[str, str], set[str]] = {}
            for parsed in filter(None, map(parse_folder_name, names)):
                table.setdefault((parsed[1], parsed[0].lower()), set()).add(parsed[0])
            index = (names, table)
            with self._lock:
                self._spellings = index
        found = index[1].get((repo_type, repo_id.lower()), set())
        return next(iter(found)) if len(found) == 1 else None

    def _folder_names(self) -> tuple[str, ...]:
        now = time.monotonic()
        with self._lock:
            if self._names is not None and self._names[0] > now:
                return self._names[1]
        names = _folders(self.root)
        with self._lock:
            self._names = (now + self.ttl, names)
        return names


def _unreadable(folder: str, parts) -> StoreMiss:
    """500 ``CacheUnreadable``: the repo exists (not 404) and no token fixes it (not 401/403)."""
    shown = ", ".join(f"{folder}/{p}" for p in sorted(parts))
    return StoreMiss("CacheUnreadable", f"{shown} cannot be read by the server (permission denied for uid "
                     f"{os.geteuid()}): ask the mirror's operator to fix the cache's permissions", status=500)


def unreadable_repos(root: Path) -> tuple[str, ...]:
    """Repo folders of the cache ``root`` (or their ``blobs/``, ``snapshots/``, ``refs/``, ``.no_exist/``) this user
    cannot list or enter, relative to ``root`` (``models--org--name/blobs/``): what ``serve`` warns about at start."""
    found = []
    for name in _folders(root):
        if parse_folder_name(name) is None:
            continue
        if not os.access(root / name, os.R_OK | os.X_OK):
            found.append(f"{name}/")
            continue
        found += [f"{name}/{sub}/" for sub in ("blobs", "snapshots", "refs", ".no_exist")
                  if os.path.isdir(root / name / sub) and not os.access(root / name / sub, os.R_OK | os.X_OK)]
    return tuple(found)


def _folders(root: Path) -> tuple[str, ...]:
    """The folders (not links) of ``root``, sorted; none when it cannot be listed."""
    try:
        return tuple(sorted(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)))
    except OSError:
        return ()


def _covers(canonical: _Repo, legacy: _Repo) -> bool:
    """Whether every ref, commit and file of ``legacy`` is in ``canonical`` (same commit, same blob)."""
    if any(canonical.refs.get(name) != commit for name, commit in legacy.refs.items()):
        return False
    for commit, snapshot in legacy.snapshots.items():
        other = canonical.snapshots.get(commit)
        if other is None:
            return False
        for path, f in snapshot.files.items():
            g = other.files.get(path)
            if g is None or (g.blob_id, g.size) != (f.blob_id, f.size):
                return False
    return True


def _folder_name(repo_type: str, repo_id: str) -> str | None:
    """``models--ORG--NAME`` for a valid id, None otherwise (huggingface_hub forbids ``--`` and ``..`` in ids)."""
    parts = repo_id.split("/")
    if repo_type not in SERVED_TYPES or len(parts) > 2 or not all(REPO_NAME_RE.match(p) and "--" not in p
                                                                    for p in parts):
        return None
    return repo_folder_name(repo_id, repo_type)


def _from_blob_name(rel: str, local: Path, etag: str, size: int) -> RepoFile | None:
    """A RepoFile from a sha256 (LFS) or git blob sha1 blob name; None for other names."""
    if is_sha256(etag):
        pointer = lfs_pointer(etag, size)
        return RepoFile(rel, local, size, git_blob_sha1(pointer), etag, True, len(pointer))
    if is_commit(etag):
        return RepoFile(rel, local, size, etag, None, False, 0)
    return None


def _markers(folder: Path) -> frozenset[str]:
    """Paths of the ``.no_exist/<commit>/`` markers (names only; links are not followed)."""
    found = set()
    for dirpath, _dirnames, filenames in walk_tree(folder):  # iterative, 64 levels at most, links not entered
        rel = os.path.relpath(dirpath, folder)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        found.update(prefix + name for name in filenames)
    return frozenset(found)


def _read_trees(root: Path, folder: str, commit: str) -> dict[str, dict] | None:
    """``<folder>/trees/<commit>.json`` (huggingface_hub _tree_cache.py, format_version 1): path -> entry, or None."""
    try:
        with open_beneath(root, (folder, "trees", f"{commit}.json")) as f:  # bounds.TooDeep is a ValueError
            data = loads_json(f.read(_TREES_MAX_BYTES + 1)[:_TREES_MAX_BYTES], f"trees/{commit}.json")
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("format_version") == 1 else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return None
    return files

