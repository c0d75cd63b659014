"""HubServer: the Hub-compatible, read-only test and mirror server over a store of repos.

It speaks the subset of the Hugging Face Hub protocol that huggingface_hub's downloaders use
(docs/cache-layout.md, 'The Hub protocol'; routes in :mod:`.routing`), so tests, benchmarks, air-gapped mirrors and ``hfcache serve``
can point ``endpoint=`` at it. This module owns the lifecycle (origins, graceful stop), the request log and the
access log; the answers are :mod:`.routing` and :mod:`.answers`, the stores :mod:`.folder_store` and
:mod:`.cache_store`, the server stacks :mod:`.wsgi` (werkzeug: in-process, instant start, used by the tests) and
:mod:`.asgi` (uvicorn: what ``hfcache serve`` runs; see README "Mirror: hfcache serve" for the measurement).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from werkzeug.wrappers import Request, Response

from .accesslog import LogEntry, RequestRecord
from .cache_store import CacheStore
from .faults import Faults
from .folder_store import FolderStore
from .http import header_value, url_host
from .metrics import CONTENT_TYPE, MirrorMetrics
from .pullthrough import PullThroughConfig, PullThroughStore
from .routing import Router
from .vocabulary import DEFAULT_BRANCH, Store, StoreMiss
from .wsgi import WerkzeugOrigin, wsgi_app
from .xet import CasService, XetMode

__all__ = ["BACKENDS", "LAYOUTS", "HubServer"]

logger = logging.getLogger(__name__)

BACKENDS = ("werkzeug", "uvicorn")
LAYOUTS = ("repos", "cache")


class HubServer:
    """A Hub-compatible read-only HTTP server (main origin, and a CDN origin for LFS files) over ``root``.

    Protocol per docs/cache-layout.md ('The Hub protocol'), checked against huggingface_hub 2.4.0 (file_download.py
    ``get_hf_file_metadata`` / ``_get_metadata_or_catch_error``, utils/_http.py ``hf_raise_for_status``).

    Args:
        root (str | Path): folder of repo folders (``layout="repos"``) or a hub cache (``layout="cache"``).
        host (str): interface for both origins.
        port (int): main origin port; 0 picks a free one. The CDN origin always picks a free port.
        legacy_ids (dict[str, str] | None): legacy id -> canonical id; None reads
            ``<root>/legacy_ids.json`` if present. ``layout="repos"`` only (a cache's aliases come from its folders).
        token (str | None): if set, every main-origin request except ``/healthz`` must carry
            ``Authorization: Bearer <token>``, else 401 ``RepoNotFound`` (as the Hub answers for private repos).
            The CDN origin never checks it (it stands for the Hub's signed CDN URLs).
        gated (Iterable[str]): canonical repo ids answered with 403 ``GatedRepo`` on API and resolve routes.
        throttle_bps (int | None): if set, file bodies are paced to about this many bytes per second
            (werkzeug backend only).
        overrides (dict[tuple[str, str], bytes] | None): ``(canonical repo_id, path) -> bytes`` served as that
            file's body while listings and ETags keep the real file's hashes (to test client hash checks).
        page_size (int): entries per tree listing page before a ``Link: rel="next"`` header.
        layout (str): ``"repos"`` (:class:`FolderStore`) or ``"cache"`` (:class:`CacheStore`).
        backend (str): ``"werkzeug"`` (threaded, default) or ``"uvicorn"`` (asyncio; what ``hfcache serve`` runs).
        lfs_redirect (bool): True: LFS files answer 302 to the CDN origin, as the Hub does. False: no CDN origin;
            the main origin serves LFS bytes itself with ``X-Linked-Etag``/``X-Linked-Size`` (one port to expose).
        record_requests (bool): keep every request in memory for :attr:`requests` (tests); False for long runs.
        access_log (IO[str] | None): a text stream receiving one line per finished request
            (``TIME METHOD PATH STATUS BYTES SECONDS``); headers, and so tokens, are never written.
        metrics (bool): answer ``GET /metrics`` (Prometheus text, :mod:`.metrics`; no token needed, no repo ids).
        upstream (PullThroughConfig | None): ``layout="cache"`` only: fetch what the cache lacks from these
            upstreams (:class:`~.pullthrough.PullThroughStore`); ``/healthz`` then says whether they answer.
        faults (Faults | None): misbehaviours to inject, as poorer mirrors and flaky networks do (:mod:`.faults`:
            no ``?blobs=true``, no tree API, unquoted ETags, 429s, failing bodies, no ``Range``; werkzeug only).
        xet (bool | XetMode): speak Xet as the Hub does (:mod:`.xet`): True for :class:`~.xet.XetMode`'s defaults
            (every LFS file), or a mode (e.g. ``XetMode(min_size=1)``: every non-empty file). A third origin, the
            CAS (:attr:`cas_endpoint`), answers reconstructions and xorb ranges; resolve answers carry
            ``X-Xet-Hash`` and ``Link: ...; rel="xet-auth"``; plain GETs still get the bytes (LFS files through the
            CDN origin, the Hub's LFS bridge). Not with ``upstream``.

    Raises:
        ValueError: an unknown layout or backend, a bad throttle, legacy_ids with a cache, throttle or faults on
            uvicorn, an upstream with ``layout="repos"``, xet with an upstream.
        FileNotFoundError: ``layout="cache"`` and ``root`` is not a directory.
        OSError: from ``start()`` if a port cannot be bound.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        legacy_ids: dict[str, str] | None = None,
        token: str | None = None,
        gated: Iterable[str] = (),
        throttle_bps: int | None = None,
        overrides: dict[tuple[str, str], bytes] | None = None,
        page_size: int = 50,
        layout: str = "repos",
        backend: str = "werkzeug",
        lfs_redirect: bool = True,
        record_requests: bool = True,
        access_log: IO[str] | None = None,
        metrics: bool = False,
        upstream: PullThroughConfig | None = None,
        faults: Faults | None = None,
        xet: bool | XetMode = False,
    ) -> None:
        root = Path(root)
        _check_options(layout=layout, backend=backend, throttle_bps=throttle_bps, upstream=upstream, faults=faults,
                       xet=xet)
        self.xet = CasService(XetMode() if xet is True else xet) if xet else None
        self.metrics = MirrorMetrics(Path(root) if layout == "cache" else None) if metrics or upstream else None
        if upstream is not None:
            self._store: Store = PullThroughStore(root, upstream, self.metrics)
        else:
            self._store = _open_store(root, layout, legacy_ids)
        self.root = root
        self.layout, self.backend = layout, backend
        self.host, self.port = host, port
        self.token = token
        self.gated = frozenset(gated)
        self.throttle_bps = throttle_bps
        self.overrides = dict(overrides or {})
        self.page_size = max(1, page_size)
        self.lfs_redirect = lfs_redirect
        self.record_requests = record_requests
        self.access_log = access_log
        self._router = Router(self._store, host=host, token=token, gated=self.gated, overrides=self.overrides,
                              page_size=self.page_size, lfs_redirect=lfs_redirect, public=self._public_routes(),
                              faults=faults, xet=self.xet)
        self.faults = self._router.faults
        self._log: list[LogEntry] = []
        self._log_lock = threading.Lock()
        self._active = 0
        self._active_cond = threading.Condition()
        self._stopping = threading.Event()
        self._origins: list[Any] = []
        self.endpoint = ""
        self.cdn_endpoint = ""
        self.cas_endpoint = ""

    # -- lifecycle

    def start(self) -> HubServer:
        """Bind the origin(s) and serve them from background threads; returns self.

        Raises:
            OSError: a port cannot be bound.
        """
        if self._origins:
            raise RuntimeError("HubServer already started")
        self._stopping.clear()
        try:
            hub = self._serve(self.port, "hub")
            if self.lfs_redirect:
                cdn = self._serve(0, "cdn")
                self._router.cdn_port = cdn.port
                self.cdn_endpoint = f"http://{url_host(self.host)}:{cdn.port}"
            if self.xet is not None:
                cas = self._serve(0, "cas")
                self.xet.cas_port = cas.port
                self.cas_endpoint = f"http://{url_host(self.host)}:{cas.port}"
        except BaseException:
            self.stop()
            raise
        self.endpoint = f"http://{url_host(self.host)}:{hub.port}"
        return self

    def stop(self, grace: float = 0.0) -> int:
        """Stop serving. New connections are refused at once; responses still streaming get up to ``grace``
        seconds to finish, then are cut short, as when a real server dies. Setting :attr:`stopping` from another
        thread ends the grace period early.

        Args:
            grace (float): seconds to let in-flight responses finish (0: cut them now).

        Returns:
            int: responses still streaming when they were cut short.
        """
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
        if isinstance(self._store, PullThroughStore):
            self._store.close()
        return cut

    @property
    def active(self) -> int:
        """Responses started and not finished yet."""
        with self._active_cond:
            return self._active

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(self, port: int, origin: str) -> Any:
        if self.backend == "uvicorn":
            from .asgi import UvicornOrigin

            # A pull-through mirror's requests waiting on upstream get threads of their own (upstream_pool.py).
            slots = getattr(getattr(self._store, "config", None), "upstream_slots", 0)
            served = UvicornOrigin(self.host, port, self, origin, extra_workers=slots if origin == "hub" else 0)
        else:
            served = WerkzeugOrigin(self.host, port, wsgi_app(self, origin, self.throttle_bps))
        self._origins.append(served)
        return served

    # -- request log and content

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request on both origins so far, in the order their responses started (a copy; empty when
        ``record_requests`` is False)."""
        with self._log_lock:
            return [entry.freeze() for entry in self._log]

    def clear_log(self) -> None:
        """Forget the requests logged so far."""
        with self._log_lock:
            self._log.clear()

    def commit_of(self, repo_id: str, repo_type: str = "model", revision: str = DEFAULT_BRANCH) -> str:
        """The 40-hex commit ``revision`` of the repo resolves to (legacy ids accepted).

        Raises:
            KeyError: no such repo or revision in the store.
        """
        try:
            return self._store.snapshot(repo_type, repo_id, revision).commit
        except StoreMiss:
            raise KeyError(repo_id) from None

    # -- one request, for both stacks

    def respond(self, origin: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[bytes],
                                                                      LogEntry]:
        """Answer one request given as a WSGI environ: (status line, headers, body, log entry).

        The body is a :class:`FileBody` for file bytes, else a short iterable. The caller streams it, adds to
        ``entry.bytes_sent`` and calls :meth:`finish` exactly once, after the last byte or on failure.
        """
        entry = LogEntry(origin, environ)
        if self.faults.latency_ms:
            time.sleep(self.faults.latency_ms / 1000)
        response = self._router.answer(origin, Request(environ))
        entry.status = response.status_code
        if self.record_requests:
            with self._log_lock:
                self._log.append(entry)
        # A FileBody comes back as is (direct_passthrough); HEAD/304 get an empty iterable that closes the file.
        app_iter, status, headers = response.get_wsgi_response(environ)
        headers = [(k, header_value(v)) for k, v in headers]
        with self._active_cond:
            self._active += 1
        return status, list(headers), app_iter, entry

    def finish(self, entry: LogEntry) -> None:
        """A response is over (complete, cut short or failed): count it, write its access log line."""
        if self.metrics is not None:
            self.metrics.observe(entry.origin, entry.method, entry.path, entry.status, entry.bytes_sent)
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
        """Set when responses still streaming must end now."""
        return self._stopping

    @property
    def store(self) -> Store:
        """The store answering the requests."""
        return self._store

    # -- /metrics and /healthz

    def _public_routes(self) -> dict[str, Any]:
        routes: dict[str, Any] = {}
        if self.metrics is not None:
            routes["metrics"] = lambda request: Response(self.metrics.render(), content_type=CONTENT_TYPE)
        if isinstance(self._store, PullThroughStore):
            self.metrics.before_scrape = self._store.upstream_health
            routes["healthz"] = self._healthz
        return routes

    def _healthz(self, request: Request) -> Response:
        """200 while the mirror serves its cache; the body says which upstreams answer (liveness must not depend
        on upstream: a pod restarted for the Hub's outage would lose nothing but its ability to serve)."""
        health = self._store.upstream_health()
        body = {"status": "ok", "upstream_reachable": any(up is True for _, up in health),
                "upstreams": [{"endpoint": endpoint, "reachable": up} for endpoint, up in health]}
        return Response(json.dumps(body), mimetype="application/json")


def _check_options(*, layout: str, backend: str, throttle_bps: int | None, upstream: PullThroughConfig | None,
                   faults: Faults | None, xet: bool | XetMode) -> None:
    """Refuse a combination of HubServer options that cannot work, with a ValueError naming it."""
    if xet and upstream is not None:
        raise ValueError("xet needs a local store (no pull-through upstream)")
    if faults is not None and faults != Faults() and backend != "werkzeug":
        raise ValueError("faults are supported by the werkzeug backend only")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if throttle_bps is not None and throttle_bps <= 0:
        raise ValueError("throttle_bps must be a positive number of bytes per second")
    if throttle_bps is not None and backend != "werkzeug":
        raise ValueError("throttle_bps is supported by the werkzeug backend only")
    if upstream is not None and layout != "cache":
        raise ValueError("a pull-through upstream needs layout='cache'")


def _open_store(root: Path, layout: str, legacy_ids: dict[str, str] | None) -> Store:
    """The store for ``layout`` (``"repos"`` or ``"cache"``); ``legacy_ids`` None reads ``<root>/legacy_ids.json``.

    Raises:
        ValueError: legacy_ids with a cache.
        FileNotFoundError: ``layout="cache"`` and ``root`` is not a directory.
    """
    if layout == "cache":
        if legacy_ids is not None:
            raise ValueError("legacy_ids apply to layout='repos'; a cache's legacy folders are found by commit")
        return CacheStore(root)
    if legacy_ids is None:
        legacy_file = root / "legacy_ids.json"
        legacy_ids = json.loads(legacy_file.read_text()) if legacy_file.is_file() else {}
    return FolderStore(root, legacy_ids)
