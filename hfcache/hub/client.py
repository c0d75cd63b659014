"""Hub access: the only hfcache module that talks to the network.

Metadata, in order of preference (DESIGN §2; anything huggingface_hub can download from, hfcache can warm from):

1. Repo info as ``HfApi.repo_info(files_metadata=True)`` asks it (``GET {endpoint}/api/{type}s/{repo_id}/revision/
   {rev}?blobs=true``, read with a bound on its decoded size, see ``HubClient._repo_info``): canonical id, commit,
   and every file's size, git blob sha1 and LFS sha256 in one request.
2. Where the siblings carry ``rfilename`` only (mirrors ignoring ``?blobs=true``): the tree API at the commit
   (``/tree/{commit}?recursive=true``, paged with ``Link: rel="next"``).
3. Where the tree API is refused too: one ``HEAD`` on ``resolve/{commit}/{path}`` per *selected* file
   (:meth:`HubClient.describe`), reading ``X-Linked-Etag``/``ETag`` and ``X-Linked-Size``/``Content-Length`` as
   ``hf_hub_download`` does (``get_hf_file_metadata``).

Every id parsed from an answer is validated (commit 40 hex, blob ids 40/64 lowercase hex, safe paths) and a source
that gives no hash or size for a file is an error naming the file: hash checks stay mandatory.

Requests use huggingface_hub's shared HTTP client (``get_session``, with its request hooks and offline-mode guard)
and its error mapping (``hf_raise_for_status``); transient failures are retried per :mod:`hfcache.hub.retry`. File
bodies are opened here (:meth:`HubClient.open_body`, with ``Range``) and written by :mod:`hfcache.hub.transfer`.
Library gap: ``http_get`` (``file_download.py``) takes its timeout from a module constant read at import time,
retries with uninterruptible sleeps, and never hashes what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import BinaryIO, NamedTuple
from urllib.parse import quote, urlsplit

import httpx2
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from .. import pools
from .._version import __version__
from ..errors import (EndpointUnreachable, GatedRepo, HubError, IntegrityError, OfflineViolation, RepoNotFound,
                      UsageError, RevisionNotFound)
from ..records import UnsafePath, valid_repo_id, validate_repo_path
from .retry import DEFAULT_RETRIES, RetryCounter, ShortBody
from .retry import is_transient as _transient_without_client

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
BLOB_ID_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
#: Largest repo info answer (or tree page) read, decoded (README "warm"): the Hub's answer for a repo of 100,000
#: files is ~20 MB.
MAX_METADATA_BYTES = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit, as the endpoint publishes it.

    Attributes:
        path (str): ``/``-separated path in the repo.
        size (int): size in bytes.
        blob_id (str): git blob sha1 (40 hex).
        lfs_sha256 (str | None): sha256 (64 hex) for LFS files, else None.
    """

    path: str
    size: int
    blob_id: str
    lfs_sha256: str | None = None

    @property
    def etag(self) -> str:
        """The blob name in the cache: sha256 for LFS files, git blob sha1 otherwise (DESIGN §1)."""
        return self.lfs_sha256 or self.blob_id

    @property
    def hash(self) -> str:
        """Algorithm-prefixed expected hash: ``sha256:<hex>`` or ``git-sha1:<hex>``."""
        return f"sha256:{self.lfs_sha256}" if self.lfs_sha256 else f"git-sha1:{self.blob_id}"


@dataclass(frozen=True)
class RepoRevision:
    """A repo resolved to a commit.

    Attributes:
        repo_id (str): the id as requested (may be a legacy id such as ``bert-base-uncased``).
        canonical_id (str): the id the endpoint answered with (``google-bert/bert-base-uncased``).
        repo_type (str): ``model`` or ``dataset``.
        revision (str): the requested revision (branch, tag or commit).
        commit_hash (str): the 40-hex commit.
        files (tuple[RemoteFile, ...]): the files whose size and hash are known, sorted by path.
        paths (tuple[str, ...]): every file path of the repo at that commit, sorted (default: those of ``files``).
        metadata (str): where sizes and hashes came from: ``model-info`` (``?blobs=true``), ``tree`` (the tree
            API), ``head`` (one HEAD per file, see :meth:`HubClient.describe`) or ``lock``.
    """

    repo_id: str
    canonical_id: str
    repo_type: str
    revision: str
    commit_hash: str
    files: tuple[RemoteFile, ...]
    paths: tuple[str, ...] = ()
    metadata: str = "model-info"

    def __post_init__(self) -> None:
        if not self.paths:
            object.__setattr__(self, "paths", tuple(sorted(f.path for f in self.files)))

    @property
    def by_path(self) -> dict[str, RemoteFile]:
        """The described files by path."""
        return {f.path: f for f in self.files}


