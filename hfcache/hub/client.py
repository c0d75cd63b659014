"""The Hub client: metadata (in order of preference, docs/cache-layout.md 'The Hub protocol'), file bodies, errors
mapped. Answers are untrusted (:mod:`.answers`), read under a deadline or a throughput floor (:mod:`.bodies`),
retried when transient (:mod:`.retry`). Library gap: ``http_get`` (``file_download.py``) takes its timeout from a
constant read at import, retries with uninterruptible sleeps, and never hashes what it wrote.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import BinaryIO
from urllib.parse import quote

import httpx2
from huggingface_hub import errors as hf_errors
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from .. import pools
from .._version import __version__
from ..bounds import TooDeep, loads_json
from ..errors import (
    EndpointUnreachable,
    GatedRepo,
    HubError,
    IntegrityError,
    OfflineViolation,
    RepoNotFound,
    RevisionNotFound,
)
from ..names import is_sha256
from ..pace import Deadline, Throughput, TooSlow, metadata_deadline, min_rate
from ..records import DEFAULT_ENDPOINT, DEFAULT_RETRIES, DEFAULT_TIMEOUT
from . import answers
from .bodies import SLOW_HINT, iter_body, read_capped, slow_body, watched
from .files import RemoteFile, RepoRevision
from .retry import RetryCounter, ShortBody
from .retry import is_transient as _transient_without_client
from .session import hub_session
from .session import no_agent_registry_fetch as _no_agent_registry_fetch
from .urls import origin, resolve_url, validate_endpoint

__all__ = ["DEFAULT_ENDPOINT", "HubClient", "is_transient"]

#: Largest repo info answer (or tree page) read, decoded: the Hub's answer for a repo of 100,000 files is ~20 MB.
MAX_METADATA_BYTES = 64 * 1024 * 1024
#: Largest error body read (its message is what ``hf_raise_for_status`` shows); the rest is never read.
MAX_ERROR_BYTES = 64 * 1024
#: Bytes asked of the socket per read of an HTTP/1.1 body (httpcore2 asks 64 KiB).
READ_BYTES = 1024 * 1024


def large_reads() -> None:
    """Read HTTP/1.1 bodies in reads of :data:`READ_BYTES`. Library gap: httpcore2 reads a fixed
    ``HTTP11Connection.READ_NUM_BYTES`` per ``recv``, no option sets it; each read runs the parser, decoder and
    hfcache's per-chunk checks (docs/benchmarks.md, "Where the time goes")."""
    with contextlib.suppress(ImportError, AttributeError):
        from httpcore2._sync.http11 import HTTP11Connection

        if HTTP11Connection.READ_NUM_BYTES < READ_BYTES:
            HTTP11Connection.READ_NUM_BYTES = READ_BYTES


def _session():
    large_reads()
    return hub_session()


