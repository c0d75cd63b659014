"""A pull-through store (``hfcache serve --upstream``): a hub cache that resolves and fetches what it lacks with
warm's code path (pinned to the resolution's commit and hashes), in a bounded pool (:mod:`.upstream_pool`). What a
request gets: docs/serve.md, "Pull-through mirror". The upstream token goes only to the upstreams, never logged
or answered.
"""

from __future__ import annotations

import fnmatch
import io
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from ..cache import safefs
from ..cache.layout import RepoFolder
from ..errors import HfcacheError, HubError, UsageError
from ..hub.files import RepoRevision
from ..hub.urls import validate_endpoint
from ..names import check_commit, is_commit
from ..pace import Deadline
from ..records import HubOptions, WarmRequest
from ..warming.lockfile import LockedFile, LockedRepo
from ..warming.orchestrate import fetch_pinned, make_clients, resolve_revision
from .cache_store import CacheStore
from .metrics import MirrorMetrics
from .pruner import Pruner
from .upstream_errors import inert
from .upstream_errors import store_miss as _store_miss
from .upstream_ids import Names, keep, storage_id
from .upstream_listing import has_listing, revision_from_listing, snapshot_view, write_listing
from .upstream_pool import DEFAULT_UPSTREAM_SLOTS, MAX_UPSTREAM_SLOTS, UpstreamPool, fetch_deadline, resolve_deadline
from .vocabulary import RepoFile, RepoSnapshot, StoreMiss

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


@dataclass(frozen=True)
class PullThroughConfig:
    """How a pull-through mirror reaches upstream: ``upstreams`` (URLs, in order), a ``token`` for them only (not in
    ``repr``), ``allow`` (repo id globs; empty: all), ``revalidate`` (seconds a branch or tag stays resolved),
    ``max_size`` (bytes, kept by pruning), ``timeout`` (seconds for a connection or any byte), ``upstream_slots``
    (:mod:`.upstream_pool`). Raises UsageError: no upstream, a bad URL, a negative or out-of-range value."""

    upstreams: tuple[str, ...]
    token: str | None = field(default=None, repr=False)
    allow: tuple[str, ...] = ()
    revalidate: float = DEFAULT_REVALIDATE
    max_size: int | None = None
    timeout: float = 10.0
    upstream_slots: int = DEFAULT_UPSTREAM_SLOTS

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise UsageError("a pull-through mirror needs at least one --upstream")
        object.__setattr__(self, "upstreams", tuple(validate_endpoint(u) for u in self.upstreams))
        if self.revalidate < 0:
            raise UsageError(f"--revalidate must not be negative, got {self.revalidate}")
        if self.max_size is not None and self.max_size < 0:
            raise UsageError(f"--max-size must not be negative, got {self.max_size}")
        if not 1 <= self.upstream_slots <= MAX_UPSTREAM_SLOTS:
            raise UsageError(f"--upstream-slots must be 1 to {MAX_UPSTREAM_SLOTS}, got {self.upstream_slots}")


@dataclass
class _Resolved:
    revision: RepoRevision
    snapshot: RepoSnapshot
    checked: float  # time.monotonic() of the resolution


