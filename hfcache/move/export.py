"""export: a subset of a cache into a new cache directory or a reproducible tar, relocatable anywhere.

The plan is computed first (sorted entries, each distinct content once), then written as a directory or a tar.
Library gap: huggingface_hub has no export; copying a cache by hand breaks on symlinks, duplicates shared bytes and
gives a new layer digest on every build.

- Links stay relative (``../../blobs/<etag>``), so the result can be moved anywhere; ``materialize`` writes real
  files in ``snapshots/`` instead (hardlinks of the blobs: no symlink at all, same bytes once), which
  huggingface_hub reads as its no-symlink form.
- Each distinct blob is stored once: a blob that recurs in several repos (the bert ``vocab.txt``) becomes a
  hardlink, on disk and as a hardlink entry in a tar.
- The tar is byte-identical for the same content, whatever the machine, time or order on disk: sorted entries,
  mtime 0, uid/gid 0 (or ``chown``), no user or group names, modes 0644/0755 (0664/0775 with ``group_writable``).
- Every blob is hashed while it is copied and compared with its name: a corrupt cache is never shipped.
- No ``.incomplete``, no lock files, nothing but the HF layout (tokens never live in a cache), plus warm's record of
  each exported revision (``.locks/<folder>/hfcache/<commit>.json``, :mod:`hfcache.cache.published`; huggingface_hub never
  reads ``.locks``), so ``verify`` on the export still knows which files the revision must hold.
- A revision that does not match its record (a file lost: neither in the snapshot nor marked absent), or whose
  snapshot holds a FIFO, device or a link leaving the repo (:func:`hfcache.cache.scan.load_hazards`), is refused (exit 5):
  an export never launders a broken revision into one that verifies.
- The source may be a group-shared cache whose members swap folders while root exports it: blobs are opened with
  ``safefs.open_blob``, every other file and the ``.no_exist`` markers through folders opened from the cache root
  without following links (:mod:`hfcache.cache.safefs_tree`; iterative walks, at most
  :data:`hfcache.bounds.MAX_TREE_DEPTH` levels: deeper is exit 5 naming the repo), and each file is read at
  exactly its planned size. A DEST inside the source cache is refused by the command (:mod:`hfcache.move.destination`);
  the directory form is written by :mod:`hfcache.move.export_dir`.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..bounds import MAX_TREE_DEPTH
from ..cache import safefs
from ..cache.root import CACHEDIR_TAG
from ..cache import safefs_tree
from .export_store import HashingReader as _HashingReader, SizedReader as _SizedReader
from .export_store import open_plain_source as _open_source
from .export_store import with_store_blobs as _with_store_blobs
from ..errors import CacheError, UsageError
from ..warming.lockfile import Lockfile
from ..records import folder_ids
from ..cache.published import MAX_RECORD_BYTES, read_record, record_parts
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, load_hazards, scan_cache

_CHUNK = 1024 * 1024


@dataclass(frozen=True, order=True)
class Entry:
    """One entry of an export, relative to the cache root (``/``-separated).

    Attributes:
        name (str): path in the exported cache, e.g. ``models--gpt2/blobs/<etag>``.
        kind (str): ``dir``, ``file`` (content from ``source``), ``symlink`` (to ``target``), ``hardlink`` (same
            content as the earlier entry ``target``), ``data`` (content is ``target``: a ref, ``CACHEDIR.TAG``) or
            ``empty`` (an empty file: a ``.no_exist`` marker).
        target (str): link target (``symlink``), the entry it repeats (``hardlink``) or the content (``data``).
        source (str): absolute path of the content to copy (``file``); else ``""``.
        etag (str): the blob name whose hash the content must have (``file`` entries of blobs); else ``""``.
        size (int): bytes of content (``file``), 0 otherwise.
    """

    name: str
    kind: str
    target: str = ""
    source: str = ""
    etag: str = ""
    size: int = 0


@dataclass(frozen=True)
class ExportPlan:
    """What an export writes.

    Attributes:
        entries (tuple[Entry, ...]): sorted by name (directories before their contents).
        repos (tuple[str, ...]): repo folder names exported.
        unique_bytes (int): bytes of distinct content (what the export adds on disk or in a layer).
    """

    entries: tuple[Entry, ...]
    repos: tuple[str, ...]
    unique_bytes: int



def _revisions_for(repo: RepoInfo, wanted: set[str] | None) -> list:
    """The repo's revisions selected by ``wanted`` (commits and ref names; None = all)."""
    if wanted is None:
        return list(repo.revisions)
    commits = {repo.refs.get(w, "").strip() for w in wanted} | wanted
    return [r for r in repo.revisions if r.commit_hash in commits]


