"""One scanner of a cache's metadata, shared by ``ls`` and the commands that judge a cache (verify, prune).

Metadata only (``scandir``, ``lstat``, ``readlink``, refs of 40 bytes): no hashing, no writes. Unlike
``huggingface_hub.scan_cache_dir``, which drops a repo it considers corrupted into ``warnings``, every repo folder is
returned with its problems listed (library gap: an operator debugging a failed offline load needs the broken repos).
A revision's last use: docs/ls.md, "Last use".
"""

from __future__ import annotations

import contextlib
import gc
import operator
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..bounds import MAX_TREE_DEPTH
from ..names import is_commit, parse_folder_name
from .fsops import open_read_at, scan_tree
from .root import access_error
from .safefs import kind_of, list_modes, repo_layout_problems
from .store_blobs import scan_blobs


class SnapshotFile(NamedTuple):
    """One entry of ``snapshots/<commit>/`` (a NamedTuple: created ~30,000 times for a 10,000-repo cache): its
    ``path`` (str) in the repo, the ``etag`` (str | None) a link into ``blobs/`` names, the content's ``size`` (int:
    bytes, 0 for a broken link), its ``form`` (str: ``link``, ``file`` (a real file), ``broken``, ``absolute``,
    ``outside`` (a relative link leaving ``blobs/``)), its ``inode`` (tuple[int, int] | None) to count it once."""

    path: str
    etag: str | None
    size: int
    form: str
    inode: tuple[int, int] | None


@dataclass(frozen=True)
class RevisionInfo:
    """One snapshot of a repo: ``commit_hash`` (str), the sorted ``refs`` (tuple[str, ...]) pointing to it, its
    ``files`` (tuple[SnapshotFile, ...]) by path, ``size_on_disk`` (int: bytes of its distinct contents),
    ``last_used`` (float: seconds since the epoch, module docstring), ``problems`` (tuple[str, ...]: ``"vocab.txt:
    broken link"``)."""

    commit_hash: str
    refs: tuple[str, ...]
    files: tuple[SnapshotFile, ...]
    size_on_disk: int
    last_used: float
    problems: tuple[str, ...]


#: The health of a repo folder that holds no file in any snapshot (a folder a failed or interrupted warm made).
EMPTY = "empty: no snapshot holds a file (warm it again, or `hfcache prune` removes it)"


@dataclass(frozen=True)
class RepoInfo:
    """One repo folder of a cache.

    Attributes:
        repo_id, repo_type, folder (str): decoded from the folder name (``models--ORG--NAME`` -> ``ORG/NAME``).
        refs (dict[str, str]): ref name -> content (commit, or whatever malformed text it holds).
        revisions (tuple[RevisionInfo, ...]): sorted by commit.
        size_on_disk (int): bytes of the repo's distinct contents (blobs, real snapshot files, ``.incomplete``).
        blob_count (int): regular files and healthy shared-store links in ``blobs/``.
        incomplete (tuple[str, ...]): leftover ``blobs/*.incomplete`` names. last_used (float): its revisions' newest.
        problems (tuple[str, ...]): repo-level and revision-level problems, in a stable order.
        inodes (dict[tuple[int, int], int]): (device, inode) -> size of every distinct content, to total a cache.
        unsafe (tuple[str, ...]): parts that are symlinks or not directories (:data:`.safefs.REPO_PARTS`,
            ``.locks/<folder>``): nothing below the folder was read, and every command leaves the repo alone.
        unreadable (tuple[str, ...]): parts this user cannot list or read (``blobs/``, ``refs/main``), each also a
            problem; commands that change a repo leave such a repo alone.
    """

    repo_id: str
    repo_type: str
    folder: str
    refs: dict[str, str] = field(default_factory=dict)
    revisions: tuple[RevisionInfo, ...] = ()
    size_on_disk: int = 0
    blob_count: int = 0
    incomplete: tuple[str, ...] = ()
    last_used: float = 0.0
    problems: tuple[str, ...] = ()
    inodes: dict[tuple[int, int], int] = field(default_factory=dict)
    unsafe: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()

    @property
    def health(self) -> str:
        """``ok``, the problems joined by ``; ``, or :data:`EMPTY` for a repo no snapshot of which holds a file (never
        ``ok``: nothing there loads; not a problem: other commands leave such a folder to prune)."""
        if self.problems:
            return "; ".join(self.problems)
        return "ok" if any(rev.files for rev in self.revisions) else EMPTY