class PullThroughStore:
    """A :class:`CacheStore` over ``cache_dir`` that fetches what it lacks as ``config`` says, counting in
    ``metrics``. Raises FileNotFoundError: no cache at ``cache_dir``; UsageError: a malformed setting."""

    def __init__(self, cache_dir: str | Path, config: PullThroughConfig, metrics: MirrorMetrics | None = None):
        self.cache = CacheStore(cache_dir)
        self.root = self.cache.root
        self.config = config
        self.metrics = metrics or MirrorMetrics()
        # A pulled file is fetched over at most 4 connections (its ranges): the mirror serves others meanwhile.
        self.hub = HubOptions(endpoints=config.upstreams, token=config.token or False, timeout=config.timeout,
                              max_workers=4)
        self.clients = make_clients(self.hub)
        self._lock = threading.Lock()
        # Every memory of what upstream said is bounded (LISTINGS_KEPT entries, least recently used dropped): ids
        # are keyed without case, as the Hub resolves them, so case variants share one entry and one folder.
        self._refs: OrderedDict[tuple[str, str, str], _Resolved] = OrderedDict()  # (type, id.lower(), ref)
        self._commits: OrderedDict[tuple[str, str, str], _Resolved] = OrderedDict()  # (type, stored id, commit)
        self._names = Names(LISTINGS_KEPT)  # asked id -> the id it is stored under; legacy folders to fill
        self._pool = UpstreamPool(config.upstream_slots)
        self._touched: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._health: tuple[float, list[tuple[str, bool | None]]] | None = None
        self._health_thread: threading.Thread | None = None
        self._pruner = Pruner(self.root, config.max_size, self.metrics) if config.max_size is not None else None

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        """The id ``repo_id`` is answered under: the cache's alias (a legacy folder), the id it was stored under (a
        case variant, a legacy id upstream renamed: :mod:`.upstream_ids`), else, for an org-less id, what upstream
        answers for ``main``."""
        alias = self.cache.canonical_id(repo_type, repo_id)
        if alias != repo_id:
            return alias
        stored = self._stored_id(repo_type, repo_id)
        if stored != repo_id or repo_type != "model" or "/" in repo_id:
            return stored
        try:
            return self.snapshot(repo_type, repo_id, "main").repo_id
        except StoreMiss:
            return repo_id

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision``: the upstream listing (files fetched on demand), or what the cache holds. Raises
        StoreMiss: not found (404), not allowed (403), upstream unreachable, busy or slow (503), other commit (502)."""
        stored = self._stored_id(repo_type, repo_id)
        cached = self._cached(repo_type, stored, revision)
        if not self._allowed(repo_id):  # checked first: nothing remembered of upstream answers a non-allowed id
            if cached is not None:
                return cached
            raise StoreMiss("RepoNotAllowed", f"{repo_id} is not in this mirror's cache, and this mirror's --allow "
                            "list does not let it be fetched from upstream", status=403)
        known = self._known(repo_type, repo_id, revision, cached)
        if known is not None:
            return known

        def resolve() -> RepoSnapshot:
            again = self._known(repo_type, repo_id, revision, cached)  # resolved while this request waited
            return again if again is not None else self._resolve(repo_type, repo_id, revision, cached)

        deadline = resolve_deadline(f"{repo_id}@{revision} from upstream", self.config.timeout)
        if cached is not None:  # the cache can answer: an upstream silent for --timeout counts as failing
            deadline = Deadline(min(deadline.seconds, self.config.timeout), deadline.what)
        try:
            return self._pool.run(("resolve", repo_type, repo_id.lower(), revision), resolve, deadline)
        except StoreMiss as miss:
            if miss.retry_after is None or cached is None:  # busy or too slow, and the cache holds nothing
                raise
            with self._lock:  # as when upstream fails: the stale resolution, else what the cache holds
                stale = self._refs.get((repo_type, repo_id.lower(), revision))
            return stale.snapshot if stale is not None else self._full(cached)

    def expand(self, snapshot: RepoSnapshot, path: str) -> RepoSnapshot:
        """``snapshot`` with upstream's whole listing of its commit when it is a cache-only answer and ``path`` is
        neither held nor known absent (only then is upstream asked, once per commit); else ``snapshot``. Raises
        StoreMiss: 503 (upstream busy or too slow), 502 (another commit)."""
        if (snapshot.listing is not None or path in snapshot.files or path in snapshot.absent
                or not self._allowed(snapshot.repo_id)):
            return snapshot
        resolved = self._listing_of(snapshot)
        return resolved.snapshot if resolved is not None else snapshot

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot, *, head: bool = False) -> BinaryIO:
        """The file's bytes from the cache, fetched from upstream first if it lacks them. Raises StoreMiss: the fetch
        failed (502 bad bytes, 503 unreachable, busy or slow; nothing kept), or a prune removed it at once (503)."""
        body = self._held(snapshot, repo_file)
        if body is not None:
            if not head:
                self.metrics.cache_hits.inc()
                self._touch(snapshot)
            return body
        if head:  # metadata only: the listing has it, no bytes are fetched for a HEAD (no descriptor either)
            return io.BytesIO()
        self.metrics.cache_misses.inc()

        def fetch() -> None:
            held = self._held(snapshot, repo_file)  # fetched while this request waited
            if held is None:
                self._fetch(snapshot, repo_file)
            else:
                held.close()

        self._pool.run(("fetch", snapshot.repo_type, snapshot.repo_id, snapshot.commit, repo_file.path), fetch,
                       fetch_deadline(repo_file.size, f"{snapshot.repo_id}: {repo_file.path} from upstream"))
        body = self._held(snapshot, repo_file)
        if body is None:  # fetched and gone at once: a concurrent prune; never a 404 (clients would record "absent")
            raise StoreMiss("CacheError", f"{snapshot.repo_id}: {inert(repo_file.path)} was removed from the cache "
                            "while it was being fetched; retry", status=503, retry_after=1)
        self._touch(snapshot)
        return body

    def upstream_health(self, wait: float = HEALTH_WAIT) -> list[tuple[str, bool | None]]:
        """(endpoint, reachable) per upstream; None: not known yet. Checked in a background thread at most every
        :data:`HEALTH_TTL` seconds, waiting at most ``wait`` seconds for it; updates ``hfcache_upstream_up``."""
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
        self._pool.close()
        if self._pruner is not None:
            self._pruner.close()

    def _stored_id(self, repo_type: str, repo_id: str) -> str:
        """The id ``repo_id`` was stored under (remembered, else a cache folder equal ignoring case), else itself."""
        return self._names.stored(repo_type, repo_id) or self.cache.spelled(repo_type, repo_id) or repo_id

    def _cached(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot | None:
        try:
            return self.cache.snapshot(repo_type, repo_id, revision)
        except StoreMiss:
            return None

    def _known(self, repo_type: str, repo_id: str, revision: str, cached: RepoSnapshot | None) -> RepoSnapshot | None:
        """A fresh resolution, a known commit or a commit the cache holds (also after a restart): no upstream."""
        now = time.monotonic()
        with self._lock:
            if is_commit(revision):
                key = (repo_type, cached.repo_id if cached is not None else self._stored_id(repo_type, repo_id),
                       revision)
                resolved = self._commits.get(key)
                if resolved is not None:
                    self._commits.move_to_end(key)
                    return resolved.snapshot
            else:
                resolved = self._refs.get((repo_type, repo_id.lower(), revision))
                if resolved is not None and now - resolved.checked < self.config.revalidate:
                    self._refs.move_to_end((repo_type, repo_id.lower(), revision))
                    return resolved.snapshot
                return None
        return self._full(cached)

    def _full(self, cached: RepoSnapshot | None) -> RepoSnapshot | None:
        """``cached`` with the whole listing when the cache keeps it (what it lacks stays fetchable), else itself."""
        if cached is None or cached.listing is None:
            return cached
        revision = revision_from_listing(cached, self.cache.listing(cached))
        if revision is None:
            return cached
        resolved = _Resolved(revision, snapshot_view(self.root, revision), time.monotonic())
        with self._lock:
            keep(LISTINGS_KEPT, self._commits, (cached.repo_type, cached.repo_id, cached.commit), resolved)
        return resolved.snapshot

    def _resolve(self, repo_type: str, repo_id: str, revision: str, cached: RepoSnapshot | None) -> RepoSnapshot:
        """Ask upstream (kept under :func:`.upstream_ids.storage_id`); on failure the stale resolution, the cache, or
        the mapped StoreMiss; another commit for a 40-hex revision: 502, nothing kept."""
        try:
            request = WarmRequest(repo_id, revision=revision, repo_type=repo_type)
        except UsageError as exc:
            raise StoreMiss("RepoNotFound", exc.message) from None
        try:
            upstream = resolve_revision(request, self.clients)
        except HubError as exc:
            self.metrics.upstream_failures.labels(type(exc).__name__).inc()
            with self._lock:
                stale = self._refs.get((repo_type, repo_id.lower(), revision))
                if stale is not None:  # ask again in a while, not on every request while upstream is down
                    stale.checked = time.monotonic() - self.config.revalidate + RETRY_AFTER_FAILURE
            if stale is not None:
                return stale.snapshot
            if cached is not None:
                return self._full(cached)
            raise _store_miss(type(exc).__name__, exc.message) from None
        if is_commit(revision) and upstream.commit_hash != revision:
            self.metrics.upstream_failures.labels("UpstreamError").inc()
            raise _store_miss("UpstreamError", f"{repo_id}@{revision}: the upstream answered another commit "
                              f"({upstream.commit_hash}) for this commit: refused, nothing kept")
        stored, legacy = storage_id(repo_id, upstream.canonical_id, lambda i: self.cache.spelled(repo_type, i))
        upstream = replace(upstream, canonical_id=stored)
        self.metrics.upstream_resolutions.inc()
        resolved = _Resolved(upstream, snapshot_view(self.root, upstream), time.monotonic())
        self._names.record(repo_type, repo_id, stored, legacy)
        with self._lock:
            if not is_commit(revision):  # the asked id and the stored one are resolved alike (without case)
                for asked in {repo_id.lower(), stored.lower()}:
                    keep(LISTINGS_KEPT, self._refs, (repo_type, asked, revision), resolved)
            keep(LISTINGS_KEPT, self._commits, (repo_type, stored, upstream.commit_hash), resolved)
        return resolved.snapshot

    def _allowed(self, repo_id: str) -> bool:
        """``--allow`` (globs matched ignoring case, as the Hub matches ids): the id, or an id resolved to it."""
        allow = self.config.allow
        if not allow or _matches(repo_id, allow):
            return True
        return any(_matches(asked, allow) for asked in self._names.askers(repo_id))

    def _held(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> BinaryIO | None:
        """The open file when the cache holds it in this snapshot with the listed size, else None."""
        folder = RepoFolder(self.root, snapshot.repo_id, snapshot.repo_type)
        if not os.path.lexists(folder.pointer_path(snapshot.commit, repo_file.path)):
            return None
        try:
            body = self.cache.open(repo_file)
        except OSError:
            return None
        if os.fstat(body.fileno()).st_size != repo_file.size:
            body.close()
            return None
        return body

    def _fetch(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> None:
        """Fetch one file with warm's code path (pinned to the resolved commit and hashes), or raise StoreMiss."""
        resolved = self._listing_of(snapshot)
        remote = next((f for f in resolved.revision.files if f.path == repo_file.path), None) if resolved else None
        if resolved is None or remote is None:  # a cache-only answer, and upstream still does not answer
            raise StoreMiss("UpstreamUnavailable", f"{snapshot.repo_id}: {inert(repo_file.path)} is not in this "
                            "mirror's cache and the upstream could not be reached to fetch it", status=503)
        alias = self._names.legacy(snapshot.repo_type, snapshot.repo_id)
        with self._lock:
            ref = self._ref_name(snapshot)
        request = WarmRequest(alias or snapshot.repo_id, revision=ref, repo_type=snapshot.repo_type, kind="all")
        locked = LockedRepo(request=request, canonical_id=snapshot.repo_id, commit_hash=snapshot.commit,
                            files=(LockedFile(remote.path, remote.size, remote.hash),))
        try:
            result = fetch_pinned(locked, cache_dir=self.root, hub=self.hub)
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
        """The upstream listing of the snapshot's commit, remembered or asked now; None when upstream cannot say.
        Raises StoreMiss: busy or too slow (503), another commit (502)."""
        key = (snapshot.repo_type, snapshot.repo_id, snapshot.commit)
        with self._lock:
            resolved = self._commits.get(key) or next((r for r in self._refs.values() if (
                r.snapshot.repo_type, r.snapshot.repo_id, r.snapshot.commit) == key), None)
        if resolved is not None:
            return resolved

        def resolve() -> RepoSnapshot:
            with self._lock:
                again = self._commits.get(key)
            if again is not None:
                return again.snapshot
            return self._resolve(snapshot.repo_type, snapshot.repo_id, snapshot.commit, None)

        deadline = resolve_deadline(f"{snapshot.repo_id}@{snapshot.commit} from upstream", self.config.timeout)
        try:
            self._pool.run(("resolve", key[0], key[1].lower(), key[2]), resolve, deadline)
        except StoreMiss as miss:
            if miss.status == 502 or miss.retry_after is not None:
                raise
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
            if not has_listing(folder, revision.commit_hash):
                write_listing(folder, revision)
        if self._pruner is not None and downloaded:
            self._pruner.request()

    def _ref_name(self, snapshot: RepoSnapshot) -> str:
        """The ref a fetch writes (``main`` first), else the commit (no ref); called with ``_lock`` held."""
        names = sorted({rev for (rtype, _, rev), r in self._refs.items()
                        if rtype == snapshot.repo_type and r.snapshot.repo_id == snapshot.repo_id
                        and r.snapshot.commit == snapshot.commit}, key=lambda n: (n != "main", n))
        return names[0] if names else snapshot.commit

    def _touch(self, snapshot: RepoSnapshot) -> None:
        """Record a use (the snapshot folder's mtime), at most once a second, through a descriptor opened without
        following a link."""
        key = (snapshot.repo_id, snapshot.commit)
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(key, -TOUCH_INTERVAL) < TOUCH_INTERVAL:
                return
            keep(LISTINGS_KEPT, self._touched, key, now)
        try:
            name = RepoFolder(self.root, snapshot.repo_id, snapshot.repo_type).name
            fd = safefs.open_dir(self.root, (name, "snapshots", check_commit(snapshot.commit)))
        except (OSError, HfcacheError):  # gone, or a planted link: no use recorded
            return
        try:
            os.utime(fd)  # best effort: a read-only cache keeps its old time
        except OSError:
            pass
        finally:
            os.close(fd)


def _matches(repo_id: str, globs: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(repo_id.lower(), glob.lower()) for glob in globs)
