"""import's check against what the target cache holds, under the repo locks before anything is published: the
source's claims (which blob a path shows, which paths a commit has, where a ref points) against the target's entries,
warm's record and ``trees/`` listing; anything else than the same content refuses the import (docs/security.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache import safefs
from ..cache.content import fd_matches
from ..cache.layout import RepoFolder
from ..cache.published import PublishedRevision, read_record
from ..errors import CacheError
from ..integrity.expectations import read_tree_listing

if TYPE_CHECKING:  # pragma: no cover
    from .import_plan import _RepoPlan


def _kind(path: Path) -> str:
    """``missing``, ``dir``, ``link``, ``file`` or ``other``, without following a symlink."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:
        return "other"
    return {stat.S_IFDIR: "dir", stat.S_IFLNK: "link", stat.S_IFREG: "file"}.get(stat.S_IFMT(mode), "other")


def _blocked(root: Path, parts: tuple[str, ...]) -> str | None:
    """The first existing folder on the way to ``root/parts`` (the entry excluded) that is not a real directory."""
    path = root
    for depth in range(len(parts)):
        kind = _kind(path)
        if kind == "missing":
            return None
        if kind != "dir":
            return "/".join(parts[:depth]) or "."
        path = path / parts[depth]
    return None


def _same_blob(path: Path, kind: str, folder: RepoFolder, etag: str) -> bool:
    """Whether the existing snapshot entry ``path`` shows the content ``blobs/<etag>``."""
    if kind == "link":
        return os.path.normpath(path.parent / os.readlink(path)) == os.path.normpath(folder.blob_path(etag))
    if kind == "file":
        try:  # opened from the cache root through folder fds (O_NOFOLLOW|O_NONBLOCK): a swapped parent is refused
            fd = safefs.open_file(folder.cache_dir, path.relative_to(folder.cache_dir).parts,
                                  os.O_RDONLY | os.O_NONBLOCK)
            return fd_matches(fd, etag)
        except (OSError, ValueError, CacheError):
            return False
    return False


def store_blob_holds(folder: RepoFolder, etag: str) -> bool:
    """Whether the target's ``blobs/<etag>`` is a link into huggingface_hub 2.4's shared Xet store
    (``utils/_shared_blobs.py``) whose payload hashes to ``etag`` (reused by the import)."""
    if safefs.store_link_of(folder.cache_dir, folder.name, etag) is None:
        return False
    try:
        fd = safefs.open_blob(folder.cache_dir, folder.name, etag)
    except (OSError, CacheError):
        return False
    return fd_matches(fd, etag)


class _Conflicts:
    def __init__(self, folder: RepoFolder) -> None:
        self.folder = folder
        self.found: list[str] = []
        self._listings: dict[str, dict | None] = {}
        self._records: dict[str, PublishedRevision | None] = {}

    def record(self, commit: str) -> PublishedRevision | None:
        """warm's record of ``commit`` (read once), or None."""
        if commit not in self._records:
            self._records[commit] = read_record(self.folder.cache_dir, self.folder.name, commit)
        return self._records[commit]

    def listing(self, commit: str) -> dict | None:
        """The target's ``trees/<commit>.json`` as path -> Expected (read once, no link followed), or None."""
        if commit not in self._listings:
            parts = ("trees", f"{commit}.json")
            regular = _blocked(self.folder.root, parts) is None and _kind(self.where(*parts)) == "file"
            self._listings[commit] = (read_tree_listing(str(self.folder.cache_dir), self.folder.name, commit)
                                      if regular else None)
        return self._listings[commit]

    def where(self, *parts: str) -> Path:
        return self.folder.root.joinpath(*parts)

    def add(self, parts: tuple[str, ...], why: str) -> None:
        self.found.append(f"{self.folder.name}/{'/'.join(parts)} ({why})")

    def writable(self, parts: tuple[str, ...]) -> bool:
        """False (and a conflict recorded) when a folder on the way to ``parts`` is a file or a symlink."""
        if (blocked := _blocked(self.folder.root, parts)) is None:
            return True
        self.add(parts, f"{self.folder.name}/{blocked} is a file or symlink where a folder must be"
                 if blocked != "." else "the repo folder is a file or symlink")
        return False


def check_target(folder: RepoFolder, repo: _RepoPlan, move_refs: bool = False) -> tuple[list[str], set, list[str]]:
    """(conflicts: one line per entry held otherwise or blocked, present: the ``(commit, path)`` snapshot entries held
    with the same content, moved: the refs that move) of the plan against ``folder`` (``move_refs``: a ref may move)."""
    c = _Conflicts(folder)
    present: set[tuple[str, str]] = set()
    for (commit, path), etag in sorted(repo.links.items()):
        parts = ("snapshots", commit, *path.split("/"))
        if not c.writable(parts):
            continue
        kind = _kind(c.where(*parts))
        if kind == "dir":
            c.add(parts, "the target has a folder there")
        elif kind != "missing" and _same_blob(c.where(*parts), kind, folder, etag):
            present.add((commit, path))
        elif kind != "missing":
            c.add(parts, "the target already has it with other content")
        if _kind(c.where(".no_exist", commit, *path.split("/"))) != "missing":
            c.add(parts, "the target records that this file does not exist at that commit")
        listed = c.listing(commit)
        if listed is not None and (path not in listed or listed[path].etag != etag):
            c.add(parts, "the target's trees/ listing of that commit says otherwise")
        record = c.record(commit)
        if record is not None and _record_hash(record, path) != etag:
            c.add(parts, "the target's record of that commit does not list it" if path not in record.files
                  else "the target's record of that commit lists another hash")
    for commit, path in sorted(repo.markers):
        _check_marker(c, commit, path)
    _check_trees(c, repo)
    for etag in sorted(repo.blobs):
        parts = ("blobs", etag)
        kind = _kind(c.where(*parts)) if c.writable(parts) else "missing"
        if kind == "link" and store_blob_holds(folder, etag):
            continue  # the target's shared-store payload already holds these bytes: reused, not duplicated
        if kind == "link" and safefs.store_link_of(folder.cache_dir, folder.name, etag) is not None:
            c.add(parts, "the target's shared Xet store payload for it holds other bytes or is not a file")
        elif kind not in ("missing", "file"):
            c.add(parts, "the target has something other than a file there")
    moved = _check_refs(c, repo, move_refs)
    return c.found, present, moved


