"""export: a subset of a cache as a reproducible tar (here) or a new cache folder (:mod:`.export_dir`), each distinct
content once, every blob hashed while copied (:mod:`.export_store`). Format, refusals, threat model: docs/transfer.md.
"""

from __future__ import annotations

import dataclasses
import io
import os
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..bounds import MAX_TREE_DEPTH
from ..cache import safefs, safefs_tree
from ..cache.content import DigestWriter
from ..cache.published import MAX_RECORD_BYTES, read_record, record_parts
from ..cache.root import CACHEDIR_TAG
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, load_hazards, scan_cache
from ..errors import CacheError, UsageError
from ..records import folder_ids
from ..warming.lockfile import Lockfile
from .export_store import entry_reader, with_store_blobs

_CHUNK = 1024 * 1024


@dataclass(frozen=True, order=True)
class Entry:
    """One entry of an export: ``name`` relative to the cache root, ``/``-separated; ``kind``: ``dir``, ``file``
    (``size`` bytes of the absolute path ``source``, hashed against ``etag`` for a blob), ``symlink`` (to ``target``),
    ``hardlink`` (to the earlier entry ``target``), ``data`` (``target`` is the content), ``empty`` (a marker)."""

    name: str
    kind: str
    target: str = ""
    source: str = ""
    etag: str = ""
    size: int = 0


@dataclass(frozen=True)
class ExportPlan:
    """What an export writes: ``entries`` sorted by name (folders before their content), the repo folders
    exported, and ``unique_bytes`` of distinct content (what the export adds on disk or in a layer)."""

    entries: tuple[Entry, ...]
    repos: tuple[str, ...]
    unique_bytes: int


def plan_export(cache_dir: str | os.PathLike[str], specs: Iterable[str] = (), lock: Lockfile | None = None,
                materialize: bool = False) -> ExportPlan:
    """Plan an export of ``cache_dir``: the repos ``specs`` (``REPO_ID[@REVISION]``, every revision without ``@``)
    and ``lock`` name at their commits (requested and canonical folder), else the whole cache; ``materialize``: real
    files in ``snapshots/`` instead of symlinks. Raises UsageError: a named repo or revision is not in the cache;
    CacheError: a repo has a planted link, cannot be read, or a snapshot is broken or lost a recorded file."""
    selection = _selection(specs, lock)
    info = _scan_selected(cache_dir, selection)
    entries: list[Entry] = [Entry("CACHEDIR.TAG", "data", target=CACHEDIR_TAG)]
    first_of_content: dict[str, str] = {}  # etag -> entry name holding it
    if unsafe := [f"{r.folder}: {'; '.join(r.unsafe)}" for r in info.repos if r.unsafe]:  # never read through a planted link, never ship a repo without saying so
        raise CacheError(f"unsafe cache layout, nothing exported: {unsafe[0]}" + _more(unsafe),
                         hint="remove the symlink or file (or pass only other repos), then rerun")
    unique = sum(_plan_repo(info.cache_dir, repo, _selected_revisions(repo, selection), materialize, entries,
                            first_of_content) for repo in info.repos)
    return ExportPlan(entries=_in_link_order(entries), repos=tuple(r.folder for r in info.repos), unique_bytes=unique)


def _in_link_order(entries: list[Entry]) -> tuple[Entry, ...]:
    """``entries`` sorted by name, each shared content a ``file`` at its first entry in that order and a hardlink to
    it at every later one: a tar reader and ``os.link`` need a hardlink's target written before it, and the repo
    that first held a blob in scan order (by id) need not come first by folder name (``distilbert-base-uncased``
    and ``distilbert/distilbert-base-uncased``). The first is always a blob: a folder's ``blobs/`` sorts before its
    ``snapshots/``."""
    entries.sort(key=lambda e: e.name)
    planned = {e.name: e for e in entries if e.kind == "file"}
    shared = {e.target for e in entries if e.kind == "hardlink"}
    first: dict[str, str] = {}  # the planned holder's name -> the first entry holding that content
    out = []
    for e in entries:
        held = e.target if e.kind == "hardlink" else e.name
        if e.kind not in ("file", "hardlink") or held not in shared:
            out.append(e)
        elif held in first:
            out.append(Entry(e.name, "hardlink", target=first[held]))
        else:
            first[held] = e.name
            out.append(dataclasses.replace(planned[held], name=e.name))
    return tuple(out)


