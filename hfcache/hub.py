"""Hub access: the only hfcache module that talks to the network.

Resolving a revision and listing files is one ``HfApi.repo_info(files_metadata=True)`` request (made here with a
bound on the answer's decoded size, see ``HubClient._repo_info``)
(``GET {endpoint}/api/{type}s/{repo_id}/revision/{rev}?blobs=true``, DESIGN §2.1): it gives the canonical id,
the commit and every file's size, git blob sha1 and LFS sha256 up front, so no per-file HEAD is needed.

Downloads use huggingface_hub's shared HTTP client (``get_session``, with its request hooks and offline-mode
guard) and its error mapping (``hf_raise_for_status``), but stream the body themselves. Library gap: ``http_get``
(``file_download.py``) takes its timeout from a module constant read at import time, retries five times with
sleeps, and never hashes what it wrote; hfcache needs a per-call timeout and the hash of the bytes while they
stream.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import re
from urllib.parse import quote, urlsplit
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import httpx2
from huggingface_hub import DatasetInfo, ModelInfo, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from ._version import __version__
from .errors import (
    EndpointUnreachable,
    GatedRepo,
    HubError,
    IntegrityError,
    OfflineViolation,
    RepoNotFound,
    UsageError,
    RevisionNotFound,
)
from .records import valid_repo_id
from .selection import UnsafePath, validate_repo_path

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1024 * 1024
#: Largest repo info answer read, decoded (README "warm"): the Hub's answer for a repo of 100,000 files is ~20 MB.
MAX_METADATA_BYTES = 64 * 1024 * 1024


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
        files (tuple[RemoteFile, ...]): every file of the repo at that commit, sorted by path.
    """

    repo_id: str
    canonical_id: str
    repo_type: str
    revision: str
    commit_hash: str
    files: tuple[RemoteFile, ...]


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
        raise UsageError("the endpoint URL must not carry credentials", hint="pass the token with --token-file")
    return endpoint.rstrip("/")