def plan_export(
    cache_dir: str | os.PathLike[str],
    specs: Iterable[str] = (),
    lock: Lockfile | None = None,
    materialize: bool = False,
) -> ExportPlan:
    """Plan an export of ``cache_dir``.

    Args:
        cache_dir: the source cache.
        specs: ``REPO_ID[@REVISION]`` to export (every revision of the repo without ``@``); empty with no lock:
            the whole cache.
        lock: export exactly the locked repos at their commits (both the requested and the canonical folder).
        materialize: real files in ``snapshots/`` instead of symlinks.

    Returns:
        ExportPlan.

    Raises:
        UsageError: a named repo or revision is not in the cache.
        CacheError: a snapshot is broken (a link to a missing blob, or pointing outside the repo).
    """
    selection = _selection(specs, lock)
    info = _scan_selected(cache_dir, selection)
    entries: list[Entry] = [Entry("CACHEDIR.TAG", "data", target=CACHEDIR_TAG)]
    first_of_content: dict[str, str] = {}  # etag -> entry name holding it
    unique = 0
    repos = []
    unsafe = [f"{r.folder}: {'; '.join(r.unsafe)}" for r in info.repos if r.unsafe]
    if unsafe:  # never read through a planted link, never ship a repo without saying so
        raise CacheError(f"unsafe cache layout, nothing exported: {unsafe[0]}"
                         + (f" (and {len(unsafe) - 1} more)" if len(unsafe) > 1 else ""),
                         hint="remove the symlink or file (or pass only other repos), then rerun")
    for repo in info.repos:
        revisions = _selected_revisions(repo, selection)
        repos.append(repo.folder)
        unique += _plan_repo(info.cache_dir, repo, revisions, materialize, entries, first_of_content)
    entries.sort(key=lambda e: e.name)
    return ExportPlan(entries=tuple(entries), repos=tuple(repos), unique_bytes=unique)


def _selection(specs: Iterable[str], lock: Lockfile | None) -> dict[tuple[str, str], set[str] | None]:
    """(repo id, repo type) -> the revisions ``specs`` and ``lock`` name (None: every revision of the repo)."""
    selection: dict[tuple[str, str], set[str] | None] = {}
    for spec in specs:
        repo_id, _, revision = spec.partition("@")
        selection.setdefault((repo_id, "model"), set())
        if revision:
            selection[(repo_id, "model")].add(revision)  # type: ignore[union-attr]
        else:
            selection[(repo_id, "model")] = None
    for locked in lock.repos if lock else ():
        for repo_id in folder_ids(locked.request.repo_id, locked.canonical_id):
            current = selection.setdefault((repo_id, locked.request.repo_type), set())
            if current is not None:
                current.add(locked.commit_hash)
    return selection


def _scan_selected(cache_dir: str | os.PathLike[str], selection: dict[tuple[str, str], set[str] | None]):
    """The scan of the selected repos (the whole cache when nothing is selected). A spec's entry (keyed as a model)
    whose id the cache holds only as another type (``kernels--``, ``datasets--``) is re-keyed to it in ``selection``.

    Raises:
        UsageError: a selected repo is not in the cache.
    """
    info = scan_cache(cache_dir, {r for r, _ in selection} if selection else None)
    found = {(r.repo_id, r.repo_type) for r in info.repos}
    for repo_id, _ in [key for key in selection if key[1] == "model" and key not in found]:
        # A REPO_ID spec names the repo whatever its type (a kernels--/datasets-- folder): its revisions go with it.
        other = next((t for r, t in sorted(found) if r == repo_id and (r, t) not in selection), None)
        if other is not None:
            selection[(repo_id, other)] = selection.pop((repo_id, "model"))
    missing = sorted(f"{r}" for r, t in selection if (r, t) not in found)
    if missing:
        raise UsageError(f"not in the cache: {', '.join(missing)}", hint="check the repo ids (hfcache ls)")
    return info


def _selected_revisions(repo: RepoInfo, selection: dict[tuple[str, str], set[str] | None]) -> list:
    """The revisions of ``repo`` to export.

    Raises:
        UsageError: a named revision is not in the cache. CacheError: part of the repo cannot be read.
    """
    wanted = selection.get((repo.repo_id, repo.repo_type)) if selection else None
    revisions = _revisions_for(repo, wanted)
    if wanted is not None and not revisions:
        raise UsageError(f"{repo.repo_id}: revision(s) {', '.join(sorted(wanted))} not in the cache",
                         hint="`hfcache ls` lists the cached revisions; warm the one you need first")
    if repo.unreadable:
        raise CacheError(f"{repo.repo_id}: {repo.folder}/{repo.unreadable[0]} cannot be read by this user "
                         "(permission denied)", hint="ask the cache's owner to make it group-readable "
                         "(`hfcache doctor` prints the fix), or export other repos")
    return revisions