class HubClient:
    """A connection to one Hub endpoint with one token, one timeout and one retry budget per request.

    Args:
        endpoint: base URL (default: ``HF_ENDPOINT``, read now, not at import as huggingface_hub reads it).
        token: a Hub token, or None for anonymous access. Never logged or stored by hfcache.
        timeout: seconds to wait for a connection or any byte of an answer (it also sets the metadata deadline).
        retries: retries of a transient failure per request or per file download (:mod:`hfcache.hub.retry`).
        withheld_hint: the hint of a 401/403/gated answer when a token exists but was withheld from this endpoint.

    Raises:
        UsageError: an invalid endpoint, or a malformed
            ``HFCACHE_METADATA_DEADLINE``/``HFCACHE_MIN_RATE``/``HFCACHE_RATE_WINDOW``.
    """

    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES, withheld_hint: str | None = None) -> None:
        _no_agent_registry_fetch()
        self.endpoint = validate_endpoint(endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
        # token=False stops huggingface_hub from reading a stored token behind our back.
        self._token: str | bool = token or False
        self.timeout, self.retries, self.withheld_hint = timeout, retries, withheld_hint
        # Read now, so a malformed setting fails before any request (exit 2).
        self.deadline = metadata_deadline(timeout)
        self.rate, self.rate_window = min_rate()

    def __repr__(self) -> str:  # never show the token
        return f"HubClient(endpoint={self.endpoint!r})"

    def sibling(self, endpoint: str, *, with_token: bool) -> HubClient:
        """A client of ``endpoint`` with this one's settings, and its token only when ``with_token`` (the caller decides
        whether the token was given for that host: docs/security.md). Raises UsageError: an invalid endpoint."""
        return HubClient(endpoint=validate_endpoint(endpoint), token=self._token if with_token and self._token
                         else None, timeout=self.timeout, retries=self.retries)

    def counter(self, stop: threading.Event | None = None) -> RetryCounter:
        """A retry counter with this client's budget (one per repo: the report shows its count)."""
        return RetryCounter(self.retries, stop, is_transient)

    def reachable(self, timeout: float | None = None) -> bool:
        """Whether the endpoint answers HTTP at all (``HEAD /`` without the token) within ``timeout`` seconds (default:
        the client's), for ``serve --upstream``'s ``/healthz``."""
        seconds = timeout or self.timeout
        try:  # a drip of headers must not hold a health check either
            with watched(Deadline(seconds, f"{self.endpoint}: health check")):
                _session().head(self.endpoint + "/", timeout=seconds, follow_redirects=False)
        except (httpx2.HTTPError, hf_errors.OfflineModeIsEnabled, TooSlow):
            return False
        return True

    def resolve(self, repo_id: str, revision: str = "main", repo_type: str = "model",
                counter: RetryCounter | None = None) -> RepoRevision:
        """Resolve ``revision`` (branch, tag or commit, always sent as ``/revision/<rev>``: some mirrors answer 404
        without it) to a commit and list every file, with sizes and hashes where the listing gives them (else
        :meth:`describe` asks). Returns a RepoRevision. Raises RepoNotFound, RevisionNotFound, GatedRepo,
        EndpointUnreachable, HubError (a malformed answer)."""
        counter = counter or self.counter()
        with self._mapped(repo_id, revision):
            info = counter.budget().call(lambda: self._repo_info(repo_id, revision, repo_type),
                                         f"{repo_id}@{revision}")
        canonical_id, commit = answers.answered_identity(self.endpoint, repo_id, info)
        answers.check_asked_commit(self.endpoint, repo_id, revision, commit)
        paths = tuple(sorted(answers.safe_path(repo_id, s.rfilename, self.endpoint) for s in info.siblings or ()))
        repo = RepoRevision(repo_id=repo_id, canonical_id=canonical_id, repo_type=repo_type, revision=revision,
                            commit_hash=commit, files=(), paths=paths, metadata="head")
        repo = self._listed_files(repo, info, counter)
        answers.check_listing(self.endpoint, repo, info)
        return repo

    def _listed_files(self, repo: RepoRevision, info: answers.RepoInfo, counter: RetryCounter) -> RepoRevision:
        """``repo`` with the files its listing describes: siblings with ``size`` and ``blobId``, else the tree API's."""
        siblings = list(info.siblings or ())
        if siblings and all(s.size is not None and s.blob_id is not None for s in siblings):
            files = [answers.remote_file(self.endpoint, repo.repo_id, "repo info", s.rfilename, s.size, s.blob_id,
                                 s.lfs_sha256) for s in siblings]
            return replace(repo, files=tuple(sorted(files, key=lambda f: f.path)), metadata="model-info")
        if (listed := self._tree_files(repo, counter)) is not None:
            if not repo.paths:  # siblings omitted altogether: the tree is the listing
                repo = replace(repo, paths=tuple(sorted(f.path for f in listed)))
            wanted = set(repo.paths)
            repo = replace(repo, files=tuple(sorted((f for f in listed if f.path in wanted), key=lambda f: f.path)),
                           metadata="tree")
        return repo

    def _repo_info(self, repo_id: str, revision: str, repo_type: str) -> answers.RepoInfo:
        """``HfApi.repo_info(files_metadata=True)``'s request, bounded, unparsed fields ignored, not retried here."""
        # Library gap: HfApi.model_info decodes the body unbounded, loads all of hf_api.py (~0.13 s, docs/benchmarks.md)
        # and parses fields hfcache never reads (a mirror's odd value fails it): answers.parse_repo_info reads ours.
        url = f"{self.endpoint}/api/{repo_type}s/{repo_id}/revision/{quote(revision, safe='')}"
        _, data = self._get_json(url, {"blobs": True}, f"{repo_id}@{revision}")
        if not isinstance(data, dict):
            raise HubError(f"{repo_id}@{revision}: the answer of {self.endpoint} is not a JSON object",
                           hint="the endpoint is broken or hostile")
        return answers.parse_repo_info(data)

    def _get_json(self, url: str, params: dict | None, what: str, accepted: tuple[int, ...] = (),
                  limit: int = MAX_METADATA_BYTES, tally: list[int] | None = None) -> tuple[httpx2.Response, object]:
        """(response, JSON; None for a status in ``accepted``), ``limit`` decoded bytes at most, within the deadline."""
        deadline = self.metadata_deadline(what)
        headers = build_hf_headers(token=self._token, library_name="hfcache", library_version=__version__)
        with watched(deadline), _session().stream("GET", url, params=params, headers=headers,
                                                  timeout=self.timeout) as r:
            deadline.check()
            body = bytearray()
            for chunk in iter_body(r, lambda n: deadline.check()):
                body += chunk
                if len(body) > limit:
                    raise HubError(f"{what}: the answer of {self.endpoint} is larger than "
                                   f"{limit} bytes (decoded); refused",
                                   hint="the endpoint is broken or hostile")
            if tally is not None:
                tally.append(len(body))
            if r.status_code in accepted:
                return r, None
            hf_raise_for_status(_with_body(r, bytes(body[:MAX_ERROR_BYTES])) if r.is_error else r)
        try:
            return r, loads_json(bytes(body), f"{what}: the answer of {self.endpoint}")
        except TooDeep:
            raise HubError(f"{what}: the answer of {self.endpoint} is JSON nested too deep",
                           hint="the endpoint is broken or hostile") from None

    def metadata_deadline(self, what: str) -> Deadline:
        return Deadline(self.deadline, f"{what}: {self.endpoint}")

    @contextmanager
    def _mapped(self, repo_id: str, revision: str, path: str | None = None) -> Iterator[None]:
        try:
            yield
        except HubError:
            raise
        except BaseException as exc:
            what = f"{repo_id}@{revision}" + (f": {path}" if path else "")
            translated = _translate(exc, what, repo_id, revision, self.endpoint, self.withheld_hint)
            if translated is exc:
                raise
            raise translated from exc

    def describe(self, repo: RepoRevision, paths: Iterable[str], counter: RetryCounter | None = None) -> RepoRevision:
        """``repo`` with ``paths`` described: one ``HEAD`` on ``resolve/<commit>/<path>`` per file not known yet, read
        as ``hf_hub_download`` reads it (``get_hf_file_metadata``: ``X-Linked-Etag``/``ETag`` as the blob id, a 64-hex
        one an LFS sha256; ``X-Linked-Size``/``Content-Length``; ``X-Repo-Commit``, if sent, must be the commit). Raises
        HubError (a file the repo does not list, an answer without a usable hash or size), RepoNotFound,
        RevisionNotFound, GatedRepo, EndpointUnreachable."""
        known = repo.by_path
        if not (missing := sorted(set(paths) - set(known))):
            return repo
        counter = counter or self.counter()
        for path in missing:
            if path not in repo.paths:
                raise HubError(f"{repo.repo_id}: {path} is not in the repo at {repo.commit_hash}",
                               hint="check the lock, --include and the repo")
        # A few HEADs at once (a `--kind all` of a large repo is hundreds of them); the first error wins.
        with pools.pool(min(_HEAD_WORKERS, len(missing)), "hfcache-head") as executor:
            futures = [executor.submit(self._head_file, repo, p, counter) for p in missing]
            for file in pools.ordered(futures):  # interruptible (pools.py), not joined after an error
                known[file.path] = file
        return replace(repo, files=tuple(sorted(known.values(), key=lambda f: f.path)))

    def _head_file(self, repo: RepoRevision, path: str, counter: RetryCounter) -> RemoteFile:
        # file_download.py (and tqdm, asyncio) is loaded only for endpoints that list names without hashes.
        from huggingface_hub import get_hf_file_metadata

        url = resolve_url(self.endpoint, repo.canonical_id, path, repo.repo_type, repo.commit_hash)
        def head():  # the whole answer (redirects included) within the metadata deadline
            with watched(self.metadata_deadline(f"{repo.repo_id}: HEAD {path}")):
                _session()  # the watchdog's hook on the client get_hf_file_metadata uses
                return get_hf_file_metadata(url, token=self._token, timeout=self.timeout, library_name="hfcache",
                                            library_version=__version__, endpoint=self.endpoint)

        with self._mapped(repo.repo_id, repo.commit_hash, path=path):
            meta = counter.budget().call(head, f"{repo.repo_id}: HEAD {path}")
        if meta.commit_hash is not None and meta.commit_hash != repo.commit_hash:
            raise HubError(f"{repo.repo_id}: HEAD {path} at {self.endpoint} answered commit {meta.commit_hash!r}, "
                           f"not {repo.commit_hash}", hint="the endpoint is broken or not Hub-compatible")
        etag = meta.etag or ""
        if meta.size is None:
            raise HubError(f"{repo.repo_id}: HEAD {path} at {self.endpoint} gave no size (X-Linked-Size or "
                           "Content-Length)", hint="the endpoint is not Hub-compatible")
        lfs = is_sha256(etag)  # a 64-hex ETag is an LFS file's sha256
        return answers.remote_file(self.endpoint, repo.repo_id, "HEAD", path, meta.size, "" if lfs else etag,
                           etag if lfs else None)

    def _tree_files(self, repo: RepoRevision, counter: RetryCounter) -> list[RemoteFile] | None:
        """The tree API's files at the commit (``repo.paths``, or all), None without tree API; ``MAX_TREE_*`` bound."""
        # Library gap: HfApi.list_repo_tree pages through http_backoff, whose retries would multiply --retries.
        url = f"{self.endpoint}/api/{repo.repo_type}s/{repo.canonical_id}/tree/{quote(repo.commit_hash, safe='')}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        files: list[RemoteFile] = []
        what, wanted = f"{repo.repo_id}: tree listing", set(repo.paths)
        listing = Deadline(self.deadline * LISTING_DEADLINE_PAGES, f"{what} (all pages): {self.endpoint}")
        entries_seen, sizes = 0, [0]
        while True:
            with self._mapped(repo.repo_id, repo.commit_hash):
                listing.check()
                response, entries = counter.budget().call(lambda url=url, params=params: self._get_json(
                    url, params, what, _NO_TREE, min(MAX_METADATA_BYTES, MAX_TREE_BYTES - sum(sizes)), sizes), what)
            if response.status_code in _NO_TREE:
                return None
            with self._mapped(repo.repo_id, repo.commit_hash):
                if not isinstance(entries, list):
                    raise ValueError("the tree listing is not a JSON array")
                entries_seen += len(entries)
                if entries_seen > MAX_TREE_ENTRIES:
                    raise HubError(f"{what} at {self.endpoint} has more than {MAX_TREE_ENTRIES} entries; refused",
                                   hint="the endpoint is broken or hostile (the Hub's largest repos list a few "
                                   "hundred thousand)")
                files += [f for f in (answers.tree_entry(self.endpoint, repo.repo_id, e) for e in entries
                                      if not isinstance(e, dict) or e.get("type") == "file")
                          if not wanted or f.path in wanted]
            del entries
            next_url = response.links.get("next", {}).get("url")
            if not next_url:
                return files
            if origin(next_url) != origin(self.endpoint):  # the token must not follow a link to another host
                raise HubError(f"{repo.repo_id}: tree listing at {self.endpoint} links to another origin "
                               f"({origin(next_url)})", hint="the endpoint is broken or hostile")
            url, params = next_url, None

    @contextmanager
    def open_body(self, repo: RepoRevision, file: RemoteFile, start: int = 0,
                  end: int | None = None, ranged: bool = False) -> Iterator[httpx2.Response]:
        """Open the GET of ``file``'s bytes ``[start, end)`` at the repo's commit (a ``Range`` unless the whole file
        and not ``ranged``). Yields the streaming response, 200 (``Range`` ignored) or 206, for the caller to read
        (:func:`iter_body` under a :meth:`throughput` floor); redirects are followed (httpx drops ``Authorization``
        across origins), the answer head within the metadata deadline. Raises HfHubHTTPError and httpx2 errors
        untranslated (the caller retries), TooSlow, HubError (``X-Repo-Commit`` names another commit)."""
        end = file.size if end is None else end
        url = resolve_url(self.endpoint, repo.canonical_id, file.path, repo.repo_type, repo.commit_hash)
        headers = build_hf_headers(token=self._token, library_name="hfcache", library_version=__version__)
        # Identity encoding keeps Content-Length and byte offsets meaningful for size checks and ranges.
        headers["Accept-Encoding"] = "identity"
        if start > 0 or end < file.size or ranged:
            headers["Range"] = f"bytes={start}-{end - 1}"
        deadline = self.metadata_deadline(f"{repo.repo_id}: {file.path}: answer headers")
        with ExitStack() as body:
            with watched(deadline):
                response = body.enter_context(_session().stream("GET", url, headers=headers, timeout=self.timeout,
                                                                follow_redirects=True))
                if response.is_error:
                    hf_raise_for_status(_with_body(response, read_capped(response, deadline, MAX_ERROR_BYTES)))
                hf_raise_for_status(response)
            answered = response.headers.get("X-Repo-Commit")
            if answered is not None:
                answers.check_asked_commit(self.endpoint, repo.repo_id, repo.commit_hash, answered.strip())
            yield response

    def throughput(self, what: str) -> Throughput:
        return Throughput(self.rate, self.rate_window, f"{what}: {self.endpoint}")

    def mapped(self, repo: RepoRevision, path: str | None = None):
        """A context turning library errors of requests for ``repo`` into hfcache errors (:func:`_translate`)."""
        return self._mapped(repo.repo_id, repo.commit_hash, path=path)

    def download(self, repo: RepoRevision, file: RemoteFile, out: BinaryIO,
                 counter: RetryCounter | None = None) -> None:
        """Download one small file into ``out`` (truncated on a retry), checking its size and hash (blobs into a cache:
        :func:`hfcache.hub.transfer.download_blob`). Raises IntegrityError (not the published size or hash),
        EndpointUnreachable, RepoNotFound, RevisionNotFound, GatedRepo, HubError."""
        counter = counter or self.counter()

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            hasher = file.hasher()
            written = 0
            floor = self.throughput(f"{repo.repo_id}: {file.path}")
            with self.open_body(repo, file) as response:
                for chunk in iter_body(response, lambda n: slow_body(floor, n)):
                    written += len(chunk)
                    if written > file.size:
                        raise IntegrityError(f"{repo.repo_id}: {file.path} is larger than the {file.size} bytes "
                                             "the endpoint published")
                    hasher.update(chunk)
                    out.write(chunk)
            if written != file.size:
                raise IntegrityError(f"{repo.repo_id}: {file.path} has {written} bytes, the endpoint published "
                                     f"{file.size}")
            if not hasher.matches():
                raise IntegrityError(f"{repo.repo_id}: {file.path} does not match its expected hash "
                                     f"(expected {file.hash}, got {hasher.hexdigest()})")

        with self.mapped(repo, file.path):
            counter.budget().call(attempt, f"{repo.repo_id}: {file.path}")


def is_transient(exc: BaseException) -> bool:
    """True for a failure worth retrying: :func:`hfcache.hub.retry.is_transient`'s, or a connection cut mid-answer."""
    return _transient_without_client(exc) or isinstance(
        exc, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError))


