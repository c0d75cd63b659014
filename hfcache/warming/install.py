"""warm --lock: install exactly what a lock pins, with zero network when the cache already holds it.

The check is ``stat`` calls only (:func:`hfcache.warming.lockfile.cache_status`); huggingface_hub and the HTTP client are
imported only when something is actually missing, so an image rebuild or an init container on a warm volume costs
milliseconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from ..cache.root import resolve_cache_dir
from .lockfile import CacheStatus, Lockfile, cache_statuses
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from ..records import ProgressSink, RepoResult, WarmedFile, WarmReport


def _satisfied_result(status: CacheStatus) -> RepoResult:
    """A repo the cache already holds: no request was made, so no endpoint is named (``endpoint=None``)."""
    repo = status.repo
    return RepoResult(
        request=repo.request,
        endpoint=None,
        canonical_id=repo.canonical_id,
        commit_hash=repo.commit_hash,
        files=tuple(WarmedFile(f.path, f.size, f.hash, "cached") for f in repo.files),
        absent=repo.absent,
        metadata="lock",
    )


def warm_lock(
    lock: Lockfile,
    *,
    cache_dir: str | Path | None = None,
    endpoint: str | Sequence[str] | None = None,
    token: str | bool | None = None,
    max_workers: int = 8,
    timeout: float = 10.0,
    progress: ProgressSink | None = None,
    retries: int = 5,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_lock_wait: Callable[[LockWait], None] | None = None,
    withheld: Collection[str] = (),
    on_notice: Callable[[str], None] | None = None,
) -> WarmReport:
    """Make ``cache_dir`` hold exactly what ``lock`` pins.

    Repos the cache already satisfies (size check only) cost no request. The others are downloaded by commit and
    every file is checked against the lock's hash: bytes that differ, or a commit the endpoint no longer has, fail
    that repo and nothing of it becomes visible.

    Args: as :func:`hfcache.warming.orchestrate.warm` (``withheld``: the manifest's endpoints that get no token,
    :attr:`hfcache.warming.project.LockInstall.withheld`).

    Returns:
        WarmReport with one result per locked repo, in lock order.

    Raises:
        UsageError, CacheError: as :func:`hfcache.warming.orchestrate.warm`.
    """
    started = time.monotonic()
    root = resolve_cache_dir(cache_dir)
    statuses = cache_statuses(lock, root)
    named = [endpoint] if isinstance(endpoint, str) or endpoint is None else (list(endpoint) or [None])
    # The endpoints configured, as warm reports them (none is asked anything when the cache satisfies the lock).
    endpoints = tuple((e or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/") for e in named)
    results: list[RepoResult | None] = [_satisfied_result(s) if s.satisfied else None for s in statuses]
    todo = [s.repo for s in statuses if not s.satisfied]
    if todo:
        from ..hub.session import prepare_session

        prepare_session()  # the HTTP client is made while hfcache.warming.orchestrate imports (hub/session.py)
        from .orchestrate import warm  # the network path: only now pay for huggingface_hub's import

        report = warm([r.request for r in todo], cache_dir=root, endpoint=endpoint, token=token,
                      max_workers=max_workers, timeout=timeout, progress=progress, pinned=todo, retries=retries,
                      lock_timeout=lock_timeout, on_lock_wait=on_lock_wait, withheld=withheld, on_notice=on_notice)
        endpoints = report.endpoints
        fetched = iter(report.repos)
        results = [r if r is not None else next(fetched) for r in results]
    return WarmReport(cache_dir=str(root), repos=tuple(r for r in results if r is not None),
                      seconds=time.monotonic() - started, endpoints=endpoints)
