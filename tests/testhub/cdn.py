"""The test Hub's CDN origin (``lfs_redirect=True``, the default), as the Hub splits LFS files off its main origin.

Around the product's main-origin answers (which serve LFS bytes themselves, with ``X-Linked-Etag``/``X-Linked-Size``),
a resolve of an LFS file answers 302 to this origin with that metadata on the redirect: ``get_hf_file_metadata``
stops at a cross-origin redirect and reads X-Repo-Commit, X-Linked-Etag and X-Linked-Size from it; the download then
goes to ``Location`` without Authorization. The origin serves LFS bytes by content hash with no token check (a
stand-in for the Hub's signed CDN URLs): ``/lfs/[datasets/|kernels/]{repo_id}/{sha256}``.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from werkzeug.wrappers import Request, Response

from hfcache.names import is_sha256, url_prefix
from hfcache.serve.answers import file_response
from hfcache.serve.http import HttpError, path_segments, url_host
from hfcache.serve.routing import PATH_REPO_TYPES, open_body
from hfcache.serve.vocabulary import DEFAULT_BRANCH, RepoFile, RepoSnapshot, Store, StoreMiss

from .routes import CONDITIONAL, route_of, subrequest

__all__ = ["Cdn"]


class Cdn:
    """The CDN origin of one server: LFS files of ``base``'s snapshots (no gating), opened through ``store`` (with
    a test's overridden bodies). ``host``: the interface bound, for redirects when a request names no host.
    :attr:`port` is set once the origin is bound."""

    def __init__(self, store: Store, base: Store, host: str) -> None:
        self.store, self.base, self.host = store, base, host
        self.port = 0
        self._commits: dict[tuple[str, str, str], str] = {}  # (type, repo id, sha256) -> the commit redirected from

    def split(self, answer: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """The main origin's ``answer`` with LFS files redirected here."""

        def split_answer(request: Request) -> Response:
            route = route_of(request)
            if route is None or route.kind != "resolve" or request.method not in ("GET", "HEAD"):
                return answer(request)
            # The product's answer to a plain HEAD (token, gating, errors) says whether it is an LFS file: the request
            # itself when it is one, else a HEAD without Range or conditions (a GET would fetch, a Range could 416).
            plain = request.method == "HEAD" and not any(h in request.environ for h in CONDITIONAL)
            probe = answer(request if plain else subrequest(request, method="HEAD", drop=CONDITIONAL))
            linked = probe.headers.get("X-Linked-Etag")
            if probe.status_code != 200 or linked is None:
                if plain:
                    return probe
                probe.close()
                return answer(request)
            probe.close()
            # Same host name the client used for the main origin, so the CDN is reachable wherever the hub is.
            cdn_host = url_host(urlsplit(request.host_url).hostname or self.host)
            commit, sha256 = probe.headers["X-Repo-Commit"], linked[1:-1]
            self._commits[(route.repo_type, route.repo_id, sha256)] = commit
            location = f"http://{cdn_host}:{self.port}/lfs/{url_prefix(route.repo_type)}{route.repo_id}/{sha256}"
            return Response(b"", status=302, headers={
                "Location": location, "X-Repo-Commit": commit, "X-Linked-Etag": linked,
                "X-Linked-Size": probe.headers["X-Linked-Size"], "ETag": linked})

        return split_answer

    def answer(self, request: Request) -> Response:
        """A CDN origin request: LFS bytes by content hash, from the commit a redirect named (else ``main``).

        Raises:
            HttpError: 405, 404 (no such route, repo or LFS file), the store's errors.
        """
        segments = path_segments(request.environ)
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        if len(segments) < 3 or segments[0] != "lfs":
            raise HttpError(404, None, "Not found")
        typed = segments[1] in PATH_REPO_TYPES
        repo_type, segments = (PATH_REPO_TYPES[segments[1]], segments[2:]) if typed else ("model", segments[1:])
        repo_id, sha256 = "/".join(segments[:-1]), segments[-1]
        found = self._lfs_file(repo_type, repo_id, sha256) if is_sha256(sha256) else None
        if found is None:
            raise HttpError(404, None, "Not found")
        snapshot, repo_file = found
        body, length = open_body(self.store, snapshot, repo_file, head=request.method == "HEAD")
        return file_response(request, body, length, sha256, {})

    def _lfs_file(self, repo_type: str, repo_id: str, sha256: str) -> tuple[RepoSnapshot, RepoFile] | None:
        """(snapshot, file) of the LFS file ``sha256``: in the commit a redirect named, else in ``main``."""
        for revision in filter(None, (self._commits.get((repo_type, repo_id, sha256)), DEFAULT_BRANCH)):
            try:
                snapshot = self.base.snapshot(repo_type, repo_id, revision)
            except StoreMiss:
                continue
            found = next((f for f in snapshot.files.values() if f.is_lfs and f.sha256 == sha256), None)
            if found is not None:
                return snapshot, found
        return None