class Hasher:
    """Incremental hash of a blob, matching how the Hub names it.

    For LFS files the etag is the sha256 of the content; for other files it is the git blob sha1,
    ``sha1(b"blob <size>\\0" + content)`` (git's object format), so the size must be known up front.
    """

    def __init__(self, file: RemoteFile) -> None:
        self.file = file
        if file.lfs_sha256:
            self._h = hashlib.sha256()
        else:
            self._h = hashlib.sha1()  # noqa: S324 - git's object id, not a security hash
            self._h.update(b"blob %d\0" % file.size)

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def matches(self) -> bool:
        return self.hexdigest() == self.file.etag


def hash_file(path: str, file: RemoteFile) -> bool:
    """Return True when the file at ``path`` has exactly ``file``'s size and hash.

    Args:
        path: local file path.
        file: what the endpoint (or a lock) says the content is.
    """
    hasher = Hasher(file)
    seen = 0
    # O_NOFOLLOW|O_NONBLOCK + S_ISREG: a link, FIFO or device planted in another repo's blobs/ is never read.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        while chunk := f.read(_CHUNK):
            hasher.update(chunk)
            seen += len(chunk)
    return seen == file.size and hasher.matches()


def validate_endpoint(endpoint: str) -> str:
    """Return the endpoint without a trailing slash, or raise UsageError for anything but an http(s) URL with a host.

    Credentials in the URL (``https://user:pass@host``) are refused: they would end up in messages and reports.
    """
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise UsageError(f"invalid endpoint {endpoint!r}", hint="use an http(s) URL such as https://huggingface.co")
    if parts.username or parts.password:
        raise UsageError("the endpoint URL must not carry credentials",
                         hint="pass the token in a file instead: --token-file (serve: --upstream-token-file)")
    return endpoint.rstrip("/")


def resolve_url(endpoint: str, repo_id: str, path: str, repo_type: str, revision: str) -> str:
    """The URL of one file at a revision: ``{endpoint}/{prefix}{repo_id}/resolve/{revision}/{path}``.

    Same URL as ``hf_hub_url`` (file_download.py: ``HUGGINGFACE_CO_URL_TEMPLATE``, prefix ``datasets/`` or
    ``spaces/``, revision quoted with no safe character, path quoted keeping ``/``), built here because importing
    file_download.py loads tqdm and asyncio (~25 ms of every cold warm, issue 18).

    Args:
        endpoint: base URL without a trailing slash.
        repo_id: ``org/name`` or a legacy id. path: the file's path in the repo. repo_type: ``model``, ``dataset``
            or ``space``. revision: a branch, tag or commit.

    Returns:
        str: the absolute URL.
    """
    prefix = {"dataset": "datasets/", "space": "spaces/"}.get(repo_type, "")
    return f"{endpoint}/{prefix}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def _no_agent_registry_fetch() -> None:
    """Keep huggingface_hub's agent detection from fetching its registry: hfcache talks only to its endpoints.

    Library gap: ``build_hf_headers`` (utils/_headers.py, also inside ``get_hf_file_metadata``) calls
    ``detect_agent()`` unless telemetry is disabled, and its first call (utils/_detect_agent.py, huggingface_hub
    >= 1.x) fetches ``{constants.ENDPOINT}/api/agent-harnesses`` -- the public Hub even when hfcache was given
    another endpoint, with a 3 s timeout, once from every worker thread that races to it -- and writes
    ``$HF_HOME/.agent_harnesses.json`` (into an image layer, under ``RUN hfcache warm``). Here the registry is taken
    from that file if it exists (so the user agent still names a detected agent) and is otherwise empty; it is
    never fetched. A huggingface_hub without this module is left alone.
    """
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import _detect_agent as agent
        if agent._registry is None:
            cached = agent._read_cached_registry(constants.AGENT_HARNESSES_PATH, max_age=None)
            agent._registry = cached or agent._EMPTY_REGISTRY
    except (ImportError, AttributeError):
        pass


