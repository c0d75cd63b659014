"""The main origin's Xet side, around the product's answers (which know nothing of Xet): ``X-Xet-Hash`` and the
``Link`` header on resolve answers of Xet files, ``xetHash`` in tree entries (hf_api.py ``RepoFile`` reads it), and
the read-token route (:mod:`.cas` has the facts and their sources)."""

from __future__ import annotations

import json
from collections.abc import Callable

from werkzeug.wrappers import Request, Response

from hfcache.serve.http import HttpError, repo_path
from hfcache.serve.vocabulary import RepoFile, RepoSnapshot, Store, StoreMiss

from ..routes import Route, route_of, subrequest
from .cas import CasService
from .xorb import XetFile

__all__ = ["XetHub"]


class XetHub:
    """``answer`` (the main origin's, ``request -> Response``) speaking Xet for the files ``cas.mode`` serves.

    Args:
        cas (CasService): which files are Xet files, their chunked form, the read token.
        store (Store): the store the files are read from to be chunked (never a test's ``overrides``).
        answer (Callable[[Request], Response]): the main origin's answers.
    """

    def __init__(self, cas: CasService, store: Store, answer: Callable[[Request], Response]) -> None:
        self.cas, self.store, self._answer = cas, store, answer

    def __call__(self, request: Request) -> Response:
        route = route_of(request)
        if route is not None and route.is_api("xet-read-token") and len(route.rest) == 2:
            # The product's checks (token, method) and errors for the repo and revision, then the token.
            check = self._answer(subrequest(request, route.api_path("revision", route.rest[1])))
            if check.status_code != 200:
                return check
            check.close()
            return self.cas.token_response(request)
        response = self._answer(request)
        if route is None or response.status_code not in (200, 206, 302, 304):
            return response
        try:
            if route.kind == "resolve" and "X-Repo-Commit" in response.headers:
                self._add_headers(request, route, response)
            elif route.is_api("tree") and response.status_code == 200:
                self._add_hashes(route, response)
        except BaseException:
            response.close()
            raise
        return response

    def _add_headers(self, request: Request, route: Route, response: Response) -> None:
        """The Hub's Xet headers on a resolve answer (a 302 to the CDN, or the bytes), when the file is a Xet file."""
        commit = response.headers["X-Repo-Commit"]
        snapshot = self._snapshot(route, commit)
        repo_file = snapshot.files.get(repo_path(list(route.rest[2:]))) if snapshot is not None else None
        xet_file = self._xet_file(snapshot, repo_file) if repo_file is not None else None
        if xet_file is not None:
            response.headers.update(self.cas.resolve_headers(request, route.repo_type, route.repo_id, commit, xet_file))

    def _add_hashes(self, route: Route, response: Response) -> None:
        snapshot = self._snapshot(route, route.rest[1])
        page = json.loads(response.get_data())
        for entry in page:
            repo_file = snapshot.files.get(entry["path"]) if snapshot and entry["type"] == "file" else None
            xet_file = self._xet_file(snapshot, repo_file) if repo_file is not None else None
            if xet_file is not None:
                entry["xetHash"] = xet_file.hash
        response.set_data(json.dumps(page))

    def _snapshot(self, route: Route, revision: str) -> RepoSnapshot | None:
        try:
            return self.store.snapshot(route.repo_type, route.repo_id, revision)
        except StoreMiss:  # changed since the product answered
            return None

    def _xet_file(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> XetFile | None:
        """The Xet form of a file served through Xet (chunked on first use), else None.

        Raises:
            HttpError: 404 EntryNotFound when the file cannot be read (deleted since the scan, or refused).
        """
        if not self.cas.mode.serves(repo_file):
            return None
        try:
            return self.cas.index.describe(repo_file, lambda: self.store.open(repo_file, snapshot))
        except OSError:
            raise HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit}) from None