@dataclass(frozen=True)
class CacheInfo:
    """A whole cache: ``repos`` sorted by (type, id); ``size_on_disk`` counts every distinct content once."""

    cache_dir: str
    repos: tuple[RepoInfo, ...]
    size_on_disk: int


def scan_cache(cache_dir: str | os.PathLike[str], repo_ids: set[str] | None = None) -> CacheInfo:
    """Scan every repo folder of ``cache_dir`` (or those whose id is in ``repo_ids``); empty for a missing cache.
    CacheError (exit 5) when it exists but this user cannot list it."""
    root = Path(cache_dir)
    # The scan allocates ~10 objects per file and frees none: the cyclic collector would run thousands of times for
    # nothing (a third of the wall time on 10,000 repos). Paused for the scan, restored after.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _scan(root, repo_ids)
    finally:
        if enabled:
            gc.enable()


def _scan(root: Path, repo_ids: set[str] | None) -> CacheInfo:
    folders, locks = repo_folders(root, repo_ids)
    repos = [scan_folder(root, folder, locks) for folder in folders]
    seen: dict[tuple[int, int], int] = {}
    for repo in repos:
        seen.update(repo.inodes)
    return CacheInfo(cache_dir=str(root), repos=tuple(repos), size_on_disk=sum(seen.values()))


#: (folder name, repo_id, repo_type, is a real directory) of one repo folder of a cache.
FolderEntry = tuple[str, str, str, bool]


def repo_folders(root: Path, repo_ids: set[str] | None = None) -> tuple[list[FolderEntry], dict[str, int] | None]:
    """The repo folders of the cache at ``root``, sorted by (repo_type, repo_id case-folded), and the listing of its
    ``.locks`` (for :func:`scan_folder`), to scan one at a time (``ls --json``). CacheError as :func:`scan_cache`."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        entries = []
    except PermissionError:
        raise access_error(root) from None
    # .locks is listed once for the whole cache (not looked up per repo: this runs 10,000 times). No .locks at all
    # is fine ({}); one that is a link or a file makes every repo report it (None: each repo checks in full).
    try:
        locks_mode: int | None = os.lstat(root / ".locks").st_mode
    except FileNotFoundError:
        locks_mode = None
    except OSError:
        locks_mode = stat.S_IFLNK
    if locks_mode is None:
        locks: dict[str, int] | None = {}
    else:
        locks = list_modes(str(root / ".locks")) if stat.S_ISDIR(locks_mode) else None
    folders = []
    for entry in entries:
        parsed = parse_folder_name(entry.name)
        if parsed is not None and (repo_ids is None or parsed[0] in repo_ids):
            folders.append((entry.name, parsed[0], parsed[1], entry.is_dir(follow_symlinks=False)))
    folders.sort(key=lambda f: (f[2], f[1].lower()))
    return folders, locks


def scan_folder(root: str | os.PathLike[str], folder: FolderEntry, locks: dict[str, int] | None) -> RepoInfo:
    """Scan one entry of :func:`repo_folders` (metadata only)."""
    name, repo_id, repo_type, is_dir = folder
    if not is_dir:
        # A planted link (or file) named like a repo folder: reported, never followed.
        return _unsafe_repo(name, (repo_id, repo_type), repo_layout_problems(os.fspath(root), name))
    return scan_repo(os.path.join(root, name), repo_id, repo_type, locks)


def _scandir(path: str, denied: list[str] | None = None, rel: str = "") -> list[os.DirEntry]:
    """The entries of ``path``; a folder this user cannot list is added to ``denied`` (as ``rel``) and gives none."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except PermissionError:
        if denied is not None:
            denied.append(rel)
        return []


