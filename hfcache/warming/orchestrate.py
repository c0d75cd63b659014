"""warm: download a selection of repo files into a cache, verified, in huggingface_hub's own layout.

The entry points (:func:`warm`, :func:`fetch_pinned`, :func:`resolve_revision`) run one
:class:`hfcache.warming.repo_job.RepoJob` per repo, all at once. Per repo: one request resolves the revision and lists
every file with its hash (``hfcache.hub.client.HubClient.resolve``); :mod:`hfcache.warming.selection` picks the files
(``HubClient.describe`` fills in sizes and hashes with one HEAD per file where the endpoint's listing has none); each
missing blob is downloaded by :mod:`hfcache.hub.transfer` to ``blobs/<etag>.<random>.incomplete`` (resuming a
leftover; large files in parallel ranges), hashed in order, and renamed into place only when size and hash match.
Only when every blob of the repo is in place does the repo become visible (:mod:`hfcache.warming.publish`), in
huggingface_hub's order: snapshot links, ``.no_exist`` markers, and the ref last. A failed repo leaves no snapshot
entry and no ref behind.

Library gap: ``hf_hub_download``/``snapshot_download`` publish a file as soon as its bytes arrive and check only
its size (docs/cache-layout.md, 'Hashes'; docs/security.md); they also never write ``.no_exist`` markers for files a
repo lacks, which transformers 5 needs to load a tokenizer offline (docs/cache-layout.md, 'Traps the libraries leave').
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import TYPE_CHECKING

from huggingface_hub.utils import get_token

from .. import pools
from ..cache.root import ensure_cache_root, resolve_cache_dir, symlinks_supported
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from ..errors import HubError, UsageError
from ..hub.client import HubClient
from ..hub.files import RepoRevision
from ..hub.retry import DEFAULT_RETRIES
from ..hub.transfer import Slots
from ..hub.urls import validate_endpoint
from ..records import NoProgress, ProgressSink, RepoResult, WarmReport, WarmRequest
from .repo_job import InFlight, RepoJob

if TYPE_CHECKING:  # the lock file's module (and tomllib) is not needed to warm by name (docs/benchmarks.md)
    from .lockfile import LockedRepo

_PUBLISH_GRACE = 0.5  # seconds an interrupted warm waits for repos in the middle of publishing
#: Repos warmed at once (threads; their connections are bounded by ``max_workers``).
_REPO_THREADS = 64


def resolve_token(token: str | bool | None) -> str | None:
    """``None`` -> the token huggingface_hub would use (``HF_TOKEN``, then the token file); ``False`` -> none."""
    if token is False:
        return None
    if token is None or token is True:
        return get_token()
    return token


def warm(
    requests: Sequence[WarmRequest],
    *,
    cache_dir: str | Path | None = None,
    endpoint: str | Sequence[str] | None = None,
    token: str | bool | None = None,
    max_workers: int = 8,
    timeout: float = 10.0,
    progress: ProgressSink | None = None,
    pinned: Sequence[LockedRepo] | None = None,
    retries: int = DEFAULT_RETRIES,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_lock_wait: Callable[[LockWait], None] | None = None,
    withheld: Collection[str] = (),
    on_notice: Callable[[str], None] | None = None,
) -> WarmReport:
    """Warm every request into ``cache_dir``; a failed repo never stops the others.

    Args:
        requests: the repos to warm.
        cache_dir: cache root (default: ``HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``).
        endpoint: Hub base URL, or several tried in order per repo (an in-cluster mirror first): a repo that an
            endpoint cannot serve (not found, unreachable, bytes failing the hash check, gated) is tried on the next,
            with the same checks; ``RepoResult.endpoint`` says which one served it. Default: ``HF_ENDPOINT`` or the
            public Hub.
        token: Hub token; None reads it as huggingface_hub does, False sends none. Never logged or stored.
        max_workers: connections at once (repo resolutions, files and the ranges of large files, across all repos),
            >= 1.
        timeout: seconds to wait for a connection or for any byte of an answer.
        retries: retries of a transient failure (429, 502-504, a cut connection) per request or file download,
            with exponential backoff and jitter, honouring ``Retry-After`` (:mod:`hfcache.hub.retry`); >= 0.
        progress: optional receiver of progress events.
        pinned: one locked repo per request (``warm --lock``): no resolution request; the lock's commit, files
            and hashes are used, so bytes that differ from the lock are refused.
        lock_timeout: seconds to wait at most for a lock another process holds (a repo another warm or prune
            changes, a blob another process downloads); then that repo fails with exit 5 naming the lock.
        on_lock_wait: told (once per lock, after a few seconds) which lock a repo waits for and who holds it.
        withheld: endpoints that get no token (a manifest's endpoint without the opt-in,
            :func:`hfcache.warming.manifest.withheld_endpoints`); warmed from anonymously.
        on_notice: told once, in one line, when a token exists and ``withheld`` keeps it from an endpoint.

    Returns:
        WarmReport with one RepoResult per request, in request order.

    Raises:
        UsageError: ``max_workers`` < 1, ``timeout`` <= 0 or ``retries`` < 0.
        CacheError: the cache root cannot be created or written (no repo is attempted then).
    """
    _check_arguments(retries=retries, max_workers=max_workers, timeout=timeout, lock_timeout=lock_timeout)
    started = time.monotonic()
    root = resolve_cache_dir(cache_dir)
    for named in ([endpoint] if isinstance(endpoint, str) else endpoint) or [os.environ.get("HF_ENDPOINT")]:
        if named:
            validate_endpoint(named)  # a malformed endpoint is a usage error before anything is created
    ensure_cache_root(root)  # before the token is read: an unreadable cache is the error worth naming first
    clients = make_clients(endpoint, token, timeout, retries, withheld=withheld, on_notice=on_notice)
    results = _run_jobs(requests, root, clients, max_workers=max_workers, sink=progress or NoProgress(),
                        pinned=pinned, lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
    return WarmReport(cache_dir=str(root), repos=results, seconds=time.monotonic() - started,
                      endpoints=tuple(c.endpoint for c in clients))


def _check_arguments(*, retries: int, max_workers: int, timeout: float, lock_timeout: float) -> None:
    """Raise UsageError for a value :func:`warm` cannot run with."""
    if retries < 0:
        raise UsageError(f"--retries must be at least 0, got {retries}")
    if max_workers < 1:
        raise UsageError(f"--max-workers must be at least 1, got {max_workers}")
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout}")
    if lock_timeout < 0:
        raise UsageError(f"--lock-timeout must not be negative, got {lock_timeout}")


def _run_jobs(requests: Sequence[WarmRequest], root: Path, clients: list[HubClient], *, max_workers: int,
              sink: ProgressSink, pinned: Sequence[LockedRepo] | None, lock_timeout: float,
              on_lock_wait: Callable[[LockWait], None] | None) -> tuple[RepoResult, ...]:
    """One :class:`RepoJob` per request, all at once; their results in request order. Ctrl-C or SIGTERM stops them
    (:data:`_PUBLISH_GRACE`) and is re-raised."""
    use_symlinks = symlinks_supported(root)
    stop = threading.Event()  # set on Ctrl-C/SIGTERM: downloads abort at their next chunk, nothing more is published
    slots = Slots(max_workers)
    files_pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hfcache-file")
    # One thread per repo (up to _REPO_THREADS): a repo's thread mostly waits for its files, and a repo beyond the
    # first max_workers must not wait for a whole repo to finish before it is even resolved. Connections stay bounded
    # by ``slots`` (resolution requests and file transfers alike).
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
        # Interrupted: workers stop at their next chunk and keep their partial files; do not wait for a worker
        # blocked on a silent socket (the process is about to exit, SIGTERM must take effect within a second).
        stop.set()
        for pool in (repos_pool, files_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        # A repo already publishing (links, markers, ref: milliseconds) gets to finish it, so that an exit right
        # after this never leaves half a snapshot; the others stop at their next chunk.
        wait_futures(futures, timeout=_PUBLISH_GRACE)
        raise
    for pool in (repos_pool, files_pool):
        pool.shutdown(wait=True)
    return results



def make_clients(endpoint: str | Sequence[str] | None, token: str | bool | None, timeout: float,
                 retries: int = DEFAULT_RETRIES, *, withheld: Collection[str] = (),
                 on_notice: Callable[[str], None] | None = None) -> list[HubClient]:
    """One HubClient per endpoint, in order of preference (an in-cluster mirror first, then the Hub).

    Args:
        endpoint: one URL, several, or None (``HF_ENDPOINT`` or the public Hub).
        token: as :func:`warm`.
        timeout: seconds per connection or byte.
        retries: retries of a transient failure per request (:mod:`hfcache.hub.retry`).
        withheld: endpoints (without a trailing slash) whose client gets no token: a manifest's endpoint the user
            did not opt in to (:func:`hfcache.warming.manifest.withheld_endpoints`).
        on_notice: told once (one line, never the token) when a token exists and is withheld from an endpoint.

    Returns:
        list[HubClient]: in the order given.

    Raises:
        UsageError: an endpoint is not an http(s) URL, or a malformed HFCACHE_* deadline setting.
    """
    endpoints = [endpoint] if endpoint is None or isinstance(endpoint, str) else list(endpoint) or [None]
    resolved = resolve_token(token)
    skip = {e.rstrip("/") for e in withheld}
    clients, anonymous = [], []
    for e in endpoints:
        kept = resolved if e is None or e.rstrip("/") not in skip else None
        if resolved and kept is None:
            anonymous.append(e.rstrip("/"))
        clients.append(HubClient(endpoint=e, token=kept, timeout=timeout, retries=retries,
                                 withheld_hint=_WITHHELD_HINT if resolved and kept is None else None))
    if anonymous and on_notice is not None:
        on_notice(f"the Hub token is not sent to the manifest's endpoint {', '.join(anonymous)}: warming from it "
                  f"anonymously (pass --trust-manifest-endpoint or set {TRUST_ENDPOINT_ENV}=1 to send it)")
    return clients


#: manifest.TRUST_ENDPOINT_ENV, not imported: the manifest's module (and tomllib) is not needed to warm by name.
TRUST_ENDPOINT_ENV = "HFCACHE_TRUST_MANIFEST_ENDPOINT"
_WITHHELD_HINT = (f"the token was not sent to this endpoint, named by the manifest: pass --trust-manifest-endpoint "
                  f"(or set {TRUST_ENDPOINT_ENV}=1) if you trust it")


def resolve_revision(request: WarmRequest, clients: Sequence[HubClient]) -> RepoRevision:
    """Resolve ``request``'s revision on the endpoints in order, as a warm repo job does: a Hub-side failure (not
    found, unreachable, gated, malformed) moves on to the next endpoint.

    Args:
        request: the repo and revision (selection fields are ignored: every file is listed).
        clients: endpoints in order of preference (:func:`make_clients`).

    Returns:
        RepoRevision: the commit, the canonical id and every file with its size and hash: from repo info, else the
        tree API, else one ``HEAD`` per file (:meth:`HubClient.describe`, for endpoints that list names only).

    Raises:
        HubError (RepoNotFound, RevisionNotFound, GatedRepo, EndpointUnreachable...): the last endpoint's error, its
        message naming what the others answered.
    """
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


def fetch_pinned(locked: LockedRepo, *, cache_dir: str | Path, endpoint: Sequence[str], token: str | bool | None,
                 timeout: float = 10.0, max_workers: int = 4) -> RepoResult:
    """Fetch the files of ``locked`` (a commit and files with known hashes) into the cache: :func:`warm` with a pin.

    The pull-through mirror's per-file fetch (``hfcache serve --upstream``): the same code path as ``warm --lock``
    (endpoints in order, hash checks, the repo and blob locks, the legacy-id folder, huggingface_hub's publishing
    order, the snapshot touched as a use), for just the files a client asked for.

    Args:
        locked: the request (its revision becomes the ref written), the canonical id, commit and files to fetch.
        cache_dir: the cache root.
        endpoint: the endpoints, in order of preference.
        token: the Hub token (False: none).
        timeout: seconds to wait for a connection or for any byte of an answer.
        max_workers: parallel downloads.

    Returns:
        RepoResult: ``error_type`` says what failed (``IntegrityError``: bytes that failed the hash check on every
        endpoint; nothing of them is kept).

    Raises:
        CacheError: the cache root cannot be created or written.
    """
    report = warm([locked.request], cache_dir=cache_dir, endpoint=list(endpoint), token=token,
                  max_workers=max_workers, timeout=timeout, pinned=[locked])
    return report.repos[0]
