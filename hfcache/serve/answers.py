"""The Hub protocol's answers (docs/cache-layout.md, 'The Hub protocol'): repo info, tree pages, file bodies, redirects and 404s.

Each function turns a :class:`~hfcache.serve.vocabulary.RepoSnapshot` (and the request) into the response the Hub
would send, checked against huggingface_hub 2.4.0 (hf_api.py, file_download.py). Which answer a request gets is
:mod:`.routing`'s business.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

from werkzeug.wrappers import Request, Response

from ..names import PLURALS, url_prefix
from .body import FileBody
from .faults import FaultState
from .http import HttpError, json_response, raw_target
from .vocabulary import RepoFile, RepoSnapshot

__all__ = ["etag_header", "file_response", "legacy_redirect", "lfs_redirect", "not_found", "repo_info", "tree_page"]


def repo_info(request: Request, snapshot: RepoSnapshot, *, blobs: bool = True) -> Response:
    """Repo info as ``HfApi.repo_info`` parses it (hf_api.py ``ModelInfo``/``RepoSibling``).

    ``?blobs=true`` adds sizes and hashes to the siblings unless ``blobs`` is False (a mirror that ignores it:
    siblings carry ``rfilename`` only, :class:`~.faults.Faults` ``no_blobs``).
    """
    with_blobs = blobs and request.args.get("blobs", "").lower() in ("true", "1")
    siblings = [_sibling(f, with_blobs) for f in snapshot.files.values()]
    info = {
        "_id": snapshot.commit[:24],
        # The canonical id even when asked by a legacy id, as the Hub does.
        "id": snapshot.repo_id,
        "modelId": snapshot.repo_id,
        "author": snapshot.repo_id.split("/")[0] if "/" in snapshot.repo_id else None,
        "sha": snapshot.commit,
        "private": False,
        "gated": False,
        "disabled": False,
        "lastModified": "2024-01-01T00:00:00.000Z",
        "tags": [],
        "siblings": siblings,
    }
    return json_response(info)


def tree_page(request: Request, snapshot: RepoSnapshot, folder: str, page_size: int, *,
              xet_hash: Callable[[RepoFile], str | None] | None = None) -> Response:
    """A page of ``page_size`` ``list_repo_tree`` entries, with a ``Link: <...>; rel="next"`` header like the Hub's.

    ``xet_hash``, if given, names the Xet file hash of a file (None: not a Xet file); file entries of the page then
    carry it as ``xetHash``, as the Hub's do (hf_api.py ``RepoFile`` reads ``xetHash``).

    Raises:
        HttpError: 404 for a folder the snapshot does not hold, 400 for a bad ``cursor``.
    """
    if folder and folder not in snapshot.directories:
        raise not_found(snapshot, folder)
    recursive = request.args.get("recursive", "").lower() in ("true", "1")
    entries = _tree_entries(snapshot, folder, recursive)
    raw_cursor = request.args.get("cursor", "0")  # an offset into the listing, opaque to clients
    if not raw_cursor.isdigit():
        raise HttpError(400, None, "Invalid cursor")
    cursor = int(raw_cursor)
    page = entries[cursor : cursor + page_size]
    if xet_hash is not None:
        for entry in page:
            found = xet_hash(snapshot.files[entry["path"]]) if entry["type"] == "file" else None
            if found is not None:
                entry["xetHash"] = found
    response = json_response(page)
    if cursor + page_size < len(entries):
        query = {**request.args.to_dict(), "cursor": str(cursor + page_size)}
        path = raw_target(request.environ).split("?", 1)[0]
        response.headers["Link"] = f'<{request.host_url.rstrip("/")}{path}?{urlencode(query)}>; rel="next"'
    return response


def lfs_redirect(snapshot: RepoSnapshot, repo_file: RepoFile, cdn_host: str, cdn_port: int,
                 faults: FaultState | None = None) -> Response:
    """302 to the CDN origin at ``cdn_host`` (already URL-ready) and ``cdn_port``; the file metadata rides on the 302.
    ETags are quoted unless ``faults`` says ``unquoted_etags``.

    ``get_hf_file_metadata`` stops at a cross-origin redirect and reads X-Repo-Commit, X-Linked-Etag
    and X-Linked-Size from it; the download then goes to ``Location`` without Authorization.
    """
    prefix = url_prefix(snapshot.repo_type)
    location = f"http://{cdn_host}:{cdn_port}"
    location += f"/lfs/{prefix}{snapshot.repo_id}/{repo_file.sha256}"
    etag = etag_header(repo_file.sha256, faults)
    headers = {
        "Location": location,
        "X-Repo-Commit": snapshot.commit,
        "X-Linked-Etag": etag,
        "X-Linked-Size": str(repo_file.size),
        "ETag": etag,
    }
    return Response(b"", status=302, headers=headers)


def etag_header(etag: str, faults: FaultState | None = None) -> str:
    """An ``ETag``/``X-Linked-Etag`` value: quoted as the Hub sends it, bare with ``faults``' ``unquoted_etags``."""
    return faults.faults.etag(etag) if faults is not None else f'"{etag}"'


