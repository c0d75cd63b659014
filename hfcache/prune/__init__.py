"""prune: keep a shared cache within age and size budgets, never touching what is pinned or in use (docs/prune.md:
the policy, what goes with a revision, why it is safe next to ``hfcache warm``).

As huggingface_hub's ``DeleteCacheStrategy``, two steps: :func:`plan_prune` (:mod:`.policy`, from metadata alone)
computes a frozen :class:`PrunePlan`; :func:`execute` (:mod:`.executor`) runs exactly that plan. :mod:`.inventory`
keeps the ledger of items and bytes, :mod:`.housekeeping` the blobs and files no revision needs, :mod:`.store`
huggingface_hub 2.4's shared Xet blob store.
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
