"""warm: download a selection of repo files into a cache, verified, in huggingface_hub's own layout. :func:`warm_repos`
runs one :class:`.repo_job.RepoJob` per repo, all at once; a repo becomes visible only when every blob is in place
and hash-checked (library gap: docs/cache-layout.md, 'Traps the libraries leave').
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from huggingface_hub.utils import get_token

from .. import pools
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from ..cache.root import ensure_cache_root, resolve_cache_dir, symlinks_supported
from ..errors import HubError, UsageError
from ..hub.client import HubClient
from ..hub.files import RepoRevision
from ..hub.slots import Slots
from ..hub.urls import validate_endpoint
from ..records import TRUST_ENDPOINT_ENV, HubOptions, NoProgress, ProgressSink, RepoResult, WarmReport, WarmRequest
from . import undo
from .repo_job import InFlight, RepoJob

if TYPE_CHECKING:  # the lock file's module (and tomllib) is not needed to warm by name (docs/benchmarks.md)
    from .lockfile import LockedRepo

_PUBLISH_GRACE = 0.5  # seconds an interrupted warm waits for repos in the middle of publishing
_REPO_THREADS = 64  # repos warmed at once (their connections are bounded by max_workers)
_WITHHELD_HINT = (f"the token was not sent to this endpoint, named by the manifest: pass --trust-manifest-endpoint "
                  f"(or set {TRUST_ENDPOINT_ENV}=1) if you trust it")


def warm(requests: Sequence[WarmRequest], *, cache_dir: str | Path | None = None,
         endpoint: str | Sequence[str] | None = None, token: str | bool | None = None,
         max_workers: int = HubOptions.max_workers, timeout: float = HubOptions.timeout,
         progress: ProgressSink | None = None, pinned: Sequence[LockedRepo] | None = None,
         retries: int = HubOptions.retries,
         lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_lock_wait: Callable[[LockWait], None] | None = None,
         withheld: Collection[str] = (), on_notice: Callable[[str], None] | None = None) -> WarmReport:
    """Warm every request into ``cache_dir`` (``hfcache.warm``, the Python API); a failed repo never stops the others.

    Args:
        endpoint: Hub base URL, or several tried in order per repo (one that cannot serve a repo: not found,
            unreachable, bad bytes, gated, passes it on). token, timeout, retries, max_workers, withheld: as
            :class:`hfcache.records.HubOptions` (``on_notice`` is told once when a token is withheld).
        pinned: one locked repo per request (``warm --lock``): its commit, files and hashes, no resolution.
        lock_timeout: seconds to wait for a lock another process holds (then that repo fails, exit 5).

    Returns WarmReport with one RepoResult per request, in request order.
    Raises UsageError: ``max_workers`` < 1, ``timeout`` <= 0, ``retries`` < 0, ``lock_timeout`` < 0, a bad endpoint.
    CacheError: the cache root cannot be created or written (no repo is attempted then)."""
    hub = HubOptions(endpoints=endpoint, token=token, timeout=timeout, retries=retries, max_workers=max_workers,
                     withheld=tuple(withheld))
    return warm_repos(requests, hub, cache_dir=cache_dir, progress=progress, pinned=pinned, lock_timeout=lock_timeout,
                      on_lock_wait=on_lock_wait, on_notice=on_notice)


def warm_repos(requests: Sequence[WarmRequest], hub: HubOptions, *, cache_dir: str | Path | None = None,
               progress: ProgressSink | None = None, pinned: Sequence[LockedRepo] | None = None,
               lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_lock_wait: Callable[[LockWait], None] | None = None,
               on_notice: Callable[[str], None] | None = None,
               clients: Sequence[HubClient] | None = None) -> WarmReport:
    """:func:`warm` with the Hub options in one record (arguments as :func:`warm`); ``clients``: the endpoints to
    fetch from instead of ``hub``'s (``hfcache pull s3://``'s :class:`hfcache.bucket.pull.BucketClient`)."""
    if lock_timeout < 0:
        raise UsageError(f"--lock-timeout must not be negative, got {lock_timeout}")
    started = time.monotonic()
    root = resolve_cache_dir(cache_dir)
    for named in hub.endpoints or (os.environ.get("HF_ENDPOINT"),):
        if named:
            validate_endpoint(named)  # a malformed endpoint is a usage error before anything is created
    created = not os.path.lexists(root)
    ensure_cache_root(root)  # before the token is read: an unreadable cache is the error worth naming first
    clients = list(clients) if clients else make_clients(hub, on_notice=on_notice)
    results = _run_jobs(requests, root, clients, max_workers=hub.max_workers, sink=progress or NoProgress(),
                        pinned=pinned, lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
    if created and not any(r.ok for r in results):  # every repo failed (a mistyped id): no new cache folder stays
        undo.drop_new_root(root)
    return WarmReport(cache_dir=str(root), repos=results, seconds=time.monotonic() - started,
                      endpoints=tuple(c.endpoint for c in clients))


def _run_jobs(requests: Sequence[WarmRequest], root: Path, clients: list[HubClient], *, max_workers: int,
              sink: ProgressSink, pinned: Sequence[LockedRepo] | None, lock_timeout: float,
              on_lock_wait: Callable[[LockWait], None] | None) -> tuple[RepoResult, ...]:
    """One :class:`RepoJob` per request, all at once; results in request order. Ctrl-C/SIGTERM stops them."""
    use_symlinks = symlinks_supported(root)
    stop = threading.Event()  # set on Ctrl-C/SIGTERM: downloads abort at their next chunk, nothing more is published
    slots = Slots(max_workers)
    files_pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hfcache-file")
    # A thread per repo: a repo beyond the first max_workers must not wait for a whole repo before it is resolved;
    # connections stay bounded by ``slots`` (resolutions and file transfers alike).
    repos_pool = ThreadPoolExecutor(max_workers=min(len(requests), _REPO_THREADS) or 1,
                                    thread_name_prefix="hfcache-repo")
    inflight = InFlight()
    futures = [
        repos_pool.submit(RepoJob(i, req, root, clients, files_pool, sink, use_symlinks, slots,
                                  pinned=pinned[i] if pinned else None, stop=stop, inflight=inflight,
                                  lock_timeout=lock_timeout, on_lock_wait=on_lock_wait).run)
        for i, req in enumerate(requests)
    ]
    try:
        results = tuple(pools.ordered(futures))  # never a wait Ctrl-C/SIGTERM cannot interrupt (pools.py)
    except BaseException:
        # Workers stop at their next chunk and keep their partial files; one blocked on a silent socket is not
        # waited for (SIGTERM must take effect within a second).
        stop.set()
        for pool in (repos_pool, files_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        # A repo already publishing (milliseconds) finishes it: an exit now never leaves half a snapshot.
        wait_futures(futures, timeout=_PUBLISH_GRACE)
        raise
    for pool in (repos_pool, files_pool):
        pool.shutdown(wait=True)
    return results


def make_clients(hub: HubOptions, *, on_notice: Callable[[str], None] | None = None) -> list[HubClient]:
    """One HubClient per endpoint of ``hub``, in order (``HF_ENDPOINT`` or the Hub when it names none), each with the
    token (``hub.read_token()``, else huggingface_hub's) unless ``hub.withheld`` names it (``on_notice`` is told once).
    Raises UsageError: an endpoint not an http(s) URL, an unreadable token file, a malformed HFCACHE_* setting."""
    token = hub.read_token().token
    resolved = None if token is False else get_token() if token is None or token is True else token
    skip = {e.rstrip("/") for e in hub.withheld}
    clients, anonymous = [], []
    for e in hub.endpoints or (None,):
        kept = resolved if e is None or e.rstrip("/") not in skip else None
        if resolved and kept is None:
            anonymous.append(e.rstrip("/"))
        clients.append(HubClient(endpoint=e, token=kept, timeout=hub.timeout, retries=hub.retries,
                                 withheld_hint=_WITHHELD_HINT if resolved and kept is None else None))
    if anonymous and on_notice is not None:
        on_notice(f"the Hub token is not sent to the manifest's endpoint {', '.join(anonymous)}: warming from it "
                  f"anonymously (pass --trust-manifest-endpoint or set {TRUST_ENDPOINT_ENV}=1 to send it)")
    return clients


def user_client(hub: HubOptions) -> HubClient:
    """The client of the endpoint the user configured: ``hub``'s first, else ``HF_ENDPOINT``, else the Hub."""
    return make_clients(replace(hub, endpoints=hub.endpoints[:1]))[0]


def resolve_revision(request: WarmRequest, clients: Sequence[HubClient]) -> RepoRevision:
    """Resolve ``request``'s revision on the endpoints in order, as a repo job does (a Hub-side failure moves on):
    a RepoRevision with every file's size and hash. Raises HubError: the last endpoint's, naming the others'."""
    failures: list[str] = []
    for n, client in enumerate(clients):
        try:
            counter = client.counter()
            repo = client.resolve(request.repo_id, request.revision, request.repo_type, counter=counter)
            return client.describe(repo, repo.paths, counter)
        except HubError as exc:
            if n < len(clients) - 1:
                failures.append(f"{client.endpoint}: {exc.message}")
                continue
            if failures:
                raise type(exc)(f"{exc.message} (also tried: {'; '.join(failures)})", hint=exc.hint) from None
            raise
    raise UsageError("no endpoint to resolve from")


def fetch_pinned(locked: LockedRepo, *, cache_dir: str | Path, hub: HubOptions) -> RepoResult:
    """The pull-through mirror's fetch of ``locked`` with ``warm --lock``'s code path (the request's revision is the
    ref written). Returns the RepoResult (``error_type``: what failed). Raises CacheError: the cache is unwritable."""
    return warm_repos([locked.request], hub, cache_dir=cache_dir, pinned=[locked]).repos[0]