def file_response(request: Request, body: BinaryIO, length: int, etag: str, headers: dict[str, str],
                  faults: FaultState | None = None) -> Response:
    """200/206/304/416 for an open file of ``length`` bytes, its body a :class:`FileBody` (constant memory).

    Takes ownership of ``body``: it is closed here unless it goes out as the response body.

    ``If-None-Match`` (weak comparison) gives 304; one satisfiable ``Range`` gives 206, an unsatisfiable one 416;
    several ranges, or an ``If-Range`` naming another version, give the whole file (RFC 9110 allows both).
    ``faults`` (:mod:`.faults`): unquoted ETags; ``Range`` ignored (no ``Accept-Ranges``); the first N GETs failing
    with 502/503, or marked to be cut midway (:attr:`FileBody.fault_reset`, done by :mod:`.wsgi`).

    Raises:
        HttpError: a 502/503 body failure injected by ``faults``.
    """
    no_range = faults is not None and faults.faults.no_range
    headers = {**headers, "ETag": etag_header(etag, faults)}
    if not no_range:
        headers["Accept-Ranges"] = "bytes"
    try:
        reset = _body_failure(request, faults)
        if request.if_none_match and request.if_none_match.contains_weak(etag):
            body.close()
            return Response(status=304, headers=headers)
        start, size, status = 0, length, 200
        ranges = None if no_range else request.range
        if_range = request.if_range
        if ranges is not None and (if_range.etag is None and if_range.date is None or if_range.etag == etag):
            bounds = ranges.range_for_length(length)
            if bounds is not None:
                start, stop = bounds
                size, status = stop - start, 206
                headers["Content-Range"] = f"bytes {start}-{stop - 1}/{length}"
            elif ranges.units == "bytes" and len(ranges.ranges) == 1:
                body.close()
                headers = {"Content-Range": f"bytes */{length}", "ETag": headers["ETag"]}
                return Response(b"", status=416, headers=headers)
        file_body = FileBody(body, start, size)
        file_body.fault_reset = reset
        response = Response(file_body, status=status, headers=headers,
                            mimetype="application/octet-stream", direct_passthrough=True)
        response.content_length = size
        return response
    except BaseException:
        body.close()
        raise


def _body_failure(request: Request, faults: FaultState | None) -> bool:
    """Whether this GET's body is to be cut midway (a ``reset`` fault); raises the 502/503 of the other kinds.

    Raises:
        HttpError: one of the first ``failing_bodies`` GETs, with ``body_failure`` 502 or 503.
    """
    if faults is None or request.method != "GET" or not faults.take_body_failure():
        return False
    if faults.faults.body_failure == "reset":
        return True
    raise HttpError(int(faults.faults.body_failure), None, "fault: bad gateway or unavailable")


def not_found(snapshot: RepoSnapshot, path: str) -> HttpError:
    """404 EntryNotFound; with ``X-Repo-Commit`` only when the path is known not to exist at that commit.

    X-Repo-Commit is what makes huggingface_hub write a ``.no_exist`` marker (file_download.py); a file a cache
    does not hold may well exist upstream, so it gets the error without the header (no marker, nothing lied).
    """
    if snapshot.knows_absent(path):
        return HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
    return HttpError(404, "EntryNotFound", f"{path} is not held by this mirror")


def _sibling(repo_file: RepoFile, with_blobs: bool) -> dict[str, Any]:
    sibling: dict[str, Any] = {"rfilename": repo_file.path}
    if with_blobs:
        sibling.update(size=repo_file.size, blobId=repo_file.blob_id)
        if repo_file.is_lfs:
            sibling["lfs"] = {"sha256": repo_file.sha256, "size": repo_file.size, "pointerSize": repo_file.pointer_size}
    return sibling


def _tree_entries(snapshot: RepoSnapshot, folder: str, recursive: bool) -> list[dict[str, Any]]:
    """Tree entries under ``folder`` ("" = root) as ``RepoFile``/``RepoFolder`` parse them (hf_api.py)."""
    prefix = f"{folder}/" if folder else ""

    def wanted(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    entries: list[dict[str, Any]] = [
        {"type": "directory", "oid": _folder_oid(snapshot.commit, d), "size": 0, "path": d}
        for d in snapshot.directories
        if wanted(d)
    ]
    for f in snapshot.files.values():
        if wanted(f.path):
            entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.is_lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            entries.append(entry)
    return sorted(entries, key=lambda e: e["path"])


def _folder_oid(commit: str, folder: str) -> str:
    """A stable 40-hex id for a folder; it only has to look like a git tree id, nothing downloads by it."""
    return hashlib.sha1(f"tree {commit} {folder}".encode()).hexdigest()


def legacy_redirect(request: Request, repo_type: str, canonical: str, rest: list[str]) -> Response:
    """307 to the canonical id's URL, as the Hub answers renamed repos.

    A relative Location on the same origin is followed by ``_httpx2_follow_hub_redirects_with_backoff``
    (utils/_http.py), so X-Repo-Commit and ETag come from the canonical response.
    """
    prefix = [PLURALS[repo_type]] if repo_type != "model" else []
    path = "/" + "/".join(quote(s, safe="") for s in [*prefix, *canonical.split("/"), *rest])
    query = request.environ.get("QUERY_STRING")
    return Response(b"", status=307, headers={"Location": path + (f"?{query}" if query else "")})

