"""prune: keep a shared cache within age and size budgets, never touching what is pinned or in use.

Library gap (docs/cache-layout.md, 'Traps the libraries leave'): ``hf cache prune`` removes only detached revisions
and deletes every ``.incomplete`` file, including another process's live download; it has no age or size policy and
no notion of pinned revisions.

Two steps, as huggingface_hub's ``DeleteCacheStrategy`` (``utils/_cache_manager.py``): :func:`plan_prune` computes a
frozen :class:`PrunePlan` from metadata alone (the one scanner, :mod:`hfcache.cache.scan`), and :func:`execute` runs exactly
that plan. ``--dry-run`` prints the plan; a real run executes the same plan.

Policy, in order (pinned revisions are never removed):

1. housekeeping: blobs no snapshot uses, ``.incomplete`` files older than ``grace`` (an hour) whose download lock
   (``.locks/<folder>/<etag>.lock``, held by huggingface_hub and hfcache while they download) is not held, what an
   interrupted prune left behind;
2. detached revisions: no ref points to them (a ref with stray whitespace still counts as pointing), unless used
   within ``grace`` (huggingface_hub creates the snapshot folder of a download by commit hash, which gets no ref,
   before the first file arrives);
3. revisions whose last use (:mod:`hfcache.cache.scan`: newest of blob atimes, snapshot folder mtime, ref mtimes) is
   older than ``older_than``;
4. least-recently-used revisions until the cache is at most ``max_size`` bytes (sizes as ``hfcache ls`` counts
   them: every distinct content once).

With a revision go its refs, its snapshot, its ``.no_exist/<commit>`` markers and ``trees/<commit>.json`` listing, the
blobs no remaining revision uses and their ``.locks`` files; a repo folder left with nothing is removed.

Execution is safe next to a running ``hfcache warm``: each repo folder is changed under the repo lock warm holds
(:meth:`hfcache.cache.layout.RepoFolder.repo_lock`), after re-reading the folder; an item whose reason no longer holds (a
ref now points to the revision, the revision was used since the plan, a remaining revision now uses the blob, a
download holds the blob's lock) is skipped, never forced. Within a repo, refs go first, then the revision's markers
and listing, then its snapshot, then blobs, so that no loader ever sees a link to a missing blob; a snapshot is first
renamed out of ``snapshots/`` (atomic) and then deleted, so a loader never sees half a snapshot. A prune killed at
any point leaves a cache that verifies, and the next prune finishes the job: every step leaves either the item
itself or something the next plan removes again (a revision without its ref is detached, a blob without a snapshot
is an orphan, a snapshot moved aside sits in the repo's trash folder).

Modules: :mod:`.plan` (the records: policy, plan, outcomes), :mod:`.policy` (:func:`plan_prune`: which revisions go and why),
:mod:`.housekeeping` (orphans, stale downloads, leftovers, lock files, empty folders), :mod:`.inventory` (the ledger
of items and bytes both fill), :mod:`.store` (huggingface_hub 2.4's shared Xet blob store: which payloads a removal
frees, their sweep under the per-hash lock), :mod:`.executor` (:func:`execute`).

The shared store (``utils/_shared_blobs.py``): a repo blob that links into it frees nothing itself; its payload is
freed (a ``payload`` item) when the plan removes its last repo link, the payload's ``.refs`` manifest names exactly
those links, and no hardlink keeps it; payloads no repo links to any more (a repo folder deleted by hand) go as
housekeeping, as in ``hf cache prune``. A missing, unreadable or hostile manifest keeps the payload (a warning).
"""

from .executor import execute
from .plan import (
    DEFAULT_GRACE,
    KINDS,
    TRASH,
    ItemOutcome,
    KeepSpec,
    PlanItem,
    PrunePlan,
    PrunePolicy,
    PruneResult,
    RevisionRemoval,
)
from .policy import plan_prune

__all__ = ["DEFAULT_GRACE", "KINDS", "TRASH", "ItemOutcome", "KeepSpec", "PlanItem", "PrunePlan", "PrunePolicy",
           "PruneResult", "RevisionRemoval", "execute", "plan_prune"]
