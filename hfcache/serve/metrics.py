"""``GET /metrics`` of ``hfcache serve`` (the series: docs/serve.md, "GET /metrics"), one registry per server (tests
run several in one process). Labels are the route and the status only: a client cannot grow the number of series.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
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
    """The counters and gauges of one server; ``cache_dir`` (Path | None): the cache whose size
    ``hfcache_cache_bytes`` reports (None: no such gauge)."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        counter, gauge = partial(Counter, registry=self.registry), partial(Gauge, registry=self.registry)
        self.requests = counter("hfcache_serve_requests", "HTTP requests answered, by route and status",
                                ["route", "status"])
        self.bytes_served = counter("hfcache_serve_bytes_served", "Response body bytes sent")
        self.cache_hits = counter("hfcache_serve_cache_hits", "File bodies answered from the cache")
        self.cache_misses = counter("hfcache_serve_cache_misses", "File bodies the cache lacked")
        self.upstream_resolutions = counter("hfcache_upstream_resolutions", "Revisions resolved against upstream")
        self.upstream_fetches = counter("hfcache_upstream_fetches", "Files downloaded from upstream, verified and kept")
        self.upstream_bytes = counter("hfcache_upstream_bytes", "Bytes downloaded from upstream")
        self.upstream_failures = counter("hfcache_upstream_failures", "Failed upstream resolutions and fetches",
                                         ["reason"])
        self.verification_failures = counter("hfcache_verification_failures",
                                             "Upstream bytes that failed the hash check (never served, not kept)")
        self.upstream_up = gauge("hfcache_upstream_up", "1 when the upstream answered the last health check",
                                 ["endpoint"])
        self._cache_dir = cache_dir
        self._size: tuple[float, int] | None = None
        self._size_lock = threading.Lock()
        if cache_dir is not None:
            gauge("hfcache_cache_bytes", "Bytes on disk (every distinct content once)").set_function(self._cache_bytes)
        self.before_scrape: Callable[[], None] | None = None

    def observe(self, target: str, status: int, bytes_sent: int) -> None:
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
