"""The records hfcache's rooms pass around: requests, results and the Hub options, as frozen dataclasses; the checks
of ids, paths and sizes they hold. Standard library only (``warm --lock`` on a warm cache imports it).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from .bounds import MAX_TREE_DEPTH
from .errors import UsageError

KINDS = ("tokenizer", "model", "all")

#: The repo types hfcache warms (huggingface_hub constants.py ``REPO_TYPES_WITH_KERNEL``, less ``space``).
REPO_TYPES = ("model", "dataset", "kernel")

# huggingface_hub utils/_validators.py REPO_ID_REGEX, copied: importing it loads the HTTP stack.
_REPO_ID_RE = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)
#: Longest repo path component / whole repo path, in UTF-8 bytes (Linux NAME_MAX / PATH_MAX, less its NUL).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
#: Longest revision (bytes): a ref is the file ``refs/<revision>``, one name of at most NAME_MAX bytes.
MAX_REVISION_BYTES = 255
#: The largest file size accepted from an endpoint, a lock or a record: 2**53 - 1, the largest integer a JSON number
#: carries exactly (RFC 8259, section 6); past it, arithmetic on sizes (parts, ranges, deadlines) overflows a float.
MAX_FILE_SIZE = 2**53 - 1
MAX_GLOBS = 100  #: most include (or exclude) globs of one request
MAX_GLOB_CHARS = 256  #: longest glob accepted
_BAD_REVISION = re.compile(r"(^|/)\.\.?(/|$)|^/|\\|\s|\x00")

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TIMEOUT = 10.0  #: seconds to wait for a connection or any byte of an answer (``--timeout``)
DEFAULT_RETRIES = 5  #: retries of a transient failure per request or file (``--retries``, :mod:`hfcache.hub.retry`)
DEFAULT_MAX_WORKERS = 8  #: connections at once (``--max-workers``)
#: Set to 1 to send the Hub token to a manifest's ``endpoint`` too (``--trust-manifest-endpoint``; docs/warm.md).
TRUST_ENDPOINT_ENV = "HFCACHE_TRUST_MANIFEST_ENDPOINT"


@dataclass(frozen=True)
class HubOptions:
    """How a command reaches the Hub: built once by the CLI's shared options (or the Python API) and passed down.

    Attributes:
        endpoints (tuple[str, ...]): in order of preference (a str is one); empty: ``HF_ENDPOINT`` or the Hub.
        token (str | bool | None): a token; None: huggingface_hub's (``HF_TOKEN``, the saved token); False: none.
        token_file (str | None): a file holding the token, read by :meth:`read_token`.
        timeout (float), retries (int), max_workers (int; also verify's hashing threads): as the options
            (``DEFAULT_*``); UsageError unless ``retries`` >= 0, ``max_workers`` >= 1 and ``timeout`` > 0.
        withheld (tuple[str, ...]): endpoints that get no token: a manifest's, without the opt-in
            (:func:`hfcache.warming.manifest.withheld_endpoints`).
    """

    endpoints: tuple[str, ...] = ()
    token: str | bool | None = field(default=None, repr=False)
    token_file: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    max_workers: int = DEFAULT_MAX_WORKERS
    withheld: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        endpoints = self.endpoints
        object.__setattr__(self, "endpoints", (endpoints,) if isinstance(endpoints, str) else tuple(endpoints or ()))
        object.__setattr__(self, "withheld", tuple(self.withheld))
        if self.retries < 0:
            raise UsageError(f"--retries must be at least 0, got {self.retries}")
        if self.max_workers < 1:
            raise UsageError(f"--max-workers must be at least 1, got {self.max_workers}")
        if self.timeout <= 0:
            raise UsageError(f"--timeout must be positive, got {self.timeout}")

    def read_token(self) -> HubOptions:
        """These options with ``token_file`` read into ``token`` (unchanged without a file). UsageError (exit 2): both
        a token and a file, or the file unreadable or empty."""
        if self.token_file is None:
            return self
        if self.token:
            raise UsageError("--token and --token-file are mutually exclusive", hint="give one of them")
        return replace(self, token=read_token_file(self.token_file), token_file=None)

    def named(self) -> tuple[str, ...]:
        """The endpoints as a report names them: without a trailing slash, an empty one as ``HF_ENDPOINT`` or the
        Hub."""
        default = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        return tuple((e or default).rstrip("/") for e in self.endpoints or ("",))


def read_token_file(path: str, option: str = "--token-file") -> str:
    """The token in the file ``path``, stripped. UsageError (exit 2): unreadable or empty, naming ``option``."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"cannot read {option} {path}: {exc.strerror}",
                         hint="give a readable file holding the token") from None
    if not value:
        raise UsageError(f"{option} {path} is empty", hint="write the token into it, or drop the option")
    return value


