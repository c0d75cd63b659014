"""Which answer (:mod:`.answers`) a request to the Hub protocol gets, after the token check (the routes:
docs/cache-layout.md, 'The Hub protocol'; docs/serve.md).
"""

from __future__ import annotations

import hmac
import io
import os
from collections.abc import Callable, Mapping
from typing import BinaryIO

from werkzeug.wrappers import Request, Response

from ..names import PLURALS
from ..records import REPO_TYPES
from .answers import file_response, legacy_redirect, not_found, repo_info, tree_page
from .http import HttpError, guarded, path_segments, repo_path, split_repo_id
from .vocabulary import DEFAULT_BRANCH, RepoFile, RepoSnapshot, Store, StoreMiss

__all__ = ["PATH_REPO_TYPES", "URL_REPO_TYPES", "Router", "miss_error", "open_body"]

#: URL segment -> repo type (huggingface_hub constants.py ``REPO_TYPES_MAPPING``; no spaces: nothing serves them).
URL_REPO_TYPES = {PLURALS[t]: t for t in REPO_TYPES}
#: The prefixed types of resolve paths (``REPO_TYPES_URL_PREFIXES``); models have none.
PATH_REPO_TYPES = {PLURALS[t]: t for t in REPO_TYPES if t != "model"}


class Router:
    """Answers requests from ``store`` (Store). ``token`` (str | None): the bearer token every request but
    ``/healthz`` and ``public`` must carry; ``public`` (Mapping[str, Callable[[Request], Response]]): one-segment paths
    answered before the token check (a ``healthz`` replaces the plain ``ok``); ``page_size``: tree entries per page."""

    page_size = 50

    def __init__(self, store: Store, *, token: str | None = None,
                 public: Mapping[str, Callable[[Request], Response]] | None = None) -> None:
        self.store, self.token = store, token
        self.public = dict(public or {})

    def answer(self, request: Request) -> Response:
        return guarded(self._route, request)

    def _route(self, request: Request) -> Response:
        segments = path_segments(request.environ)
        if len(segments) == 1 and segments[0] in self.public and request.method in ("GET", "HEAD"):
            return self.public[segments[0]](request)
        if segments == ["healthz"]:
            return Response("ok", mimetype="text/plain")
        if self.token is not None:
            sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(sent, f"Bearer {self.token}".encode()):
                # The Hub answers 401 + RepoNotFound for private repos, so clients raise RepositoryNotFoundError.
                raise HttpError(401, "RepoNotFound", "Invalid username or password.")
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        if len(segments) >= 3 and segments[0] == "api" and segments[1] in URL_REPO_TYPES:
            return self._api(request, URL_REPO_TYPES[segments[1]], segments[2:])
        if segments and segments[0] in PATH_REPO_TYPES:
            return self._resolve(request, PATH_REPO_TYPES[segments[0]], segments[1:])
        return self._resolve(request, "model", segments)

    def _snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        try:
            return self.store.snapshot(repo_type, repo_id, revision)
        except StoreMiss as miss:
            raise miss_error(miss) from None

    def _api(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        repo_id, rest = split_repo_id(segments, {"revision", "tree"})
        if not rest:
            return repo_info(request, self._snapshot(repo_type, repo_id, DEFAULT_BRANCH))
        if rest[0] == "revision" and len(rest) == 2:
            return repo_info(request, self._snapshot(repo_type, repo_id, rest[1]))
        if rest[0] == "tree" and len(rest) >= 2:
            folder = repo_path(rest[2:]) if len(rest) > 2 else ""
            return tree_page(request, self._snapshot(repo_type, repo_id, rest[1]), folder, self.page_size)
        self._snapshot(repo_type, repo_id, DEFAULT_BRANCH)  # RepoNotFound before a plain 404
        raise HttpError(404, None, "Not found")

    def _resolve(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        """``/{repo_id}/resolve/{rev}/{path}``: the bytes (LFS files with X-Linked-Etag / X-Linked-Size, which
        file_download.py reads before ETag / Content-Length), or an error."""
        repo_id, rest = split_repo_id(segments, {"resolve"})
        if len(rest) < 3 or rest[0] != "resolve":
            raise HttpError(404, None, "Not found")
        canonical = self.store.canonical_id(repo_type, repo_id)
        if canonical != repo_id:
            return legacy_redirect(request, repo_type, canonical, rest)
        path = repo_path(rest[2:])
        snapshot = self._snapshot(repo_type, repo_id, rest[1])
        repo_file = snapshot.files.get(path)
        expand = getattr(self.store, "expand", None)  # a pull-through store: a held commit lists what it holds
        if repo_file is None and expand is not None:
            try:
                snapshot = expand(snapshot, path)
            except StoreMiss as miss:
                raise miss_error(miss) from None
            repo_file = snapshot.files.get(path)
        if repo_file is None:
            raise not_found(snapshot, path)
        headers = {"X-Repo-Commit": snapshot.commit}
        if repo_file.is_lfs and repo_file.sha256:
            headers.update({"X-Linked-Etag": f'"{repo_file.sha256}"', "X-Linked-Size": str(repo_file.size)})
        redirect = getattr(self.store, "redirect", None)  # a bucket store: the body is a presigned URL away
        if redirect is not None and request.method == "GET":
            try:
                location = redirect(repo_file, snapshot)
            except StoreMiss as miss:
                raise miss_error(miss) from None
            return Response(status=302, headers={**headers, "Location": location, "ETag": f'"{repo_file.etag}"'})
        body, length = open_body(self.store, snapshot, repo_file, head=request.method == "HEAD")
        return file_response(request, body, length, repo_file.etag, headers)


def miss_error(miss: StoreMiss) -> HttpError:
    return HttpError(miss.status, miss.code, miss.message, miss.headers())


def open_body(store: Store, snapshot: RepoSnapshot, repo_file: RepoFile, *, head: bool) -> tuple[BinaryIO, int]:
    """(open body, its length in bytes) of a file of ``snapshot``; ``head``: a HEAD request (nothing is fetched).
    Raises HttpError: 404 EntryNotFound for a file gone since the scan or refused (a link); a store's miss."""
    try:
        body = store.open(repo_file, snapshot, head=head)
    except OSError:
        raise HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit}) from None
    except StoreMiss as miss:
        raise miss_error(miss) from None
    try:  # the size on disk now, so the framing stays right even if the file changed since the scan
        return body, os.fstat(body.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):  # not a file: metadata only (HEAD)
        return body, repo_file.size
