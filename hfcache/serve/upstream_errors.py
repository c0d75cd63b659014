"""How the pull-through mirror answers when upstream fails: hfcache error classes as the Hub's HTTP errors."""

from __future__ import annotations

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
    """``message`` (which may quote upstream text: a listed file name, an error) as one line of printable ASCII,
    for the JSON ``error`` body and the ``X-Error-Message`` header alike: whitespace runs (CR, LF, U+2028...) become
    one space, every other character ``str.isprintable`` refuses (ESC, DEL, C1, bidi controls) is escaped as
    ``\\xNN``/``\\uNNNN``, non-ASCII as ``\\uNNNN``; cut to ``limit`` characters."""
    text = "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in " ".join(message.split()))
    return text.encode("ascii", "backslashreplace").decode()[:limit]
