"""HubServer: ``hfcache serve``'s server, the Hub protocol (:mod:`.routing`) over a store of repos on uvicorn
(:mod:`.asgi`) in background threads: the lifecycle (the origin, graceful stop), the access log, ``/metrics``."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from werkzeug.wrappers import Request, Response

from .body import LogEntry
from .cache_store import CacheStore
from .folder_store import FolderStore
from .http import header_value, url_host
from .metrics import CONTENT_TYPE, MirrorMetrics
from .pullthrough import PullThroughConfig, PullThroughStore
from .routing import Router
from .vocabulary import Store

__all__ = ["LAYOUTS", "HubServer"]

logger = logging.getLogger(__name__)

LAYOUTS = ("repos", "cache", "bucket")


class HubServer:
    """A Hub-compatible read-only HTTP server over ``root`` for huggingface_hub's downloaders (docs/cache-layout.md,
    'The Hub protocol'; huggingface_hub 2.4.0 file_download.py ``get_hf_file_metadata``): one origin (LFS files with
    ``X-Linked-Etag``/``X-Linked-Size``, no CDN), ``GET /metrics`` (:mod:`.metrics`) and ``GET /healthz``.

    Args:
        root: a hub cache (``layout="cache"``) or repo folders (``layout="repos"``, legacy ids from
            ``<root>/legacy_ids.json`` if present). host, port: where to listen (0: any free port).
        token: required as ``Authorization: Bearer`` (not by ``/healthz``, ``/metrics``), else 401 ``RepoNotFound``.
        access_log: one line per finished request (never a header). upstream: ``layout="cache"`` only: pull
            through (``/healthz`` then says whether the upstreams answer). store: ``layout="bucket"`` only: the
            store to answer from (:class:`.bucket_store.BucketStore`).

    Raises:
        ValueError: an unknown layout, an upstream with ``layout="repos"``. FileNotFoundError: no cache at ``root``.
    """

    def __init__(self, root: str | Path, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 layout: str = "repos", access_log: IO[str] | None = None,
                 upstream: PullThroughConfig | None = None, store: Store | None = None) -> None:
        if layout not in LAYOUTS or (layout == "bucket") != (store is not None):
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r} (a given store: 'bucket')")
        if upstream is not None and layout != "cache":
            raise ValueError("a pull-through upstream needs layout='cache'")
        self.root, self.layout, self.host, self.port = Path(root), layout, host, port
        self.token, self.access_log, self.upstream = token, access_log, upstream
        self.metrics = MirrorMetrics(self.root if layout == "cache" else None)
        self._store = store if store is not None else self._open_store()
        self.router = Router(self._store, token=token, public=self._public_routes())
        self._log_lock = threading.Lock()
        self._active = 0
        self._active_cond = threading.Condition()
        self._stopping = threading.Event()
        self._origins: list[Any] = []
        self.endpoint = ""

    def _open_store(self) -> Store:
        if self.upstream is not None:
            return PullThroughStore(self.root, self.upstream, self.metrics)
        if self.layout == "cache":
            return CacheStore(self.root)
        legacy_file = self.root / "legacy_ids.json"
        return FolderStore(self.root, json.loads(legacy_file.read_text()) if legacy_file.is_file() else {})

    def start(self) -> HubServer:
        """Bind the origin and serve it from background threads; returns self. Raises OSError: the port is taken."""
        if self._origins:
            raise RuntimeError("HubServer already started")
        self._stopping.clear()
        try:
            hub = self._serve(self.port, "hub")
        except BaseException:
            self.stop()
            raise
        self.endpoint = f"http://{url_host(self.host)}:{hub.port}"
        return self

    def stop(self, grace: float = 0.0) -> int:
        """Stop serving: new connections are refused at once; responses still streaming get up to ``grace`` seconds
        (setting :attr:`stopping` ends it early), then are cut short. Returns the number cut short."""
        origins, self._origins = self._origins, []
        if grace <= 0:
            self._stopping.set()
        for origin in origins:
            origin.close_listener(grace)
        deadline = time.monotonic() + max(0.0, grace)
        with self._active_cond:
            while self._active and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._active_cond.wait(min(left, 0.2))
            cut = self._active
        self._stopping.set()
        for origin in origins:
            origin.join(timeout=5)
        if self.upstream is not None or self.layout == "bucket":
            self._store.close()
        return cut

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(self, port: int, origin: str) -> Any:
        from .asgi import UvicornOrigin  # uvicorn is imported when a server starts

        # A pull-through mirror's requests waiting on upstream get threads of their own (upstream_pool.py).
        slots = self.upstream.upstream_slots if self.upstream is not None and origin == "hub" else 0
        slots = slots or getattr(self._store, "upstream_slots", 0)  # a bucket store that pulls through
        served = UvicornOrigin(self.host, port, self, origin, extra_workers=slots)
        self._origins.append(served)
        return served

    def answer(self, origin: str, request: Request) -> Response:
        return self.router.answer(request)

    def respond(self, origin: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[bytes],
                                                                      LogEntry]:
        """(status line, headers, body, log entry) for a WSGI environ: the :class:`~.body.Responder` contract."""
        entry = LogEntry(environ)
        response = self.answer(origin, Request(environ))
        entry.status = response.status_code
        # A FileBody comes back as is (direct_passthrough); HEAD/304 get an empty iterable that closes the file.
        app_iter, status, headers = response.get_wsgi_response(environ)
        with self._active_cond:
            self._active += 1
        return status, [(k, header_value(v)) for k, v in headers], app_iter, entry

    def finish(self, entry: LogEntry) -> None:
        """A response is over (complete, cut short or failed): count it, write its access log line."""
        self.metrics.observe(entry.path, entry.status, entry.bytes_sent)
        if self.access_log is not None:
            line = entry.access_line()
            with self._log_lock:
                try:
                    self.access_log.write(line)
                    self.access_log.flush()
                except (OSError, ValueError):
                    logger.warning("cannot write the access log", exc_info=True)
        with self._active_cond:
            self._active -= 1
            self._active_cond.notify_all()

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    @property
    def store(self) -> Store:
        return self._store

    def _public_routes(self) -> dict[str, Any]:
        routes: dict[str, Any] = {"metrics": lambda request: Response(self.metrics.render(), content_type=CONTENT_TYPE)}
        if self.upstream is not None:
            self.metrics.before_scrape = self._store.upstream_health
            routes["healthz"] = self._healthz
        return routes

    def _healthz(self, request: Request) -> Response:
        """200 while the mirror serves (liveness never follows upstream); the body says which upstreams answer."""
        health = self._store.upstream_health()
        body = {"status": "ok", "upstream_reachable": any(up is True for _, up in health),
                "upstreams": [{"endpoint": endpoint, "reachable": up} for endpoint, up in health]}
        return Response(json.dumps(body), mimetype="application/json")