_HEAD_WORKERS = 8
_NO_TREE = (400, 404, 405, 501)  # "no tree API here": fall back to HEAD per file
#: A whole tree listing (all pages): most entries (the Hub's largest repos list a few hundred thousand), most decoded
#: bytes (an ``expand=false`` entry is ~100-250), most metadata deadlines.
MAX_TREE_ENTRIES, MAX_TREE_BYTES, LISTING_DEADLINE_PAGES = 1_000_000, 512 * 1024 * 1024, 10


def _with_body(response: httpx2.Response, content: bytes) -> httpx2.Response:
    """An error ``response`` rebuilt around the bounded body read, as ``hf_raise_for_status`` reads it."""
    # Library gap: hf_raise_for_status (_format) reads a streamed error answer whole, unbounded, with no deadline.
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx2.Response(response.status_code, headers=headers, request=response.request,
                           content=answers.error_document(content, response.headers.get("Content-Type", "")))


def _translate(exc: BaseException, what: str, repo_id: str, revision: str, endpoint: str,
               withheld: str | None) -> BaseException:
    """``exc`` as the hfcache error with a one-line message (``exc`` itself when none applies); an HTTP error answer's
    own text (``X-Error-Message``) is quoted in it, and its hint fits the answer: a token for 401 and gated repos,
    the mirror's ``--allow`` list for a pull-through mirror's ``RepoNotAllowed``."""
    told = _told(exc, endpoint)
    if isinstance(exc, TooSlow):  # a deadline or throughput floor (hfcache.pace): the message names both
        return EndpointUnreachable(_first_line(exc), hint=SLOW_HINT)
    if isinstance(exc, hf_errors.GatedRepoError):
        return GatedRepo(f"{repo_id}: access is gated or forbidden at {endpoint}{told}",
                         hint=withheld or "accept the repo's conditions on the Hub and pass a token "
                         "with access (--token-file)")
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return RevisionNotFound(f"{repo_id}: revision {revision!r} not found at {endpoint}{told}",
                                hint="check the branch, tag or commit name")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return RepoNotFound(f"{repo_id}: repo not found at {endpoint} (or private without access){told}",
                            hint=withheld or "check the repo id and --repo-type; for a private repo "
                            "pass a token")
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return OfflineViolation(f"{what}: HF_HUB_OFFLINE is set, so nothing can be downloaded",
                                hint="unset HF_HUB_OFFLINE for hfcache warm (or use warm --lock on a warm cache)")
    if isinstance(exc, RuntimeError) and type(exc).__name__ == "NetworkBlocked":
        # hfcache's own network guard (hfcache exec, enforce_offline) around this process: matched by name, as
        # the exec sitecustomize loads the guard by file path (another module than hfcache.offline.guard).
        return OfflineViolation(f"{what}: {endpoint} is not reachable from here: {_first_line(exc)}",
                                hint="run it outside hfcache exec, or allow the endpoint's host (--allow-host)")
    if isinstance(exc, ShortBody):
        return EndpointUnreachable(f"{what}: the connection to {endpoint} was cut mid-body",
                                   hint="retry later or raise --retries")
    if isinstance(exc, httpx2.TimeoutException):
        return EndpointUnreachable(f"{what}: no answer from {endpoint} within the timeout",
                                   hint="check the endpoint, or raise --timeout")
    if isinstance(exc, httpx2.TooManyRedirects):
        return HubError(f"{what}: too many redirects from {endpoint}", hint="the endpoint is misconfigured")
    if isinstance(exc, (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)):
        return EndpointUnreachable(f"{what}: the connection to {endpoint} was cut ({_first_line(exc)})",
                                   hint="retry later or raise --retries")
    if isinstance(exc, (httpx2.ConnectError, httpx2.NetworkError)):
        return EndpointUnreachable(f"{what}: cannot connect to {endpoint} ({_first_line(exc)})",
                                   hint="check --endpoint / HF_ENDPOINT and the network")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        code = exc.response.headers.get("X-Error-Code", "") if exc.response is not None else ""
        if code == "RepoNotAllowed":  # hfcache serve's pull-through mirror (serve/pullthrough.py): no token helps
            return GatedRepo(f"{repo_id}: refused by the mirror at {endpoint}{told}",
                             hint=f"the mirror fetches only the repos its `hfcache serve --allow` globs name: ask its "
                             f"operator to allow {repo_id}, or warm from an endpoint that has it")
        if status in (401, 403):
            return GatedRepo(f"{repo_id}: HTTP {status} from {endpoint}: not authorized{told}",
                             hint=withheld or "pass a token with access (--token-file or HF_TOKEN)")
        return HubError(f"{what}: HTTP {status} from {endpoint}{told}", hint="retry later or check the endpoint")
    if isinstance(exc, (ValueError, KeyError, TypeError, RecursionError)):  # malformed JSON or fields
        return HubError(f"{what}: malformed answer from {endpoint} ({_first_line(exc)})",
                        hint="the endpoint is not Hub-compatible")
    if isinstance(exc, httpx2.HTTPError):
        return EndpointUnreachable(f"{what}: {_first_line(exc)}", hint="check the endpoint and network")
    return exc


def _told(exc: BaseException, endpoint: str) -> str:
    """`` (it said: TEXT)`` for an HTTP error answer that carried its own text (:func:`answers.said`), else
    ``""``."""
    text = answers.said(getattr(exc, "server_message", None)) if isinstance(exc, hf_errors.HfHubHTTPError) else ""
    return f" (it said: {text})" if text else ""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__).splitlines()[0]
