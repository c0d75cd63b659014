"""A :class:`HubClient` that only fetches file bodies, each from a URL a callable gives for the file's etag (a bucket's
presigned GET URL: ``hfcache pull s3://``, :mod:`hfcache.bucket.pull`). The repos it serves are pinned (commit, files,
sizes and hashes known), so nothing is resolved or described through it; the download engine
(:mod:`hfcache.hub.transfer`) uses it as it uses any endpoint: ranges, resume, hashing, retries."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from huggingface_hub.errors import HfHubHTTPError

from ..errors import HubError
from .bodies import watched
from .client import HubClient, _session


class BodiesClient(HubClient):
    """File bodies from ``url_of(etag)``; ``name`` stands for the endpoint in reports and errors (a signed URL is
    never shown); ``missing_hint``: the hint of a 404.

    Args:
        name: what the source is called (``s3://BUCKET/PREFIX``). url_of: etag -> a URL to GET, computed per request
            (each may expire). timeout, retries: as :class:`HubClient`'s.
    """

    def __init__(self, name: str, url_of: Callable[[str], str], *, timeout: float, retries: int,
                 missing_hint: str = "the source lost the object") -> None:
        # HubClient checks an http(s) endpoint; this one never asks a Hub API, so the name is only shown.
        super().__init__(endpoint="https://bodies.invalid", token=None, timeout=timeout, retries=retries)
        self.endpoint, self._url_of, self._missing_hint = name, url_of, missing_hint

    def sibling(self, endpoint: str, *, with_token: bool) -> HubClient:
        raise HubError(f"{self.endpoint}: names no other endpoint")

    @contextmanager
    def open_body(self, repo, file, start: int = 0, end: int | None = None, ranged: bool = False) -> Iterator:
        """The GET of ``file``'s bytes ``[start, end)`` (a ``Range`` unless the whole file and not ``ranged``), as
        :meth:`HubClient.open_body` yields it; no header but ``Range`` and ``Accept-Encoding`` is sent, no redirect is
        followed. Raises HubError: 404 (no such object), 401/403 (access denied or the URL expired);
        ``HfHubHTTPError`` for any other status (the retry budget retries 429 and 5xx)."""
        end = file.size if end is None else end
        url = self._url_of(file.etag)
        headers = {"Accept-Encoding": "identity"}
        if start > 0 or end < file.size or ranged:
            headers["Range"] = f"bytes={start}-{end - 1}"
        what = f"{self.endpoint}: {file.etag}"
        with ExitStack() as body:
            with watched(self.metadata_deadline(f"{what}: answer headers")):
                response = body.enter_context(_session().stream("GET", url, headers=headers, timeout=self.timeout,
                                                                follow_redirects=False))
            status = response.status_code
            if status == 404:
                raise HubError(f"{what} ({repo.repo_id}: {file.path}): no such object", hint=self._missing_hint)
            if status in (401, 403):
                raise HubError(f"{what}: access denied (HTTP {status})",
                               hint="check the credentials and the bucket's policy")
            if status not in (200, 206):
                # Only the status is kept: the answer's URL is a signed one and must not reach a message.
                raise HfHubHTTPError(f"HTTP {status} from {self.endpoint}", response=response)
            yield response