def _more(items: list) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _selection(specs: Iterable[str], lock: Lockfile | None) -> dict[tuple[str, str], set[str] | None]:
    """(repo id, repo type) -> the revisions ``specs`` and ``lock`` name (None: every revision of the repo)."""
    selection: dict[tuple[str, str], set[str] | None] = {}
    for spec in specs:
        repo_id, _, revision = spec.partition("@")
        current = selection.setdefault((repo_id, "model"), set())
        if not revision:
            selection[(repo_id, "model")] = None
        elif current is not None:  # a bare id named before: every revision already
            current.add(revision)
    for locked in lock.repos if lock else ():
        for repo_id in folder_ids(locked.request.repo_id, locked.canonical_id):
            if (current := selection.setdefault((repo_id, locked.request.repo_type), set())) is not None:
                current.add(locked.commit_hash)
    return selection


def _scan_selected(cache_dir: str | os.PathLike[str], selection: dict[tuple[str, str], set[str] | None]):
    """The scan of the selected repos (all when none); a spec is re-keyed to the type the cache holds its id as."""
    info = scan_cache(cache_dir, {r for r, _ in selection} if selection else None)
    found = {(r.repo_id, r.repo_type) for r in info.repos}
    for repo_id, _ in [key for key in selection if key[1] == "model" and key not in found]:
        if (other := next((t for r, t in sorted(found) if r == repo_id and (r, t) not in selection), None)) is not None:
            selection[(repo_id, other)] = selection.pop((repo_id, "model"))
    if missing := sorted(f"{r}" for r, t in selection if (r, t) not in found):
        raise UsageError(f"not in the cache: {', '.join(missing)}", hint="check the repo ids (hfcache ls)")
    return info


def _selected_revisions(repo: RepoInfo, selection: dict[tuple[str, str], set[str] | None]) -> list:
    """The revisions of ``repo`` to export (UsageError: a named one is not cached; CacheError: unreadable)."""
    wanted = selection.get((repo.repo_id, repo.repo_type)) if selection else None
    revisions = list(repo.revisions)
    if wanted is not None:
        commits = {repo.refs.get(w, "").strip() for w in wanted} | wanted
        revisions = [r for r in revisions if r.commit_hash in commits]
        if not revisions:
            raise UsageError(f"{repo.repo_id}: revision(s) {', '.join(sorted(wanted))} not in the cache",
                             hint="`hfcache ls` lists the cached revisions; warm the one you need first")
    if repo.unreadable:
        raise CacheError(f"{repo.repo_id}: {repo.folder}/{repo.unreadable[0]} cannot be read by this user "
                         "(permission denied)", hint="ask the cache's owner to make it group-readable "
                         "(`hfcache doctor` prints the fix), or export other repos")
    return revisions


def _plan_repo(cache_dir: str, repo: RepoInfo, revisions: list, materialize: bool, entries: list[Entry],
               first_of_content: dict[str, str]) -> int:
    """Append the entries of ``repo`` at ``revisions``; returns the bytes of new distinct content."""
    folder = repo.folder
    root = Path(cache_dir) / folder
    dirs = {folder, f"{folder}/blobs", f"{folder}/snapshots"}
    records = {rev.commit_hash: _checked_record(cache_dir, repo, rev) for rev in revisions}
    revisions = [with_store_blobs(cache_dir, folder, rev) for rev in revisions]
    unique = _plan_blobs(repo, revisions, root, entries, first_of_content)
    for rev in revisions:
        unique += _plan_revision(folder, root, rev, materialize, entries, first_of_content, dirs)
    for commit, record in sorted(records.items()):
        if record is not None:
            dirs.update({".locks", f".locks/{folder}", f".locks/{folder}/hfcache"})
            entries.append(Entry("/".join(record_parts(folder, commit)), "data", target=record))
    commits = {r.commit_hash for r in revisions}
    for ref, value in sorted(repo.refs.items()):
        if value in commits:
            name = f"{folder}/refs/{ref}"
            dirs.update(_parents(name, stop=folder))
            entries.append(Entry(name, "data", target=value))
    entries.extend(Entry(d, "dir") for d in dirs)
    return unique


