"""prune: keep a shared cache within age and size budgets, never touching what is pinned or in use.

Library gap (DESIGN §3): ``hf cache prune`` removes only detached revisions and deletes every ``.incomplete`` file,
including another process's live download; it has no age or size policy and no notion of pinned revisions.

Two steps, as huggingface_hub's ``DeleteCacheStrategy`` (``utils/_cache_manager.py``): :func:`plan_prune` computes a
frozen :class:`PrunePlan` from metadata alone (the one scanner, :mod:`hfcache.scan`), and :func:`execute` runs exactly
that plan. ``--dry-run`` prints the plan; a real run executes the same plan.

Policy, in order (pinned revisions are never removed):

1. housekeeping: blobs no snapshot uses, ``.incomplete`` files older than ``grace`` (an hour) whose download lock
   (``.locks/<folder>/<etag>.lock``, held by huggingface_hub and hfcache while they download) is not held, what an
   interrupted prune left behind;
2. detached revisions: no ref points to them (a ref with stray whitespace still counts as pointing), unless used
   within ``grace`` (huggingface_hub creates the snapshot folder of a download by commit hash, which gets no ref,
   before the first file arrives);
3. revisions whose last use (:mod:`hfcache.scan`: newest of blob atimes, snapshot folder mtime, ref mtimes) is
   older than ``older_than``;
4. least-recently-used revisions until the cache is at most ``max_size`` bytes (sizes as ``hfcache ls`` counts
   them: every distinct content once).

With a revision go its refs, its snapshot, its ``.no_exist/<commit>`` markers and ``trees/<commit>.json`` listing, the
blobs no remaining revision uses and their ``.locks`` files; a repo folder left with nothing is removed.

Execution is safe next to a running ``hfcache warm``: each repo folder is changed under the repo lock warm holds
(:meth:`hfcache.cache.RepoFolder.repo_lock`), after re-reading the folder; an item whose reason no longer holds (a
ref now points to the revision, the revision was used since the plan, a remaining revision now uses the blob, a
download holds the blob's lock) is skipped, never forced. Within a repo, refs go first, then the revision's markers
and listing, then its snapshot, then blobs, so that no loader ever sees a link to a missing blob; a snapshot is first
renamed out of ``snapshots/`` (atomic) and then deleted, so a loader never sees half a snapshot. A prune killed at
any point leaves a cache that verifies, and the next prune finishes the job: every step leaves either the item
itself or something the next plan removes again (a revision without its ref is detached, a blob without a snapshot
is an orphan, a snapshot moved aside sits in the repo's trash folder).
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from .cache import RepoFolder, access_error, cache_error, resolve_cache_dir
from .errors import CacheError, UsageError
from .locking import DEFAULT_LOCK_TIMEOUT, LockTimeout, LockWait, try_lock
from .sharing import cache_policy, make_dirs
from .lockfile import Lockfile, pinned_revisions, read_lock
from .records import valid_repo_id
from .scan import RepoInfo, RevisionInfo, scan_cache, scan_repo
from .units import format_duration

#: Folder inside a repo folder where snapshots wait for deletion (neither hfcache's scanner nor huggingface_hub's
#: ``scan_cache_dir`` reads it, and it is on the same filesystem, so the move out of ``snapshots/`` is atomic).
TRASH = ".hfcache-trash"
#: ``.incomplete`` files, empty repo folders and detached revisions younger than this (seconds) are left alone: a
#: download may be in progress.
DEFAULT_GRACE = 3600.0

#: Item kinds in execution order within a repo folder.
KINDS = ("ref", "no_exist", "tree", "snapshot", "lock", "blob", "incomplete", "trash", "repo_folder")


@dataclass(frozen=True)
class KeepSpec:
    """A ``--keep REPO_ID[@REVISION]``: every revision of the repo, or the one a ref or commit hash names.

    Attributes:
        repo_id (str): as the cache folder names it (any repo type).
        revision (str | None): a ref name (``main``) or a 40-hex commit; None keeps every revision.
    """

    repo_id: str
    revision: str | None = None

    @classmethod
    def parse(cls, spec: str) -> KeepSpec:
        """``org/name`` or ``org/name@main`` or ``org/name@<40 hex>``.

        Raises:
            UsageError: malformed repo id or empty revision.
        """
        repo_id, sep, revision = spec.partition("@")
        if not valid_repo_id(repo_id):
            raise UsageError(f"--keep {spec}: invalid repo id {repo_id!r}", hint="use REPO_ID or REPO_ID@REVISION")
        if sep and not revision:
            raise UsageError(f"--keep {spec}: empty revision after '@'", hint="use REPO_ID or REPO_ID@REVISION")
        return cls(repo_id, revision or None)

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class PrunePolicy:
    """What a plan was computed from.

    Attributes:
        older_than (float | None): seconds; revisions unused for longer are removed.
        max_size (int | None): bytes; least-recently-used revisions are removed until the cache fits.
        keep (tuple[KeepSpec, ...]): revisions pinned on the command line.
        keep_locks (tuple[str, ...]): lock files whose revisions are pinned.
        grace (float): seconds; younger ``.incomplete`` files, empty repo folders and detached revisions used more
            recently are left alone (a download may be in progress).
    """

    older_than: float | None = None
    max_size: int | None = None
    keep: tuple[KeepSpec, ...] = ()
    keep_locks: tuple[str, ...] = ()
    grace: float = DEFAULT_GRACE


@dataclass(frozen=True)
class PlanItem:
    """One path the plan removes.

    Attributes:
        kind (str): ``ref``, ``no_exist``, ``tree``, ``snapshot``, ``lock``, ``blob``, ``incomplete``, ``trash`` or
            ``repo_folder`` (see :data:`KINDS`, in execution order).
        repo_id (str): the repo, as its folder names it.
        repo_type (str): ``model``, ``dataset`` or ``space``.
        folder (str): the repo folder name (``models--org--name``).
        path (str): ``/``-separated, relative to the cache root (lock files: ``.locks/<folder>/<etag>.lock``).
        revision (str | None): the commit a ref, snapshot, marker folder or listing belongs to; None otherwise.
        reason (str): ``detached``, ``older_than``, ``over_budget`` (with a revision), ``unused`` (a blob only removed
            revisions used, or its lock), ``orphan`` (a blob no snapshot used, or its lock), ``stale_incomplete``,
            ``interrupted`` (left by a killed prune) or ``empty``.
        detail (str): one line for people.
        bytes_freed (int): bytes this removal gives back to the filesystem (a content's bytes are counted on the
            item that removes its last name in the cache; 0 when hardlinks outside the cache keep it).
    """

    kind: str
    repo_id: str
    repo_type: str
    folder: str
    path: str
    revision: str | None
    reason: str
    detail: str
    bytes_freed: int = 0


@dataclass(frozen=True)
class RevisionRemoval:
    """A revision the plan removes (its ref, snapshot, marker and blob items are in :attr:`PrunePlan.items`).

    Attributes:
        repo_id (str), repo_type (str), folder (str): the repo.
        commit_hash (str): the snapshot folder's name.
        refs (tuple[str, ...]): refs pointing to it when planned (removed with it).
        last_used (float): seconds since the epoch when planned; a later use cancels the removal.
        size_on_disk (int): bytes of its distinct contents.
        reason (str): ``detached``, ``older_than`` or ``over_budget``.
        detail (str): one line for people.
        bytes_freed (int): bytes its removal gives back (contents no remaining revision or repo holds).
    """

    repo_id: str
    repo_type: str
    folder: str
    commit_hash: str
    refs: tuple[str, ...]
    last_used: float
    size_on_disk: int
    reason: str
    detail: str
    bytes_freed: int


@dataclass(frozen=True)
class PrunePlan:
    """Everything a prune would remove, and why; :func:`execute` runs exactly this.

    Attributes:
        cache_dir (str): the cache root.
        now (float): the time the ages were measured against (seconds since the epoch).
        policy (PrunePolicy): what the plan was computed from.
        items (tuple[PlanItem, ...]): paths to remove, grouped by repo folder (sorted), in execution order.
        revisions (tuple[RevisionRemoval, ...]): revisions removed, in policy order (detached, age, LRU).
        pinned (tuple[tuple[str, str, str], ...]): (repo_type, repo_id, commit) of every pinned revision present.
        repos_before (int), revisions_before (int): counts before pruning.
        repos_removed (int): repo folders removed entirely.
        bytes_before (int): cache size before (every distinct content once, as ``hfcache ls``).
        bytes_freed (int): sum of the items' ``bytes_freed``.
        bytes_pinned (int): bytes of the pinned revisions' distinct contents.
        warnings (tuple[str, ...]): e.g. a budget that pinned revisions make impossible, a ``--keep`` matching nothing.
        unreadable (tuple[str, ...]): ``<folder>/<part>`` of repos left alone because this user cannot read all of
            them (what they hold, and what uses it, is unknown); the prune then exits 5.
    """

    cache_dir: str
    now: float
    policy: PrunePolicy
    items: tuple[PlanItem, ...]
    revisions: tuple[RevisionRemoval, ...]
    pinned: tuple[tuple[str, str, str], ...]
    repos_before: int
    revisions_before: int
    repos_removed: int
    bytes_before: int
    bytes_freed: int
    bytes_pinned: int
    warnings: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()

    @property
    def bytes_kept(self) -> int:
        """Cache size after the plan."""
        return self.bytes_before - self.bytes_freed

    @property
    def budget_met(self) -> bool:
        """False when ``max_size`` is set and the cache stays above it (pinned revisions hold too much)."""
        return self.policy.max_size is None or self.bytes_kept <= self.policy.max_size


@dataclass(frozen=True)
class ItemOutcome:
    """What :func:`execute` did with one item.

    Attributes:
        item (PlanItem): the planned item.
        status (str): ``removed``; ``gone`` (already absent: a previous, interrupted prune or another process);
            ``skipped`` (its reason no longer holds, or something uses it now: see ``note``); ``failed`` (an OSError).
        note (str): why it was skipped or failed; empty otherwise.
    """

    item: PlanItem
    status: str
    note: str = ""


@dataclass(frozen=True)
class PruneResult:
    """The outcome of :func:`execute`.

    Attributes:
        plan (PrunePlan): the plan executed.
        outcomes (tuple[ItemOutcome, ...]): one per plan item, in plan order.
        seconds (float): wall time of the execution.
    """

    plan: PrunePlan
    outcomes: tuple[ItemOutcome, ...]
    seconds: float

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def bytes_freed(self) -> int:
        """Bytes of the items actually removed (planned bytes of ``removed`` items)."""
        return sum(o.item.bytes_freed for o in self.outcomes if o.status == "removed")

    @property
    def ok(self) -> bool:
        return not any(o.status == "failed" for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        """0, or 5 (cache error) when an item could not be removed or a repo could not be read."""
        return 0 if self.ok and not self.plan.unreadable else CacheError.exit_code


# ------------------------------------------------------------------------------------------------ planning


class _Repo:
    """Bookkeeping for one repo folder while the plan is computed. The per-name tables (``detail``) are only built
    for folders the plan touches: on a 10,000-repo cache most folders are only counted."""

    __slots__ = ("info", "base", "refs_to", "linked", "detailed", "blobs", "blob_users", "inode_users",
                 "blobs_by_inode", "names", "incomplete", "removed", "deleted_blobs", "removed_incomplete", "trash",
                 "items")

    def __init__(self, info: RepoInfo, base: str, refs_to: dict[str, list[str]], linked: set[str]) -> None:
        self.info = info
        self.base = base
        self.refs_to = refs_to
        self.linked = linked  # etags that snapshot links point to
        self.detailed = False
        self.blobs: dict[str, tuple[tuple[int, int], int]] = {}  # etag -> (inode, size)
        self.blob_users: dict[str, int] = {}  # etag -> remaining revisions linking to it
        self.inode_users: dict[tuple[int, int], int] = {}  # inode -> remaining revisions holding it as a real file
        self.blobs_by_inode: dict[tuple[int, int], list[str]] = {}
        self.names: dict[tuple[int, int], int] = {}  # inode -> names of it in this folder not yet removed
        self.incomplete: list[tuple[str, tuple[int, int], int, float]] = []  # (name, inode, size, mtime)
        self.removed: dict[str, str] = {}  # commit -> reason
        self.deleted_blobs: dict[str, str] = {}  # etag -> reason
        self.removed_incomplete: set[str] = set()
        self.trash = False
        self.items: list[PlanItem] = []


def plan_prune(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    older_than: float | None = None,
    max_size: int | None = None,
    keep: Iterable[str | KeepSpec] = (),
    keep_locks: Iterable[str | os.PathLike[str] | Lockfile] = (),
    grace: float = DEFAULT_GRACE,
    now: float | None = None,
) -> PrunePlan:
    """Compute what a prune removes, from metadata only (no hashing, no writes, no network).

    Args:
        cache_dir: the cache root (default: ``HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``).
        older_than: seconds; unpinned revisions whose last use is older are removed. None: no age policy.
        max_size: bytes; then least-recently-used unpinned revisions are removed until the cache is at most this.
        keep: ``REPO_ID[@REVISION]`` strings (or KeepSpec): pinned. Without a revision every revision of the repo
            is pinned; a revision is a ref name or a 40-hex commit.
        keep_locks: lock file paths (or parsed Lockfile): every revision they pin is pinned. A pin covers every
            repo folder holding that commit (a legacy id and its canonical repo).
        grace: seconds; ``.incomplete`` files and empty repo folders younger than this, and detached revisions
            used more recently, are kept (a download may be in progress).
        now: the time to measure ages against (seconds since the epoch; default: now).

    Returns:
        PrunePlan. The plan's ``warnings`` say when ``max_size`` cannot be met without pinned revisions.

    Raises:
        UsageError: a malformed ``keep`` spec, an unreadable or invalid lock, a negative duration or size.
        CacheError: ``cache_dir`` is a file, or exists but cannot be reached or listed by this user. (A cache
            directory that does not exist gives an empty plan and a warning: a CronJob on a fresh volume has nothing
            to prune.)
    """
    if older_than is not None and older_than < 0:
        raise UsageError(f"--older-than must not be negative, got {older_than}")
    if max_size is not None and max_size < 0:
        raise UsageError(f"--max-size must not be negative, got {max_size}")
    specs = tuple(k if isinstance(k, KeepSpec) else KeepSpec.parse(k) for k in keep)
    locks: list[tuple[str, Lockfile]] = []
    for lock in keep_locks:
        locks.append(("<lock>", lock) if isinstance(lock, Lockfile) else (str(lock), read_lock(lock)))
    policy = PrunePolicy(older_than=older_than, max_size=max_size, keep=specs,
                         keep_locks=tuple(name for name, _ in locks), grace=grace)
    root = resolve_cache_dir(cache_dir)
    now = time.time() if now is None else now
    try:
        os.lstat(root)
    except FileNotFoundError:
        # A cron job on a fresh volume, before anything was warmed: nothing to prune is not a failure (said, though:
        # a mistyped --cache-dir must not pass unnoticed).
        return _Planner(str(root), (), 0, policy, locks, now).plan(
            warnings=(f"no cache at {root} (nothing to prune)",))
    except PermissionError:  # exists or not, this user cannot tell: never "no cache"
        raise access_error(root) from None
    except NotADirectoryError:
        pass
    if not os.path.isdir(root):
        raise CacheError(f"{root} is not a directory", hint="pass the cache root as --cache-dir")
    with _gc_paused():
        info = scan_cache(root)
        readable = tuple(r for r in info.repos if not r.unreadable)
        denied = tuple(f"{r.folder}/{part}" for r in info.repos for part in r.unreadable)
        plan = _Planner(str(root), readable, info.size_on_disk, policy, locks, now).plan(
            warnings=tuple(f"left alone: {d} cannot be read by this user (permission denied)" for d in denied))
        return replace(plan, unreadable=denied)


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while a whole cache is scanned and planned: that allocates ~10 objects per
    file and frees none, so the collector would traverse them again and again (a third of the time on a
    10,000-repo cache) to find no cycle. Restored afterwards, as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Planner:
    """The policy over a scanned cache. Bytes are tracked per content (inode): a content is freed when the last repo
    folder holding it lets it go, and only if no hardlink outside the cache keeps it."""

    def __init__(self, root: str, repos: Sequence[RepoInfo], size_on_disk: int, policy: PrunePolicy,
                 locks: Sequence[tuple[str, Lockfile]], now: float) -> None:
        self.root = root
        self.infos = repos
        self.policy = policy
        self.locks = locks
        self.now = now
        self.bytes_before = size_on_disk
        self.warnings: list[str] = []
        self.sizes: dict[tuple[int, int], int] = {}
        self.holders: dict[tuple[int, int], int] = {}  # repo folders still holding each content
        self.names_total: dict[tuple[int, int], int] = {}  # names of each content in detailed folders
        self.a_path: dict[tuple[int, int], str] = {}
        self.freed = 0
        self.outside_kept = 0
        self.repos: list[_Repo] = []
        self.removals: list[RevisionRemoval] = []

    # -- setup

    def _repo(self, info: RepoInfo) -> _Repo:
        refs_to: dict[str, list[str]] = {}
        for name, value in info.refs.items():
            # A hand-written ref with a trailing newline breaks offline loads but still says which revision the
            # user wants: never treat its revision as detached.
            refs_to.setdefault(value.strip(), []).append(name)
        linked = {f.etag for rev in info.revisions for f in rev.files if f.form == "link"}
        sizes, holders = self.sizes, self.holders
        for inode, size in info.inodes.items():
            sizes[inode] = size
            holders[inode] = holders.get(inode, 0) + 1
        repo = _Repo(info, f"{self.root}/{info.folder}", refs_to, linked)
        repo.trash = os.path.isdir(f"{repo.base}/{TRASH}")
        # Folders that may hold something to clean up get their per-name tables now; the others only if the policy
        # removes one of their revisions. Real-file snapshots (no symlinks) are matched to blobs by inode.
        if info.incomplete or repo.trash or info.blob_count > len(linked) or not info.revisions or (
                not info.blob_count and any(f.form == "file" for rev in info.revisions for f in rev.files)):
            self._detail(repo)
        return repo

    def _detail(self, repo: _Repo) -> None:
        """Build the per-name tables of a folder the plan touches."""
        if repo.detailed:
            return
        repo.detailed = True
        info, base = repo.info, repo.base
        blobs, blob_users, inode_users, names = repo.blobs, repo.blob_users, repo.inode_users, repo.names
        a_path, names_total = self.a_path, self.names_total
        for rev in info.revisions:
            seen_etags = set()
            seen_inodes = set()
            for f in rev.files:
                if f.form == "link":
                    blobs[f.etag] = (f.inode, f.size)
                    seen_etags.add(f.etag)
                elif f.form == "file":
                    seen_inodes.add(f.inode)
                    names[f.inode] = names.get(f.inode, 0) + 1
                    a_path.setdefault(f.inode, f"{base}/snapshots/{rev.commit_hash}/{f.path}")
            for etag in seen_etags:
                blob_users[etag] = blob_users.get(etag, 0) + 1
            for inode in seen_inodes:
                inode_users[inode] = inode_users.get(inode, 0) + 1
        if info.blob_count > len(repo.linked):
            # Some blobs are not linked from any snapshot (orphans, or real-file snapshots): list them.
            try:
                with os.scandir(f"{base}/blobs") as it:
                    for e in it:
                        if e.name.endswith(".incomplete"):
                            continue
                        st = e.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            blobs[e.name] = ((st.st_dev, st.st_ino), st.st_size)
            except OSError:
                pass
        for etag, (inode, size) in blobs.items():
            names[inode] = names.get(inode, 0) + 1
            a_path.setdefault(inode, f"{base}/blobs/{etag}")
            repo.blobs_by_inode.setdefault(inode, []).append(etag)
        for name in info.incomplete:
            try:
                st = os.lstat(f"{base}/blobs/{name}")
            except OSError:
                continue
            inode = (st.st_dev, st.st_ino)
            names[inode] = names.get(inode, 0) + 1
            a_path.setdefault(inode, f"{base}/blobs/{name}")
            repo.incomplete.append((name, inode, st.st_size, st.st_mtime))
        for inode, count in names.items():
            names_total[inode] = names_total.get(inode, 0) + count

    def _release(self, repo: _Repo, inode: tuple[int, int] | None) -> int:
        """One name of ``inode`` in ``repo`` is removed; return the bytes freed (when it was the last name)."""
        if inode is None or not repo.names.get(inode):
            return 0
        repo.names[inode] -= 1
        if repo.names[inode] > 0:
            return 0
        self.holders[inode] -= 1
        if self.holders[inode] > 0:
            return 0
        try:
            outside = os.lstat(self.a_path[inode]).st_nlink > self.names_total[inode]
        except OSError:
            outside = False
        if outside:  # hardlinked outside the cache (an export, a copy-free image layer): the bytes stay
            self.outside_kept += self.sizes[inode]
            return 0
        return self.sizes[inode]

    def _pins(self) -> tuple[set[str], list[str]]:
        """Pinned commit hashes, and warnings for pins that match nothing."""
        commits: set[str] = set()
        warnings = []
        present = {(r.info.repo_type, r.info.repo_id, rev.commit_hash) for r in self.repos for rev in r.info.revisions}
        for name, lock in self.locks:
            pins = pinned_revisions(lock)
            commits |= {c for _, _, c in pins}
            missing = pins - present
            if missing:
                shown = ", ".join(sorted(f"{i}@{c[:12]}" for _, i, c in missing)[:3])
                warnings.append(f"--keep-lock {name}: {len(missing)} pinned revision(s) not in the cache ({shown}"
                                + (", ..." if len(missing) > 3 else "") + ")")
        by_id: dict[str, list[_Repo]] = {}
        for repo in self.repos:
            by_id.setdefault(repo.info.repo_id, []).append(repo)
        for spec in self.policy.keep:
            matches = by_id.get(spec.repo_id, [])
            if not matches:
                warnings.append(f"--keep {spec}: no such repo in the cache")
                continue
            found = False
            for repo in matches:
                for rev in repo.info.revisions:
                    if spec.revision is None or spec.revision == rev.commit_hash \
                            or spec.revision in repo.refs_to.get(rev.commit_hash, ()):
                        commits.add(rev.commit_hash)
                        found = True
            if not found:
                warnings.append(f"--keep {spec}: no revision or ref {spec.revision!r} of {spec.repo_id} in the cache")
        return commits, warnings

    # -- the policy

    def plan(self, warnings: Sequence[str] = ()) -> PrunePlan:
        self.repos = [self._repo(info) for info in self.infos]
        pinned_commits, pin_warnings = self._pins()
        self.warnings = [*warnings, *pin_warnings]
        pinned = []
        pinned_inodes: dict[tuple[int, int], int] = {}
        candidates: list[tuple[_Repo, RevisionInfo]] = []
        for repo in self.repos:
            for rev in repo.info.revisions:
                if rev.commit_hash in pinned_commits:
                    pinned.append((repo.info.repo_type, repo.info.repo_id, rev.commit_hash))
                    pinned_inodes.update((f.inode, f.size) for f in rev.files if f.inode is not None)
                else:
                    candidates.append((repo, rev))

        # 1. housekeeping: orphan blobs, stale partial downloads, leftovers of an interrupted prune
        for repo in self.repos:
            if repo.detailed:
                self._housekeeping(repo)
        # 2. detached revisions (not those used within the grace period: huggingface_hub creates the snapshot folder
        # of a download by commit hash, which has no ref, before its first file arrives)
        for repo, rev in candidates:
            if not repo.refs_to.get(rev.commit_hash) and rev.last_used < self.now - self.policy.grace:
                self._remove_revision(repo, rev, "detached", "no ref points to it")
        # 3. age
        if self.policy.older_than is not None:
            cutoff = self.now - self.policy.older_than
            for repo, rev in candidates:
                if rev.commit_hash not in repo.removed and rev.last_used < cutoff:
                    self._remove_revision(repo, rev, "older_than",
                                          f"not used for more than {format_duration(self.policy.older_than)}")
        # 4. size, least recently used first
        max_size = self.policy.max_size
        if max_size is not None and self.bytes_before - self.freed > max_size:
            order = sorted(candidates, key=lambda c: (c[1].last_used, c[0].info.repo_type, c[0].info.repo_id.lower(),
                                                      c[1].commit_hash))
            for repo, rev in order:
                if self.bytes_before - self.freed <= max_size:
                    break
                if rev.commit_hash not in repo.removed:
                    self._remove_revision(repo, rev, "over_budget",
                                          "least recently used while the cache is over --max-size")
        repos_removed = 0
        for repo in self.repos:
            if repo.detailed:
                self._lock_items(repo)
                repos_removed += self._empty_folder(repo)
        bytes_pinned = sum(pinned_inodes.values())
        kept = self.bytes_before - self.freed
        if max_size is not None and kept > max_size:
            self.warnings.append(
                f"cannot reach --max-size {max_size} bytes: the cache stays at {kept} bytes; pinned revisions hold "
                f"{bytes_pinned} bytes" + (" and live downloads or outside hardlinks hold the rest"
                                          if kept > bytes_pinned else ""))
        if self.outside_kept:
            self.warnings.append(f"{self.outside_kept} bytes stay on disk: removed blobs are hardlinked outside the "
                                 "cache")
        order_of = {kind: i for i, kind in enumerate(KINDS)}
        items = [item for repo in sorted(self.repos, key=lambda r: r.info.folder) if repo.items
                 for item in sorted(repo.items, key=lambda i: order_of[i.kind])]
        return PrunePlan(
            cache_dir=self.root,
            now=self.now,
            policy=self.policy,
            items=tuple(items),
            revisions=tuple(self.removals),
            pinned=tuple(sorted(pinned)),
            repos_before=len(self.repos),
            revisions_before=sum(len(r.info.revisions) for r in self.repos),
            repos_removed=repos_removed,
            bytes_before=self.bytes_before,
            bytes_freed=sum(i.bytes_freed for i in items),
            bytes_pinned=bytes_pinned,
            warnings=tuple(self.warnings),
        )

    def _item(self, repo: _Repo, kind: str, path: str, revision: str | None, reason: str, detail: str,
              bytes_freed: int = 0) -> None:
        info = repo.info
        repo.items.append(PlanItem(kind, info.repo_id, info.repo_type, info.folder, path, revision, reason, detail,
                                   bytes_freed))

    def _housekeeping(self, repo: _Repo) -> None:
        folder = repo.info.folder
        for etag in sorted(repo.blobs):
            inode = repo.blobs[etag][0]
            if not repo.blob_users.get(etag) and not repo.inode_users.get(inode):
                self._delete_blob(repo, etag, "orphan", "no snapshot uses it")
        for name, inode, size, mtime in repo.incomplete:
            if mtime < self.now - self.policy.grace and not _lock_held(self._lock_path(folder, _etag_of(name))):
                freed = self._release(repo, inode)
                self.freed += freed
                self._item(repo, "incomplete", f"{folder}/blobs/{name}", None, "stale_incomplete",
                           f"partial download untouched for {_age(self.now - mtime)}, no live download lock", freed)
                repo.removed_incomplete.add(name)
        if repo.trash:
            self._item(repo, "trash", f"{folder}/{TRASH}", None, "interrupted", "left by an interrupted prune")

    def _lock_path(self, folder: str, etag: str) -> str:
        return f"{self.root}/.locks/{folder}/{etag}.lock"

    def _lock_items(self, repo: _Repo) -> None:
        """The ``.locks`` files of blobs (and partial downloads) the plan removes, unless something of that etag
        stays in the folder."""
        folder = repo.info.folder
        gone = dict(repo.deleted_blobs)
        for name, *_ in repo.incomplete:
            if name in repo.removed_incomplete:
                gone.setdefault(_etag_of(name), "stale_incomplete")
        if not gone:
            return
        staying = {etag for etag in repo.blobs if etag not in repo.deleted_blobs}
        staying |= {_etag_of(name) for name, *_ in repo.incomplete if name not in repo.removed_incomplete}
        for etag in sorted(gone):
            if etag not in staying and os.path.isfile(self._lock_path(folder, etag)):
                self._item(repo, "lock", f".locks/{folder}/{etag}.lock", None, gone[etag],
                           "lock file of a removed blob" if gone[etag] != "stale_incomplete"
                           else "lock file of a removed partial download")

    def _delete_blob(self, repo: _Repo, etag: str, reason: str, detail: str) -> None:
        inode, size = repo.blobs[etag]
        repo.deleted_blobs[etag] = reason
        freed = self._release(repo, inode)
        self.freed += freed
        self._item(repo, "blob", f"{repo.info.folder}/blobs/{etag}", None, reason, detail, freed)

    def _remove_revision(self, repo: _Repo, rev: RevisionInfo, reason: str, detail: str) -> None:
        self._detail(repo)
        commit = rev.commit_hash
        folder = repo.info.folder
        repo.removed[commit] = reason
        freed_before = self.freed
        refs = tuple(sorted(repo.refs_to.get(commit, ())))
        for name in refs:
            self._item(repo, "ref", f"{folder}/refs/{name}", commit, reason, detail)
        snapshot_freed = 0
        real_inodes = set()
        etags = set()
        for f in rev.files:
            if f.form == "file":
                snapshot_freed += self._release(repo, f.inode)
                real_inodes.add(f.inode)
            elif f.form == "link":
                etags.add(f.etag)
        self.freed += snapshot_freed
        self._item(repo, "snapshot", f"{folder}/snapshots/{commit}", commit, reason, detail, snapshot_freed)
        if os.path.lexists(f"{repo.base}/.no_exist/{commit}"):
            self._item(repo, "no_exist", f"{folder}/.no_exist/{commit}", commit, reason, detail)
        if os.path.lexists(f"{repo.base}/trees/{commit}.json"):
            self._item(repo, "tree", f"{folder}/trees/{commit}.json", commit, reason, detail)
        released = []
        for etag in etags:
            repo.blob_users[etag] -= 1
            if repo.blob_users[etag] == 0:
                released.append(etag)
        for inode in real_inodes:
            repo.inode_users[inode] -= 1
            if repo.inode_users[inode] == 0:
                released.extend(repo.blobs_by_inode.get(inode, ()))
        for etag in sorted(set(released)):
            if etag in repo.deleted_blobs or etag not in repo.blobs:
                continue
            if repo.blob_users.get(etag) or repo.inode_users.get(repo.blobs[etag][0]):
                continue
            self._delete_blob(repo, etag, "unused", "used only by removed revisions")
        self.removals.append(RevisionRemoval(
            repo_id=repo.info.repo_id, repo_type=repo.info.repo_type, folder=folder, commit_hash=commit, refs=refs,
            last_used=rev.last_used, size_on_disk=rev.size_on_disk, reason=reason, detail=detail,
            bytes_freed=self.freed - freed_before))

    def _empty_folder(self, repo: _Repo) -> int:
        """Plan the removal of a repo folder the plan leaves empty (or that was empty, for longer than ``grace``)."""
        info = repo.info
        if len(repo.removed) < len(info.revisions):
            return 0
        if any(commit not in repo.removed for commit in repo.refs_to):
            return 0  # a ref to a missing snapshot, or malformed: verify reports it; prune does not guess
        if any(etag not in repo.deleted_blobs for etag in repo.blobs):
            return 0
        if any(name not in repo.removed_incomplete for name, *_ in repo.incomplete):
            return 0  # a live or recent download
        if any(p.startswith("blobs/") for p in info.problems):
            return 0  # something in blobs/ that is not a regular file: not ours to delete
        if not info.revisions and not info.refs and not repo.blobs and not repo.incomplete and not repo.trash \
                and _has_entries(repo.base):
            # Empty before this plan (and not left so by an interrupted prune, which leaves its trash folder there
            # until the very end): a download may just have created it, so only take it when untouched for a while.
            newest = 0.0
            for sub in ("", "/blobs", "/snapshots", "/refs"):
                try:
                    newest = max(newest, os.lstat(repo.base + sub).st_mtime)
                except OSError:
                    pass
            if newest > self.now - self.policy.grace:
                return 0
        self._item(repo, "repo_folder", info.folder, None, "empty", "no revision, ref or blob left")
        return 1


def _has_entries(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except OSError:
        return False


def _etag_of(incomplete_name: str) -> str:
    """``<etag>.<random>.incomplete`` (huggingface_hub >= 1.x and hfcache), ``<etag>.incomplete`` (older
    huggingface_hub) or ``.<etag>.<random>.incomplete`` (hfcache's hardlink temp) -> ``<etag>``."""
    return incomplete_name.lstrip(".").split(".", 1)[0]


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _lock_held(path: str) -> bool:
    """Whether a live process holds the lock at ``path`` (huggingface_hub's ``WeakFileLock``, hfcache's
    ``file_lock``: both lock the blob's lock file while they download it). A missing lock file, or an empty one on a
    filesystem without flock (a flock-based run's leftover), is held by nobody."""
    with try_lock(Path(path)) as why:
        return bool(why)


# ------------------------------------------------------------------------------------------------ execution


def execute(plan: PrunePlan, *, on_item: Callable[[ItemOutcome], None] | None = None,
            lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
            on_lock_wait: Callable[[LockWait], None] | None = None) -> PruneResult:
    """Remove what ``plan`` lists, repo folder by repo folder, each under hfcache's repo lock.

    Before changing a folder, it is scanned again under the lock; an item whose reason no longer holds is skipped
    (see the module docstring). Within a folder: refs; ``.no_exist``/``trees/`` entries (while the snapshot still
    exists, so that a prune killed in between plans them again); snapshots (moved out of ``snapshots/`` atomically,
    then deleted); ``.locks`` files, then their blobs (each under its download lock when one exists);
    ``.incomplete`` files; leftovers of an interrupted prune; the empty folder.

    Args:
        plan: from :func:`plan_prune`.
        on_item: called after each item (progress).
        lock_timeout: seconds to wait at most for a repo's lock (another warm or prune changing that folder).
        on_lock_wait: told which lock it waits for, and who holds it, when a wait lasts a few seconds.

    Returns:
        PruneResult with one outcome per item, in plan order. OSErrors become ``failed`` outcomes (exit 5).

    Raises:
        CacheError: the repo lock cannot be created (read-only cache); LockTimeout (a CacheError) when a repo's lock
            stays held for ``lock_timeout`` seconds.
    """
    started = time.monotonic()
    root = Path(plan.cache_dir)
    by_folder: dict[str, list[PlanItem]] = {}
    for item in plan.items:
        by_folder.setdefault(item.folder, []).append(item)
    planned = {(r.folder, r.commit_hash): r for r in plan.revisions}
    outcomes: list[ItemOutcome] = []
    for folder, items in by_folder.items():
        first = items[0]
        repo = RepoFolder(root, first.repo_id, first.repo_type, lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
        try:
            lock = repo.repo_lock()
            lock.__enter__()
        except LockTimeout as exc:
            # Another warm or prune keeps this folder: its items fail (exit 5, naming the lock), the others go on.
            for item in items:
                outcomes.append(ItemOutcome(item, "failed", exc.message))
                if on_item:
                    on_item(outcomes[-1])
            continue
        except OSError as exc:
            raise cache_error(exc, f"prune {folder}") from exc
        try:
            for outcome in _execute_folder(root, folder, items, planned):
                outcomes.append(outcome)
                if on_item:
                    on_item(outcome)
        finally:
            lock.__exit__(None, None, None)
    return PruneResult(plan=plan, outcomes=tuple(outcomes), seconds=time.monotonic() - started)


def _execute_folder(root: Path, folder: str, items: list[PlanItem],
                    planned: dict[tuple[str, str], RevisionRemoval]) -> Iterable[ItemOutcome]:
    first = items[0]
    base = root / folder
    current = scan_repo(base, first.repo_id, first.repo_type)
    revisions = {r.commit_hash: r for r in current.revisions}
    refs_to: dict[str, set[str]] = {}
    for name, value in current.refs.items():
        refs_to.setdefault(value.strip(), set()).add(name)
    # Which planned revision removals still hold, now that we hold the lock.
    skipped: dict[str, str] = {}
    for commit in {i.revision for i in items if i.revision}:
        removal = planned.get((folder, commit))
        rev = revisions.get(commit)
        if removal is None or rev is None:
            continue
        new_refs = refs_to.get(commit, set()) - set(removal.refs)
        if new_refs:
            skipped[commit] = f"a ref points to it now ({', '.join(sorted(new_refs))})"
        elif rev.last_used > removal.last_used:
            skipped[commit] = "used since the plan was made"
    remaining = [r for r in current.revisions
                 if r.commit_hash in skipped or (folder, r.commit_hash) not in planned]
    used_etags = {f.etag for r in remaining for f in r.files if f.etag}
    used_inodes = {f.inode for r in remaining for f in r.files if f.inode is not None}

    for item in items:
        path = root / item.path
        try:
            if item.revision in skipped:
                yield ItemOutcome(item, "skipped", skipped[item.revision])
            elif item.kind == "ref":
                yield _remove_ref(item, path)
            elif item.kind == "snapshot":
                yield _remove_snapshot(item, path, base)
            elif item.kind in ("no_exist", "tree", "trash"):
                yield _remove_tree(item, path)
            elif item.kind == "blob":
                yield _remove_blob(item, path, root / ".locks" / folder / f"{path.name}.lock", used_etags,
                                   used_inodes)
            elif item.kind == "incomplete":
                yield _remove_incomplete(item, path, root / ".locks" / folder / f"{_etag_of(path.name)}.lock")
            elif item.kind == "lock":
                yield _remove_lock(item, path, used_etags)
            elif item.kind == "repo_folder":
                yield _remove_repo_folder(item, base)
            else:  # pragma: no cover - every kind is handled above
                yield ItemOutcome(item, "skipped", f"unknown kind {item.kind}")
        except OSError as exc:
            yield ItemOutcome(item, "failed", f"{exc.strerror or exc}: {exc.filename or path}")


def _remove_ref(item: PlanItem, path: Path) -> ItemOutcome:
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return ItemOutcome(item, "gone")
    if content.decode("utf-8", "replace").strip() != item.revision:
        return ItemOutcome(item, "skipped", f"now points to {content[:12].decode('utf-8', 'replace')}")
    path.unlink()
    return ItemOutcome(item, "removed")


def _remove_snapshot(item: PlanItem, path: Path, base: Path) -> ItemOutcome:
    if not os.path.lexists(path):
        return ItemOutcome(item, "gone")
    trash = base / TRASH
    make_dirs(trash, base, cache_policy(base.parent))  # shared: a prune killed here leaves it to others
    # One atomic rename takes the whole snapshot out of sight; deleting its entries one by one in place would let a
    # loader see half a snapshot (and transformers silently drops a missing chat template).
    aside = trash / f"{path.name}.{uuid.uuid4().hex[:8]}"
    os.rename(path, aside)
    shutil.rmtree(aside)
    _rmdir_quiet(trash)
    return ItemOutcome(item, "removed")


def _remove_tree(item: PlanItem, path: Path) -> ItemOutcome:
    if not os.path.lexists(path):
        return ItemOutcome(item, "gone")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    return ItemOutcome(item, "removed")


def _remove_blob(item: PlanItem, path: Path, lock_path: Path, used_etags: set[str],
                 used_inodes: set[tuple[int, int]]) -> ItemOutcome:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ItemOutcome(item, "gone")
    if path.name in used_etags or (st.st_dev, st.st_ino) in used_inodes:
        return ItemOutcome(item, "skipped", "a remaining revision uses it now")
    if not stat.S_ISREG(st.st_mode):
        return ItemOutcome(item, "skipped", "not a regular file")
    with _held(lock_path) as why:
        if why:
            return ItemOutcome(item, "skipped", why)
        path.unlink()
    return ItemOutcome(item, "removed")


def _remove_incomplete(item: PlanItem, path: Path, lock_path: Path) -> ItemOutcome:
    if not os.path.lexists(path):
        return ItemOutcome(item, "gone")
    with _held(lock_path) as why:
        if why:
            return ItemOutcome(item, "skipped", why)
        path.unlink()
    return ItemOutcome(item, "removed")


def _remove_lock(item: PlanItem, path: Path, used_etags: set[str]) -> ItemOutcome:
    # Before the blob: a prune killed between the two leaves a blob without a lock file (which the next prune
    # removes as unused), never a lock file nobody would plan to remove.
    etag = path.name[: -len(".lock")]
    if etag in used_etags:
        return ItemOutcome(item, "skipped", "a remaining revision uses its blob now")
    if not os.path.lexists(path):
        return ItemOutcome(item, "gone")
    with try_lock(path) as why:
        if why:
            return ItemOutcome(item, "skipped", why)
        # Unlinked while held: a process waiting on it then wins an unlinked inode, which filelock 4 notices
        # (st_nlink == 0) and re-opens the path; with an older filelock the worst case is one duplicate download,
        # never a corrupt cache, because every writer downloads to a private .incomplete file and renames it.
        # A soft marker (no flock) is ours while held: unlinking it is its release.
        path.unlink(missing_ok=True)
    return ItemOutcome(item, "removed")


def _remove_repo_folder(item: PlanItem, base: Path) -> ItemOutcome:
    if not base.exists():
        return ItemOutcome(item, "gone")
    for dirpath, dirnames, filenames in os.walk(base):
        rel = os.path.relpath(dirpath, base).replace(os.sep, "/")
        top = rel.split("/", 1)[0]
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        if (filenames or links) and top not in (".no_exist", "trees", TRASH):
            name = (filenames or links)[0]
            return ItemOutcome(item, "skipped", "not empty: " + (f"{rel}/{name}" if rel != "." else name))
    # The trash folder marks the removal as a prune's until the very end: a prune killed halfway leaves it, and the
    # next prune then removes the rest at once instead of waiting out the grace period of an empty folder.
    make_dirs(base / TRASH, base, cache_policy(base.parent))
    for sub in (".no_exist", "trees"):
        if (base / sub).exists():
            shutil.rmtree(base / sub)
    trash_entries = [e.path for e in os.scandir(base / TRASH)]
    for entry in trash_entries:
        shutil.rmtree(entry) if os.path.isdir(entry) and not os.path.islink(entry) else os.unlink(entry)
    # Bottom-up, snapshots/ last: a repo folder without snapshots/ is what huggingface_hub's scan calls corrupted.
    keep_last = (base, base / "snapshots", base / TRASH)
    try:
        for dirpath, _, _ in sorted(os.walk(base), key=lambda w: -w[0].count(os.sep)):
            if Path(dirpath) not in keep_last:
                os.rmdir(dirpath)
        if (base / "snapshots").exists():
            os.rmdir(base / "snapshots")
        os.rmdir(base / TRASH)
        os.rmdir(base)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return ItemOutcome(item, "skipped", f"not empty any more: {exc.filename}")
        raise
    return ItemOutcome(item, "removed")


def _rmdir_quiet(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _held(path: Path):
    """Hold the lock at ``path``, without waiting, while a blob is removed; ``as`` gives "" when held (or when there
    is no lock file: nobody downloads that blob), else why it could not be taken."""
    return try_lock(path)
