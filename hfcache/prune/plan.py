"""prune's records: the policy, the plan and its items, the outcome of executing it (frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CacheError, UsageError
from ..records import valid_repo_id

#: Folder inside a repo folder where snapshots wait for deletion (neither hfcache's scanner nor huggingface_hub's
#: ``scan_cache_dir`` reads it; on the same filesystem, so the move out of ``snapshots/`` is atomic).
TRASH = ".hfcache-trash"
#: ``.incomplete`` files, empty repo folders and detached revisions younger than this (seconds) are left alone: a
#: download may be in progress.
DEFAULT_GRACE = 3600.0
#: Item kinds in execution order within a repo folder.
KINDS = ("ref", "no_exist", "tree", "snapshot", "lock", "blob", "payload", "incomplete", "trash", "repo_folder")


@dataclass(frozen=True)
class KeepSpec:
    """A ``--keep REPO_ID[@REVISION]``: ``repo_id`` as the cache folder names it (any type); ``revision`` a ref name
    or a 40-hex commit (None keeps every revision of the repo)."""

    repo_id: str
    revision: str | None = None

    @classmethod
    def parse(cls, spec: str) -> KeepSpec:
        """``org/name``, ``org/name@main`` or ``org/name@<40 hex>``; UsageError: malformed id or empty revision."""
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
    """What a plan was computed from: ``older_than`` (seconds; revisions unused for longer go), ``max_size``
    (bytes; least-recently-used revisions go until the cache fits), ``keep`` (pinned on the command line),
    ``keep_locks`` (lock files whose revisions are pinned), ``grace`` (seconds; younger ``.incomplete`` files,
    empty repo folders and detached revisions used more recently are left alone), ``superseded`` (a detached revision
    of a repo whose refs name another revision goes at once, whatever the grace)."""

    older_than: float | None = None
    max_size: int | None = None
    keep: tuple[KeepSpec, ...] = ()
    keep_locks: tuple[str, ...] = ()
    grace: float = DEFAULT_GRACE
    superseded: bool = False


@dataclass(frozen=True)
class GraceKept:
    """What the grace period keeps that would go without it: ``kind`` ``revision`` (detached) or ``incomplete`` (a
    partial download); ``path`` relative to the cache root; ``revision`` (the commit, for a revision);
    ``last_used`` (seconds since the epoch: the snapshot's last use, the file's mtime); ``why`` (one line)."""

    repo_id: str
    repo_type: str
    kind: str
    path: str
    revision: str | None
    last_used: float
    why: str


@dataclass(frozen=True)
class PlanItem:
    """One path the plan removes: ``kind`` (:data:`KINDS`; a ``payload``: a shared Xet store file whose last links
    the plan removes, listed with the repo of its last link), the repo (``repo_id``, ``repo_type``, ``folder``),
    ``path`` (``/``-separated, relative to the cache root), the ``revision`` it belongs to, ``reason`` (``detached``,
    ``superseded``, ``older_than``, ``over_budget``, ``unused``: only removed revisions used the blob, ``orphan``: no
    snapshot used it, ``stale_incomplete``, ``interrupted``: left by a killed prune, or ``empty``), ``detail`` (one
    line for people),
    ``bytes_freed`` (counted on the item removing a content's last name in the cache; 0 when hardlinks outside the
    cache keep it; a store link 0, its payload item the payload's bytes)."""

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
    """A revision the plan removes (its items are in :attr:`PrunePlan.items`): ``refs`` pointing to it when
    planned, ``last_used`` (seconds since the epoch: a later use cancels the removal), ``size_on_disk`` (bytes of
    its distinct contents), ``reason`` (``detached``, ``older_than``, ``over_budget``), ``detail``, ``bytes_freed``
    (contents no remaining revision or repo holds)."""

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
    """Everything a prune would remove, and why; :func:`execute` runs exactly this. ``now``: seconds since the epoch
    ages are measured against; ``items``: grouped by repo folder (sorted), in execution order, payloads last;
    ``revisions``: in policy order (detached, age, LRU); ``pinned``: (repo_type, repo_id, commit) of every pinned
    revision present; ``bytes_before``: every distinct content once, as ``hfcache ls``; ``bytes_freed``: the items'
    sum; ``bytes_pinned``: the pinned revisions' contents; ``warnings``: e.g. a budget pinned revisions make
    impossible, a ``--keep`` matching nothing; ``unreadable``: ``<folder>/<part>`` of repos left alone because this
    user cannot read all of them (the prune then exits 5); ``empty``: the cache folder exists and holds nothing;
    ``kept``: what only the grace period keeps, and why."""

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
    kept: tuple[GraceKept, ...] = ()

    @property
    def bytes_kept(self) -> int:
        return self.bytes_before - self.bytes_freed

    @property
    def budget_met(self) -> bool:
        """False when ``max_size`` is set and the cache stays above it (pinned revisions hold too much)."""
        return self.policy.max_size is None or self.bytes_kept <= self.policy.max_size


@dataclass(frozen=True)
class ItemOutcome:
    """What :func:`execute` did with one item: ``status`` ``removed``, ``gone`` (already absent), ``skipped`` (its
    reason no longer holds: ``note`` says why) or ``failed`` (an OSError: ``note``); ``bytes_freed``: what a
    payload's sweep measured when it differs from the plan, else None (the planned bytes when ``removed``, else 0)."""

    item: PlanItem
    status: str
    note: str = ""
    bytes_freed: int | None = None


@dataclass(frozen=True)
class PruneResult:
    """The outcome of :func:`execute`: the ``plan``, one outcome per item (in plan order), the wall ``seconds``."""

    plan: PrunePlan
    outcomes: tuple[ItemOutcome, ...]
    seconds: float

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def bytes_freed(self) -> int:
        """Bytes of the items removed (planned bytes, or what a payload's sweep measured)."""
        return sum(o.item.bytes_freed if o.bytes_freed is None else o.bytes_freed
                   for o in self.outcomes if o.status == "removed")

    @property
    def ok(self) -> bool:
        return not any(o.status == "failed" for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        """0, or 5 (cache error) when an item could not be removed or a repo could not be read."""
        return 0 if self.ok and not self.plan.unreadable else CacheError.exit_code