@dataclass(frozen=True)
class WarmRequest:
    """One repo to warm.

    Attributes:
        repo_id (str): ``org/name`` or a legacy id; the cache folder is named after it, as loaders will ask for it.
        revision (str): branch, tag or 40-hex commit. repo_type (str): one of :data:`REPO_TYPES`.
        kind (str): one of :data:`KINDS` (:func:`hfcache.warming.selection.select`).
        include, exclude (tuple[str, ...]): globs added to / removed from the kind's selection.

    Raises UsageError: a malformed id, revision, type, kind or glob list (at most :data:`MAX_GLOBS` globs of
    :data:`MAX_GLOB_CHARS` characters: fnmatch's cost grows with the square of a pattern).
    """

    repo_id: str
    revision: str = "main"
    repo_type: str = "model"
    kind: str = "tokenizer"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not valid_repo_id(self.repo_id):
            raise UsageError(f"invalid repo id {shown(self.repo_id)}",
                             hint="use ORG/NAME or a legacy id such as bert-base-uncased")
        if not self.revision or _BAD_REVISION.search(self.revision):
            raise UsageError(f"invalid revision {shown(self.revision)} for {self.repo_id}",
                             hint="use a branch, tag or 40-hex commit")
        if len(self.revision.encode()) > MAX_REVISION_BYTES:
            raise UsageError(f"invalid revision {self.revision[:40]!r}... for {self.repo_id}: longer than "
                             f"{MAX_REVISION_BYTES} bytes", hint="use a branch, tag or 40-hex commit")
        if self.repo_type not in REPO_TYPES:
            raise UsageError(f"invalid repo type {shown(self.repo_type)}", hint=f"use one of {', '.join(REPO_TYPES)}")
        if self.kind not in KINDS:
            raise UsageError(f"invalid kind {shown(self.kind)}", hint=f"use one of {', '.join(KINDS)}")
        for name in ("include", "exclude"):
            globs = getattr(self, name)
            if isinstance(globs, str) or not all(isinstance(g, str) and g for g in globs):
                raise UsageError(f"{name} must be a sequence of non-empty glob strings, got {shown(globs)}")
            if len(globs) > MAX_GLOBS or any(len(g) > MAX_GLOB_CHARS for g in globs):
                raise UsageError(f"{name}: at most {MAX_GLOBS} globs of at most {MAX_GLOB_CHARS} characters each",
                                 hint="match with shorter patterns (e.g. '*.json', 'onnx/*')")
            object.__setattr__(self, name, tuple(globs))

    @classmethod
    def parse(cls, spec: str, **options) -> WarmRequest:
        """A request from ``REPO_ID[@REVISION]``; ``options`` are the other fields. UsageError as the constructor."""
        repo_id, sep, revision = spec.partition("@")
        if sep and not revision:
            raise UsageError(f"invalid repo spec {shown(spec)}: empty revision after '@'", hint="use REPO_ID@REVISION")
        return cls(repo_id=repo_id, revision=revision or "main", **options)

    @property
    def spec(self) -> str:
        return self.repo_id if self.revision == "main" else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class WarmedFile:
    """A file of a warmed repo: ``path`` in the repo, ``size`` in bytes, ``hash`` (``sha256:<hex>`` or
    ``git-sha1:<hex>``), ``source``: ``downloaded`` (fetched and hashed now), ``cached`` (blob present, size checked)
    or ``linked`` (hardlinked from an identical, re-hashed blob of another repo folder)."""

    path: str
    size: int
    hash: str
    source: str


