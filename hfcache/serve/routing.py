"""Routing of the Hub protocol: which answer (:mod:`.answers`) a request gets, after auth and gating checks.

Routes (docs/cache-layout.md, 'The Hub protocol'):

- ``GET /api/{models|datasets|kernels}/{repo_id}[/revision/{rev}]``    repo info (``HfApi.repo_info``)
- ``GET /api/{models|datasets|kernels}/{repo_id}/tree/{rev}[/{path}]`` tree listing (``HfApi.list_repo_tree``)
- ``HEAD|GET /[datasets/|kernels/]{repo_id}/resolve/{rev}/{path}``     file metadata and bytes (``hf_hub_download``)
- ``HEAD|GET {cdn_endpoint}/lfs/[datasets/|kernels/]{repo_id}/{sha256}`` LFS bytes on the CDN origin
- ``GET /api/{models|datasets|kernels}/{repo_id}/xet-read-token/{rev}`` Xet read token (``xet=``: :mod:`.xet.cas`)
- ``GET {cas_endpoint}/v{1,2}/reconstructions/{hash}``, ``/xorbs/...``  the CAS origin (``xet=``: :mod:`.xet.cas`)
- ``GET /healthz``                                                     liveness probe
"""

from __future__ import annotations

import hmac
import io
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import BinaryIO
from urllib.parse import urlsplit

from werkzeug.wrappers import Request, Response

from ..names import PLURALS, is_sha256
from ..records import REPO_TYPES
from .answers import etag_header, file_response, legacy_redirect, lfs_redirect, not_found, repo_info, tree_page
from .faults import Faults, FaultState
from .http import HttpError, path_segments, raw_target, repo_path, split_repo_id, url_host
from .vocabulary import DEFAULT_BRANCH, RepoFile, RepoSnapshot, Store, StoreMiss
from .xet import CasService, XetFile

__all__ = ["Router"]

logger = logging.getLogger(__name__)

#: URL segment -> repo type (huggingface_hub constants.py ``REPO_TYPES_MAPPING``; no spaces: nothing serves them).
_URL_REPO_TYPES = {PLURALS[t]: t for t in REPO_TYPES}
#: The prefixed types of resolve and CDN paths (``REPO_TYPES_URL_PREFIXES``); models have none.
_PATH_REPO_TYPES = {PLURALS[t]: t for t in REPO_TYPES if t != "model"}