class HubClient:
    """A connection to one Hub endpoint with one token, one timeout and one retry budget per request.

    Args:
        endpoint: base URL, e.g. ``https://huggingface.co`` (default: ``HF_ENDPOINT`` as huggingface_hub read it).
        token: a Hub token, or None for anonymous access. Never logged or stored by hfcache.
        timeout: seconds to wait for a connection or for any byte of an answer.
        retries: retries of a transient failure per request or per file download (:mod:`hfcache.hub.retry`).
    """

    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 10.0,
                 retries: int = DEFAULT_RETRIES) -> None:
        _no_agent_registry_fetch()
        # HF_ENDPOINT is read now, not at import time as huggingface_hub's constants.ENDPOINT is (DESIGN §3).
        self.endpoint = validate_endpoint(endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
        # token=False stops huggingface_hub from reading a stored token behind our back.
        self._token: str | bool = token or False
        self.timeout = timeout
        self.retries = retries

    def __repr__(self) -> str:  # never show the token
        return f"HubClient(endpoint={self.endpoint!r})"

    def counter(self, stop: threading.Event | None = None) -> RetryCounter:
        """A retry counter with this client's budget (one per repo: the report shows its count)."""
        return RetryCounter(self.retries, stop, is_transient)

    def reachable(self, timeout: float | None = None) -> bool:
        """Whether the endpoint answers HTTP at all (any status, even 404: a server is there).

        One ``HEAD`` of the endpoint's root, without the token (nothing there needs it). For health checks
        (``hfcache serve --upstream``'s ``/healthz``), not for deciding what a repo request gets.

        Args:
            timeout: seconds to wait (default: the client's timeout).
        """
        try:
            get_session().head(self.endpoint + "/", timeout=timeout or self.timeout, follow_redirects=False)
        except (httpx2.HTTPError, OfflineModeIsEnabled):
            return False
        return True

    def resolve(self, repo_id: str, revision: str = "main", repo_type: str = "model",
                counter: RetryCounter | None = None) -> RepoRevision:
        """Resolve ``revision`` to a commit and list every file, with sizes and hashes where the endpoint lists them.

        Sources, in order (DESIGN §2): repo info at ``/revision/<rev>?blobs=true``; where its siblings lack
        ``size``/``blobId``, the tree API at the commit (paged, recursive); where that is refused too, nothing more:
        :meth:`describe` then asks one ``HEAD`` per selected file.

        Args:
            repo_id: ``org/name`` or a legacy id.
            revision: branch, tag or 40-hex commit (always sent as ``/revision/<rev>``: some mirrors answer 404
                to repo info without it).
            repo_type: ``model`` or ``dataset``.
            counter: counts retries (default: a fresh one).

        Returns:
            RepoRevision with the canonical id, the commit, every path, and the files described so far.

        Raises:
            RepoNotFound, RevisionNotFound, GatedRepo, EndpointUnreachable, HubError (malformed answer).
        """
        counter = counter or self.counter()
        with _mapped_errors(repo_id, revision, self.endpoint):
            info = counter.budget().call(lambda: self._repo_info(repo_id, revision, repo_type),
                                         f"{repo_id}@{revision}")
        commit = info.sha or ""
        canonical_id = info.id or repo_id
        if "/" in repo_id and canonical_id != repo_id:
            # Only a legacy id (no org) is renamed by the Hub (``gpt2`` -> ``openai-community/gpt2``); an
            # ``org/name`` request answered with another id is taken as the requested repo (README: stored under the
            # requested id only): its files are fetched from the requested repo's URLs, no other id is claimed.
            canonical_id = repo_id
        if not valid_repo_id(canonical_id):
            raise HubError(f"{repo_id}: {self.endpoint} answered an invalid repo id {canonical_id!r}",
                           hint="the endpoint is broken or hostile")
        if not COMMIT_RE.fullmatch(commit):
            raise HubError(f"{repo_id}: {self.endpoint} answered commit {commit!r}, not 40 hex characters",
                           hint="the endpoint is broken or not Hub-compatible")
        paths = tuple(sorted(self._safe_path(repo_id, s.rfilename) for s in info.siblings or ()))
        repo = RepoRevision(repo_id=repo_id, canonical_id=canonical_id, repo_type=repo_type, revision=revision,
                            commit_hash=commit, files=(), paths=paths, metadata="head")
        siblings = list(info.siblings or ())
        if siblings and all(s.size is not None and s.blob_id is not None for s in siblings):
            files = [self._remote_file(repo_id, "repo info", s.rfilename, s.size, s.blob_id, s.lfs_sha256)
                     for s in siblings]
            repo = replace(repo, files=tuple(sorted(files, key=lambda f: f.path)), metadata="model-info")
        elif (listed := self._tree_files(repo, counter)) is not None:
            if not paths:  # siblings omitted altogether: the tree is the listing
                repo = replace(repo, paths=tuple(sorted(f.path for f in listed)))
            wanted = set(repo.paths)
            repo = replace(repo, files=tuple(sorted((f for f in listed if f.path in wanted), key=lambda f: f.path)),
                           metadata="tree")
        if info.siblings is None and not repo.paths:
            # No listing at all (``"siblings": null`` and no tree): an endpoint fault, not an empty selection.
            raise HubError(f"{repo_id}: {self.endpoint} answered no file listing (siblings) for {revision}",
                           hint="the endpoint is broken or not Hub-compatible")
        clash = _file_and_folder(set(repo.paths))
        if clash:
            raise HubError(f"{repo_id}: endpoint listed {clash!r} as a file and as a folder",
                           hint="the endpoint is broken or hostile")
        return repo

    def _repo_info(self, repo_id: str, revision: str, repo_type: str) -> _RepoInfo:
        """``HfApi.repo_info(files_metadata=True)`` with a bound on the answer (``MAX_METADATA_BYTES`` decoded).

        Library gap: ``HfApi.model_info``/``dataset_info`` (hf_api.py) read the whole body with ``get_session().get``
        and decode it without bound: a gzip-encoded answer of a few MiB inflates to gigabytes in memory, and
        ``hf_raise_for_status`` reads a streamed error body whole too. Same request (URL, ``?blobs=true``, headers,
        redirects), but the body is read as it decodes and refused past the bound, error bodies included. It also
        does not retry; the caller does (:mod:`hfcache.hub.retry`). Only the fields hfcache reads are parsed
        (:func:`_parse_repo_info`, same keys as ``ModelInfo.__init__``): importing ``ModelInfo`` loads all of
        ``hf_api.py`` (~0.13 s, a fifth of a cold warm of nine tokenizers: issue 18), and its parsing of fields
        hfcache never reads (card data, spaces, inference mappings) can fail on a mirror's odd values.

        Raises:
            HubError: the answer is larger than the bound, not JSON, or nested too deep; and what
                ``hf_raise_for_status`` raises (mapped by the caller).
        """
        url = f"{self.endpoint}/api/{repo_type}s/{repo_id}/revision/{quote(revision, safe='')}"
        _, data = self._get_json(url, {"blobs": True}, f"{repo_id}@{revision}")
        if not isinstance(data, dict):
            raise HubError(f"{repo_id}@{revision}: the answer of {self.endpoint} is not a JSON object",
                           hint="the endpoint is broken or hostile")
        return _parse_repo_info(data)

    def _get_json(self, url: str, params: dict | None, what: str,
                  accepted: tuple[int, ...] = ()) -> tuple[httpx2.Response, object]:
        """GET a JSON document with the body bounded to ``MAX_METADATA_BYTES`` decoded.

        Returns:
            (response, parsed JSON); the JSON is None when the status is one of ``accepted`` (not raised).

        Raises:
            HubError: too large or nested too deep; what ``hf_raise_for_status`` raises for other statuses;
            ValueError: not JSON.
        """
        headers = build_hf_headers(token=self._token, library_name="hfcache", library_version=__version__)
        with get_session().stream("GET", url, params=params, headers=headers, timeout=self.timeout) as r:
            body = bytearray()
            for chunk in r.iter_bytes():  # decoded (gzip, br, ...) as it arrives
                body += chunk
                if len(body) > MAX_METADATA_BYTES:
                    raise HubError(f"{what}: the answer of {self.endpoint} is larger than "
                                   f"{MAX_METADATA_BYTES} bytes (decoded); refused",
                                   hint="the endpoint is broken or hostile")
            if r.status_code in accepted:
                return r, None
            hf_raise_for_status(r)  # the body is consumed: its message comes from X-Error-Message
        try:
            return r, json.loads(body)
        except RecursionError:
            raise HubError(f"{what}: the answer of {self.endpoint} is JSON nested too deep",
                           hint="the endpoint is broken or hostile") from None

    def describe(self, repo: RepoRevision, paths: Iterable[str], counter: RetryCounter | None = None) -> RepoRevision:
        """``repo`` with ``paths`` described: one ``HEAD`` on ``resolve/<commit>/<path>`` per file not known yet.

        Reads what ``hf_hub_download`` reads (``get_hf_file_metadata``, file_download.py): ``X-Linked-Etag`` /
        ``ETag`` (quoted or not) as the blob id, ``X-Linked-Size`` / ``Content-Length`` as the size,
        ``X-Repo-Commit`` (if sent) must be the commit. A 64-hex ETag is an LFS sha256, a 40-hex one a git blob sha1.

        Raises:
            HubError: a file the repo does not list, or an answer without a usable hash or size (names the file).
            RepoNotFound, RevisionNotFound, GatedRepo, EndpointUnreachable.
        """
        known = repo.by_path
        missing = sorted(set(paths) - set(known))
        if not missing:
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
        # Only endpoints that list names without hashes come here: file_download.py (and tqdm, asyncio) is loaded
        # then, not on every warm (issue 18).
        from huggingface_hub import get_hf_file_metadata

        url = resolve_url(self.endpoint, repo.canonical_id, path, repo.repo_type, repo.commit_hash)
        with _mapped_errors(repo.repo_id, repo.commit_hash, self.endpoint, path=path):
            meta = counter.budget().call(lambda: get_hf_file_metadata(
                url, token=self._token, timeout=self.timeout, library_name="hfcache", library_version=__version__,
                endpoint=self.endpoint), f"{repo.repo_id}: HEAD {path}")
        if meta.commit_hash is not None and meta.commit_hash != repo.commit_hash:
            raise HubError(f"{repo.repo_id}: HEAD {path} at {self.endpoint} answered commit {meta.commit_hash!r}, "
                           f"not {repo.commit_hash}", hint="the endpoint is broken or not Hub-compatible")
        etag = meta.etag or ""
        if meta.size is None:
            raise HubError(f"{repo.repo_id}: HEAD {path} at {self.endpoint} gave no size (X-Linked-Size or "
                           "Content-Length)", hint="the endpoint is not Hub-compatible")
        if SHA256_RE.fullmatch(etag):
            return self._remote_file(repo.repo_id, "HEAD", path, meta.size, "", etag)
        return self._remote_file(repo.repo_id, "HEAD", path, meta.size, etag, None)

    def _tree_files(self, repo: RepoRevision, counter: RetryCounter) -> list[RemoteFile] | None:
        """Every file of the tree API listing at the commit, or None when the endpoint has no tree API.

        Library gap: ``HfApi.list_repo_tree`` pages through ``http_backoff``, whose own retries (500s, timeouts,
        uninterruptible sleeps) would multiply ``--retries``; this follows the same ``Link: rel="next"`` pages.
        """
        url = f"{self.endpoint}/api/{repo.repo_type}s/{repo.canonical_id}/tree/{quote(repo.commit_hash, safe='')}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        files: list[RemoteFile] = []
        what = f"{repo.repo_id}: tree listing"
        for _ in range(_MAX_TREE_PAGES):
            with _mapped_errors(repo.repo_id, repo.commit_hash, self.endpoint):
                response, entries = counter.budget().call(lambda: self._get_json(url, params, what, _NO_TREE), what)
            if response.status_code in _NO_TREE:
                return None
            with _mapped_errors(repo.repo_id, repo.commit_hash, self.endpoint):
                if not isinstance(entries, list):
                    raise ValueError("the tree listing is not a JSON array")
                files += [self._tree_entry(repo.repo_id, e) for e in entries
                          if not isinstance(e, dict) or e.get("type") == "file"]
            next_url = response.links.get("next", {}).get("url")
            if not next_url:
                return files
            if _origin(next_url) != _origin(self.endpoint):  # the token must not follow a link to another host
                raise HubError(f"{repo.repo_id}: tree listing at {self.endpoint} links to another origin "
                               f"({_origin(next_url)})", hint="the endpoint is broken or hostile")
            url, params = next_url, None
        raise HubError(f"{repo.repo_id}: tree listing at {self.endpoint} has more than {_MAX_TREE_PAGES} pages",
                       hint="the endpoint is broken or hostile")

    def _tree_entry(self, repo_id: str, entry: object) -> RemoteFile:
        if not isinstance(entry, dict):
            raise ValueError(f"a tree entry is not an object: {entry!r:.80}")
        lfs = entry.get("lfs") or None
        return self._remote_file(repo_id, "tree listing", entry["path"], entry.get("size"), entry.get("oid"),
                                 lfs.get("oid") if isinstance(lfs, dict) else None)

    def _remote_file(self, repo_id: str, source: str, path: str, size: object, blob_id: object,
                     lfs_sha256: object) -> RemoteFile:
        """A RemoteFile from untrusted fields: a safe path, a size >= 0, 40/64 lowercase hex ids, else HubError."""
        path = self._safe_path(repo_id, path)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise HubError(f"{repo_id}: {source} at {self.endpoint} gave no valid size for {path} ({size!r})",
                           hint="the endpoint must publish sizes like the Hub (DESIGN §2)")
        if lfs_sha256 is not None and not (isinstance(lfs_sha256, str) and SHA256_RE.fullmatch(lfs_sha256)):
            raise HubError(f"{repo_id}: {source} at {self.endpoint} gave sha256 {lfs_sha256!r} for {path}, "
                           "not 64 lowercase hex characters", hint="the endpoint is broken or hostile")
        if lfs_sha256 is None and not (isinstance(blob_id, str) and BLOB_ID_RE.fullmatch(blob_id)):
            raise HubError(f"{repo_id}: {source} at {self.endpoint} gave blob id {blob_id!r} for {path}, "
                           "not 40 or 64 lowercase hex characters", hint="the endpoint is broken or hostile")
        return RemoteFile(path=path, size=size, blob_id=blob_id if isinstance(blob_id, str) else "",
                          lfs_sha256=lfs_sha256)

    def _safe_path(self, repo_id: str, path: object) -> str:
        try:
            if not isinstance(path, str):
                raise UnsafePath(f"unsafe repo file path {path!r}")
            return validate_repo_path(path)
        except UnsafePath as exc:
            raise HubError(f"{repo_id}: endpoint listed an {exc}", hint="the endpoint is broken or hostile") from None

    @contextmanager
    def open_body(self, repo: RepoRevision, file: RemoteFile, start: int = 0,
                  end: int | None = None) -> Iterator[httpx2.Response]:
        """Open the GET of ``file``'s bytes ``[start, end)`` at the repo's commit (a ``Range`` unless the whole file).

        Yields the streaming response, status 200 (whole body: the server ignored ``Range``) or 206; the caller
        checks which and reads it. Redirects are followed (the CDN); httpx drops ``Authorization`` across origins.

        Raises:
            HfHubHTTPError (via ``hf_raise_for_status``) and httpx2 errors, untranslated: the caller retries them.
        """
        end = file.size if end is None else end
        url = resolve_url(self.endpoint, repo.canonical_id, file.path, repo.repo_type, repo.commit_hash)
        headers = build_hf_headers(token=self._token, library_name="hfcache", library_version=__version__)
        # Identity encoding keeps Content-Length and byte offsets meaningful for size checks and ranges.
        headers["Accept-Encoding"] = "identity"
        if start > 0 or end < file.size:
            headers["Range"] = f"bytes={start}-{end - 1}"
        with get_session().stream("GET", url, headers=headers, timeout=self.timeout,
                                  follow_redirects=True) as response:
            hf_raise_for_status(response)
            yield response

    def mapped(self, repo: RepoRevision, path: str | None = None) -> _mapped_errors:
        """A context turning library errors of requests for ``repo`` into hfcache errors (one-line messages)."""
        return _mapped_errors(repo.repo_id, repo.commit_hash, self.endpoint, path=path)

    def download(self, repo: RepoRevision, file: RemoteFile, out: BinaryIO,
                 counter: RetryCounter | None = None) -> None:
        """Download one (small) file into ``out`` from byte 0, checking its size and hash; a transient failure
        starts over (``out`` is truncated). For blobs in a cache use :func:`hfcache.hub.transfer.download_blob`.

        Raises:
            IntegrityError: the bytes do not match the published size or hash.
            EndpointUnreachable, RepoNotFound, RevisionNotFound, GatedRepo, HubError.
        """
        counter = counter or self.counter()

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            hasher = Hasher(file)
            written = 0
            with self.open_body(repo, file) as response:
                for chunk in response.iter_bytes():
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
    """True for a failure worth retrying (:mod:`hfcache.hub.retry`): a 429, 502, 503 or 504, or a connection cut
    mid-answer, including httpx2's ``RemoteProtocolError`` (peer closed early), ``ReadError`` and ``WriteError``.
    Timeouts and refused connections are not retried (``--timeout`` bounds the wait; the next endpoint is a better
    bet)."""
    return _transient_without_client(exc) or isinstance(
        exc, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError))


