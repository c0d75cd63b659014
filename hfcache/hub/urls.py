"""The URLs hfcache accepts and builds: endpoint validation, a file's ``resolve`` URL, a URL's origin."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from ..errors import UsageError
from ..names import url_prefix
from ..records import shown


def validate_endpoint(endpoint: str) -> str:
    """The endpoint without a trailing slash. Raises UsageError: not an http(s) URL with a host, credentials in it (they
    would end up in messages), a character that is not printable ASCII or a space (a line break would split messages).
    """
    if not (endpoint.isascii() and endpoint.isprintable()) or " " in endpoint:
        raise UsageError(f"invalid endpoint {shown(endpoint)}: only printable ASCII without spaces",
                         hint="use an http(s) URL such as https://huggingface.co (percent-encode other characters)")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
    except ValueError:
        parts = host = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise UsageError(f"invalid endpoint {shown(endpoint)}",
                         hint="use an http(s) URL such as https://huggingface.co")
    if parts.username or parts.password:
        raise UsageError("the endpoint URL must not carry credentials",
                         hint="pass the token in a file instead: --token-file (serve: --upstream-token-file)")
    return endpoint.rstrip("/")


def resolve_url(endpoint: str, repo_id: str, path: str, repo_type: str, revision: str) -> str:
    """``{endpoint}/{prefix}{repo_id}/resolve/{revision}/{path}`` as ``hf_hub_url`` builds it (file_download.py), here
    because importing file_download.py loads tqdm and asyncio (~25 ms, docs/benchmarks.md)."""
    return f"{endpoint}/{url_prefix(repo_type)}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, lowercase host, port) of a URL: a link to another origin must not get the token."""
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port
