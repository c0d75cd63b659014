"""The Xet answers: the Hub's Xet headers and read token, and the CAS origin (reconstructions, xorb ranges).

Facts relied on (huggingface/hub-docs docs/xet/*.md; huggingface/xet-core ``xet_client``; huggingface_hub 2.4.0
``utils/_xet.py``, ``constants.py``, ``file_download.py``):

- resolve answers of Xet files carry ``X-Xet-Hash`` (docs/xet/file-id.md) and ``Link: <token URL>; rel="xet-auth"``
  (huggingface_hub ``parse_xet_file_data_from_response``); a Xet download needs a size (``X-Linked-Size`` or
  ``Content-Length``) and never follows the resolve redirect (file-id.md);
- ``GET /api/{type}s/{repo}/xet-read-token/{rev}`` answers ``{"accessToken", "exp", "casUrl"}`` (docs/xet/auth.md;
  hf_xet's refresher reads this body) and the same as ``X-Xet-Access-Token``, ``X-Xet-Token-Expiration``,
  ``X-Xet-Cas-Url`` headers (what huggingface_hub ``parse_xet_connection_info_from_headers`` reads);
- ``GET {casUrl}/v2/reconstructions/{file_hash}`` (``xorbs``: per xorb, a URL and ``{chunks, bytes}`` ranges) is what
  hf_xet asks first, falling back to ``/v1/`` (``fetch_info``: ``{range, url, url_range}``) on 404/501 (docs/xet/api.md;
  xet-core ``remote_client.rs`` ``get_reconstruction_with_version_override``); both take an optional
  ``Range: bytes=a-b`` (inclusive) and answer 416 past the end; chunk ranges are end-exclusive, byte ranges inclusive
  (docs/xet/download-protocol.md);
- the xorb URL is a presigned-like URL fetched with ``Range`` set to the listed bytes and no ``Authorization``
  (``X-Xet-Signed-Range`` query, download-protocol.md; remote_client.rs ``get_file_term_data`` uses its plain client);
- CAS calls carry ``Authorization: Bearer <accessToken>``, else 401 (docs/xet/api.md, "Error Cases").
"""

from __future__ import annotations

import secrets
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from werkzeug.wrappers import Request, Response

from hfcache.names import PLURALS
from hfcache.serve.http import HttpError, json_response, path_segments, url_host

from .index import XetIndex, XetMode
from .xorb import XetFile

__all__ = ["CasService"]