_HEAD_WORKERS = 8
_NO_TREE = (400, 404, 405, 501)  # "no tree API here": fall back to HEAD per file
_MAX_TREE_PAGES = 10_000


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class _mapped_errors:
    """Context manager turning huggingface_hub / httpx2 errors into hfcache errors with one-line messages."""

    def __init__(self, repo_id: str, revision: str, endpoint: str, path: str | None = None) -> None:
        self.what = f"{repo_id}@{revision}" + (f": {path}" if path else "")
        self.repo_id = repo_id
        self.revision = revision
        self.endpoint = endpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or isinstance(exc, HubError):
            return False
        translated = self._translate(exc)
        if translated is exc:
            return False
        raise translated from exc

    def _translate(self, exc: BaseException) -> BaseException:
        if isinstance(exc, GatedRepoError):
            return GatedRepo(f"{self.repo_id}: access is gated or forbidden at {self.endpoint}",
                             hint="accept the repo's conditions on the Hub and pass a token with access (--token-file)")
        if isinstance(exc, RevisionNotFoundError):
            return RevisionNotFound(f"{self.repo_id}: revision {self.revision!r} not found at {self.endpoint}",
                                    hint="check the branch, tag or commit name")
        if isinstance(exc, RepositoryNotFoundError):
            return RepoNotFound(f"{self.repo_id}: repo not found at {self.endpoint} (or private without access)",
                                hint="check the repo id and --repo-type; for a private repo pass a token")
        if isinstance(exc, OfflineModeIsEnabled):
            return OfflineViolation(f"{self.what}: HF_HUB_OFFLINE is set, so nothing can be downloaded",
                                    hint="unset HF_HUB_OFFLINE for hfcache warm (or use warm --lock on a warm cache)")
        if isinstance(exc, ShortBody):
            return EndpointUnreachable(f"{self.what}: the connection to {self.endpoint} was cut mid-body",
                                       hint="retry later or raise --retries")
        if isinstance(exc, httpx2.TimeoutException):
            return EndpointUnreachable(f"{self.what}: no answer from {self.endpoint} within the timeout",
                                       hint="check the endpoint, or raise --timeout")
        if isinstance(exc, httpx2.TooManyRedirects):
            return HubError(f"{self.what}: too many redirects from {self.endpoint}", hint="the endpoint is misconfigured")
        if isinstance(exc, (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)):
            return EndpointUnreachable(f"{self.what}: the connection to {self.endpoint} was cut ({_first_line(exc)})",
                                       hint="retry later or raise --retries")
        if isinstance(exc, (httpx2.ConnectError, httpx2.NetworkError)):
            return EndpointUnreachable(f"{self.what}: cannot connect to {self.endpoint} ({_first_line(exc)})",
                                       hint="check --endpoint / HF_ENDPOINT and the network")
        if isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else "?"
            if status in (401, 403):
                return GatedRepo(f"{self.repo_id}: HTTP {status} from {self.endpoint}: not authorized",
                                 hint="pass a token with access (--token-file or HF_TOKEN)")
            return HubError(f"{self.what}: HTTP {status} from {self.endpoint}", hint="retry later or check the endpoint")
        if isinstance(exc, (ValueError, KeyError, TypeError, RecursionError)):  # malformed JSON or fields
            return HubError(f"{self.what}: malformed answer from {self.endpoint} ({_first_line(exc)})",
                            hint="the endpoint is not Hub-compatible")
        if isinstance(exc, httpx2.HTTPError):
            return EndpointUnreachable(f"{self.what}: {_first_line(exc)}", hint="check the endpoint and network")
        return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _file_and_folder(paths: set[str]) -> str | None:
    """A path of ``paths`` that is also a folder of another (``a`` and ``a/b``): no cache can hold both."""
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                return "/".join(parts[:i])
    return None