@dataclass(frozen=True)
class RepoResult:
    """The outcome for one :class:`WarmRequest`.

    Attributes:
        request: what was asked. endpoint (str | None): the endpoint whose answers were used (all failed: the last
            tried); None when no request was made. canonical_id (str | None): the id the endpoint answered with.
        commit_hash (str | None): the resolved commit. files (tuple[WarmedFile, ...]): sorted by path.
        absent (tuple[str, ...]): optional tokenizer names the repo lacks (``.no_exist`` markers).
        bytes_downloaded, retries (429, 502-504, cut connections), requests (every retry and redirect hop; 0 when the
            cache satisfied it) (int): for this repo, all endpoints.
        metadata (str | None): where sizes and hashes came from: ``model-info``, ``tree``, ``head`` or ``lock``.
        seconds (float): wall time. error (str | None): one-line reason it failed. hint (str | None): what to do.
        exit_code (int): 0, or the documented exit code of the error.
        notes (tuple[str, ...]): one-line warnings: what warm changed beyond the request (a legacy id's canonical
            ref moved), custom code in another repo, a file too large to parse.
        error_type (str | None): the error's class name in :mod:`hfcache.errors` (``Interrupted``, exit 130, on
            Ctrl-C), for callers that answer each kind differently (the mirror).
    """

    request: WarmRequest
    endpoint: str | None
    canonical_id: str | None = None
    commit_hash: str | None = None
    files: tuple[WarmedFile, ...] = ()
    absent: tuple[str, ...] = ()
    bytes_downloaded: int = 0
    retries: int = 0
    requests: int = 0
    metadata: str | None = None
    seconds: float = 0.0
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0
    notes: tuple[str, ...] = ()
    error_type: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class WarmReport:
    """The outcome of one warm: ``cache_dir`` (str) written, ``repos`` (tuple[RepoResult, ...]) in request order,
    ``seconds`` (float) of wall time, the ``endpoints`` (tuple[str, ...]) configured in order of preference, and
    ``warnings`` (tuple[str, ...]): ``hfcache warm``'s own (a lock that drifted, a root umask hiding the cache)."""

    cache_dir: str
    repos: tuple[RepoResult, ...]
    seconds: float
    endpoints: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.repos)

    @property
    def exit_code(self) -> int:
        """0 when every repo succeeded, else the exit code of the first failed repo (request order)."""
        return next((r.exit_code for r in self.repos if not r.ok), 0)

    @property
    def bytes_downloaded(self) -> int:
        return sum(r.bytes_downloaded for r in self.repos)

    @property
    def requests(self) -> int:
        """HTTP requests sent for all repos; 0: the cache alone answered."""
        return sum(r.requests for r in self.repos)

    @property
    def satisfied_by_cache(self) -> bool:
        """True when every repo succeeded from a lock without a single request (``warm --lock`` on a warm cache)."""
        return bool(self.repos) and self.ok and self.requests == 0 and all(r.metadata == "lock" for r in self.repos)


class ProgressSink(Protocol):
    """Receives progress events from a warm (from worker threads). ``key`` is the request's index."""

    def planned(self, cache_dir: str, requests: Sequence[WarmRequest], satisfied: Sequence[RepoResult]) -> None:
        """Before anything starts (``hfcache warm`` only): every request, and those a lock's cache already holds."""

    def repo_started(self, key: int, label: str, files: int, total_bytes: int) -> None: ...

    def advance(self, key: int, nbytes: int) -> None: ...

    def repo_finished(self, key: int, result: RepoResult) -> None: ...


