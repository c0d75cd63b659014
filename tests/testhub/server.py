"""The test Hub: ``hfcache serve``'s server (:class:`hfcache.serve.HubServer`) with what tests need and users do not.

It reuses the product's store, router, lifecycle and uvicorn stack, and adds around them: the werkzeug stack
(:mod:`.wsgi`, the default: in-process, instant start; paced bodies), a CDN origin for LFS files (:mod:`.cdn`), Xet
(:mod:`.xet`), faults (:mod:`.faults`), gated repos and overridden bodies (:class:`TestStore`), legacy ids given in
code, a tree page size, and the request log (:attr:`HubServer.requests`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, BinaryIO

from werkzeug.wrappers import Request, Response

from hfcache import serve
from hfcache.serve.body import LogEntry
from hfcache.serve.folder_store import FolderStore
from hfcache.serve.http import guarded, url_host
from hfcache.serve.pullthrough import PullThroughConfig
from hfcache.serve.vocabulary import DEFAULT_BRANCH, RepoFile, RepoSnapshot, Store, StoreMiss

from .cdn import Cdn
from .faults import Faults, FaultyHub
from .wsgi import WerkzeugOrigin, wsgi_app
from .xet import CasService, XetHub, XetMode

__all__ = ["BACKENDS", "HubServer", "RequestRecord", "TestStore"]

BACKENDS = ("werkzeug", "uvicorn")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the test Hub saw it.

    Attributes:
        origin (str): ``"hub"`` (main origin), ``"cdn"`` (LFS origin) or ``"cas"`` (Xet).
        method (str): HTTP method, e.g. ``"HEAD"``.
        path (str): raw request target as sent: path and query string, still URL-encoded.
        status (int): HTTP status code answered.
        authorized (bool): whether the request carried an ``Authorization`` header (any value).
        bytes_sent (int): body bytes handed to the socket (0 for HEAD and redirects).
        range (str | None): the ``Range`` header as sent, e.g. ``"bytes=1048576-"``; None without one.
    """

    origin: str
    method: str
    path: str
    status: int
    authorized: bool
    bytes_sent: int
    range: str | None = None