class _Sibling(NamedTuple):
    """One entry of a repo info's ``siblings`` as the Hub spells it: ``rfilename``, ``size``, ``blobId``,
    ``lfs.sha256`` (``RepoSibling``/``BlobLfsInfo`` in huggingface_hub's hf_api.py). Values unchecked: see
    :meth:`HubClient._remote_file`."""

    rfilename: object
    size: object
    blob_id: object
    lfs_sha256: object


class _RepoInfo(NamedTuple):
    """The fields of ``GET /api/{type}s/{repo_id}/revision/{rev}?blobs=true`` hfcache reads; ``siblings`` is None
    when the answer has none (``"siblings": null`` or missing), as ``ModelInfo.siblings``."""

    id: str | None
    sha: str | None
    siblings: list[_Sibling] | None


def _parse_repo_info(data: dict) -> _RepoInfo:
    """The repo info fields hfcache reads, with ``ModelInfo.__init__``'s keys (hf_api.py).

    Raises:
        KeyError, TypeError: a sibling without ``rfilename`` or not an object, ``lfs`` not an object, ``id`` or
            ``sha`` not a string (mapped to a one-line HubError by ``_mapped_errors``).
    """
    raw = data.get("siblings")
    siblings = None
    if raw is not None:
        if not isinstance(raw, list):
            raise TypeError("siblings is not a JSON array")
        siblings = []
        for entry in raw:
            if not isinstance(entry, dict):
                raise TypeError(f"a sibling is not an object: {entry!r:.80}")
            lfs = entry.get("lfs") or None
            if lfs is not None and not isinstance(lfs, dict):
                raise TypeError(f"lfs of {entry['rfilename']!r:.80} is not an object")
            siblings.append(_Sibling(entry["rfilename"], entry.get("size"), entry.get("blobId"),
                                     lfs.get("sha256") if lfs else None))
    for key in ("id", "sha"):
        if not isinstance(data.get(key), (str, type(None))):
            raise TypeError(f"{key} is not a string")
    return _RepoInfo(data.get("id"), data.get("sha"), siblings)
