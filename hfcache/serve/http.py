"""HTTP vocabulary of the server: error answers, request-target parsing and small response helpers; it knows nothing
of stores or of HubServer."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from werkzeug.wrappers import Request, Response

__all__ = ["PRINTABLE", "HttpError", "guarded", "header_value", "json_response", "path_segments",
           "raw_target", "repo_path", "split_repo_id", "url_host"]

logger = logging.getLogger("hfcache.serve.routing")

PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))  # what a header value or access log line holds verbatim


class HttpError(Exception):
    """An error answer: status, Hub ``X-Error-Code`` and extra headers (docs/cache-layout.md, 'The Hub protocol')."""

    def __init__(self, status: int, code: str | None, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})

    def response(self) -> Response:
        headers = dict(self.headers)
        if self.code is not None:
            headers["X-Error-Code"] = self.code
            headers["X-Error-Message"] = self.message
        headers = {k: header_value(v) for k, v in headers.items()}
        body = json.dumps({"error": self.message})
        return Response(body, status=self.status, mimetype="application/json", headers=headers)


def guarded(handler: Callable[[Request], Response], request: Request) -> Response:
    """``handler``'s answer to ``request``, an :class:`HttpError`'s answer, or a 500 (logged) on a bug."""
    try:
        return handler(request)
    except HttpError as error:
        return error.response()
    except Exception:
        logger.exception("HubServer failed on %s %s", request.method, raw_target(request.environ))
        return HttpError(500, None, "Internal server error").response()


def header_value(value: str) -> str:
    """``value`` as a header value every stack sends: printable ASCII as is, anything else percent-escaped (a request
    path in a message may be no Latin-1, or hold a ``%0D%0A``: either was a 500)."""
    if all(" " <= c <= "~" for c in value):
        return value
    return quote(value, safe=PRINTABLE + " ")


def raw_target(environ: Mapping[str, Any]) -> str:
    """The request target exactly as sent (path + query, still encoded)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return raw
    query = environ.get("QUERY_STRING")
    return quote(environ.get("PATH_INFO", "/")) + (f"?{query}" if query else "")


def path_segments(environ: Mapping[str, Any]) -> list[str]:
    """Path segments, each URL-decoded on its own: ``refs%2Fpr%2F1`` stays one segment (huggingface_hub quotes
    revisions with ``safe=""``, hf_api.py; werkzeug's PATH_INFO would lose it)."""
    path = raw_target(environ).split("?", 1)[0]
    if path.startswith(("http://", "https://")):  # absolute-form request target
        path = urlsplit(path).path
    return [unquote(segment) for segment in path.split("/")[1:]]


def split_repo_id(segments: list[str], keywords: set[str]) -> tuple[str, list[str]]:
    """(repo_id, rest): a route keyword in second place ends a one-part (org-less) id, as huggingface_hub's
    ``_parse_repo_info_from_url`` (utils/_http.py) reads it."""
    size = 1 if len(segments) < 2 or segments[1] in keywords else 2
    return "/".join(segments[:size]), segments[size:]


def repo_path(parts: list[str]) -> str:
    """A repo-relative file path from decoded segments; refuses anything that could climb out."""
    # Segments may themselves hold '/' (list_repo_tree quotes the folder with safe=""), so split again.
    pieces = "/".join(parts).split("/")
    if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in pieces):
        raise HttpError(400, None, "Invalid path")
    return "/".join(pieces)


def json_response(data: Any) -> Response:
    return Response(json.dumps(data), mimetype="application/json")


def url_host(host: str) -> str:
    """A host usable in a URL: wildcard binds become loopback, IPv6 gets brackets."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host
