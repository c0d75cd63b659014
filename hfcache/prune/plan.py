"""prune's records: the policy, the plan and its items, the outcome of executing it (frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CacheError, UsageError
from ..records import valid_repo_id

__all__ = ["DEFAULT_GRACE", "KINDS", "TRASH", "ItemOutcome", "KeepSpec", "PlanItem", "PrunePlan", "PrunePolicy",
           "PruneResult", "RevisionRemoval"]

#: Folder inside a repo folder where snapshots wait for deletion (neither hfcache's scanner nor huggingface_hub's
#: ``scan_cache_dir`` reads it, and it is on the same filesystem, so the move out of ``snapshots/`` is atomic).
TRASH = ".hfcache-trash"
#: ``.incomplete`` files, empty repo folders and detached revisions younger than this (seconds) are left alone: a
#: download may be in progress.
DEFAULT_GRACE = 3600.0

#: Item kinds in execution order within a repo folder.
KINDS = ("ref", "no_exist", "tree", "snapshot", "lock", "blob", "payload", "incomplete", "trash", "repo_folder")


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
        kind (str): ``ref``, ``no_exist``, ``tree``, ``snapshot``, ``lock``, ``blob``, ``payload``, ``incomplete``,
            ``trash`` or ``repo_folder`` (see :data:`KINDS`, in execution order). A ``payload`` is a file of
            huggingface_hub 2.4's shared Xet store (``path`` ``blobs/<h[:2]>/<h>``) that the removed repo links
            were the last users of; it is listed with the repo of its last link and swept after every folder.
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
            item that removes its last name in the cache; 0 when hardlinks outside the cache keep it; a blob that
            is a link into the shared store counts 0, its payload item the payload's bytes).
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
        empty (bool): the cache folder exists and holds nothing (a fresh volume): "empty cache: nothing to prune".
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
    empty: bool = False

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
        bytes_freed (int | None): bytes actually freed when they differ from the plan's (a payload whose sweep
            found another hardlink keeping it); None: the item's planned bytes when ``removed``, else 0.
    """

    item: PlanItem
    status: str
    note: str = ""
    bytes_freed: int | None = None


@dataclass(frozen=True)
class PruneResult:
    """The outcome of :func:`execute`.

    Attributes:
        plan (PrunePlan): the plan executed.
        outcomes (tuple[ItemOutcome, ...]): one per plan item, in plan order except that ``payload`` items (swept
            after every repo folder) come last.
        seconds (float): wall time of the execution.
    """

    plan: PrunePlan
    outcomes: tuple[ItemOutcome, ...]
    seconds: float

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def bytes_freed(self) -> int:
        """Bytes of the items actually removed (planned bytes of ``removed`` items, or what a payload's sweep
        measured)."""
        return sum(o.item.bytes_freed if o.bytes_freed is None else o.bytes_freed
                   for o in self.outcomes if o.status == "removed")

    @property
    def ok(self) -> bool:
        return not any(o.status == "failed" for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        """0, or 5 (cache error) when an item could not be removed or a repo could not be read."""
        return 0 if self.ok and not self.plan.unreadable else CacheError.exit_code
