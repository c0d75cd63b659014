"""import: merge an exported cache into a cache. Every entry is read (:mod:`.import_plan`), staged under
``<cache>/.locks/`` (:mod:`.import_staging`), checked and compared with the target (:mod:`.import_conflicts`: nothing
it holds is replaced) before each repo is published under its repo lock. Refusals and bounds: docs/transfer.md."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..bounds import TooDeep
from ..cache import safefs
from ..cache.atomic import atomic_output_at
from ..cache.content import SHA256, algorithm_of
from ..cache.fsops import open_read_at
from ..cache.layout import RepoFolder
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from ..cache.published import write_record
from ..cache.root import cache_error, ensure_cache_root, symlinks_supported
from ..cache.safefs_tree import iter_tree
from ..cache.scan import parse_folder_name
from ..errors import CacheError, CheckFailed, IntegrityError, UsageError
from ..records import folder_clash
from .import_conflicts import check_target, store_blob_holds
from .import_plan import _Reader, _RepoPlan
from .import_source import Member, members_of_dir, tar_members
from .import_staging import _CHUNK, _Staging


@dataclass(frozen=True)
class ImportReport:
    """The outcome of :func:`import_cache`: ``files``, snapshot entries merged (those already there included);
    ``blobs_new``/``blobs_existing``, blob entries per repo folder; ``blob_contents``, distinct contents (verify's);
    ``moved``, refs moved to the source's commit (``move_refs``)."""

    cache_dir: str
    repos: tuple[str, ...]
    files: int
    blobs_new: int
    blobs_existing: int
    blob_contents: int
    bytes_new: int
    moved: tuple[str, ...]


def import_cache(src: str, cache_dir: Path, move_refs: bool = False, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 on_lock_wait: Callable[[LockWait], None] | None = None) -> ImportReport:
    """Merge the cache at ``src`` (a directory, a tar file, or ``-`` for a tar on stdin) into ``cache_dir``.
    ``move_refs``: a ref the target has at another commit moves to the source's (reported), else it refuses;
    ``lock_timeout``: seconds per repo lock. Raises (nothing is written then, but for a CacheError while publishing)
    LockTimeout (exit 5); UsageError: a missing ``src``, a refused entry (named), a bound passed; IntegrityError: a
    blob or file not its hash; CheckFailed: a target entry held otherwise (named); CacheError: the target unwritable."""
    if src != "-" and not os.path.isdir(src) and not os.path.isfile(src):
        raise UsageError(f"{src}: no such directory or tar file", hint="give an exported directory, a tar or -")

    def members() -> Iterator[tuple[Member, BinaryIO | None]]:
        if src == "-":
            return tar_members(sys.stdin.buffer)
        if os.path.isdir(src):
            return members_of_dir(Path(src))
        return tar_members(open(src, "rb"))

    try:
        return import_members(members, cache_dir, move_refs=move_refs, lock_timeout=lock_timeout,
                              on_lock_wait=on_lock_wait)
    except tarfile.TarError as exc:
        raise UsageError(f"{src}: not a readable tar ({exc})") from None


def import_members(members: Callable[[], Iterable[tuple[Member, BinaryIO | None]]], cache_dir: Path,
                   move_refs: bool = False, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                   on_lock_wait: Callable[[LockWait], None] | None = None, listings: bool = True) -> ImportReport:
    """Merge the entries ``members()`` yields (a :class:`Member` and, for a file, its byte stream) into ``cache_dir``,
    consumed to its end before anything is checked or published; ``cache_dir`` is created if missing, removed again if
    nothing was published. ``listings`` False: the ``trees/`` listings are checked but neither compared with the target
    nor published (``pull --verify-key``). Else as :func:`import_cache`, plus what ``members`` raises."""
    created = _missing_ancestors(cache_dir)
    staging = None
    published = False
    try:
        ensure_cache_root(cache_dir)
        staging = _Staging(cache_dir)
        plan = _Reader(staging).read(members())
        _check(plan, staging, cache_dir)
        for repo in plan.values():
            _resolve_files(repo, staging)
        _check_shape(plan)
        for repo in plan.values() if not listings else ():
            repo.trees.clear()
        with contextlib.ExitStack() as locks:
            folders = {name: RepoFolder(cache_dir, *parse_folder_name(name), lock_timeout=lock_timeout,
                                        on_lock_wait=on_lock_wait) for name in sorted(plan)}
            for folder in folders.values():
                locks.enter_context(folder.repo_lock())
            checked = _check_target(plan, folders, move_refs)
            published = True
            return _publish(plan, staging, cache_dir, folders, checked)
    except (UsageError, IntegrityError) as exc:
        if exc.hint is None:  # every refusal of an entry says what happened to the target, and what to do
            exc.hint = "nothing was imported; the source is corrupt or was crafted, check where it came from"
        raise
    except OSError as exc:
        raise cache_error(exc, f"import into {cache_dir}") from exc
    finally:
        if staging is not None:
            staging.remove()
        locks_dir = cache_dir / ".locks"
        with contextlib.suppress(OSError):
            if locks_dir.is_dir() and not locks_dir.is_symlink() and not any(locks_dir.iterdir()):
                locks_dir.rmdir()
        if not published:
            _remove_created(cache_dir, created)


def _missing_ancestors(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first (what creating ``path`` would add)."""
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    return missing


def _remove_created(cache_dir: Path, created: list[Path]) -> None:
    """Undo the creation of a cache root that received nothing (another import's staging stays)."""
    if not created:
        return
    with contextlib.suppress(OSError):
        if {entry.name for entry in os.scandir(cache_dir)} <= {"CACHEDIR.TAG", ".locks"}:
            with contextlib.suppress(OSError, CacheError, TooDeep):
                entries = list(iter_tree(cache_dir, (".locks",)))
                for here, name, mode in entries:
                    if stat.S_ISREG(mode) and name.endswith(".lock"):
                        with contextlib.suppress(OSError, CacheError), \
                                safefs.dir_fd(cache_dir, (".locks", *here)) as fd:
                            if os.stat(name, dir_fd=fd, follow_symlinks=False).st_size == 0:
                                os.unlink(name, dir_fd=fd)
                for here, name, mode in sorted(entries, key=lambda e: len(e[0]), reverse=True):
                    if stat.S_ISDIR(mode):
                        with contextlib.suppress(OSError, CacheError):
                            safefs.rmdir(cache_dir, (".locks", *here, name))
            with contextlib.suppress(OSError, CacheError):  # emptied just now (the repo locks' folders are gone)
                safefs.rmdir(cache_dir, (".locks",))
            (cache_dir / "CACHEDIR.TAG").unlink(missing_ok=True)
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            return


def _check(plan: dict[str, _RepoPlan], staging: _Staging, cache_dir: Path) -> None:
    """Refuse corrupt blobs, links to blobs nobody has, and real files whose hash nothing vouches for."""
    for folder_name, repo in sorted(plan.items()):
        folder = RepoFolder(cache_dir, *parse_folder_name(folder_name))
        folder.ensure_safe()  # a target repo folder with a planted link: refused before any repo is published
        for etag, member in sorted(repo.blobs.items()):
            _, _, sha256, sha1 = staging.files[member]
            if (sha256 if algorithm_of(etag) == SHA256 else sha1) != etag:
                raise IntegrityError(f"refused {folder_name}/blobs/{etag}: content does not match the blob name",
                                     hint="the source cache is corrupt; run `hfcache verify` on it")
        for (commit, path), etag in sorted(repo.links.items()):
            if etag not in repo.blobs and not (_regular_file(folder.blob_path(etag))
                                               or store_blob_holds(folder, etag)):
                raise UsageError(f"refused {folder_name}/snapshots/{commit}/{path}: link to a blob that neither the "
                                 "source nor the target cache has")
        for (commit, path), member in sorted(repo.files.items()):
            _, _, sha256, sha1 = staging.files[member]
            if sha256 in repo.blobs or sha1 in repo.blobs:
                continue
            blob_id, lfs, _ = _listed(repo, commit, path)
            if lfs == sha256 or blob_id == sha1:
                continue
            raise IntegrityError(f"refused {folder_name}/snapshots/{commit}/{path}: no blob or trees/ listing "
                                 "vouches for its hash" + (" (it does not match the listing)" if blob_id else ""))


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _listing(repo: _RepoPlan, commit: str) -> dict[str, tuple[str, str, int]]:
    return repo.trees.get(f"{commit}.json", (None, {}))[1]


def _listed(repo: _RepoPlan, commit: str, path: str) -> tuple[str, str, int]:
    """(blob id, LFS sha256, size) the source's listing of ``commit`` gives ``path`` (empty when unlisted)."""
    return _listing(repo, commit).get(path) or ("", "", 0)


def _resolve_files(repo: _RepoPlan, staging: _Staging) -> None:
    """Real snapshot files become blobs named by the hash that vouched for them, and links to those blobs."""
    for (commit, path), member in repo.files.items():
        _, _, sha256, sha1 = staging.files[member]
        etag = sha256 if (sha256 in repo.blobs or _listed(repo, commit, path)[1] == sha256) else sha1
        repo.blobs.setdefault(etag, member)
        repo.links[(commit, path)] = etag
    repo.files.clear()


def _check_shape(plan: dict[str, _RepoPlan]) -> None:
    """UsageError naming an entry the source contradicts (file and folder, file and marker, listing)."""
    for folder_name, repo in sorted(plan.items()):
        for section, keys in (("snapshots", set(repo.links)), (".no_exist", repo.markers)):
            for commit in sorted({c for c, _ in keys}):
                if clash := folder_clash(p for c, p in keys if c == commit):
                    raise UsageError(f"refused {folder_name}/{section}/{commit}/{clash}: a file and a folder at once")
        if clash := folder_clash(repo.refs):
            raise UsageError(f"refused {folder_name}/refs/{clash}: a file and a folder at once")
        for commit, path in sorted(set(repo.links) & repo.markers):
            raise UsageError(f"refused {folder_name}/.no_exist/{commit}/{path}: the source also has that file")
        for (commit, path), etag in sorted(repo.links.items()):
            if _listing(repo, commit) and etag not in _listed(repo, commit, path)[:2]:
                raise UsageError(f"refused {folder_name}/snapshots/{commit}/{path}: its own trees/ listing of that "
                                 "commit says otherwise")


def _check_target(plan: dict[str, _RepoPlan], folders: dict[str, RepoFolder], move_refs: bool) -> dict:
    """Folder name -> (entries present, refs that move), under the repo locks; CheckFailed names conflicts."""
    results = {name: check_target(folders[name], repo, move_refs) for name, repo in sorted(plan.items())}
    if conflicts := [line for found, _, _ in results.values() for line in found]:
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        raise CheckFailed(f"refused the import, nothing was changed: {'; '.join(conflicts[:5])}{more}",
                          hint="what the target holds is never replaced by an import")
    return {name: (present, moved) for name, (_, present, moved) in results.items()}


def _publish(plan: dict[str, _RepoPlan], staging: _Staging, cache_dir: Path, folders: dict[str, RepoFolder],
             checked: dict) -> ImportReport:
    """Publish each repo in warm's order (blobs, links, markers, listings, refs last); the repo locks are held."""
    symlinks = symlinks_supported(cache_dir)
    published: dict[str, str] = {}  # etag -> the repo folder that has it, to hardlink instead of copying again
    counts = {"new": 0, "existing": 0, "bytes": 0}
    for folder_name, repo in sorted(plan.items()):
        folder, present = folders[folder_name], checked[folder_name][0]
        folder.make_dir(folder.root / "snapshots")
        _publish_blobs(folder, repo, staging, published, counts)
        for (commit, path), etag in sorted(repo.links.items()):
            if (commit, path) not in present:
                folder.link(commit, path, etag, symlinks=symlinks)
        for commit, path in sorted(repo.markers):
            folder.mark_absent(commit, path)
        _record_published(folder, repo, staging)
        for tree, (staged, _) in sorted(repo.trees.items()):
            _publish_listing(folder, tree, staged, staging)
        for ref, commit in sorted(repo.refs.items()):
            folder.write_ref(ref, commit)
    names = sorted(plan)
    return ImportReport(cache_dir=str(cache_dir), repos=tuple(names), files=sum(len(plan[n].links) for n in names),
                        blobs_new=counts["new"], blobs_existing=counts["existing"],
                        blob_contents=len({etag for n in names for etag in plan[n].blobs}), bytes_new=counts["bytes"],
                        moved=tuple(ref for n in names for ref in checked[n][1]))


def _record_published(folder: RepoFolder, repo: _RepoPlan, staging: _Staging) -> None:
    """Write warm's record (:mod:`hfcache.cache.published`) of each revision published, merged; skipped if read-only."""
    for commit in sorted({c for c, _ in repo.links} | {c for c, _ in repo.markers}):
        files = []
        for (c, path), etag in sorted(repo.links.items()):
            if c != commit:
                continue
            size = staging.files[repo.blobs[etag]][1] if etag in repo.blobs else _blob_size(folder, etag)
            if size is not None and (algorithm := algorithm_of(etag)) is not None:
                files.append((path, size, f"{algorithm}:{etag}"))
        absent = [path for c, path in sorted(repo.markers) if c == commit]
        with contextlib.suppress(OSError, CacheError):
            write_record(folder.cache_dir, folder.name, commit, files, absent)


def _blob_size(folder: RepoFolder, etag: str) -> int | None:
    """The size of the target's ``blobs/<etag>`` (``safefs.open_blob``), or None."""
    try:
        fd = safefs.open_blob(folder.cache_dir, folder.name, etag)
    except (OSError, CacheError):
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _publish_listing(folder: RepoFolder, tree: str, staged: Path, staging: _Staging) -> None:
    """Copy a staged ``trees/<commit>.json`` into the repo unless it has one, through folder descriptors."""
    dfd = folder.open_dir(folder.root / "trees")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.stat(tree, dir_fd=dfd, follow_symlinks=False)
            return
        with os.fdopen(open_read_at(staging.fd, staged.name), "rb") as src, \
                atomic_output_at(dfd, tree, folder.policy) as out:
            shutil.copyfileobj(src, out, _CHUNK)
    finally:
        os.close(dfd)


def _publish_blobs(folder: RepoFolder, repo: _RepoPlan, staging: _Staging, published: dict[str, str],
                   counts: dict[str, int]) -> None:
    """Publish each blob: a hardlink of one published before, the staged file renamed in, or a checked copy."""
    for etag, member in sorted(repo.blobs.items()):
        staged, size, _, _ = staging.files[member]
        if folder.blob_ok(etag, size):
            counts["existing"] += 1
            continue
        source = published.get(etag)
        if source is not None and folder.adopt_blob(folder.cache_dir / source / "blobs" / etag, etag):
            pass
        elif staging.holds(staged):
            folder.move_blob_in(staging.fd, staged.name, etag)
            counts["bytes"] += size
        elif source is not None:
            folder.copy_blob(source, etag, size)
        else:  # pragma: no cover - a staged file is only consumed by a publish that records it
            raise IntegrityError(f"refused {folder.name}/blobs/{etag}: its staged content is gone")
        published[etag] = folder.name
        counts["new"] += 1