def _record_hash(record: PublishedRevision, path: str) -> str | None:
    """The hex digest the record gives ``path`` (as blob names are), or None."""
    entry = record.files.get(path)
    return entry[1].split(":", 1)[1] if entry else None


def _check_marker(c: _Conflicts, commit: str, path: str) -> None:
    parts = (".no_exist", commit, *path.split("/"))
    if not c.writable(parts):
        return
    if _kind(c.where("snapshots", commit, *path.split("/"))) != "missing":
        c.add(parts, "the target has this file at that commit")
    kind = _kind(c.where(*parts))
    if kind not in ("missing", "file") or (kind == "file" and os.lstat(c.where(*parts)).st_size != 0):
        c.add(parts, "the target has something other than an empty marker there")
    record, listed = c.record(commit), c.listing(commit)
    if record is not None and (path in record.files or path not in record.absent):
        c.add(parts, "the target's record of that commit " + ("lists this file" if path in record.files
                                                              else "does not mark it absent"))
    if listed is not None and path in listed:
        c.add(parts, "the target's trees/ listing of that commit lists this file")


def _listing_disagrees(c: _Conflicts, commit: str, ours: dict[str, tuple[str, int]]) -> str | None:
    """Why the source's listing of ``commit`` contradicts what the target holds at that commit, or None."""
    record = c.record(commit)
    for path, (etag, _size) in sorted(ours.items()):
        if record is not None and _record_hash(record, path) != etag:
            return f"it lists {path} " + ("with another hash than" if path in record.files else "unlike") + \
                " the target's record of that commit"
        pointer = c.where("snapshots", commit, *path.split("/"))
        kind = _kind(pointer)
        if kind in ("link", "file") and not _same_blob(pointer, kind, c.folder, etag):
            return f"it lists {path} with another content than the target's snapshot"
        if _kind(c.where(".no_exist", commit, *path.split("/"))) != "missing":
            return f"it lists {path}, which the target records as absent at that commit"
    return None


def _check_trees(c: _Conflicts, repo: _RepoPlan) -> None:
    for name, (_staged, files) in sorted(repo.trees.items()):
        parts = ("trees", name)
        if not c.writable(parts):
            continue
        kind = _kind(c.where(*parts))
        if kind == "missing":
            if why := _listing_disagrees(c, name.removesuffix(".json"), _expected(files)):
                c.add(parts, why)
            continue
        theirs = c.listing(name.removesuffix(".json")) if kind == "file" else None
        ours = _expected(files)
        if theirs is None or {p: (e.etag, e.size) for p, e in theirs.items()} != ours:
            c.add(parts, "the target already has another listing of that commit")


def _expected(files: dict[str, tuple[str, str, int]]) -> dict[str, tuple[str, int]]:
    return {path: (lfs or blob_id, size) for path, (blob_id, lfs, size) in files.items()}


def _check_refs(c: _Conflicts, repo: _RepoPlan, move_refs: bool) -> list[str]:
    moved = []
    commits = {commit for commit, _ in repo.links}  # markers alone are no snapshot
    for ref, commit in sorted(repo.refs.items()):
        parts = ("refs", *ref.split("/"))
        if commit not in commits and not _has_snapshot(c, commit):
            c.add(parts, f"it names commit {commit}, of which neither the source nor the target has a snapshot")
        if not c.writable(parts):
            continue
        kind = _kind(c.where(*parts))
        if kind == "missing":
            continue
        current = (safefs.read_small(c.folder.cache_dir, (c.folder.name, *parts), 1024).strip()
                   if kind == "file" else b"")  # from the root, no link followed, a FIFO refused: never blocks
        if current == commit.encode():
            continue
        if kind == "file" and move_refs:
            moved.append(f"{c.folder.name}/refs/{ref}")
        else:
            c.add(parts, f"the target's ref points to {current.decode('ascii', 'replace')[:40] or 'something else'}; "
                  "pass --move-refs to move it")
    return moved


def _has_snapshot(c: _Conflicts, commit: str) -> bool:
    """Whether the target's ``snapshots/<commit>`` is a real folder with an entry."""
    if _blocked(c.folder.root, ("snapshots", commit, "x")) is not None or _kind(c.where("snapshots", commit)) != "dir":
        return False
    with os.scandir(c.where("snapshots", commit)) as entries:
        return any(True for _ in entries)
