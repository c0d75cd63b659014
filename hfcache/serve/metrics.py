"""``GET /metrics`` of ``hfcache serve``: Prometheus text through ``prometheus_client``, one
:class:`prometheus_client.CollectorRegistry` per server (no process-global state: tests run several servers in one
process). Labels are the route and the status only, never a repo id or a path: a client cannot grow the number of
series, and nothing private leaks into a scrape.

Series (counters get prometheus_client's ``_total`` suffix):

- ``hfcache_serve_requests_total{route,status}``   requests answered (``route``: see :func:`route_of`)
- ``hfcache_serve_bytes_served_total``             response body bytes sent
- ``hfcache_serve_cache_hits_total``               file bodies answered from the cache
- ``hfcache_serve_cache_misses_total``             file bodies the cache lacked (fetched from upstream, or failed)
- ``hfcache_upstream_resolutions_total``           revisions resolved against upstream (repo info requests)
- ``hfcache_upstream_fetches_total``               files downloaded from upstream (verified and kept)
- ``hfcache_upstream_bytes_total``                 bytes downloaded from upstream
- ``hfcache_upstream_failures_total{reason}``      failed upstream resolutions and fetches, by hfcache error class
- ``hfcache_verification_failures_total``          fetches whose bytes failed the hash check (never served, not kept)
- ``hfcache_cache_bytes``                          bytes on disk (every distinct content once, as ``hfcache ls``)
- ``hfcache_upstream_up{endpoint}``                1 when the upstream answered the last health check
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from ..cache.scan import scan_cache

__all__ = ["CONTENT_TYPE", "MirrorMetrics", "route_of"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Seconds a measured cache size is reused by scrapes (a scan reads every folder of the cache).
SIZE_TTL = 15.0


def route_of(target: str) -> str:
    """The route label of a request: ``repo_info``, ``tree``, ``resolve``, ``healthz``, ``metrics`` or ``other``;
    from the raw target (path and query, URL-encoded) as the access log holds it."""
    segments = [unquote(s) for s in target.split("?", 1)[0].split("/")[1:]]
    if segments in (["healthz"], ["metrics"]):
        return segments[0]
    if len(segments) >= 3 and segments[0] == "api" and segments[1] in ("models", "datasets", "kernels"):
        return "tree" if "tree" in segments[3:5] else "repo_info"
    if "resolve" in segments[1:4]:
        return "resolve"
    return "other"


class MirrorMetrics:
    """The counters and gauges of one server (see the module docstring).

    Args:
        cache_dir (Path | None): the cache whose size ``hfcache_cache_bytes`` reports (None: no such gauge).
    """

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("hfcache_serve_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.bytes_served = Counter("hfcache_serve_bytes_served", "Response body bytes sent", registry=r)
        self.cache_hits = Counter("hfcache_serve_cache_hits", "File bodies answered from the cache", registry=r)
        self.cache_misses = Counter("hfcache_serve_cache_misses", "File bodies the cache lacked", registry=r)
        self.upstream_resolutions = Counter("hfcache_upstream_resolutions",
                                            "Revisions resolved against upstream", registry=r)
        self.upstream_fetches = Counter("hfcache_upstream_fetches", "Files downloaded from upstream, verified and kept",
                                        registry=r)
        self.upstream_bytes = Counter("hfcache_upstream_bytes", "Bytes downloaded from upstream", registry=r)
        self.upstream_failures = Counter("hfcache_upstream_failures", "Failed upstream resolutions and fetches",
                                         ["reason"], registry=r)
        self.verification_failures = Counter("hfcache_verification_failures",
                                             "Upstream bytes that failed the hash check (never served, not kept)",
                                             registry=r)
        self.upstream_up = Gauge("hfcache_upstream_up", "1 when the upstream answered the last health check",
                                 ["endpoint"], registry=r)
        self._cache_dir = cache_dir
        self._size: tuple[float, int] | None = None
        self._size_lock = threading.Lock()
        if cache_dir is not None:
            Gauge("hfcache_cache_bytes", "Bytes on disk (every distinct content once)",
                  registry=r).set_function(self._cache_bytes)
        self.before_scrape: Callable[[], None] | None = None

    def observe(self, target: str, status: int, bytes_sent: int) -> None:
        """Count one finished request."""
        self.requests.labels(route_of(target), str(status)).inc()
        if bytes_sent:
            self.bytes_served.inc(bytes_sent)

    def cache_changed(self) -> None:
        """The cache's size changed (a fetch, a prune): the next scrape measures it again."""
        with self._size_lock:
            self._size = None

    def render(self) -> bytes:
        """The exposition text of every series (runs :attr:`before_scrape` first, e.g. a health check)."""
        if self.before_scrape is not None:
            self.before_scrape()
        return generate_latest(self.registry)

    def _cache_bytes(self) -> float:
        now = time.monotonic()
        with self._size_lock:
            if self._size is not None and self._size[0] > now:
                return float(self._size[1])
        size = scan_cache(self._cache_dir).size_on_disk if self._cache_dir is not None else 0
        with self._size_lock:
            self._size = (now + SIZE_TTL, size)
        return float(size)
