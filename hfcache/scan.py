"""One scanner of a cache's metadata, shared by ``ls`` (and the commands that judge a cache: verify, prune).

It reads only metadata (``scandir``, ``lstat``, ``readlink``, ref contents of 40 bytes): no hashing, no writes.
Unlike ``huggingface_hub.scan_cache_dir``, which drops a repo it considers corrupted into ``warnings``, every repo
folder is returned, with its problems listed (library gap: an operator debugging a failed offline load needs to see
exactly the broken repos).

Last use, as hfcache defines it (README "Last use"): the newest of the access times of the revision's blobs, the
modification time of its snapshot folder and of the refs pointing to it. atime alone is unreliable on
``noatime``/``relatime`` mounts and read-only image layers; the snapshot and ref mtimes change whenever warm
(re)publishes a revision.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

_COMMIT_RE = re.compile(rb"^[0-9a-f]{40}$")
_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}


@dataclass(frozen=True)
class SnapshotFile:
    """One entry of ``snapshots/<commit>/``.

    Attributes:
        path (str): ``/``-separated path in the repo.
        etag (str | None): the blob name the link points to (None for real files or links outside ``blobs/``).
        size (int): size of the content in bytes (0 when the link is broken).
        form (str): ``link`` (relative symlink into ``blobs/``), ``file`` (a real file: a cache written without
            symlinks), ``broken`` (link to a missing blob), ``absolute`` (absolute link), ``outside`` (relative
            link leaving the repo's ``blobs/``).
        inode (tuple[int, int] | None): (device, inode) of the content, to count shared bytes once.
    """

    path: str
    etag: str | None
    size: int
    form: str
    inode: tuple[int, int] | None


@dataclass(frozen=True)
class RevisionInfo:
    """One snapshot of a repo.

    Attributes:
        commit_hash (str): the snapshot folder's name.
        refs (tuple[str, ...]): refs pointing to it, sorted.
        files (tuple[SnapshotFile, ...]): its entries, sorted by path.
        size_on_disk (int): bytes of its distinct contents (shared blobs counted once).
        last_used (float): seconds since the epoch (see the module docstring).
        problems (tuple[str, ...]): what is wrong, e.g. ``"vocab.txt: broken link"``.
    """

    commit_hash: str
    refs: tuple[str, ...]
    files: tuple[SnapshotFile, ...]
    size_on_disk: int
    last_used: float
    problems: tuple[str, ...]


@dataclass(frozen=True)
class RepoInfo:
    """One repo folder of a cache.

    Attributes:
        repo_id (str): decoded from the folder name (``models--ORG--NAME`` -> ``ORG/NAME``).
        repo_type (str): ``model``, ``dataset`` or ``space``.
        folder (str): the folder name.
        refs (dict[str, str]): ref name -> content (commit, or whatever malformed text it holds).
        revisions (tuple[RevisionInfo, ...]): sorted by commit.
        size_on_disk (int): bytes of the repo's distinct contents (blobs, real snapshot files, ``.incomplete``).
        blob_count (int): regular files in ``blobs/``.
        incomplete (tuple[str, ...]): leftover ``blobs/*.incomplete`` names.
        last_used (float): newest ``last_used`` of its revisions (0 when it has none).
        problems (tuple[str, ...]): repo-level and revision-level problems, in a stable order.
        inodes (dict[tuple[int, int], int]): (device, inode) -> size of every distinct content, to total a cache.
    """

    repo_id: str
    repo_type: str
    folder: str
    refs: dict[str, str]
    revisions: tuple[RevisionInfo, ...]
    size_on_disk: int
    blob_count: int
    incomplete: tuple[str, ...]
    last_used: float
    problems: tuple[str, ...]
    inodes: dict[tuple[int, int], int]

    @property
    def health(self) -> str:
        """``ok`` or the problems joined by ``; ``."""
        return "ok" if not self.problems else "; ".join(self.problems)


@dataclass(frozen=True)
class CacheInfo:
    """A whole cache: ``repos`` sorted by (type, id); ``size_on_disk`` counts every distinct content once."""

    cache_dir: str
    repos: tuple[RepoInfo, ...]
    size_on_disk: int


def parse_folder_name(name: str) -> tuple[str, str] | None:
    """``models--ORG--NAME`` -> (``ORG/NAME``, ``model``); None for names that are not repo folders."""
    prefix, sep, rest = name.partition("--")
    if not sep or prefix not in _REPO_TYPES or not rest:
        return None
    parts = rest.split("--")
    if len(parts) > 2 or any(p in ("", ".", "..") for p in parts):
        return None
    return "/".join(parts), _REPO_TYPES[prefix]


def scan_cache(cache_dir: str | os.PathLike[str], repo_ids: set[str] | None = None) -> CacheInfo:
    """Scan every repo folder of ``cache_dir`` (or only those whose id is in ``repo_ids``).

    Returns:
        CacheInfo. A missing cache directory gives an empty CacheInfo.
    """
    root = Path(cache_dir)
    repos = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        entries = []
    for entry in entries:
        parsed = parse_folder_name(entry.name)
        if parsed is None or not entry.is_dir(follow_symlinks=False):
            continue
        if repo_ids is not None and parsed[0] not in repo_ids:
            continue
        repos.append(scan_repo(Path(entry.path), parsed[0], parsed[1]))
    seen: dict[tuple[int, int], int] = {}
    for repo in repos:
        seen.update(repo.inodes)
    repos.sort(key=lambda r: (r.repo_type, r.repo_id.lower()))
    return CacheInfo(cache_dir=str(root), repos=tuple(repos), size_on_disk=sum(seen.values()))


def _scandir(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def scan_repo(folder: Path, repo_id: str, repo_type: str) -> RepoInfo:
    """Scan one repo folder (metadata only)."""
    problems: list[str] = []
    blobs_dir = folder / "blobs"
    blob_stats: dict[str, os.stat_result] = {}
    incomplete = []
    inodes: dict[tuple[int, int], int] = {}
    for e in _scandir(blobs_dir):
        st = e.stat(follow_symlinks=False)
        if e.name.endswith(".incomplete"):
            incomplete.append(e.name)
            inodes[(st.st_dev, st.st_ino)] = st.st_size
        elif stat.S_ISREG(st.st_mode):
            blob_stats[e.name] = st
            inodes[(st.st_dev, st.st_ino)] = st.st_size
        elif stat.S_ISLNK(st.st_mode):
            problems.append(f"blobs/{e.name}: a symlink, not a file")
        else:
            problems.append(f"blobs/{e.name}: not a regular file")
    incomplete.sort()
    if incomplete:
        problems.append(f"{len(incomplete)} leftover .incomplete file(s)")

    refs = _read_refs(folder / "refs")
    snapshots = {e.name: e for e in _scandir(folder / "snapshots") if e.is_dir(follow_symlinks=False)}
    for name, value in sorted(refs.items()):
        if not _COMMIT_RE.fullmatch(value.encode("utf-8", "replace")):
            problems.append(f"refs/{name}: malformed ({value!r}, expected 40 hex characters)")
        elif value not in snapshots:
            problems.append(f"refs/{name}: points to missing snapshot {value[:12]}")

    revisions = []
    for commit, entry in sorted(snapshots.items()):
        revisions.append(_scan_revision(folder, commit, Path(entry.path), refs, blob_stats, inodes))
        problems.extend(f"{commit[:12]}: {p}" for p in revisions[-1].problems)
    return RepoInfo(
        repo_id=repo_id,
        repo_type=repo_type,
        folder=folder.name,
        refs=refs,
        revisions=tuple(revisions),
        size_on_disk=sum(inodes.values()),
        blob_count=len(blob_stats),
        incomplete=tuple(incomplete),
        last_used=max((r.last_used for r in revisions), default=0.0),
        problems=tuple(problems),
        inodes=inodes,
    )


def _read_refs(refs_dir: Path) -> dict[str, str]:
    refs = {}
    for dirpath, _dirs, names in os.walk(refs_dir):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                with open(path, "rb") as f:
                    data = f.read(256)
            except OSError:
                continue
            refs[os.path.relpath(path, refs_dir).replace(os.sep, "/")] = data.decode("utf-8", "replace")
    return refs


def _scan_revision(folder: Path, commit: str, snapshot: Path, refs: dict[str, str],
                   blob_stats: dict[str, os.stat_result], inodes: dict[tuple[int, int], int]) -> RevisionInfo:
    files = []
    problems = []
    used: dict[tuple[int, int], int] = {}
    last_used = snapshot.lstat().st_mtime
    blobs_dir = os.path.join(folder, "blobs")
    for dirpath, dirs, names in os.walk(snapshot):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, snapshot).replace(os.sep, "/")
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                resolved = os.path.normpath(os.path.join(dirpath, target))
                if os.path.isabs(target):
                    form, etag = "absolute", None
                elif os.path.dirname(resolved) != blobs_dir:
                    form, etag = "outside", None
                else:
                    etag = os.path.basename(resolved)
                    form = "link" if etag in blob_stats else "broken"
                if form == "link":
                    bst = blob_stats[etag]
                    inode, size = (bst.st_dev, bst.st_ino), bst.st_size
                    last_used = max(last_used, bst.st_atime)
                else:
                    inode, size = None, 0
                    problems.append(f"{rel}: " + {"broken": "broken link (missing blob)",
                                                  "absolute": f"absolute link ({target})",
                                                  "outside": f"link points outside the repo's blobs ({target})"}[form])
            elif stat.S_ISREG(st.st_mode):
                form, etag, inode, size = "file", None, (st.st_dev, st.st_ino), st.st_size
                inodes[inode] = size
                last_used = max(last_used, st.st_atime)
            else:
                continue
            if inode is not None:
                used[inode] = size
            files.append(SnapshotFile(path=rel, etag=etag, size=size, form=form, inode=inode))
    pointing = tuple(sorted(name for name, value in refs.items() if value == commit))
    for name in pointing:
        try:
            last_used = max(last_used, os.lstat(folder / "refs" / name).st_mtime)
        except OSError:
            pass
    return RevisionInfo(commit_hash=commit, refs=pointing, files=tuple(files), size_on_disk=sum(used.values()),
                        last_used=last_used, problems=tuple(problems))
