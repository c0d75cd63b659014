"""The pull-through mirror's budget: ``serve --max-size`` keeps the cache within a size with prune's planner
(:func:`hfcache.prune.plan_prune`, least recently used revisions first), in a background thread."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..prune import execute, plan_prune
from .metrics import MirrorMetrics

logger = logging.getLogger("hfcache.serve.pullthrough")  # the mirror's log


class Pruner:
    """Keeps the cache within ``max_size`` with prune's planner, in a background thread (requests coalesce)."""

    def __init__(self, root: Path, max_size: int, metrics: MirrorMetrics) -> None:
        self.root, self.max_size, self.metrics = root, max_size, metrics
        self._wanted = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="hfcache-serve-prune", daemon=True)
        self._thread.start()
        self.request()  # a cache already over budget at start

    def request(self) -> None:
        self._wanted.set()

    def close(self) -> None:
        self._closed = True
        self._wanted.set()

    def _loop(self) -> None:
        while True:
            self._wanted.wait()
            if self._closed:
                return
            self._wanted.clear()
            try:
                plan = plan_prune(self.root, max_size=self.max_size)
                if plan.revisions:
                    result = execute(plan)
                    logger.info("pruned %d revision(s), %d bytes", len(plan.revisions), result.bytes_freed)
                    self.metrics.cache_changed()
            except Exception:  # the mirror keeps serving; the next fetch tries again
                logger.warning("prune to --max-size failed", exc_info=True)
