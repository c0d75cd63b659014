"""How the pull-through mirror answers when upstream fails: hfcache error classes as the Hub's HTTP errors, and the
empty body of a HEAD for a file not fetched yet."""

from __future__ import annotations

from .vocabulary import StoreMiss

__all__ = ["Empty", "store_miss"]

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


class Empty:
    """The body of a HEAD answer for a file not fetched yet: no bytes, and no file descriptor."""

    def read(self, size: int = -1) -> bytes:
        return b""

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def close(self) -> None:
        pass


def store_miss(error_type: str, message: str, *, fetch: bool = False) -> StoreMiss:
    """The StoreMiss for an hfcache error class: 404/403 as upstream said, 503 unreachable, 502 otherwise."""
    status, code = STATUS.get(error_type, (502, "UpstreamError"))
    if fetch and status == 404:  # the listing named the file: upstream losing it now is upstream's failure
        status, code = 502, "UpstreamError"
    # One line of printable ASCII: it also travels in the X-Error-Message header.
    text = " ".join(message.split()).encode("ascii", "backslashreplace").decode()[:1000]
    return StoreMiss(code, text, status=status)