def _unsafe_repo(name: str, parsed: tuple[str, str], unsafe: list[str]) -> RepoInfo:
    return RepoInfo(parsed[0], parsed[1], name, problems=tuple(unsafe), unsafe=tuple(unsafe))


def scan_repo(folder: str | os.PathLike[str], repo_id: str, repo_type: str,
              locks_entries: dict[str, int] | None = None) -> RepoInfo:
    """Scan one repo folder (``locks_entries`` as :func:`.safefs.repo_layout_problems`'s); one with an unsafe part
    is not read at all. String paths and ``scandir``: this runs 10,000 times for a large cache."""
    base = os.fspath(folder)
    parent, folder_name = os.path.split(base)
    unsafe = repo_layout_problems(parent, folder_name, locks_entries)
    if unsafe:
        return _unsafe_repo(folder_name, (repo_id, repo_type), unsafe)
    if not os.access(base, os.R_OK | os.X_OK):  # the folder itself cannot be listed or entered: nothing is known
        return RepoInfo(repo_id, repo_type, folder_name, problems=(f"{folder_name}/: {_DENIED}",), unreadable=("",))
    problems: list[str] = []
    denied: list[str] = []
    blob_stats, incomplete, inodes = scan_blobs(base, _scandir(base + "/blobs", denied, "blobs/"), denied, problems)

    linked: list[str] = []  # planted links below the parts: the repo is unsafe, as for a symlinked part
    refs = _read_refs(base + "/refs", denied, linked)
    snapshots = _snapshot_folders(base, denied, linked)
    if linked:
        # Not read further: every command leaves an unsafe repo alone (check fails it, export refuses it, prune
        # skips it, verify reports unsafe_layout), so nothing outside the cache is ever read through these links.
        return _unsafe_repo(folder_name, (repo_id, repo_type), sorted(linked))
    for name, value in sorted(refs.items()):
        if not is_commit(value):
            problems.append(f"refs/{name}: malformed ({value!r}, expected 40 hex characters)")
        elif value not in snapshots:
            problems.append(f"refs/{name}: points to missing snapshot {value[:12]}")

    revisions = []
    for commit, path in sorted(snapshots.items()):
        revisions.append(_scan_revision(base, commit, path, refs, blob_stats, inodes, denied))
        problems.extend(f"{commit[:12]}: {p}" for p in revisions[-1].problems)
    if denied:
        # What this user sees of the repo is partial (links into an unreadable blobs/ look broken): only the parts
        # it cannot read are reported, and commands that change a repo leave it alone.
        problems = [f"{part or folder_name + '/'}: {_DENIED}" for part in sorted(set(denied))]
    return RepoInfo(repo_id, repo_type, folder_name, refs=refs, revisions=tuple(revisions),
                    size_on_disk=sum(inodes.values()), blob_count=len(blob_stats), incomplete=tuple(incomplete),
                    last_used=max((r.last_used for r in revisions), default=0.0), problems=tuple(problems),
                    inodes=inodes, unreadable=tuple(sorted(set(denied))))


def _snapshot_folders(base: str, denied: list[str], linked: list[str]) -> dict[str, str]:
    """commit -> path of each snapshot folder; a link or file where a snapshot or ``.no_exist`` folder belongs is
    appended to ``linked`` (never followed)."""
    snapshots = {}
    for part in ("snapshots", ".no_exist"):
        for e in _scandir(f"{base}/{part}", denied, f"{part}/"):
            if not e.is_dir(follow_symlinks=False):
                linked.append(f"{part}/{e.name}: {kind_of(stat.S_IFLNK if e.is_symlink() else 0)} (left alone)")
            elif part == "snapshots":
                snapshots[e.name] = e.path
    return snapshots


