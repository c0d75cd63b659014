"""Faults the test Hub injects: what mirrors, proxies and flaky networks do to clients.

One frozen :class:`Faults` configures them; :class:`FaultyHub` wraps the product's answers (``answer(origin,
request) -> Response``, :class:`hfcache.serve.HubServer`) and rewrites them: it answers some requests itself (429s,
the 404s of a missing API), changes others (no ``?blobs=true`` data, bare ETags, no ``Range``, failing bodies), and
marks bodies to be cut midway, which the werkzeug stack (:mod:`.wsgi`) does on the raw socket.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from werkzeug.wrappers import Request, Response

from hfcache.serve.body import FileBody
from hfcache.serve.http import HttpError, path_segments

from .routes import route_of, subrequest

_BODY_FAILURES = ("502", "503", "reset")
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
#: The environ key marking a response whose body :func:`reset_midway` cuts.
RESET = "testhub.reset_midway"

Answer = Callable[[str, Request], Response]


@dataclass(frozen=True)
class Faults:
    """Misbehaviours to inject (all off by default).

    Attributes:
        no_blobs (bool): repo info ignores ``?blobs=true``: siblings carry ``rfilename`` only.
        no_tree (bool): the tree API answers 404.
        info_needs_revision (bool): repo info without ``/revision/<rev>`` answers 404.
        unquoted_etags (bool): ``ETag`` and ``X-Linked-Etag`` values without quotes.
        no_range (bool): ``Range`` is ignored (always 200 with the whole body) and ``Accept-Ranges`` is not sent.
        rate_limit (int): the first N main-origin requests answer 429 with ``Retry-After``.
        retry_after (int): seconds sent in ``Retry-After`` (whole seconds, as the Hub sends them).
        failing_bodies (int): the first N file-body GETs (resolve or CDN) fail.
        body_failure (str): how they fail: ``"502"``/``"503"`` (an error answer) or ``"reset"`` (the connection is
            cut after half the body was sent).
        latency_ms (int): every answer waits this many milliseconds before it starts (a remote Hub's round
            trip; the loopback has none).
    """

    no_blobs: bool = False
    no_tree: bool = False
    info_needs_revision: bool = False
    unquoted_etags: bool = False
    no_range: bool = False
    rate_limit: int = 0
    retry_after: int = 1
    failing_bodies: int = 0
    body_failure: str = "503"
    latency_ms: int = 0

    def __post_init__(self) -> None:
        if self.body_failure not in _BODY_FAILURES:
            raise ValueError(f"body_failure must be one of {_BODY_FAILURES}, got {self.body_failure!r}")
        if min(self.rate_limit, self.failing_bodies, self.retry_after, self.latency_ms) < 0:
            raise ValueError("fault counts and retry_after must be >= 0")


def parse_faults(specs: Iterable[str]) -> Faults:
    """Faults from ``NAME`` (a boolean switched on) or ``NAME=VALUE`` strings, e.g. ``["no_blobs", "rate_limit=3"]``.

    Raises:
        ValueError: an unknown name or a value of the wrong type.
    """
    values: dict[str, Any] = {}
    for spec in specs:
        name, sep, raw = spec.partition("=")
        if name not in Faults.__dataclass_fields__:
            raise ValueError(f"unknown fault {name!r}: one of {', '.join(Faults.__dataclass_fields__)}")
        kind = type(getattr(Faults(), name))
        if kind is bool:
            if sep and raw.lower() not in _BOOLEANS:
                raise ValueError(f"fault {name} is on or off ({', '.join(sorted(_BOOLEANS))}), got {raw!r}")
            values[name] = _BOOLEANS[raw.lower()] if sep else True
        elif kind is int:
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"fault {name} takes a whole number, got {raw!r}") from None
        else:
            values[name] = raw
    return Faults(**values)


class FaultyHub:
    """``answer`` with ``faults`` injected on the main (``"hub"``) and CDN (``"cdn"``) origins; the Xet CAS origin
    only waits ``latency_ms``. ``token``: the server's, so that a request the product refuses (401) is not counted
    as one of the first ``rate_limit``. Thread-safe."""

    def __init__(self, faults: Faults, answer: Answer, token: str | None) -> None:
        self.faults, self._answer, self._token = faults, answer, token
        self._lock = threading.Lock()
        self._counts = {"rate_limit": 0, "failing_bodies": 0}

    def __call__(self, origin: str, request: Request) -> Response:
        faults = self.faults
        if faults.latency_ms:
            time.sleep(faults.latency_ms / 1000)
        if origin == "cas":
            return self._answer(origin, request)
        refused = self._refused(request) if origin == "hub" else None
        if refused is not None:
            return refused
        response = self._answer(origin, subrequest(request, drop=("HTTP_RANGE",)) if faults.no_range else request)
        if (request.method == "GET" and response.status_code in (200, 206, 304, 416) and "ETag" in response.headers
                and self._take("failing_bodies")):  # a file answer: the first N fail
            if faults.body_failure != "reset":
                response.close()
                return HttpError(int(faults.body_failure), None, "fault: bad gateway or unavailable").response()
            if isinstance(response.response, FileBody):
                request.environ[RESET] = True
        if faults.no_blobs and response.status_code == 200 and origin == "hub" and (route := route_of(request)) \
                and route.is_info():
            info = json.loads(response.get_data())
            info["siblings"] = [{"rfilename": s["rfilename"]} for s in info["siblings"]]
            response.set_data(json.dumps(info))
        for name in ("ETag", "X-Linked-Etag") if faults.unquoted_etags else ():
            value = response.headers.get(name)
            if value and len(value) >= 2 and value[0] == value[-1] == '"':
                response.headers[name] = value[1:-1]
        if faults.no_range:
            response.headers.pop("Accept-Ranges", None)
        return response

    def _refused(self, request: Request) -> Response | None:
        """The fault's own answer to a main-origin request (429, a missing API's 404), or None. Public paths, and
        what the product refuses (401, 405), go to the product uncounted, as their checks come first."""
        sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
        if (request.method not in ("GET", "HEAD") or path_segments(request.environ) in (["healthz"], ["metrics"])
                or self._token is not None and not hmac.compare_digest(sent, f"Bearer {self._token}".encode())):
            return None
        if self._take("rate_limit"):
            return HttpError(429, None, "Too many requests", {"Retry-After": str(self.faults.retry_after)}).response()
        route = route_of(request)
        if route is None or route.kind != "api":
            return None
        if not route.rest and self.faults.info_needs_revision:
            return HttpError(404, None, "Not found").response()
        if route.is_api("tree") and self.faults.no_tree:
            info = self._answer("hub", subrequest(request, route.api_path()))  # RepoNotFound before a plain 404
            if info.status_code != 200:
                return info
            info.close()
            return HttpError(404, None, "Not found").response()
        return None

    def _take(self, name: str) -> bool:
        """True (and counted) while the first ``faults.<name>`` are being answered."""
        with self._lock:
            if self._counts[name] >= getattr(self.faults, name):
                return False
            self._counts[name] += 1
            return True


def reset_midway(chunks: Iterable[bytes], length: int, environ: Mapping[str, Any]) -> Iterator[bytes]:
    """Send about half of a body of ``length`` bytes, then cut the TCP connection (a CDN dropping a transfer).

    Raises ConnectionResetError after shutting the socket down, which werkzeug treats as a dropped connection
    (no error page written into the half-sent body).
    """
    budget = max(1, length // 2)
    sent = 0
    try:
        for chunk in chunks:
            piece = chunk[: budget - sent]
            if piece:
                yield piece
                sent += len(piece)
            if sent >= budget:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    raise ConnectionResetError("fault: connection reset mid-body")