class CasService:
    """The Xet side of one HubServer: which files are Xet files, the read token, and the CAS origin's answers.

    Args:
        mode (XetMode): which files go through Xet, xorb size limit, token lifetime.

    Attributes:
        cas_port (int): the CAS origin's port, set by the server once bound.
        access_token (str): the Xet access token handed out (random per server); CAS calls must carry it.
    """

    def __init__(self, mode: XetMode) -> None:
        self.mode = mode
        self.index = XetIndex(mode.max_xorb_bytes)
        self.cas_port = 0
        self.access_token = "xet_" + secrets.token_urlsafe(24)

    # -- main origin

    def cas_url(self, request: Request) -> str:
        """The CAS origin's URL, on the host name the client used for this request."""
        host = urlsplit(request.host_url).hostname or "127.0.0.1"
        return f"http://{url_host(host)}:{self.cas_port}"

    def resolve_headers(self, request: Request, repo_type: str, repo_id: str, commit: str,
                        xet_file: XetFile) -> dict[str, str]:
        """``X-Xet-Hash`` and the ``Link`` header (token route, reconstruction URL) of a resolve answer."""
        token_url = f"{request.host_url.rstrip('/')}/api/{PLURALS[repo_type]}/{repo_id}/xet-read-token/{commit}"
        reconstruction = f"{self.cas_url(request)}/v1/reconstructions/{xet_file.hash}"
        link = f'<{token_url}>; rel="xet-auth", <{reconstruction}>; rel="xet-reconstruction-info"'
        return {"X-Xet-Hash": xet_file.hash, "Link": link}

    def token_response(self, request: Request) -> Response:
        """The read token answer: JSON body and the same facts as headers."""
        expires = int(time.time()) + self.mode.token_ttl
        cas = self.cas_url(request)
        response = json_response({"accessToken": self.access_token, "exp": expires, "casUrl": cas})
        response.headers.update({"X-Xet-Cas-Url": cas, "X-Xet-Access-Token": self.access_token,
                                 "X-Xet-Token-Expiration": str(expires)})
        return response

    # -- CAS origin

    def answer(self, request: Request) -> Response:
        """A CAS origin request: reconstructions (v1, v2), file existence, xorb bytes.

        Raises:
            HttpError: 401 without the access token, 404 for unknown hashes or routes, 405, 416.
        """
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        segments = path_segments(request.environ)
        if len(segments) == 3 and segments[:2] == ["xorbs", "default"]:
            return self._xorb(request, segments[2])
        self._check_token(request)
        if len(segments) == 3 and segments[0] in ("v1", "v2") and segments[1] == "reconstructions":
            return self._reconstruction(request, segments[0], segments[2])
        if len(segments) == 3 and segments[:2] == ["v1", "files"]:  # api.md "Head File": HEAD only
            if request.method != "HEAD":
                raise HttpError(405, None, "Method not allowed", {"Allow": "HEAD"})
            response = Response(iter(()), direct_passthrough=True)
            response.content_length = self._file(segments[2]).size
            return response
        raise HttpError(404, None, "Not found")

    def _check_token(self, request: Request) -> None:
        sent = request.headers.get("Authorization", "")
        if not secrets.compare_digest(sent.encode(), f"Bearer {self.access_token}".encode()):
            raise HttpError(401, None, "Invalid or expired Xet token")

    def _file(self, file_hash: str) -> XetFile:
        found = self.index.file(file_hash.lower())
        if found is None:
            raise HttpError(404, None, "File not found")
        return found[0]

    def _reconstruction(self, request: Request, version: str, file_hash: str) -> Response:
        """The reconstruction of a file (or of the bytes its ``Range`` names) as ``QueryReconstructionResponse``."""
        xet_file = self._file(file_hash)
        first, last = 0, xet_file.size - 1
        if request.headers.get("Range"):
            bounds = request.range.range_for_length(xet_file.size) if request.range else None
            if bounds is None:
                raise HttpError(416, None, "Requested range not satisfiable",
                                {"Content-Range": f"bytes */{xet_file.size}"})
            first, last = bounds[0], bounds[1] - 1
        offset, terms = xet_file.terms(first, last)
        expires = int(time.time()) + self.mode.token_ttl
        base = request.host_url.rstrip("/")
        fetch: dict[str, list[dict[str, Any]]] = {}
        for term in terms:
            start, end = term.byte_range
            url = f"{base}/xorbs/default/{term.xorb.hash}?X-Xet-Signed-Range=bytes%3D{start}-{end}&Expires={expires}"
            chunks = {"start": term.start, "end": term.end}
            if version == "v1":
                entry: dict[str, Any] = {"range": chunks, "url": url, "url_range": {"start": start, "end": end}}
            else:
                entry = {"url": url, "ranges": [{"chunks": chunks, "bytes": {"start": start, "end": end}}]}
            fetch.setdefault(term.xorb.hash, []).append(entry)
        body = {
            "offset_into_first_range": offset,
            "terms": [{"hash": t.xorb.hash, "unpacked_length": t.unpacked_length,
                       "range": {"start": t.start, "end": t.end}} for t in terms],
            ("fetch_info" if version == "v1" else "xorbs"): fetch,
        }
        return json_response(body)

    def _xorb(self, request: Request, xorb_hash: str) -> Response:
        """Xorb bytes, whole or one ``Range``, read from the served file (chunks are stored uncompressed)."""
        found = self.index.xorb(xorb_hash.lower())
        if found is None:
            raise HttpError(404, None, "Xorb not found")
        xorb, opener = found
        first, last, status = 0, xorb.size - 1, 200
        headers = {"Accept-Ranges": "bytes", "ETag": f'"{xorb.hash}"'}
        if request.headers.get("Range"):
            bounds = request.range.range_for_length(xorb.size) if request.range else None
            if bounds is None:
                raise HttpError(416, None, "Requested range not satisfiable", {"Content-Range": f"bytes */{xorb.size}"})
            first, last, status = bounds[0], bounds[1] - 1, 206
            headers["Content-Range"] = f"bytes {first}-{last}/{xorb.size}"
        if not _signed_range_allows(request.args.get("X-Xet-Signed-Range"), first, last):
            raise HttpError(403, None, "Range outside the signed range")
        body = xorb.read(opener, first, last) if request.method == "GET" else iter(())  # lazy: opened on send
        response = Response(body, status=status, headers=headers, mimetype="application/octet-stream",
                            direct_passthrough=True)
        response.content_length = last - first + 1
        return response


def _signed_range_allows(signed: str | None, first: int, last: int) -> bool:
    """Whether bytes ``first..last`` lie inside a ``X-Xet-Signed-Range`` value (``bytes=a-b[,c-d]``); no value
    allows any range (a URL without a signature, e.g. typed by hand)."""
    if signed is None:
        return True
    unit, _, spec = unquote(signed).partition("=")
    if unit.strip() != "bytes":
        return False
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and high.isdigit() and int(low) <= first and last <= int(high):
            return True
    return False
