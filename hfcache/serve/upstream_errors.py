"""How the pull-through mirror answers when upstream fails: hfcache error classes as the Hub's HTTP errors."""

from __future__ import annotations

from ..names import escaped
from .vocabulary import StoreMiss

__all__ = ["inert", "store_miss"]

STATUS = {  # hfcache error class -> (HTTP status, X-Error-Code) when upstream fails and the cache has nothing
    "RepoNotFound": (404, "RepoNotFound"),
    "RevisionNotFound": (404, "RevisionNotFound"),
    "GatedRepo": (403, "GatedRepo"),
    "EndpointUnreachable": (503, "UpstreamUnavailable"),
    "IntegrityError": (502, "UpstreamIntegrityError"),
    "CacheError": (507, "CacheError"),
    "UnsafeLayout": (507, "CacheError"),  # a planted link in the repo folder: refused, nothing written through it
    "UnsafeName": (502, "UpstreamError"),
}


def store_miss(error_type: str, message: str, *, fetch: bool = False) -> StoreMiss:
    """The StoreMiss for an hfcache error class: 404/403 as upstream said, 503 unreachable, 502 otherwise."""
    status, code = STATUS.get(error_type, (502, "UpstreamError"))
    if fetch and status == 404:  # the listing named the file: upstream losing it now is upstream's failure
        status, code = 502, "UpstreamError"
    return StoreMiss(code, inert(message), status=status)


def inert(message: str, limit: int = 1000) -> str:
    """``message`` (which may quote upstream text) as one line of printable ASCII for the JSON ``error`` body and the
    ``X-Error-Message`` header: whitespace runs become one space, anything else not printable ASCII is escaped as
    ``\\xNN``/``\\uNNNN``; cut to ``limit`` characters."""
    return escaped(" ".join(message.split())).encode("ascii", "backslashreplace").decode()[:limit]