def _plan_blobs(repo: RepoInfo, revisions: list, root: Path, entries: list[Entry],
                first_of_content: dict[str, str]) -> int:
    """Append the blobs ``revisions`` link to (seen before: a hardlink); returns the new distinct bytes."""
    blobs: dict[str, int] = {}
    for rev in revisions:
        for f in rev.files:
            if f.form not in ("link", "file"):
                raise CacheError(f"{repo.repo_id}: snapshot {rev.commit_hash[:12]} has a broken entry {f.path} "
                                 f"({f.form})", hint="run `hfcache verify --repair` first")
            if f.form == "link":
                blobs[f.etag] = f.size
    unique = 0
    for etag, size in sorted(blobs.items()):
        name = f"{repo.folder}/blobs/{etag}"
        if etag in first_of_content:
            entries.append(Entry(name, "hardlink", target=first_of_content[etag]))
        else:
            first_of_content[etag] = name
            unique += size
            entries.append(Entry(name, "file", source=str(root / "blobs" / etag), etag=etag, size=size))
    return unique


def _plan_revision(folder: str, root: Path, rev, materialize: bool, entries: list[Entry],
                   first_of_content: dict[str, str], dirs: set[str]) -> int:
    """Append the snapshot entries, markers and ``trees/`` listing of ``rev``; returns the new distinct bytes."""
    unique = 0
    base = f"{folder}/snapshots/{rev.commit_hash}"
    for f in rev.files:
        name = f"{base}/{f.path}"
        dirs.update(_parents(name, stop=folder))
        if f.form == "link" and not materialize:
            entries.append(Entry(name, "symlink", target="../" * (f.path.count("/") + 2) + f"blobs/{f.etag}"))
        elif f.form == "link":
            entries.append(Entry(name, "hardlink", target=first_of_content[f.etag]))
        else:  # a real file (a cache written without symlinks): exported as is, verified by verify
            unique += f.size
            entries.append(Entry(name, "file", source=str(root / "snapshots" / rev.commit_hash / f.path),
                                 size=f.size))
    for marker in _markers(root.parent, folder, rev.commit_hash):
        name = f"{folder}/.no_exist/{rev.commit_hash}/{marker}"
        dirs.update(_parents(name, stop=folder))
        entries.append(Entry(name, "empty"))
    tree = f"{rev.commit_hash}.json"
    if (size := _regular_size(root.parent, (folder, "trees", tree))) is not None:
        dirs.add(f"{folder}/trees")
        unique += size
        entries.append(Entry(f"{folder}/trees/{tree}", "file", source=str(root / "trees" / tree), size=size))
    return unique