class Router:
    """Answers requests of the main (``"hub"``) and CDN (``"cdn"``) origins from a store.

    Args:
        store (Store): the repos served.
        host (str): the interface bound, for CDN URLs when a request names no host.
        token (str | None): bearer token every main-origin request but ``/healthz`` must carry, if set.
        gated (Iterable[str]): canonical repo ids answered with 403 ``GatedRepo``.
        overrides (Mapping[tuple[str, str], bytes]): ``(repo_id, path) -> bytes`` served instead of the file.
        page_size (int): entries per tree listing page.
        lfs_redirect (bool): LFS files answer 302 to the CDN origin (port :attr:`cdn_port`, set once bound).
        public (Mapping[str, Callable[[Request], Response]]): one-segment paths answered before the token check,
            e.g. ``{"metrics": ...}``; ``healthz`` here replaces the plain ``ok``.
        faults (Faults | None): misbehaviours to inject (:mod:`.faults`), as poorer mirrors and flaky networks do.
        xet (CasService | None): speak Xet (:mod:`.xet`): Xet headers on resolve, ``xetHash`` in tree entries,
            the read token route, and the ``"cas"`` origin's answers.
    """

    def __init__(self, store: Store, *, host: str, token: str | None, gated: Iterable[str],
                 overrides: Mapping[tuple[str, str], bytes], page_size: int, lfs_redirect: bool,
                 public: Mapping[str, Callable[[Request], Response]] | None = None,
                 faults: Faults | None = None, xet: CasService | None = None) -> None:
        self.store, self.host, self.token = store, host, token
        self.xet = xet
        self.gated = frozenset(gated)
        self.overrides = overrides
        self.page_size = page_size
        self.lfs_redirect = lfs_redirect
        self.cdn_port = 0
        self.public = dict(public or {})
        self.faults = faults or Faults()
        self._faults = FaultState(self.faults)

    def answer(self, origin: str, request: Request) -> Response:
        """The response to one request: an answer, the Hub's error for it, or a 500 (logged) on a bug."""
        handler = self._hub_app if origin == "hub" else self._cdn_app
        if origin == "cas" and self.xet is not None:
            handler = self.xet.answer
        try:
            return handler(request)
        except HttpError as error:
            return error.response()
        except Exception:
            logger.exception("HubServer failed on %s %s", request.method, raw_target(request.environ))
            return HttpError(500, None, "Internal server error").response()

    # -- main origin

    def _hub_app(self, request: Request) -> Response:
        segments = path_segments(request.environ)
        if len(segments) == 1 and segments[0] in self.public and request.method in ("GET", "HEAD"):
            return self.public[segments[0]](request)
        if segments == ["healthz"]:
            return Response("ok", mimetype="text/plain")
        self._check_token(request)
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        if self._faults.take_rate_limit():
            raise HttpError(429, None, "Too many requests", {"Retry-After": str(self.faults.retry_after)})
        if len(segments) >= 3 and segments[0] == "api" and segments[1] in _URL_REPO_TYPES:
            return self._api(request, _URL_REPO_TYPES[segments[1]], segments[2:])
        if segments and segments[0] in _PATH_REPO_TYPES:
            return self._resolve(request, _PATH_REPO_TYPES[segments[0]], segments[1:])
        return self._resolve(request, "model", segments)

    def _check_token(self, request: Request) -> None:
        if self.token is None:
            return
        sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(sent, f"Bearer {self.token}".encode()):
            # The Hub answers 401 + RepoNotFound for private repos, so clients raise RepositoryNotFoundError.
            raise HttpError(401, "RepoNotFound", "Invalid username or password.")

    def _check_gated(self, repo_type: str, repo_id: str) -> None:
        if repo_id in self.gated:
            message = (
                f"Access to {repo_type} {repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo_id} to ask for access."
            )
            raise HttpError(403, "GatedRepo", message)

    def _snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at a revision, or the Hub's error: RepoNotFound, then GatedRepo, then RevisionNotFound."""
        try:
            snapshot = self.store.snapshot(repo_type, repo_id, revision)
        except StoreMiss as miss:
            if miss.code == "RevisionNotFound" and miss.repo_id:
                self._check_gated(repo_type, miss.repo_id)
            raise HttpError(miss.status, miss.code, miss.message, miss.headers()) from None
        self._check_gated(repo_type, snapshot.repo_id)
        return snapshot

    def _api(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        repo_id, rest = split_repo_id(segments, {"revision", "tree", "xet-read-token"})
        blobs = not self.faults.no_blobs
        if not rest:
            if self.faults.info_needs_revision:
                raise HttpError(404, None, "Not found")
            return repo_info(request, self._snapshot(repo_type, repo_id, DEFAULT_BRANCH), blobs=blobs)
        if rest[0] == "revision" and len(rest) == 2:
            return repo_info(request, self._snapshot(repo_type, repo_id, rest[1]), blobs=blobs)
        if rest[0] == "tree" and len(rest) >= 2 and not self.faults.no_tree:
            folder = repo_path(rest[2:]) if len(rest) > 2 else ""
            snapshot = self._snapshot(repo_type, repo_id, rest[1])
            return tree_page(request, snapshot, folder, self.page_size, xet_hash=self._xet_hash_of(snapshot))
        if rest[0] == "xet-read-token" and len(rest) == 2 and self.xet is not None:
            self._snapshot(repo_type, repo_id, rest[1])  # the Hub's 404s for unknown repos and revisions
            return self.xet.token_response(request)
        self._snapshot(repo_type, repo_id, DEFAULT_BRANCH)  # RepoNotFound before a plain 404
        raise HttpError(404, None, "Not found")

    def _resolve(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        """``/{repo_id}/resolve/{rev}/{path}``: bytes, a redirect to the CDN (LFS), or an error."""
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
            snapshot = self._expanded(expand, snapshot, path)
            repo_file = snapshot.files.get(path)
        if repo_file is None:
            raise not_found(snapshot, path)
        headers = {"X-Repo-Commit": snapshot.commit}
        xet_file = self._xet_file(snapshot, repo_file)
        if xet_file is not None:  # the Hub's Xet headers ride on the 302 (or on the bytes, without a CDN)
            headers.update(self.xet.resolve_headers(request, repo_type, repo_id, snapshot.commit, xet_file))
        if repo_file.is_lfs and repo_file.sha256:
            if self.lfs_redirect:
                # Same host name the client used for the main origin, so the CDN is reachable wherever the hub is.
                cdn_host = url_host(urlsplit(request.host_url).hostname or self.host)
                redirect = lfs_redirect(snapshot, repo_file, cdn_host, self.cdn_port, self._faults)
                redirect.headers.update(headers)
                return redirect
            # Served here: the metadata a CDN redirect would carry rides on the answer itself (file_download.py
            # reads X-Linked-Etag / X-Linked-Size before ETag / Content-Length).
            headers.update({"X-Linked-Etag": etag_header(repo_file.sha256, self._faults),
                            "X-Linked-Size": str(repo_file.size)})
        body, length = self._open_body(snapshot, repo_file, head=request.method == "HEAD")
        return file_response(request, body, length, repo_file.etag, headers, self._faults)

    @staticmethod
    def _expanded(expand: Callable[[RepoSnapshot, str], RepoSnapshot], snapshot: RepoSnapshot,
                  path: str) -> RepoSnapshot:
        """The snapshot with upstream's whole listing when it may name ``path`` (PullThroughStore.expand)."""
        try:
            return expand(snapshot, path)
        except StoreMiss as miss:
            raise HttpError(miss.status, miss.code, miss.message, miss.headers()) from None

    # -- Xet

    def _xet_file(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> XetFile | None:
        """The Xet form of a file served through Xet (chunked on first use), else None."""
        if self.xet is None or not self.xet.mode.serves(repo_file):
            return None
        try:
            return self.xet.index.describe(repo_file, lambda: self.store.open(repo_file, snapshot))
        except OSError:  # deleted since the scan, or refused (a link leaving the served directory)
            raise HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit}) from None

    def _xet_hash_of(self, snapshot: RepoSnapshot) -> Callable[[RepoFile], str | None] | None:
        """For tree entries: the ``xetHash`` of a file of ``snapshot`` (None for files not served through Xet)."""
        if self.xet is None:
            return None

        def xet_hash(repo_file: RepoFile) -> str | None:
            xet_file = self._xet_file(snapshot, repo_file)
            return xet_file.hash if xet_file is not None else None

        return xet_hash

    # -- CDN origin

    def _cdn_app(self, request: Request) -> Response:
        """``/lfs/[datasets/|kernels/]{repo_id}/{sha256}``: LFS bytes by content hash, no auth (a signed-URL
        stand-in)."""
        segments = path_segments(request.environ)
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        if len(segments) < 3 or segments[0] != "lfs":
            raise HttpError(404, None, "Not found")
        typed = segments[1] in _PATH_REPO_TYPES
        repo_type, segments = (_PATH_REPO_TYPES[segments[1]], segments[2:]) if typed else ("model", segments[1:])
        repo_id, sha256 = "/".join(segments[:-1]), segments[-1]
        found = self.store.lfs_file(repo_type, repo_id, sha256) if is_sha256(sha256) else None
        if found is None:
            raise HttpError(404, None, "Not found")
        snapshot, repo_file = found
        body, length = self._open_body(snapshot, repo_file, head=request.method == "HEAD")
        return file_response(request, body, length, sha256, {}, self._faults)

    # -- file bodies

    def _open_body(self, snapshot: RepoSnapshot, repo_file: RepoFile, *, head: bool) -> tuple[BinaryIO, int]:
        """(open body, its length): the override bytes if any, else the file through the store.

        ``head``: a HEAD request; a pull-through store answers it from the listing without fetching the bytes.
        """
        override = self.overrides.get((snapshot.repo_id, repo_file.path))
        if override is not None:
            return io.BytesIO(override), len(override)
        try:
            body = self.store.open(repo_file, snapshot, head=head)
        except OSError:  # deleted since the scan, or refused (a link leaving the served directory)
            raise HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit}) from None
        except StoreMiss as miss:  # a pull-through store could not fetch it (upstream down, bytes failing the hash)
            raise HttpError(miss.status, miss.code, miss.message, miss.headers()) from None
        try:
            # The size on disk now, so the framing stays right even if the file changed since the scan.
            return body, os.fstat(body.fileno()).st_size
        except (AttributeError, OSError, io.UnsupportedOperation):  # not a file: metadata only (HEAD)
            return body, repo_file.size