class HubServer(serve.HubServer):
    """The test Hub over ``root``: a main origin, a CDN origin for LFS files, and with ``xet`` a CAS origin.

    Args (beyond :class:`hfcache.serve.HubServer`'s ``root``, ``host``, ``port``, ``token``, ``layout``,
    ``access_log``, ``upstream``; the CDN origin never checks ``token``: it stands for the Hub's signed URLs):
        legacy_ids (dict[str, str] | None): legacy id -> canonical id; None reads ``<root>/legacy_ids.json`` if
            present. ``layout="repos"`` only (a cache's aliases come from its folders).
        gated (Iterable[str]): canonical repo ids answered with 403 ``GatedRepo`` on API and resolve routes.
        throttle_bps (int | None): file bodies paced to about this many bytes per second (werkzeug only).
        overrides (dict[tuple[str, str], bytes] | None): ``(canonical repo_id, path) -> bytes`` served as that
            file's body while listings and ETags keep the real file's hashes (to test client hash checks).
        page_size (int): entries per tree listing page before a ``Link: rel="next"`` header.
        backend (str): ``"werkzeug"`` (default) or ``"uvicorn"`` (what ``hfcache serve`` runs).
        lfs_redirect (bool): True: LFS files answer 302 to the CDN origin (:attr:`cdn_endpoint`), as the Hub does.
            False: the main origin serves them (one port, as ``hfcache serve``).
        record_requests (bool): keep every request in memory for :attr:`requests`; False for long runs.
        faults (Faults | None): misbehaviours to inject (:mod:`.faults`; werkzeug only).
        xet (bool | XetMode): speak Xet as the Hub does (:mod:`.xet`, tests/README.md): True for :class:`XetMode`'s
            defaults (every LFS file), or a mode (e.g. ``XetMode(min_size=1)``: every non-empty file). A third
            origin, the CAS (:attr:`cas_endpoint`). Not with ``upstream``.

    Raises:
        ValueError: a combination that cannot work (see :func:`_check_options`), or :class:`hfcache.serve.HubServer`'s.
    """

    def __init__(self, root: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 legacy_ids: dict[str, str] | None = None, token: str | None = None, gated: Iterable[str] = (),
                 throttle_bps: int | None = None, overrides: dict[tuple[str, str], bytes] | None = None,
                 page_size: int = 50, layout: str = "repos", backend: str = "werkzeug", lfs_redirect: bool = True,
                 record_requests: bool = True, access_log: IO[str] | None = None,
                 upstream: PullThroughConfig | None = None, faults: Faults | None = None,
                 xet: bool | XetMode = False) -> None:
        _check_options(layout=layout, backend=backend, throttle_bps=throttle_bps, upstream=upstream, faults=faults,
                       xet=xet, legacy_ids=legacy_ids)
        self._legacy_ids, self.gated, self.overrides = legacy_ids, frozenset(gated), dict(overrides or {})
        super().__init__(root, host=host, port=port, token=token, layout=layout, access_log=access_log,
                         upstream=upstream)
        self.backend, self.throttle_bps, self.record_requests = backend, throttle_bps, record_requests
        self.router.page_size = max(1, page_size)
        self.faults = faults or Faults()
        self.xet = CasService(XetMode() if xet is True else xet) if xet else None
        self.cdn = Cdn(self.store, self._base, host) if lfs_redirect else None
        self._answer = self._compose()
        self._log: list[tuple[str, LogEntry, bool, str | None]] = []  # origin, entry, authorized, range
        self.cdn_endpoint = self.cas_endpoint = ""

    def _open_store(self) -> Store:
        base = FolderStore(self.root, self._legacy_ids) if self._legacy_ids is not None else super()._open_store()
        self._base = base
        return TestStore(base, self.gated, self.overrides) if self.gated or self.overrides else base

    def _compose(self) -> Any:
        """``answer(origin, request)``: the product's main origin, split for the CDN, speaking Xet, with faults."""
        hub = self.router.answer
        origins: dict[str, Any] = {}
        if self.cdn is not None:
            hub = self.cdn.split(hub)
            origins["cdn"] = partial(guarded, self.cdn.answer)
        if self.xet is not None:
            hub = XetHub(self.xet, self._base, hub)
            origins["cas"] = partial(guarded, self.xet.answer)
        origins["hub"] = hub

        def answer(origin: str, request: Request) -> Response:
            return origins[origin](request)

        return FaultyHub(self.faults, answer, self.token) if self.faults != Faults() else answer

    def answer(self, origin: str, request: Request) -> Response:
        return guarded(partial(self._answer, origin), request)

    def start(self) -> HubServer:
        super().start()
        try:
            if self.cdn is not None:
                self.cdn.port = self._serve(0, "cdn").port
                self.cdn_endpoint = f"http://{url_host(self.host)}:{self.cdn.port}"
            if self.xet is not None:
                self.xet.cas_port = self._serve(0, "cas").port
                self.cas_endpoint = f"http://{url_host(self.host)}:{self.xet.cas_port}"
        except BaseException:
            self.stop()
            raise
        return self

    def _serve(self, port: int, origin: str) -> Any:
        if self.backend != "werkzeug":
            return super()._serve(port, origin)
        served = WerkzeugOrigin(self.host, port, wsgi_app(self, origin, self.throttle_bps))
        self._origins.append(served)
        return served

    def respond(self, origin: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[bytes],
                                                                      LogEntry]:
        answered = super().respond(origin, environ)
        if self.record_requests:
            with self._log_lock:
                self._log.append((origin, answered[3], "HTTP_AUTHORIZATION" in environ, environ.get("HTTP_RANGE")))
        return answered

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request on every origin so far, in the order their responses started (a copy; empty when
        ``record_requests`` is False)."""
        with self._log_lock:
            return [RequestRecord(origin, e.method, e.path, e.status, authorized, e.bytes_sent, range_)
                    for origin, e, authorized, range_ in self._log]

    def clear_log(self) -> None:
        """Forget the requests logged so far."""
        with self._log_lock:
            self._log.clear()

    def commit_of(self, repo_id: str, repo_type: str = "model", revision: str = DEFAULT_BRANCH) -> str:
        """The 40-hex commit ``revision`` of the repo resolves to (legacy ids accepted; gating ignored).

        Raises:
            KeyError: no such repo or revision in the store.
        """
        try:
            return self._base.snapshot(repo_type, repo_id, revision).commit
        except StoreMiss:
            raise KeyError(repo_id) from None


class TestStore:
    """A store with gated repos (403 ``GatedRepo`` after RepoNotFound, before RevisionNotFound, as the Hub orders
    them) and overridden bodies; everything else is ``store``'s."""

    __test__ = False  # not a pytest test class

    def __init__(self, store: Store, gated: frozenset[str], overrides: dict[tuple[str, str], bytes]) -> None:
        self._store, self._gated, self._overrides = store, gated, overrides

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        try:
            snapshot = self._store.snapshot(repo_type, repo_id, revision)
        except StoreMiss as miss:
            if miss.code == "RevisionNotFound" and miss.repo_id:
                self._check_gated(repo_type, miss.repo_id)
            raise
        self._check_gated(repo_type, snapshot.repo_id)
        return snapshot

    def _check_gated(self, repo_type: str, repo_id: str) -> None:
        if repo_id in self._gated:
            raise StoreMiss("GatedRepo", f"Access to {repo_type} {repo_id} is restricted and you are not in the "
                            f"authorized list. Visit https://huggingface.co/{repo_id} to ask for access.", status=403)

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot, *, head: bool = False) -> BinaryIO:
        data = self._overrides.get((snapshot.repo_id, repo_file.path))
        if data is None:
            return self._store.open(repo_file, snapshot, head=head)
        body = tempfile.TemporaryFile()  # noqa: SIM115 - returned open: the server frames it by its fstat size
        body.write(data)
        body.seek(0)
        return body


def _check_options(*, layout: str, backend: str, throttle_bps: int | None, upstream: PullThroughConfig | None,
                   faults: Faults | None, xet: bool | XetMode, legacy_ids: dict[str, str] | None) -> None:
    """Refuse a combination of options that cannot work, with a ValueError naming it."""
    if xet and upstream is not None:
        raise ValueError("xet needs a local store (no pull-through upstream)")
    if faults is not None and faults != Faults() and backend != "werkzeug":
        raise ValueError("faults are supported by the werkzeug backend only")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if throttle_bps is not None and throttle_bps <= 0:
        raise ValueError("throttle_bps must be a positive number of bytes per second")
    if throttle_bps is not None and backend != "werkzeug":
        raise ValueError("throttle_bps is supported by the werkzeug backend only")
    if legacy_ids is not None and layout == "cache":
        raise ValueError("legacy_ids apply to layout='repos'; a cache's legacy folders are found by commit")