def _on_error(denied: list[str], where: str, other: list[str] | None = None):
    """A :func:`.fsops.scan_tree` ``onerror``: a folder this user cannot list goes to ``denied`` (``where`` + its
    relative path), a vanished one is skipped, any other error to ``other`` (raised when ``other`` is None)."""
    def failed(exc: OSError, rel: str) -> None:
        if isinstance(exc, PermissionError):
            denied.append(where + rel)
        elif not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            if other is None:
                raise exc
            other.append(f"{rel} ({exc.strerror})")
    return failed


def _read_refs(refs_dir: str, denied: list[str], linked: list[str]) -> dict[str, str]:
    """ref name (``main``, ``pr/1``) -> its content, decoded. A ref or ref folder that is a symlink, or a ref folder
    deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH`, is added to ``linked`` and never followed."""
    refs = {}
    deep: list[str] = []
    for _, rel, _, others in scan_tree(refs_dir, too_deep=deep, onerror=_on_error(denied, "refs/")):
        for e in others:
            if e.is_symlink():
                linked.append(f"refs/{rel}{e.name}: a symlink (left alone)")
                continue
            try:
                # O_NOFOLLOW: a ref that is a planted link reads as unreadable (reported malformed), never its target.
                fd = open_read_at(None, e.path)
            except PermissionError:
                denied.append(f"refs/{rel}{e.name}")
                continue
            except OSError:
                refs[rel + e.name] = "<a symlink or unreadable>"
                continue
            try:  # os.read on the fd: no file object per ref (10,000 of them on a large cache)
                data = os.read(fd, 256) if stat.S_ISREG(os.fstat(fd).st_mode) else b"<not a regular file>"
            finally:
                os.close(fd)
            refs[rel + e.name] = data.decode("utf-8", "replace")
    linked += [f"refs/{rel}: {TOO_DEEP}" for rel in deep]
    return refs


def _shortened(rel: str) -> str:
    """A deep relative path as people read it: its first three parts, ``…``, and its depth."""
    parts = rel.split("/")
    return rel if len(parts) <= 4 else "/".join(parts[:3]) + f"/… ({len(parts)} levels)"


_DENIED = ("cannot be read by this user (permission denied): ask the cache's owner to make it group-readable "
           "(`hfcache doctor` prints the fix)")
_PROBLEM_TEXT = {"broken": "broken link (missing blob)", "absolute": "absolute link ({})",
                 "outside": "link points outside the repo's blobs ({})"}
_first = operator.itemgetter(0)
_BLOB_PREFIX = ["../" * (depth + 2) + "blobs/" for depth in range(MAX_TREE_DEPTH + 1)]  # a file's, by its depth


#: Problem text of a snapshot entry that is a FIFO, device or socket.
SPECIAL_FILE = "not a regular file (a FIFO, device or socket)"
#: Problem text of a snapshot folder nested deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH` (not read below).
TOO_DEEP = f"folder chain deeper than {MAX_TREE_DEPTH} levels (not read below; left alone)"
_HAZARDS = ("absolute link", "link points outside", SPECIAL_FILE, TOO_DEEP)


def load_hazards(repo: RepoInfo, commit_hash: str) -> list[str]:
    """What would make a load (``check``) or copy (``export``) of ``commit_hash`` read outside the repo folder or
    block: the repo's ``unsafe`` parts, or that snapshot's absolute links, links leaving ``blobs``, FIFOs, devices."""
    if repo.unsafe:
        return list(repo.unsafe)
    rev = next((r for r in repo.revisions if r.commit_hash == commit_hash), None)
    if rev is None:
        return []
    return [f"snapshots/{commit_hash[:12]}/{p}" for p in rev.problems if any(h in p for h in _HAZARDS)]


