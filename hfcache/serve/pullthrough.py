"""A pull-through store: a hub cache that fetches what it lacks from upstream endpoints, verified, then serves it.

``hfcache serve --cache-dir DIR --upstream URL`` (README "Pull-through mirror"). What a request gets:

- **A revision** (repo info, tree, resolve): a branch or tag is resolved against the upstreams in order
  (:func:`hfcache.warming.orchestrate.resolve_revision`, warm's resolution) at most once per ``revalidate`` seconds; a 40-hex
  commit once per process (a commit's listing never changes), and not at all once the cache keeps its listing
  (``trees/<commit>.json``, huggingface_hub's format, written with the commit's first fetch: after a restart the
  commit is still listed whole, and what the cache lacks fetched by those hashes). Concurrent requests for the same
  revision wait for one resolution. When upstream fails, the cache answers what it holds (a stale branch keeps its
  last commit); only what the cache lacks gets an error: 503 ``UpstreamUnavailable`` when no upstream answers, the
  upstream's 404/403 otherwise.
- **A file body** the cache lacks: fetched with :func:`hfcache.warming.orchestrate.fetch_pinned` (warm with a pin: the commit and
  hashes of the resolution, the same repo and blob locks, endpoints in order, hash checked before anything becomes
  visible, huggingface_hub's publishing order, legacy-id folder), then served from the cache. Concurrent requests
  for the same file wait for one fetch (an in-process lock, then warm's blob lock across processes, so a ``hfcache
  warm`` or ``prune`` on the same cache stays safe). Bytes failing the hash check on every upstream: 502
  ``UpstreamIntegrityError`` naming the file; nothing is kept. A HEAD answers from the listing and fetches nothing.
- **--allow**: only repos whose id matches a glob (``fnmatch``, case-sensitive) are pulled through; any other repo
  the cache does not hold is refused with 403 ``RepoNotAllowed`` without contacting upstream. A canonical id reached
  through an allowed legacy id (``bert-base-uncased`` -> ``google-bert/bert-base-uncased``) is allowed.
- **Uses and budget**: serving a file touches its snapshot folder (at most once a second per revision), the last-use
  signal of :mod:`hfcache.cache.scan`; with ``max_size``, prune's planner (:func:`hfcache.prune.plan_prune`) removes
  least-recently-used revisions in a background thread after each fetch.

The upstream token goes only to the upstreams (through :mod:`hfcache.hub.client`); it is never logged or answered.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..cache.layout import RepoFolder
from ..errors import HfcacheError, HubError, UsageError
from ..hub.files import RepoRevision
from ..hub.urls import validate_endpoint
from ..warming.lockfile import LockedFile, LockedRepo
from ..records import WarmRequest
from ..warming.orchestrate import fetch_pinned, make_clients, resolve_revision
from .cache_store import CacheStore
from .metrics import MirrorMetrics
from .pruner import Pruner
from .upstream_listing import revision_from_listing, snapshot_view, write_listing
from .vocabulary import SHA1_RE, RepoFile, RepoSnapshot, StoreMiss

__all__ = ["DEFAULT_REVALIDATE", "PullThroughConfig", "PullThroughStore"]

logger = logging.getLogger(__name__)

#: Seconds a branch or tag stays resolved before upstream is asked again (``--revalidate``).
DEFAULT_REVALIDATE = 300.0
#: Seconds before a failed revalidation is tried again (the stale commit is served meanwhile).
RETRY_AFTER_FAILURE = 30.0
#: Seconds between two touches of the same snapshot folder (a use is recorded, not every request).
TOUCH_INTERVAL = 1.0
#: Commit listings kept in memory.
LISTINGS_KEPT = 4096
#: Seconds a health check of the upstreams is reused.
HEALTH_TTL = 5.0
#: Seconds ``/healthz`` waits for a fresh check before answering with the last one (probes time out after 1 s).
HEALTH_WAIT = 0.5

_STATUS = {  # hfcache error class -> (HTTP status, X-Error-Code) when upstream fails and the cache has nothing
    "RepoNotFound": (404, "RepoNotFound"),
    "RevisionNotFound": (404, "RevisionNotFound"),
    "GatedRepo": (403, "GatedRepo"),
    "EndpointUnreachable": (503, "UpstreamUnavailable"),
    "IntegrityError": (502, "UpstreamIntegrityError"),
    "CacheError": (507, "CacheError"),
}


@dataclass(frozen=True)
class PullThroughConfig:
    """How a pull-through mirror reaches upstream.

    Attributes:
        upstreams (tuple[str, ...]): endpoint URLs, in order of preference.
        token (str | None): sent to the upstreams only; never logged, never in a response (not in ``repr``).
        allow (tuple[str, ...]): repo id globs that may be pulled through; empty: every repo.
        revalidate (float): seconds a branch or tag stays resolved.
        max_size (int | None): bytes; least-recently-used revisions are pruned to stay within it.
        timeout (float): seconds to wait for an upstream connection or any byte of an answer.
    """

    upstreams: tuple[str, ...]
    token: str | None = field(default=None, repr=False)
    allow: tuple[str, ...] = ()
    revalidate: float = DEFAULT_REVALIDATE
    max_size: int | None = None
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise UsageError("a pull-through mirror needs at least one --upstream")
        # Checked here, before anything is created: http(s) with a host, no credentials in the URL.
        object.__setattr__(self, "upstreams", tuple(validate_endpoint(u) for u in self.upstreams))
        if self.revalidate < 0:
            raise UsageError(f"--revalidate must not be negative, got {self.revalidate}")
        if self.max_size is not None and self.max_size < 0:
            raise UsageError(f"--max-size must not be negative, got {self.max_size}")


@dataclass
class _Resolved:
    revision: RepoRevision
    snapshot: RepoSnapshot
    checked: float  # time.monotonic() of the resolution


class PullThroughStore:
    """A :class:`CacheStore` that fetches from upstream what it lacks (see the module docstring).

    Args:
        cache_dir (str | Path): the cache root (created if missing).
        config (PullThroughConfig): upstreams, token, allow list, revalidation, budget.
        metrics (MirrorMetrics | None): counters to update.

    Raises:
        UsageError: an upstream is not an http(s) URL.
        CacheError: the cache cannot be created.
    """

    def __init__(self, cache_dir: str | Path, config: PullThroughConfig, metrics: MirrorMetrics | None = None):
        self.cache = CacheStore(cache_dir)
        self.root = self.cache.root
        self.config = config
        self.metrics = metrics or MirrorMetrics()
        self.clients = make_clients(list(config.upstreams), config.token or False, config.timeout)
        self._lock = threading.Lock()
        self._refs: dict[tuple[str, str, str], _Resolved] = {}  # (type, id as asked, branch/tag) -> resolution
        self._commits: OrderedDict[tuple[str, str, str], _Resolved] = OrderedDict()  # (type, canonical, commit)
        self._aliases: dict[tuple[str, str], str] = {}  # (type, canonical) -> a legacy id resolved to it
        self._flights: dict[tuple, threading.Lock] = {}
        self._touched: dict[tuple[str, str], float] = {}
        self._health: tuple[float, list[tuple[str, bool | None]]] | None = None
        self._health_thread: threading.Thread | None = None
        self._pruner = Pruner(self.root, config.max_size, self.metrics) if config.max_size is not None else None

    # -- Store protocol

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        """The cache's alias, else what upstream answers for an org-less id (resolving ``main`` if needed)."""
        alias = self.cache.canonical_id(repo_type, repo_id)
        if alias != repo_id or repo_type != "model" or "/" in repo_id:
            return alias
        try:
            return self.snapshot(repo_type, repo_id, "main").repo_id
        except StoreMiss:
            return repo_id

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision``: the upstream listing (files fetched on demand), or what the cache holds.

        Raises:
            StoreMiss: not found upstream nor in the cache (404), not allowed (403), upstream unreachable (503).
        """
        cached = self._cached(repo_type, repo_id, revision)
        known = self._known(repo_type, repo_id, revision, cached)
        if known is not None:
            return known
        if not self._allowed(repo_id):
            if cached is not None:
                return cached
            raise StoreMiss("RepoNotAllowed", f"{repo_id} is not in this mirror's cache, and this mirror's --allow "
                            "list does not let it be fetched from upstream", status=403)
        with self._flight(("resolve", repo_type, repo_id, revision)):
            known = self._known(repo_type, repo_id, revision, cached)  # resolved while this request waited
            return known if known is not None else self._resolve(repo_type, repo_id, revision, cached)

    def lfs_file(self, repo_type: str, repo_id: str, sha256: str) -> tuple[RepoSnapshot, RepoFile] | None:
        return self.cache.lfs_file(repo_type, repo_id, sha256)

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot | None = None, *, head: bool = False) -> BinaryIO:
        """The file's bytes from the cache, fetched from upstream first if the cache lacks them.

        Raises:
            StoreMiss: the fetch failed (502 bad bytes, 503 upstream unreachable, ...; nothing was kept), or the file
                vanished from the cache right after its fetch (503: a concurrent prune).
            OSError: ``snapshot`` None and the file is not in the cache (the CDN origin's lookup by hash).
        """
        if snapshot is None:
            return self.cache.open(repo_file)
        body = self._held(snapshot, repo_file)
        if body is not None:
            if not head:
                self.metrics.cache_hits.inc()
                self._touch(snapshot)
            return body
        if head:  # metadata only: the listing has it, no bytes are fetched for a HEAD
            return _Empty()
        self.metrics.cache_misses.inc()
        with self._flight(("fetch", snapshot.repo_type, snapshot.repo_id, snapshot.commit, repo_file.path)):
            body = self._held(snapshot, repo_file)  # fetched while this request waited
            if body is None:
                self._fetch(snapshot, repo_file)
                body = self._held(snapshot, repo_file)
        if body is None:  # fetched and gone at once: a concurrent prune; never a 404 (clients would record "absent")
            raise StoreMiss("CacheError", f"{snapshot.repo_id}: {repo_file.path} was removed from the cache while it "
                            "was being fetched; retry", status=503)
        self._touch(snapshot)
        return body

    # -- health

    def upstream_health(self, wait: float = HEALTH_WAIT) -> list[tuple[str, bool | None]]:
        """(endpoint, reachable) per upstream; None: not known yet. Checked in a background thread at most every
        few seconds, waiting at most ``wait`` seconds for a fresh answer (a probe's 1 s timeout must hold even when
        an upstream accepts connections and never answers); updates ``hfcache_upstream_up``."""
        with self._lock:
            fresh = self._health is not None and self._health[0] > time.monotonic()
            thread = self._health_thread
            if not fresh and (thread is None or not thread.is_alive()):
                thread = threading.Thread(target=self._check_health, name="hfcache-serve-health", daemon=True)
                self._health_thread = thread
                thread.start()
        if not fresh and thread is not None:
            thread.join(wait)
        with self._lock:
            return self._health[1] if self._health is not None else [(c.endpoint, None) for c in self.clients]

    def _check_health(self) -> None:
        health = [(c.endpoint, c.reachable(timeout=min(self.config.timeout, 3.0))) for c in self.clients]
        for endpoint, up in health:
            self.metrics.upstream_up.labels(endpoint).set(1 if up else 0)
        with self._lock:
            self._health = (time.monotonic() + HEALTH_TTL, health)

    def close(self) -> None:
        if self._pruner is not None:
            self._pruner.close()

    # -- resolution

    def _cached(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot | None:
        try:
            return self.cache.snapshot(repo_type, repo_id, revision)
        except StoreMiss:
            return None

    def _known(self, repo_type: str, repo_id: str, revision: str, cached: RepoSnapshot | None) -> RepoSnapshot | None:
        """What can be answered without upstream: a fresh resolution, a known commit, a complete cached commit."""
        now = time.monotonic()
        with self._lock:
            if SHA1_RE.match(revision):
                canonical = cached.repo_id if cached is not None else self._canonical_known(repo_type, repo_id)
                resolved = self._commits.get((repo_type, canonical, revision))
                if resolved is not None:
                    self._commits.move_to_end((repo_type, canonical, revision))
                    return resolved.snapshot
            else:
                resolved = self._refs.get((repo_type, repo_id, revision))
                if resolved is not None and now - resolved.checked < self.config.revalidate:
                    return resolved.snapshot
                return None
        # A commit the cache holds with its whole listing (trees/<commit>.json, written with the first fetch):
        # answered, and its missing files fetched, without asking upstream again, also after a restart.
        full = self._full(cached)
        return full if full is not cached else None

    def _full(self, cached: RepoSnapshot | None) -> RepoSnapshot | None:
        """``cached`` with the whole repo's listing when the cache keeps it, so that what the cache lacks can still
        be listed and fetched (pinned to those hashes); else ``cached`` itself."""
        if cached is None or cached.listing is None:
            return cached
        revision = revision_from_listing(cached, self.cache.listing(cached))
        if revision is None:
            return cached
        resolved = _Resolved(revision, snapshot_view(self.root, revision), time.monotonic())
        with self._lock:
            self._commits[(cached.repo_type, cached.repo_id, cached.commit)] = resolved
            while len(self._commits) > LISTINGS_KEPT:
                self._commits.popitem(last=False)
        return resolved.snapshot

    def _resolve(self, repo_type: str, repo_id: str, revision: str, cached: RepoSnapshot | None) -> RepoSnapshot:
        """Ask upstream; on failure serve the stale resolution or the cache, else raise the mapped StoreMiss."""
        try:
            request = WarmRequest(repo_id, revision=revision, repo_type=repo_type)
        except UsageError as exc:
            raise StoreMiss("RepoNotFound", exc.message) from None
        try:
            upstream = resolve_revision(request, self.clients)
        except HubError as exc:
            self.metrics.upstream_failures.labels(type(exc).__name__).inc()
            with self._lock:
                stale = self._refs.get((repo_type, repo_id, revision))
                if stale is not None:  # ask again in a while, not on every request while upstream is down
                    stale.checked = time.monotonic() - self.config.revalidate + RETRY_AFTER_FAILURE
            if stale is not None:
                return stale.snapshot
            if cached is not None:
                return self._full(cached)
            raise _store_miss(type(exc).__name__, exc.message) from None
        self.metrics.upstream_resolutions.inc()
        resolved = _Resolved(upstream, snapshot_view(self.root, upstream), time.monotonic())
        with self._lock:
            if not SHA1_RE.match(revision):
                self._refs[(repo_type, repo_id, revision)] = resolved
                # The client follows the legacy id's redirect at once: the canonical id is resolved too.
                self._refs[(repo_type, upstream.canonical_id, revision)] = resolved
            self._commits[(repo_type, upstream.canonical_id, upstream.commit_hash)] = resolved
            self._commits.move_to_end((repo_type, upstream.canonical_id, upstream.commit_hash))
            while len(self._commits) > LISTINGS_KEPT:
                self._commits.popitem(last=False)
            if upstream.canonical_id != repo_id:
                self._aliases[(repo_type, upstream.canonical_id)] = repo_id
        return resolved.snapshot

    def _canonical_known(self, repo_type: str, repo_id: str) -> str:
        """The canonical id of an alias resolved before, else ``repo_id``. Called with ``_lock`` held."""
        return next((canonical for (rtype, canonical), alias in self._aliases.items()
                     if rtype == repo_type and alias == repo_id), repo_id)

    def _allowed(self, repo_id: str) -> bool:
        allow = self.config.allow
        if not allow or any(fnmatch.fnmatchcase(repo_id, glob) for glob in allow):
            return True
        with self._lock:  # a canonical id reached through an allowed legacy id
            legacy = [alias for (_, canonical), alias in self._aliases.items() if canonical == repo_id]
        return any(fnmatch.fnmatchcase(alias, glob) for alias in legacy for glob in allow)

    # -- files

    def _held(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> BinaryIO | None:
        """The open file when the cache holds it in this snapshot with the listed size, else None."""
        folder = RepoFolder(self.root, snapshot.repo_id, snapshot.repo_type)
        if not _lexists(folder.pointer_path(snapshot.commit, repo_file.path)):
            return None
        try:
            body = self.cache.open(repo_file)
        except OSError:
            return None
        if _size(body) != repo_file.size:
            body.close()
            return None
        return body

    def _fetch(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> None:
        """Fetch one file with warm's code path (pinned to the resolved commit and hashes), or raise StoreMiss."""
        resolved = self._listing_of(snapshot)
        remote = next((f for f in resolved.revision.files if f.path == repo_file.path), None) if resolved else None
        if resolved is None or remote is None:  # a cache-only answer, and upstream still does not answer
            raise StoreMiss("UpstreamUnavailable", f"{snapshot.repo_id}: {repo_file.path} is not in this mirror's cache "
                            "and the upstream could not be reached to fetch it", status=503)
        with self._lock:
            alias = self._aliases.get((snapshot.repo_type, snapshot.repo_id))
            ref = self._ref_name(snapshot)
        request = WarmRequest(alias or snapshot.repo_id, revision=ref, repo_type=snapshot.repo_type, kind="all")
        locked = LockedRepo(request=request, canonical_id=snapshot.repo_id, commit_hash=snapshot.commit,
                            files=(LockedFile(remote.path, remote.size, remote.hash),))
        try:
            result = fetch_pinned(locked, cache_dir=self.root, endpoint=self.config.upstreams,
                                  token=self.config.token or False, timeout=self.config.timeout)
        except HfcacheError as exc:
            result = None
            error_type, message = type(exc).__name__, exc.message
        if result is not None and not result.ok:
            error_type, message = result.error_type or "HubError", result.error or "fetch failed"
        if result is None or not result.ok:
            self.metrics.upstream_failures.labels(error_type).inc()
            if error_type == "IntegrityError":
                self.metrics.verification_failures.inc()
            raise _store_miss(error_type, f"{repo_file.path} of {snapshot.repo_id}@{snapshot.commit} could not be "
                              f"fetched from upstream: {message}", fetch=True)
        self._fetched(result, resolved, alias)

    def _listing_of(self, snapshot: RepoSnapshot) -> _Resolved | None:
        """The upstream listing of the snapshot's commit: remembered, else asked now (the snapshot may be a
        cache-only answer given while upstream was down). None when upstream cannot say."""
        key = (snapshot.repo_type, snapshot.repo_id, snapshot.commit)
        with self._lock:
            resolved = self._commits.get(key) or next(
                (r for r in self._refs.values() if (r.snapshot.repo_type, r.snapshot.repo_id, r.snapshot.commit) == key),
                None)
        if resolved is not None:
            return resolved
        try:
            with self._flight(("resolve",) + key):
                self._resolve(snapshot.repo_type, snapshot.repo_id, snapshot.commit, None)
        except StoreMiss:
            return None
        with self._lock:
            return self._commits.get(key)

    def _fetched(self, result, resolved: _Resolved, alias: str | None) -> None:
        """Count the fetch, record the commit's listing next to its snapshot, keep the cache within budget."""
        downloaded = sum(1 for f in result.files if f.source == "downloaded")
        self.metrics.upstream_fetches.inc(downloaded)
        self.metrics.upstream_bytes.inc(result.bytes_downloaded)
        self.metrics.cache_changed()
        revision = resolved.revision
        for repo_id in filter(None, (revision.canonical_id, alias)):
            folder = RepoFolder(self.root, repo_id, revision.repo_type)
            if not _lexists(folder.root / "trees" / f"{revision.commit_hash}.json"):
                write_listing(folder, revision)
        if self._pruner is not None and downloaded:
            self._pruner.request()

    def _ref_name(self, snapshot: RepoSnapshot) -> str:
        """The branch or tag a fetch writes as the ref (``main`` first), or the commit (no ref) when none points
        to the snapshot's commit. Called with ``_lock`` held."""
        names = sorted({rev for (rtype, _, rev), r in self._refs.items()
                        if rtype == snapshot.repo_type and r.snapshot.repo_id == snapshot.repo_id
                        and r.snapshot.commit == snapshot.commit}, key=lambda n: (n != "main", n))
        return names[0] if names else snapshot.commit

    def _touch(self, snapshot: RepoSnapshot) -> None:
        """Record a use of the revision (its snapshot folder's mtime, :mod:`hfcache.cache.scan`), at most once a second."""
        key = (snapshot.repo_id, snapshot.commit)
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(key, -TOUCH_INTERVAL) < TOUCH_INTERVAL:
                return
            self._touched[key] = now
        RepoFolder(self.root, snapshot.repo_id, snapshot.repo_type).touch_snapshot(snapshot.commit)

    @contextmanager
    def _flight(self, key: tuple) -> Iterator[None]:
        """One thread at a time per key (one resolution per revision, one fetch per file); the others wait."""
        with self._lock:
            lock = self._flights.setdefault(key, threading.Lock())
        with lock:
            try:
                yield
            finally:
                with self._lock:
                    if self._flights.get(key) is lock:
                        del self._flights[key]  # waiters re-check what is held before doing anything


class _Empty:
    """The body of a HEAD answer for a file not fetched yet: no bytes, and no file descriptor."""

    def read(self, size: int = -1) -> bytes:
        return b""

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def close(self) -> None:
        pass


def _store_miss(error_type: str, message: str, *, fetch: bool = False) -> StoreMiss:
    """The StoreMiss for an hfcache error class: 404/403 as upstream said, 503 unreachable, 502 otherwise."""
    status, code = _STATUS.get(error_type, (502, "UpstreamError"))
    if fetch and status == 404:  # the listing named the file: upstream losing it now is upstream's failure
        status, code = 502, "UpstreamError"
    # One line of printable ASCII: it also travels in the X-Error-Message header.
    text = " ".join(message.split()).encode("ascii", "backslashreplace").decode()[:1000]
    return StoreMiss(code, text, status=status)


def _lexists(path: Path) -> bool:
    try:
        path.lstat()
    except OSError:
        return False
    return True


def _size(body: BinaryIO) -> int:
    return os.fstat(body.fileno()).st_size
