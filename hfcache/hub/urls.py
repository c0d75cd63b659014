"""The URLs hfcache accepts and builds: endpoint validation, a file's ``resolve`` URL, a URL's origin. Standard
library only."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from ..errors import UsageError
from ..names import url_prefix
from ..records import shown


def validate_endpoint(endpoint: str) -> str:
    """The endpoint without a trailing slash.

    Raises:
        UsageError: not an http(s) URL with a host; credentials in it (they would end up in messages and reports);
            a character that is not printable ASCII, or a space (httpx's ``InvalidURL`` at the first request was
            exit 70, and a line break would split the messages naming it).
    """
    if not (endpoint.isascii() and endpoint.isprintable()) or " " in endpoint:
        raise UsageError(f"invalid endpoint {shown(endpoint)}: only printable ASCII without spaces",
                         hint="use an http(s) URL such as https://huggingface.co (percent-encode other characters)")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise UsageError(f"invalid endpoint {shown(endpoint)}",
                         hint="use an http(s) URL such as https://huggingface.co")
    if parts.username or parts.password:
        raise UsageError("the endpoint URL must not carry credentials",
                         hint="pass the token in a file instead: --token-file (serve: --upstream-token-file)")
    return endpoint.rstrip("/")


def resolve_url(endpoint: str, repo_id: str, path: str, repo_type: str, revision: str) -> str:
    """``{endpoint}/{prefix}{repo_id}/resolve/{revision}/{path}``: ``hf_hub_url``'s URL (file_download.py: prefix
    from constants.py ``REPO_TYPES_URL_PREFIXES``, revision quoted with no safe character, path keeping ``/``), built
    here because importing file_download.py loads tqdm and asyncio (~25 ms of a cold warm, docs/benchmarks.md).
    ``endpoint`` has no trailing slash."""
    return f"{endpoint}/{url_prefix(repo_type)}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, lowercase host, port) of a URL: a link to another origin must not get the token."""
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port