class NoProgress(ProgressSink):
    """A sink that ignores every event (the protocol's bodies do nothing)."""


def parse_specs(specs: Iterable[str]) -> dict[str, set[str]]:
    """``REPO_ID[@REVISION]`` arguments of ``check`` and ``verify``, parsed as ``warm`` parses them: repo id -> the
    revisions named (empty: every cached revision). UsageError: a malformed id or revision."""
    wanted: dict[str, set[str]] = {}
    for spec in specs:
        request = WarmRequest.parse(spec)
        revisions = wanted.setdefault(request.repo_id, set())
        if "@" in spec:
            revisions.add(request.revision)
    return wanted


def shown(value: object, limit: int = 80) -> str:
    """``value`` quoted for a one-line message about what a user, cache or peer supplied: ``repr`` (control
    characters escaped), cut to ``limit`` characters; an integer of more than ``limit`` digits is described (``repr``
    of one over 4,300 digits raises ValueError on Python 3.11)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def valid_size(value: object) -> bool:
    """Whether ``value`` is a file size: an ``int`` (not a ``bool``) from 0 to :data:`MAX_FILE_SIZE`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FILE_SIZE


def valid_repo_id(repo_id: str) -> bool:
    """Whether ``repo_id`` passes huggingface_hub's local repo id rules (``utils/_validators.py``)."""
    return (
        isinstance(repo_id, str)
        and repo_id.count("/") <= 1
        and _REPO_ID_RE.fullmatch(repo_id) is not None
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    )


def folder_ids(repo_id: str, canonical_id: str | None) -> tuple[str, ...]:
    """The repo ids whose cache folders a warmed repo occupies, canonical first: a legacy id (``bert-base-uncased``)
    answered as ``ORG/<the same name>`` fills both folders (loaders ask for either); any other answer (a 307 rename,
    a hostile endpoint) is stored under the requested id only, as huggingface_hub stores it."""
    if (canonical_id and canonical_id != repo_id and "/" not in repo_id
            and canonical_id.count("/") == 1 and canonical_id.split("/")[1] == repo_id):
        return canonical_id, repo_id
    return (repo_id,)


class UnsafePath(ValueError):
    """A repo path that could escape the repo folder: absolute, ``..``, backslashes, empty parts."""


def validate_repo_path(path: str) -> str:
    """``path`` if it is a safe relative repo path (no escape, at most ``MAX_TREE_DEPTH`` components of at most
    :data:`MAX_NAME_BYTES` bytes, :data:`MAX_PATH_BYTES` in all); else UnsafePath naming it."""
    if (
        not path
        or "\\" in path
        or "\0" in path
        or path.startswith("/")
        or posixpath.normpath(path) != path
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise UnsafePath(f"unsafe repo file path {shown(path, 200)}")
    parts = path.split("/")
    if len(parts) > MAX_TREE_DEPTH:
        raise UnsafePath(f"unsafe repo file path {path!r:.200}: {len(parts)} components, more than {MAX_TREE_DEPTH}")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise UnsafePath(f"unsafe repo file path {path!r:.200}: longer than {MAX_PATH_BYTES} bytes")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in parts):
        raise UnsafePath(f"unsafe repo file path {path!r:.200}: a name longer than {MAX_NAME_BYTES} bytes")
    return path


def folder_clash(paths: Iterable[str]) -> str | None:
    """The first path (sorted) that ``paths`` names both as a file and as a folder of another (``a`` and ``a/b``):
    no snapshot can hold both, so such a listing is refused before anything is fetched. None when there is none."""
    names = set(paths)
    for path in sorted(names):
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                return "/".join(parts[:i])
    return None