def _regular_size(cache_dir: Path, rel: tuple[str, ...]) -> int | None:
    """The size of the regular file ``cache_dir/rel`` (no link followed on the way), else None."""
    try:
        with safefs.dir_fd(cache_dir, rel[:-1]) as fd:
            st = os.stat(rel[-1], dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _checked_record(cache_dir: str, repo: RepoInfo, rev) -> str | None:
    """warm's record of ``rev`` (text) or None; CacheError: a load hazard, a recorded file lost."""
    if hazards := [h for h in load_hazards(repo, rev.commit_hash) if h.endswith(SPECIAL_FILE) or TOO_DEEP in h]:
        raise CacheError(f"{repo.repo_id}: unsafe cache layout, nothing exported: {repo.folder}/{hazards[0]}",
                         hint="remove it, then `hfcache verify --repair` (or re-warm) and rerun")
    if (record := read_record(cache_dir, repo.folder, rev.commit_hash)) is None:
        return None
    present = {f.path for f in rev.files}
    marked = set(_markers(Path(cache_dir), repo.folder, rev.commit_hash))
    if lost := sorted(p for p in record.files if p not in present) + sorted(
            a for a in record.absent if a not in present and a not in marked):
        raise CacheError(f"{repo.repo_id}: snapshot {rev.commit_hash[:12]} lost {lost[0]}" + _more(lost)
                         + " (in warm's record, not in the cache): nothing exported",
                         hint="run `hfcache verify --repair` (or re-warm the repo) first")
    return safefs.read_small(cache_dir, record_parts(repo.folder, rev.commit_hash), MAX_RECORD_BYTES + 1).decode()


def _parents(name: str, stop: str) -> set[str]:
    parts = name.split("/")
    return {"/".join(parts[:i]) for i in range(1, len(parts)) if len("/".join(parts[:i])) >= len(stop)}


def _markers(cache_dir: Path, folder: str, commit: str) -> list[str]:
    """The regular files below ``<folder>/.no_exist/<commit>``, sorted (CacheError: nested too deep)."""
    out = []
    try:
        for found in safefs_tree.walk(cache_dir, (folder, ".no_exist", commit), max_depth=MAX_TREE_DEPTH):
            prefix = "/".join(found.parts[3:])
            out += [f"{prefix}/{n}" if prefix else n for n, st in found.entries if stat.S_ISREG(st.st_mode)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except safefs_tree.TooDeep:
        raise CacheError(f"{folder}: unsafe cache layout, nothing exported: .no_exist/{commit[:12]} holds folders "
                         f"nested deeper than {MAX_TREE_DEPTH} levels", hint="remove them, then rerun") from None
    return sorted(out)


def modes(group_writable: bool) -> tuple[int, int]:
    """(folder mode, file mode) of an export."""
    return (0o775, 0o664) if group_writable else (0o755, 0o644)


def write_tar(plan: ExportPlan, out: BinaryIO, chown: tuple[int, int] = (0, 0), group_writable: bool = False,
              prefix: str = "") -> str:
    """Write the plan as a reproducible tar to ``out`` (every entry owned by ``chown``, under ``prefix``: ``push
    --prefix``); return the sha256 (hex) of the bytes written. Raises CacheError: a blob does not match its name; a
    source file changed or is no longer a regular file."""
    dir_mode, file_mode = modes(group_writable)
    sink = DigestWriter(out)
    under = (lambda name: f"{prefix}/{name}") if prefix else (lambda name: name)

    def info_of(name: str, kind: bytes = tarfile.REGTYPE, mode: int = file_mode, linkname: str = "",
                size: int = 0) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.linkname, info.size, info.mtime = kind, mode, linkname, size, 0
        info.uid, info.gid = chown
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        parts = prefix.split("/") if prefix else []
        for i in range(1, len(parts) + 1):
            tar.addfile(info_of("/".join(parts[:i]), tarfile.DIRTYPE, dir_mode))
        for e in plan.entries:
            name = under(e.name)
            if e.kind == "dir":
                tar.addfile(info_of(name, tarfile.DIRTYPE, dir_mode))
            elif e.kind == "symlink":
                tar.addfile(info_of(name, tarfile.SYMTYPE, 0o777, e.target))
            elif e.kind == "hardlink":
                tar.addfile(info_of(name, tarfile.LNKTYPE, linkname=under(e.target)))
            elif e.kind in ("empty", "data"):
                data = e.target.encode()
                tar.addfile(info_of(name, size=len(data)), io.BytesIO(data))
            else:
                with entry_reader(e) as reader:
                    tar.addfile(info_of(name, size=e.size), reader)
                    reader.read()  # reach the end: a blob's hash, another file's size is checked there
    out.flush()
    return sink.sha256.hexdigest()
