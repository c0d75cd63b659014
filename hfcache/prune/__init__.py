"""prune: keep a shared cache within age and size budgets, never touching what is pinned or in use (docs/prune.md).

As huggingface_hub's ``DeleteCacheStrategy``, two steps: :func:`plan_prune` (:mod:`.policy`, from metadata alone)
computes a frozen :class:`PrunePlan`; :func:`execute` (:mod:`.executor`) runs exactly that plan.
"""

from .executor import execute
from .plan import KeepSpec, PrunePlan, PruneResult
from .policy import plan_prune

__all__ = ["KeepSpec", "PrunePlan", "PruneResult", "execute", "plan_prune"]
