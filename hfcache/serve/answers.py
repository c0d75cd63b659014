"""The Hub protocol's answers (docs/cache-layout.md, 'The Hub protocol'; huggingface_hub 2.4.0 hf_api.py,
file_download.py): repo info, tree pages, file bodies, redirects and 404s, from a snapshot and the request."""

from __future__ import annotations

from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

from werkzeug.wrappers import Request, Response

from ..cache.content import sha1_hex
from ..names import PLURALS
from .body import FileBody
from .http import HttpError, json_response, raw_target
from .vocabulary import RepoFile, RepoSnapshot

__all__ = ["file_response", "legacy_redirect", "not_found", "repo_info", "tree_page"]


def repo_info(request: Request, snapshot: RepoSnapshot) -> Response:
    """Repo info as ``HfApi.repo_info`` parses it (hf_api.py ``ModelInfo``/``RepoSibling``); ``?blobs=true`` adds
    sizes and hashes to the siblings."""
    with_blobs = request.args.get("blobs", "").lower() in ("true", "1")
    return json_response({
        "_id": snapshot.commit[:24],
        "id": snapshot.repo_id,  # the canonical id even when asked by a legacy id, as the Hub does
        "modelId": snapshot.repo_id,
        "author": snapshot.repo_id.split("/")[0] if "/" in snapshot.repo_id else None,
        "sha": snapshot.commit,
        "private": False,
        "gated": False,
        "disabled": False,
        "lastModified": "2024-01-01T00:00:00.000Z",
        "tags": [],
        "siblings": [_sibling(f, with_blobs) for f in snapshot.files.values()],
    })


def tree_page(request: Request, snapshot: RepoSnapshot, folder: str, page_size: int) -> Response:
    """A page of ``page_size`` ``list_repo_tree`` entries, with a ``Link: <...>; rel="next"`` header like the Hub's.
    Raises HttpError: 404 for a folder the snapshot does not hold, 400 for a bad ``cursor``."""
    if folder and folder not in snapshot.directories:
        raise not_found(snapshot, folder)
    recursive = request.args.get("recursive", "").lower() in ("true", "1")
    entries = _tree_entries(snapshot, folder, recursive)
    raw_cursor = request.args.get("cursor", "0")  # an offset into the listing, opaque to clients
    if not raw_cursor.isdigit():
        raise HttpError(400, None, "Invalid cursor")
    cursor = int(raw_cursor)
    response = json_response(entries[cursor : cursor + page_size])
    if cursor + page_size < len(entries):
        query = {**request.args.to_dict(), "cursor": str(cursor + page_size)}
        path = raw_target(request.environ).split("?", 1)[0]
        response.headers["Link"] = f'<{request.host_url.rstrip("/")}{path}?{urlencode(query)}>; rel="next"'
    return response


def file_response(request: Request, body: BinaryIO, length: int, etag: str, headers: dict[str, str]) -> Response:
    """200/206/304/416 for an open file of ``length`` bytes (``body``: closed here unless it is the response body).
    ``If-None-Match`` (weak) gives 304; one satisfiable ``Range`` 206, an unsatisfiable one 416; several ranges, or an
    ``If-Range`` naming another version, the whole file (RFC 9110 allows both)."""
    headers = {**headers, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
    try:
        if request.if_none_match and request.if_none_match.contains_weak(etag):
            body.close()
            return Response(status=304, headers=headers)
        start, size, status = 0, length, 200
        ranges, if_range = request.range, request.if_range
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
        response = Response(FileBody(body, start, size), status=status, headers=headers,
                            mimetype="application/octet-stream", direct_passthrough=True)
        response.content_length = size
        return response
    except BaseException:
        body.close()
        raise


def not_found(snapshot: RepoSnapshot, path: str) -> HttpError:
    """404 EntryNotFound; with ``X-Repo-Commit`` (a ``.no_exist`` marker for the client) only when the path is known
    not to exist at that commit (:meth:`RepoSnapshot.knows_absent`)."""
    if snapshot.knows_absent(path):
        return HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
    return HttpError(404, "EntryNotFound", f"{path} is not held by this mirror")


def legacy_redirect(request: Request, repo_type: str, canonical: str, rest: list[str]) -> Response:
    """307 to the canonical id's URL, as the Hub answers renamed repos (huggingface_hub follows a relative Location on
    the same origin: utils/_http.py ``_httpx2_follow_hub_redirects_with_backoff``)."""
    prefix = [PLURALS[repo_type]] if repo_type != "model" else []
    path = "/" + "/".join(quote(s, safe="") for s in [*prefix, *canonical.split("/"), *rest])
    query = request.environ.get("QUERY_STRING")
    return Response(b"", status=307, headers={"Location": path + (f"?{query}" if query else "")})


def _sibling(repo_file: RepoFile, with_blobs: bool) -> dict[str, Any]:
    sibling: dict[str, Any] = {"rfilename": repo_file.path}
    if with_blobs:
        sibling.update(size=repo_file.size, blobId=repo_file.blob_id)
        if repo_file.is_lfs:
            sibling["lfs"] = {"sha256": repo_file.sha256, "size": repo_file.size, "pointerSize": repo_file.pointer_size}
    return sibling


def _tree_entries(snapshot: RepoSnapshot, folder: str, recursive: bool) -> list[dict[str, Any]]:
    """Tree entries under ``folder`` ("" = root) as hf_api.py's ``RepoFile``/``RepoFolder`` parse them (a folder's
    ``oid`` only looks like a git tree id: nothing downloads by it)."""
    prefix = f"{folder}/" if folder else ""

    def wanted(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    entries: list[dict[str, Any]] = [
        {"type": "directory", "oid": sha1_hex(f"tree {snapshot.commit} {d}".encode()), "size": 0, "path": d}
        for d in snapshot.directories if wanted(d)
    ]
    for f in snapshot.files.values():
        if wanted(f.path):
            entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.is_lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            entries.append(entry)
    return sorted(entries, key=lambda e: e["path"])