def _plan_repo(cache_dir: str, repo: RepoInfo, revisions: list, materialize: bool, entries: list[Entry],
               first_of_content: dict[str, str]) -> int:
    """Append the entries of ``repo`` at ``revisions`` to ``entries``; returns the bytes of new distinct content."""
    folder = repo.folder
    root = Path(cache_dir) / folder
    dirs = {folder, f"{folder}/blobs", f"{folder}/snapshots"}
    records = {rev.commit_hash: _checked_record(cache_dir, repo, rev) for rev in revisions}
    revisions = [_with_store_blobs(cache_dir, folder, rev) for rev in revisions]
    unique = _plan_blobs(repo, revisions, root, entries, first_of_content)
    for rev in revisions:
        unique += _plan_revision(folder, root, rev, materialize, entries, first_of_content, dirs)
    for commit, record in sorted(records.items()):
        if record is not None:
            name = "/".join(record_parts(folder, commit))
            dirs.update({".locks", f".locks/{folder}", f".locks/{folder}/hfcache"})
            entries.append(Entry(name, "data", target=record))
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
    """Append the blob entries the snapshot links of ``revisions`` use (a content seen before: a hardlink);
    returns the bytes of new distinct content.

    Raises:
        CacheError: a snapshot entry is broken (neither a link to a blob nor a real file).
    """
    folder = repo.folder
    blobs: dict[str, int] = {}
    for rev in revisions:
        for f in rev.files:
            if f.form != "link" and f.form != "file":
                raise CacheError(f"{repo.repo_id}: snapshot {rev.commit_hash[:12]} has a broken entry {f.path} "
                                 f"({f.form})", hint="run `hfcache verify --repair` first")
            if f.form == "link":
                blobs[f.etag] = f.size
    unique = 0
    for etag, size in sorted(blobs.items()):
        name = f"{folder}/blobs/{etag}"
        if etag in first_of_content:
            entries.append(Entry(name, "hardlink", target=first_of_content[etag]))
        else:
            first_of_content[etag] = name
            unique += size
            entries.append(Entry(name, "file", source=str(root / "blobs" / etag), etag=etag, size=size))
    return unique


def _plan_revision(folder: str, root: Path, rev, materialize: bool, entries: list[Entry],
                   first_of_content: dict[str, str], dirs: set[str]) -> int:
    """Append the snapshot entries, ``.no_exist`` markers and ``trees/`` listing of ``rev``, adding their folders
    to ``dirs``; returns the bytes of new distinct content (real files and the listing)."""
    unique = 0
    base = f"{folder}/snapshots/{rev.commit_hash}"
    for f in rev.files:
        name = f"{base}/{f.path}"
        dirs.update(_parents(name, stop=folder))
        if f.form == "link" and not materialize:
            target = "../" * (f.path.count("/") + 2) + f"blobs/{f.etag}"
            entries.append(Entry(name, "symlink", target=target))
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
    size = _regular_size(root.parent, (folder, "trees", tree))
    if size is not None:
        dirs.add(f"{folder}/trees")
        unique += size
        entries.append(Entry(f"{folder}/trees/{tree}", "file", source=str(root / "trees" / tree), size=size))
    return unique