def _classify_link(target: str, rel: str, base: str, entry_path: str, blob_stats) -> tuple[str, str | None]:
    """(form, etag) of a snapshot symlink that is not in huggingface_hub's own ``../../blobs/<etag>`` shape."""
    if target.startswith("/"):
        return "absolute", None
    resolved = os.path.normpath(os.path.join(os.path.dirname(entry_path), target))
    if os.path.dirname(resolved) != base + "/blobs":
        return "outside", None
    etag = os.path.basename(resolved)
    return ("link" if etag in blob_stats else "broken"), etag


def _scan_revision(base: str, commit: str, snapshot: str, refs: dict[str, str],
                   blob_stats: dict[str, os.stat_result], inodes: dict[tuple[int, int], int],
                   denied: list[str]) -> RevisionInfo:
    files = []
    problems = []
    used: dict[tuple[int, int], int] = {}
    try:
        last_used = os.lstat(snapshot).st_mtime
    except OSError:  # moved away by a concurrent prune since the listing (or snapshots/ cannot be searched)
        last_used = 0.0
    entries: list[tuple[str, os.DirEntry]] = []
    too_deep: list[str] = []
    for _, rel, _, others in scan_tree(snapshot, too_deep=too_deep,
                                       onerror=_on_error(denied, f"snapshots/{commit}/", too_deep)):
        entries += [(rel + e.name, e) for e in others]
    problems.extend(f"{_shortened(rel)}: {TOO_DEEP}" for rel in sorted(set(too_deep)))
    entries.sort(key=_first)
    readlink = os.readlink
    for rel, entry in entries:
        if entry.is_symlink():
            try:
                target = readlink(entry.path)
            except OSError:  # removed since the listing (a concurrent prune), or swapped for a file (EINVAL)
                continue
            prefix = _BLOB_PREFIX[rel.count("/")]  # scan_tree enters no folder deeper than MAX_TREE_DEPTH
            etag = target[len(prefix):]
            if target.startswith(prefix) and etag in blob_stats and "/" not in etag:
                form = "link"  # the fast path: huggingface_hub's own link shape, to a blob that exists
            else:
                form, etag = _classify_link(target, rel, base, entry.path, blob_stats)
            if form == "link":
                bst = blob_stats[etag]
                inode, size = (bst.st_dev, bst.st_ino), bst.st_size
                if bst.st_atime > last_used:
                    last_used = bst.st_atime
            else:
                inode, size = None, 0
                problems.append(f"{rel}: " + _PROBLEM_TEXT[form].format(target))
        elif entry.is_file(follow_symlinks=False):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except PermissionError:
                denied.append(f"snapshots/{commit}/{rel}")
                continue
            form, etag, inode, size = "file", None, (st.st_dev, st.st_ino), st.st_size
            inodes[inode] = size
            if st.st_atime > last_used:
                last_used = st.st_atime
        else:  # a FIFO, device or socket: a load would block on it or read forever
            problems.append(f"{rel}: {SPECIAL_FILE}")
            continue
        if inode is not None:
            used[inode] = size
        files.append(SnapshotFile(rel, etag, size, form, inode))
    pointing, last_used = _refs_to(base, refs, commit, last_used)
    return RevisionInfo(commit_hash=commit, refs=pointing, files=tuple(files), size_on_disk=sum(used.values()),
                        last_used=last_used, problems=tuple(problems))


def _refs_to(base: str, refs: dict[str, str], commit: str, last_used: float) -> tuple[tuple[str, ...], float]:
    """The sorted ref names pointing to ``commit``, and ``last_used`` raised to the newest of their mtimes."""
    pointing = tuple(sorted(name for name, value in refs.items() if value == commit))
    for name in pointing:
        with contextlib.suppress(OSError):
            last_used = max(last_used, os.lstat(f"{base}/refs/{name}").st_mtime)
    return pointing, last_used
