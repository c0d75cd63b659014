"""The URLs hfcache accepts and builds: endpoint validation, a file's ``resolve`` URL, a URL's origin.

Standard library only (huggingface_hub's ``hf_hub_url`` is not imported: see :func:`resolve_url`).
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from ..names import url_prefix
from ..errors import UsageError
from ..records import shown


def validate_endpoint(endpoint: str) -> str:
    """Return the endpoint without a trailing slash, or raise UsageError for anything but an http(s) URL with a host.

    Credentials in the URL (``https://user:pass@host``) are refused: they would end up in messages and reports.
    So is any character that is not printable ASCII or is a space (httpx raises ``InvalidURL`` on control characters
    at the first request, which surfaced as an internal error; a line break would also split the messages naming it).
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
    """The URL of one file at a revision: ``{endpoint}/{prefix}{repo_id}/resolve/{revision}/{path}``.

    Same URL as ``hf_hub_url`` (file_download.py: ``HUGGINGFACE_CO_URL_TEMPLATE``, prefix ``datasets/``, ``spaces/``
    or ``kernels/`` from constants.py ``REPO_TYPES_URL_PREFIXES``, revision quoted with no safe character, path
    quoted keeping ``/``), built here because importing file_download.py loads tqdm and asyncio (~25 ms of every
    cold warm, docs/benchmarks.md).

    Args:
        endpoint: base URL without a trailing slash.
        repo_id: ``org/name`` or a legacy id. path: the file's path in the repo. repo_type: ``model``, ``dataset``,
            ``space`` or ``kernel``. revision: a branch, tag or commit.

    Returns:
        str: the absolute URL.
    """
    return f"{endpoint}/{url_prefix(repo_type)}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, lowercase host, port) of a URL: a link to another origin must not get the token."""
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port