def _regular_size(cache_dir: Path, rel: tuple[str, ...]) -> int | None:
    """The size of ``cache_dir/rel`` when it is a regular file (lstat through its folder's descriptor, opened
    from the root without following links), else None (missing, a link, a FIFO).

    Raises:
        UnsafeLayout (CacheError, exit 5): a folder on the way is a link.
    """
    try:
        with safefs.dir_fd(cache_dir, rel[:-1]) as fd:
            st = os.stat(rel[-1], dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _checked_record(cache_dir: str, repo: RepoInfo, rev) -> str | None:
    """The text of warm's record of ``rev`` (to carry along), or None when there is none; refuses a revision an
    export would launder: one with load hazards (planted links, FIFOs, devices) or one that lost a recorded file
    (neither in the snapshot nor marked absent in ``.no_exist``) — what ``verify`` fails as ``file_missing``.

    Raises:
        CacheError (exit 5): the revision does not match its record, or holds a hazard.
    """
    # FIFOs and devices (scan skips them as files), folder chains scan did not enter (an export would silently drop
    # what lies below); links leaving the repo are refused below as broken entries.
    hazards = [h for h in load_hazards(repo, rev.commit_hash) if h.endswith(SPECIAL_FILE) or TOO_DEEP in h]
    if hazards:
        raise CacheError(f"{repo.repo_id}: unsafe cache layout, nothing exported: {repo.folder}/{hazards[0]}",
                         hint="remove it, then `hfcache verify --repair` (or re-warm) and rerun")
    record = read_record(cache_dir, repo.folder, rev.commit_hash)
    if record is None:
        return None
    present = {f.path for f in rev.files}
    marked = set(_markers(Path(cache_dir), repo.folder, rev.commit_hash))
    lost = sorted(p for p in record.files if p not in present) + sorted(
        a for a in record.absent if a not in present and a not in marked)
    if lost:
        raise CacheError(f"{repo.repo_id}: snapshot {rev.commit_hash[:12]} lost {lost[0]}"
                         + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else "")
                         + " (in warm's record, not in the cache): nothing exported",
                         hint="run `hfcache verify --repair` (or re-warm the repo) first")
    raw = safefs.read_small(cache_dir, record_parts(repo.folder, rev.commit_hash), MAX_RECORD_BYTES + 1)
    return raw.decode()


def _parents(name: str, stop: str) -> set[str]:
    parts = name.split("/")
    return {"/".join(parts[:i]) for i in range(1, len(parts)) if len("/".join(parts[:i])) >= len(stop)}


def _markers(cache_dir: Path, folder: str, commit: str) -> list[str]:
    """Relative paths of the regular files below ``<folder>/.no_exist/<commit>`` (sorted; links and other types
    ignored), walked through descriptors (:mod:`hfcache.cache.safefs_tree`), iteratively.

    Raises:
        CacheError (exit 5): folders nested deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH`, naming the repo; a
            folder on the way is a link (UnsafeLayout).
    """
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


def _modes(group_writable: bool) -> tuple[int, int]:
    return (0o775, 0o664) if group_writable else (0o755, 0o644)


def write_tar(plan: ExportPlan, out: BinaryIO, chown: tuple[int, int] = (0, 0), group_writable: bool = False,
              prefix: str = "") -> str:
    """Write the plan as a reproducible tar to ``out``; return the sha256 of the bytes written.

    Args:
        plan: what :func:`plan_export` returned (names relative to the cache root). out: the binary stream written.
        chown: (uid, gid) of every entry. group_writable: modes 0775/0664 instead of 0755/0644.
        prefix: a checked relative folder (``push --prefix``, :func:`hfcache.oci.modelpack.check_prefix`) that
            every entry is put under, its own folders first; hardlink targets get it too, relative symlink targets
            stay as they are (they point inside the same repo folder). The plan's names still open the files.

    Raises:
        CacheError: a blob's content does not match its name (a corrupt source cache); a source file is no longer a
            regular file below the cache (swapped for a link: refused, never read through).
    """
    dir_mode, file_mode = _modes(group_writable)
    digest = hashlib.sha256()
    sink = _DigestWriter(out, digest)
    under = (lambda name: f"{prefix}/{name}") if prefix else (lambda name: name)

    def info_of(name: str) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.mtime = 0
        info.uid, info.gid = chown
        info.uname = info.gname = ""
        info.mode = file_mode
        return info

    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        parts = prefix.split("/") if prefix else []
        for i in range(1, len(parts) + 1):
            info = info_of("/".join(parts[:i]))
            info.type, info.mode = tarfile.DIRTYPE, dir_mode
            tar.addfile(info)
        for e in plan.entries:
            info = info_of(under(e.name))
            if e.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, dir_mode
                tar.addfile(info)
            elif e.kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.target, 0o777
                tar.addfile(info)
            elif e.kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, under(e.target)
                tar.addfile(info)
            elif e.kind in ("empty", "data"):
                data = e.target.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = e.size
                reader = _HashingReader(e.source, e.etag, e.size) if e.etag else \
                    _SizedReader(_open_source(e), e.size, e.source)  # noqa: SIM115
                with reader:
                    tar.addfile(info, reader)
                    reader.read()  # reach EOF: a blob's hash, another file's size is checked there
    out.flush()
    return digest.hexdigest()


class _DigestWriter(io.RawIOBase):
    def __init__(self, out: BinaryIO, digest) -> None:
        self._out = out
        self._digest = digest

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._digest.update(data)
        self._out.write(data)
        return len(data)
