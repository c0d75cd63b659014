"""prune's execution: remove exactly what a :class:`~.plan.PrunePlan` lists, folder by folder under the repo lock,
through :mod:`hfcache.cache.safefs` (a folder swapped for a symlink after the plan makes the item ``skipped``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

from ..bounds import TooDeep
from ..cache import safefs
from ..cache.layout import RepoFolder
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockTimeout, LockWait, try_lock
from ..cache.published import remove_record
from ..cache.root import cache_error
from ..cache.safefs import UnsafeLayout
from ..cache.safefs_tree import iter_tree
from ..cache.scan import scan_repo
from ..cache.shared_store import StoreProblem, payload_stat, xet_hash_of_link
from ..cache.sharing import cache_policy, open_dirs
from .housekeeping import etag_of
from .plan import TRASH, ItemOutcome, PlanItem, PrunePlan, PruneResult, RevisionRemoval
from .store import sweep_payload


def execute(plan: PrunePlan, *, on_item: Callable[[ItemOutcome], None] | None = None,
            lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
            on_lock_wait: Callable[[LockWait], None] | None = None) -> PruneResult:
    """Remove what ``plan`` lists, repo folder by repo folder, each under hfcache's repo lock and scanned again under
    it: an item whose reason no longer holds is skipped. The order within a folder, and why: docs/prune.md ("Safe
    next to running work"). Then the shared Xet store's payloads (:mod:`.store`), whose outcomes come last.

    ``on_item``: called after each item (progress); ``lock_timeout``: seconds to wait at most for a repo's lock
    (another warm or prune changing that folder); ``on_lock_wait``: told which lock it waits for, and who holds it,
    when a wait lasts a few seconds. Returns a PruneResult, one outcome per item: an OSError, or a repo lock held for
    ``lock_timeout`` seconds, makes ``failed`` outcomes (exit 5). CacheError: the repo lock cannot be created (a
    read-only cache).
    """
    started = time.monotonic()
    root = Path(plan.cache_dir)
    by_folder: dict[str, list[PlanItem]] = {}
    for item in plan.items:
        if item.kind != "payload":
            by_folder.setdefault(item.folder, []).append(item)
    touched: set[str] = set()  # Xet hashes whose repo links were removed
    planned = {(r.folder, r.commit_hash): r for r in plan.revisions}
    outcomes: list[ItemOutcome] = []

    def record(outcome: ItemOutcome) -> None:
        outcomes.append(outcome)
        if on_item:
            on_item(outcome)

    _run_folders(root, by_folder, planned, touched, record, lock_timeout, on_lock_wait)
    for outcome in _sweep_store(root, [i for i in plan.items if i.kind == "payload"], touched, lock_timeout):
        record(outcome)
    return PruneResult(plan=plan, outcomes=tuple(outcomes), seconds=time.monotonic() - started)


def _run_folders(root: Path, by_folder: dict[str, list[PlanItem]], planned: dict[tuple[str, str], RevisionRemoval],
                 touched: set[str], record: Callable[[ItemOutcome], None], lock_timeout: float,
                 on_lock_wait: Callable[[LockWait], None] | None) -> None:
    for folder, items in by_folder.items():
        repo = RepoFolder(root, items[0].repo_id, items[0].repo_type, lock_timeout=lock_timeout,
                          on_lock_wait=on_lock_wait)
        try:
            lock = repo.repo_lock()
            lock.__enter__()
        except (UnsafeLayout, LockTimeout) as exc:
            # A link planted since the plan: nothing of this folder is touched (skipped). Another warm or prune
            # keeps this folder: its items fail (exit 5, naming the lock). Either way the other folders go on.
            status = "skipped" if isinstance(exc, UnsafeLayout) else "failed"
            for item in items:
                record(ItemOutcome(item, status, exc.message))
            continue
        except OSError as exc:
            raise cache_error(exc, f"prune {folder}") from exc
        try:
            for outcome in _execute_folder(root, folder, items, planned, touched):
                record(outcome)
        finally:
            lock.__exit__(None, None, None)


def _sweep_store(root: Path, payloads: list[PlanItem], touched: set[str],
                 lock_timeout: float) -> Iterable[ItemOutcome]:
    """Sweep the store payloads whose links were removed: the planned ones may be deleted (an outcome each, with
    the bytes the sweep measured), the others only have their manifest rewritten (no item, no outcome)."""
    planned = set()
    for item in payloads:
        xet_hash = item.path.rsplit("/", 1)[-1]
        planned.add(xet_hash)
        status, note, freed = sweep_payload(root, xet_hash, delete=True, lock_timeout=lock_timeout)
        yield ItemOutcome(item, status, note, None if status != "removed" or freed == item.bytes_freed else freed)
    for xet_hash in sorted(touched - planned):
        sweep_payload(root, xet_hash, delete=False, lock_timeout=lock_timeout)


def _execute_folder(root: Path, folder: str, items: list[PlanItem],
                    planned: dict[tuple[str, str], RevisionRemoval], touched: set[str]) -> Iterable[ItemOutcome]:
    current = scan_repo(root / folder, items[0].repo_id, items[0].repo_type)
    if current.unsafe:
        for item in items:
            yield ItemOutcome(item, "skipped", "left alone: " + "; ".join(current.unsafe))
        return
    revisions = {r.commit_hash: r for r in current.revisions}
    refs_to: dict[str, set[str]] = {}
    for name, value in current.refs.items():
        refs_to.setdefault(value.strip(), set()).add(name)
    skipped: dict[str, str] = {}  # the planned revision removals that no longer hold, now that the lock is held
    for commit in {i.revision for i in items if i.revision}:
        removal, rev = planned.get((folder, commit)), revisions.get(commit)
        if removal is None or rev is None:
            continue
        new_refs = refs_to.get(commit, set()) - set(removal.refs)
        if new_refs:
            skipped[commit] = f"a ref points to it now ({', '.join(sorted(new_refs))})"
        elif rev.last_used > removal.last_used:
            skipped[commit] = "used since the plan was made"
    remaining = [r for r in current.revisions if r.commit_hash in skipped or (folder, r.commit_hash) not in planned]
    used_etags = {f.etag for r in remaining for f in r.files if f.etag}
    used_inodes = {f.inode for r in remaining for f in r.files if f.inode is not None}
    for item in items:
        if item.revision in skipped:
            outcome = ItemOutcome(item, "skipped", skipped[item.revision])
        else:
            outcome = _remove_item(item, root, folder, used_etags, used_inodes, touched)
        kept = revisions.get(item.revision) if item.kind == "snapshot" else None
        if kept is not None and outcome.status not in ("removed", "gone"):
            # The snapshot stays (a link planted on the way, a failure): so do the blobs it uses, or its links
            # would point to nothing (a member's swap of the trash folder must not break a revision).
            used_etags |= {f.etag for f in kept.files if f.etag}
            used_inodes |= {f.inode for f in kept.files if f.inode is not None}
        yield outcome


def _remove_item(item: PlanItem, root: Path, folder: str, used_etags: set[str],
                 used_inodes: set[tuple[int, int]], touched: set[str]) -> ItemOutcome:
    """Remove one item of ``folder`` (the repo lock is held); a planted link or an OSError is its outcome."""
    path = root / item.path
    try:
        if item.kind == "ref":
            return _remove_ref(item, root)
        if item.kind == "snapshot":
            return _remove_snapshot(item, root, folder)
        if item.kind in ("no_exist", "tree", "trash"):
            return ItemOutcome(item, "removed" if safefs.rmtree(root, item.path) else "gone")
        if item.kind == "blob":
            return _remove_blob(item, root, root / ".locks" / folder / f"{path.name}.lock", used_etags,
                                used_inodes, touched)
        if item.kind == "incomplete":
            return _remove_incomplete(item, root, root / ".locks" / folder / f"{etag_of(path.name)}.lock")
        if item.kind == "lock":
            return _remove_lock(item, root, used_etags)
        if item.kind == "repo_folder":
            return _remove_repo_folder(item, root, folder)
        return ItemOutcome(item, "skipped", f"unknown kind {item.kind}")  # pragma: no cover - all handled above
    except UnsafeLayout as exc:
        return ItemOutcome(item, "skipped", exc.message)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a folder swapped for a link or a file meanwhile
            return ItemOutcome(item, "skipped", f"left alone: {exc.filename or path} is a symlink or not a folder")
        return ItemOutcome(item, "failed", f"{exc.strerror or exc}: {exc.filename or path}")


def _remove_ref(item: PlanItem, root: Path) -> ItemOutcome:
    try:
        content = safefs.read_small(root, item.path, 256)
    except FileNotFoundError:
        return ItemOutcome(item, "gone")
    if content.decode("utf-8", "replace").strip() != item.revision:
        return ItemOutcome(item, "skipped", f"now points to {content[:12].decode('utf-8', 'replace')}")
    safefs.unlink(root, item.path)
    return ItemOutcome(item, "removed")


def _remove_snapshot(item: PlanItem, root: Path, folder: str) -> ItemOutcome:
    parts = item.path.split("/")
    try:
        with safefs.dir_fd(root, parts[:-1]) as fd:
            os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return ItemOutcome(item, "gone")
    # The trash folder is created and shared through descriptors from the cache root (sharing.open_dirs): a trash
    # name exchanged with a symlink is refused, never chmod-ed. One atomic rename takes the whole snapshot out of
    # sight (transformers silently drops a missing chat template: a loader must never see half a snapshot).
    os.close(open_dirs(root / folder / TRASH, root, cache_policy(root)))
    aside = (folder, TRASH, f"{parts[-1]}.{uuid.uuid4().hex[:8]}")
    safefs.rename(root, parts, aside)
    remove_record(root, folder, parts[-1])  # what warm published for it: nothing left to check
    safefs.rmtree(root, aside)
    with contextlib.suppress(OSError, UnsafeLayout):
        safefs.rmdir(root, (folder, TRASH))
    return ItemOutcome(item, "removed")


def _remove_blob(item: PlanItem, root: Path, lock_path: Path, used_etags: set[str],
                 used_inodes: set[tuple[int, int]], touched: set[str]) -> ItemOutcome:
    """Remove a blob: a regular file, or a link of exactly huggingface_hub's shape into the shared store (its
    payload's Xet hash goes to ``touched``, swept after every folder); any other link is left alone."""
    parts = item.path.split("/")
    try:
        with safefs.dir_fd(root, parts[:-1]) as fd:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            xet_hash = xet_hash_of_link(os.readlink(parts[-1], dir_fd=fd)) if stat.S_ISLNK(st.st_mode) else None
    except FileNotFoundError:
        return ItemOutcome(item, "gone")
    inode = (st.st_dev, st.st_ino)
    if xet_hash is not None:
        with contextlib.suppress(OSError, StoreProblem):  # a dangling link: removed all the same
            payload = payload_stat(root, xet_hash)
            inode = (payload.st_dev, payload.st_ino)
    if parts[-1] in used_etags or inode in used_inodes:
        return ItemOutcome(item, "skipped", "a remaining revision uses it now")
    if not stat.S_ISREG(st.st_mode) and xet_hash is None:
        return ItemOutcome(item, "skipped", "not a regular file")
    with _held(lock_path) as why:
        if why:
            return ItemOutcome(item, "skipped", why)
        safefs.unlink(root, parts)
    if xet_hash is not None:
        touched.add(xet_hash)
    return ItemOutcome(item, "removed")


def _remove_incomplete(item: PlanItem, root: Path, lock_path: Path) -> ItemOutcome:
    if not os.path.lexists(root / item.path):
        return ItemOutcome(item, "gone")
    with _held(lock_path) as why:
        if why:
            return ItemOutcome(item, "skipped", why)
        if not safefs.unlink(root, item.path, missing_ok=True):
            return ItemOutcome(item, "gone")
    return ItemOutcome(item, "removed")


def _remove_lock(item: PlanItem, root: Path, used_etags: set[str]) -> ItemOutcome:
    # Before the blob: a prune killed between the two leaves a blob without a lock file (which the next prune
    # removes as unused), never a lock file nobody would plan to remove.
    path = root / item.path
    if path.name[: -len(".lock")] in used_etags:
        return ItemOutcome(item, "skipped", "a remaining revision uses its blob now")
    if not os.path.lexists(path):
        return ItemOutcome(item, "gone")
    with _held(path) as why:
        if why:
            return ItemOutcome(item, "skipped", why)
        # Unlinked while held: a process waiting on it then wins an unlinked inode, which filelock 4 notices
        # (st_nlink == 0) and re-opens the path; with an older filelock the worst case is one duplicate download
        # (every writer downloads to a private .incomplete file). A soft marker is ours while held: unlinking it
        # is its release.
        safefs.unlink(root, item.path, missing_ok=True)
    return ItemOutcome(item, "removed")


def _remove_repo_folder(item: PlanItem, root: Path, folder: str) -> ItemOutcome:
    """Remove a repo folder holding nothing but empty folders, markers, listings and prune's trash (walked by
    :func:`iter_tree`: a chain deeper than MAX_TREE_DEPTH is this folder's problem, never exit 70)."""
    try:
        left = _repo_folder_leftovers(root, folder)
    except FileNotFoundError:
        return ItemOutcome(item, "gone")
    except TooDeep as exc:
        return ItemOutcome(item, "skipped", f"left alone: {exc}")
    if isinstance(left, str):
        return ItemOutcome(item, "skipped", "not empty: " + left)
    # The trash folder marks the removal as a prune's until the very end: a prune killed halfway leaves it, and the
    # next prune then removes the rest at once instead of waiting out the grace period of an empty folder.
    os.close(open_dirs(root / folder / TRASH, root, cache_policy(root)))
    for sub in (".no_exist", "trees"):
        safefs.rmtree(root, (folder, sub))
    with safefs.dir_fd(root, (folder, TRASH)) as trash_fd:
        for entry in os.listdir(trash_fd):
            safefs.rmtree(root, (folder, TRASH, entry))
    # Bottom-up, snapshots/ last: a repo folder without snapshots/ is what huggingface_hub's scan calls corrupted.
    try:
        for rel in sorted(left, key=len, reverse=True):
            if rel not in (("snapshots",), (TRASH,)):
                safefs.rmdir(root, (folder, *rel))
        for rel in (("snapshots",), (TRASH,)):
            with contextlib.suppress(FileNotFoundError):
                safefs.rmdir(root, (folder, *rel))
        safefs.rmdir(root, (folder,))
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return ItemOutcome(item, "skipped", f"not empty any more: {exc.filename or root / folder}")
        raise
    return ItemOutcome(item, "removed")


def _repo_folder_leftovers(root: Path, folder: str) -> list[tuple[str, ...]] | str:
    """The folders (parts below the repo folder) to remove bottom-up when it holds nothing else, or the first entry
    that makes it not empty (a file or link outside ``.no_exist``, ``trees`` and the trash). Raises TooDeep,
    FileNotFoundError (the folder is gone)."""
    dirs: list[tuple[str, ...]] = []
    for here, name, mode in iter_tree(root, (folder,), skip=(".no_exist", "trees", TRASH)):
        if stat.S_ISDIR(mode):
            if here or name not in (".no_exist", "trees"):
                dirs.append((*here, name))
        elif here or name not in (".no_exist", "trees", TRASH):
            return "/".join((*here, name))
    return dirs


@contextmanager
def _held(path: Path):
    """Hold the lock at ``path`` without waiting while a blob is removed; ``as`` gives "" when held (or when there
    is no lock file: nobody downloads that blob), else why it could not be taken. A lock file (or its folder)
    planted as a symlink is never opened: filelock opens with O_TRUNC, which would truncate the link's target."""
    root = path.parent.parent.parent  # <cache>/.locks/<folder>/<name>
    try:
        fd = safefs.open_dir(root, (".locks", path.parent.name))
    except FileNotFoundError:
        yield ""
        return
    except UnsafeLayout:
        yield "its lock folder is a symlink (left alone)"
        return
    try:
        try:
            mode = os.stat(path.name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = 0
        if stat.S_ISLNK(mode):
            yield "its lock file is a symlink (left alone)"
            return
        with try_lock(path, dir_fd=fd) as why:  # opened through the folder's fd: a later swap is not followed
            yield why
    finally:
        os.close(fd)