class HubClient:
    """A connection to one Hub endpoint with one token and one timeout.

    Args:
        endpoint: base URL, e.g. ``https://huggingface.co`` (default: ``HF_ENDPOINT`` as huggingface_hub read it).
        token: a Hub token, or None for anonymous access. Never logged or stored by hfcache.
        timeout: seconds to wait for a connection or for any byte of an answer.
    """

    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 10.0) -> None:
        # HF_ENDPOINT is read now, not at import time as huggingface_hub's constants.ENDPOINT is (DESIGN §3).
        self.endpoint = validate_endpoint(endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
        # token=False stops huggingface_hub from reading a stored token behind our back.
        self._token: str | bool = token or False
        self.timeout = timeout

    def __repr__(self) -> str:  # never show the token
        return f"HubClient(endpoint={self.endpoint!r})"

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

    def resolve(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> RepoRevision:
        """Resolve ``revision`` to a commit and list every file with its size and hash.

        Args:
            repo_id: ``org/name`` or a legacy id.
            revision: branch, tag or 40-hex commit.
            repo_type: ``model`` or ``dataset``.

        Returns:
            RepoRevision with the canonical id and the files at the commit.

        Raises:
            RepoNotFound, RevisionNotFound, GatedRepo, EndpointUnreachable, HubError (malformed answer).
        """
        with _mapped_errors(repo_id, revision, self.endpoint):
            info = self._repo_info(repo_id, revision, repo_type)
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
        if info.siblings is None:  # the Hub always lists them (``[]`` for an empty repo): a broken answer
            raise HubError(f"{repo_id}: {self.endpoint} answered no file listing (siblings) for {revision}",
                           hint="the endpoint is broken or not Hub-compatible")
        files = [self._remote_file(repo_id, sibling) for sibling in info.siblings]
        files.sort(key=lambda f: f.path)
        clash = _file_and_folder({f.path for f in files})
        if clash:
            raise HubError(f"{repo_id}: endpoint listed {clash!r} as a file and as a folder",
                           hint="the endpoint is broken or hostile")
        return RepoRevision(
            repo_id=repo_id,
            canonical_id=canonical_id,
            repo_type=repo_type,
            revision=revision,
            commit_hash=commit,
            files=tuple(files),
        )

    def _remote_file(self, repo_id: str, sibling) -> RemoteFile:
        """One sibling of a ``?blobs=true`` answer, every name checked: a path, a 40-hex ``blobId``, a 64-hex
        ``lfs.sha256`` and a non-negative size (they name files in the cache: a hostile endpoint must not be able
        to point one outside it)."""
        try:
            path = validate_repo_path(sibling.rfilename)
        except UnsafePath as exc:
            raise HubError(f"{repo_id}: {self.endpoint} listed an {exc}", hint="the endpoint is broken or hostile") from None
        lfs = sibling.lfs.sha256 if sibling.lfs else None
        if sibling.size is None or sibling.blob_id is None:
            raise HubError(f"{repo_id}: endpoint gave no size or hash for {path}",
                           hint="the endpoint must answer ?blobs=true like the Hub (DESIGN §2.1)")
        if not isinstance(sibling.blob_id, str) or not COMMIT_RE.fullmatch(sibling.blob_id):
            raise HubError(f"{repo_id}: {self.endpoint} answered blobId {sibling.blob_id!r} for {path}, not 40 "
                           "lowercase hex characters", hint="the endpoint is broken or hostile")
        if lfs is not None and (not isinstance(lfs, str) or not SHA256_RE.fullmatch(lfs)):
            raise HubError(f"{repo_id}: {self.endpoint} answered lfs.sha256 {lfs!r} for {path}, not 64 lowercase "
                           "hex characters", hint="the endpoint is broken or hostile")
        if not isinstance(sibling.size, int) or isinstance(sibling.size, bool) or sibling.size < 0:
            raise HubError(f"{repo_id}: {self.endpoint} answered size {sibling.size!r} for {path}",
                           hint="the endpoint is broken or hostile")
        return RemoteFile(path=path, size=sibling.size, blob_id=sibling.blob_id, lfs_sha256=lfs)
    def _repo_info(self, repo_id: str, revision: str, repo_type: str) -> ModelInfo | DatasetInfo:
        """``HfApi.repo_info(files_metadata=True)`` with a bound on the answer (``MAX_METADATA_BYTES`` decoded).

        Library gap: ``HfApi.model_info``/``dataset_info`` (hf_api.py) read the whole body with ``get_session().get``
        and decode it without bound: a gzip-encoded answer of a few MiB inflates to gigabytes in memory, and
        ``hf_raise_for_status`` reads a streamed error body whole too. Same request (URL, ``?blobs=true``, headers,
        redirects), same parsing (``ModelInfo(**data)``), but the body is read as it decodes and refused past the
        bound, error bodies included.

        Raises:
            HubError: the answer is larger than the bound, not JSON, or nested too deep; and what
                ``hf_raise_for_status`` raises (mapped by the caller).
        """
        url = f"{self.endpoint}/api/{repo_type}s/{repo_id}/revision/{quote(revision, safe='')}"
        headers = build_hf_headers(token=self._token, library_name="hfcache", library_version=__version__)
        with get_session().stream("GET", url, params={"blobs": True}, headers=headers, timeout=self.timeout) as r:
            body = bytearray()
            for chunk in r.iter_bytes():  # decoded (gzip, br, ...) as it arrives
                body += chunk
                if len(body) > MAX_METADATA_BYTES:
                    raise HubError(f"{repo_id}@{revision}: the answer of {self.endpoint} is larger than "
                                   f"{MAX_METADATA_BYTES} bytes (decoded); refused",
                                   hint="the endpoint is broken or hostile")
            hf_raise_for_status(r)  # the body is consumed: its message comes from X-Error-Message
        try:
            data = json.loads(body)
        except RecursionError:
            raise HubError(f"{repo_id}@{revision}: the answer of {self.endpoint} is JSON nested too deep",
                           hint="the endpoint is broken or hostile") from None
        if not isinstance(data, dict):
            raise HubError(f"{repo_id}@{revision}: the answer of {self.endpoint} is not a JSON object",
                           hint="the endpoint is broken or hostile")
        return (DatasetInfo if repo_type == "dataset" else ModelInfo)(**data)

    def download(
        self,
        repo: RepoRevision,
        file: RemoteFile,
        out: BinaryIO,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        """Stream one file at the repo's commit into ``out`` and check its size and hash.

        Args:
            repo: the resolved repo (the canonical id and commit are used in the URL).
            file: the file to fetch.
            out: a binary file opened for writing at position 0.
            on_bytes: called with the byte count of every chunk written (progress).

        Raises:
            IntegrityError: the bytes do not match the published size or hash.
            EndpointUnreachable, RepoNotFound, RevisionNotFound, GatedRepo, HubError.
        """
        url = hf_hub_url(repo.canonical_id, file.path, repo_type=repo.repo_type,
                         revision=repo.commit_hash, endpoint=self.endpoint)
        headers = build_hf_headers(token=self._token, library_name="hfcache", library_version=__version__)
        # Hashing needs the identity encoding: a gzip transfer would change nothing in the bytes we hash
        # (httpx decodes), but asking for identity keeps Content-Length meaningful for the size check.
        headers["Accept-Encoding"] = "identity"
        hasher = Hasher(file)
        written = 0
        # Errors name the commit: for a locked repo, a 404 here means the pinned commit is gone.
        with _mapped_errors(repo.repo_id, repo.commit_hash, self.endpoint, path=file.path):
            with get_session().stream("GET", url, headers=headers, timeout=self.timeout,
                                      follow_redirects=True) as response:
                hf_raise_for_status(response)
                for chunk in response.iter_bytes():  # as the bytes arrive: progress and Ctrl-C stay live
                    written += len(chunk)
                    if written > file.size:
                        raise IntegrityError(
                            f"{repo.repo_id}: {file.path} is larger than the {file.size} bytes the endpoint published"
                        )
                    hasher.update(chunk)
                    out.write(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))
        if written != file.size:
            raise IntegrityError(f"{repo.repo_id}: {file.path} has {written} bytes, the endpoint published {file.size}")
        if not hasher.matches():
            raise IntegrityError(
                f"{repo.repo_id}: {file.path} does not match its expected hash "
                f"(expected {file.hash}, got {hasher.hexdigest()})"
            )


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
        if isinstance(exc, httpx2.TimeoutException):
            return EndpointUnreachable(f"{self.what}: no answer from {self.endpoint} within the timeout",
                                       hint="check the endpoint, or raise --timeout")
        if isinstance(exc, httpx2.TooManyRedirects):
            return HubError(f"{self.what}: too many redirects from {self.endpoint}", hint="the endpoint is misconfigured")
        if isinstance(exc, (httpx2.ConnectError, httpx2.NetworkError, httpx2.RemoteProtocolError)):
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


def _file_and_folder(paths: set[str]) -> str | None:
    """A path of ``paths`` that is also a folder of another (``a`` and ``a/b``): no cache can hold both."""
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                return "/".join(parts[:i])
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
