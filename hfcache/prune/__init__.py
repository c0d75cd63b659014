"""prune: keep a shared cache within age and size budgets, never touching what is pinned or in use.

Library gap (docs/cache-layout.md, 'Traps the libraries leave'): ``hf cache prune`` removes only detached revisions
and deletes every ``.incomplete`` file, another process's live download included; it has no age or size policy and
no pinned revisions. As huggingface_hub's ``DeleteCacheStrategy`` (``utils/_cache_manager.py``), two steps:
:func:`plan_prune` computes a frozen :class:`PrunePlan` from metadata alone (:mod:`hfcache.cache.scan`), and
:func:`execute` runs exactly that plan (``--dry-run`` prints it).

Policy (:mod:`.policy`; pinned revisions are never removed): housekeeping (:mod:`.housekeeping`: blobs no snapshot
uses, ``.incomplete`` files older than ``grace`` whose download lock is free, an interrupted prune's leftovers),
then detached revisions (no ref points to them, unless used within ``grace``), revisions unused for longer than
``older_than``, least-recently-used revisions until the cache fits ``max_size`` (sizes as ``hfcache ls`` counts
them). With a revision go its refs, snapshot, ``.no_exist`` markers, ``trees/`` listing, the blobs no remaining
revision uses and their ``.locks`` files; a repo folder left with nothing goes too. :mod:`.inventory` keeps the
ledger of items and bytes; :mod:`.store` handles huggingface_hub 2.4's shared Xet blob store.

Execution (:mod:`.executor`) is safe next to a running ``hfcache warm``: each repo folder is changed under warm's
repo lock after being re-read, and an item whose reason no longer holds is skipped, never forced. A prune killed at
any point leaves a cache that verifies, and the next prune finishes the job.
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
