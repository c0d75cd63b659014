"""What the test Hub's wrappers read of a request before or after the product answers it: its route, and
sub-requests to the product for another path or without some headers."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from werkzeug.wrappers import Request

from hfcache.names import PLURALS
from hfcache.serve.http import path_segments, split_repo_id
from hfcache.serve.routing import PATH_REPO_TYPES, URL_REPO_TYPES

#: The headers that make a file answer partial or conditional (206, 304, 416).
CONDITIONAL = ("HTTP_RANGE", "HTTP_IF_NONE_MATCH", "HTTP_IF_RANGE")


@dataclass(frozen=True)
class Route:
    """A main-origin request's route: ``kind`` ``"api"`` (``rest``: ``[]``, ``["revision", rev]``, ``["tree", rev,
    *folder]``, ``["xet-read-token", rev]``) or ``"resolve"`` (``rest``: ``["resolve", rev, *path]``)."""

    kind: str
    repo_type: str
    repo_id: str
    rest: tuple[str, ...]

    def is_info(self) -> bool:
        return self.kind == "api" and (not self.rest or (self.rest[0] == "revision" and len(self.rest) == 2))

    def is_api(self, name: str) -> bool:
        return self.kind == "api" and len(self.rest) >= 2 and self.rest[0] == name

    def api_path(self, *rest: str) -> str:
        """The encoded path of this repo's API route ``rest`` (``()``: repo info at ``main``)."""
        parts = ["api", PLURALS[self.repo_type], *self.repo_id.split("/"), *rest]
        return "/" + "/".join(quote(p, safe="") for p in parts)


def route_of(request: Request) -> Route | None:
    """The route of a main-origin request (as :class:`hfcache.serve.routing.Router` reads it), None for others."""
    segments = path_segments(request.environ)
    if len(segments) >= 3 and segments[0] == "api" and segments[1] in URL_REPO_TYPES:
        repo_id, rest = split_repo_id(segments[2:], {"revision", "tree", "xet-read-token"})
        return Route("api", URL_REPO_TYPES[segments[1]], repo_id, tuple(rest))
    typed = bool(segments) and segments[0] in PATH_REPO_TYPES
    repo_id, rest = split_repo_id(segments[1:] if typed else segments, {"resolve"})
    if len(rest) >= 3 and rest[0] == "resolve":
        return Route("resolve", PATH_REPO_TYPES[segments[0]] if typed else "model", repo_id, tuple(rest))
    return None


def subrequest(request: Request, path: str | None = None, *, method: str | None = None,
               drop: tuple[str, ...] = ()) -> Request:
    """``request`` for another encoded ``path`` (no query), another method, or without the ``drop`` environ keys."""
    environ = {k: v for k, v in request.environ.items() if k not in drop}
    if path is not None:
        environ.update(RAW_URI=path, REQUEST_URI=path, PATH_INFO=path, QUERY_STRING="")
    if method is not None:
        environ["REQUEST_METHOD"] = method
    return Request(environ)
