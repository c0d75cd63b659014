"""The records hfcache's commands pass around: requests and results, as frozen dataclasses.

This module is deliberately light (standard library only): ``warm --lock`` on a warm cache imports it without
loading huggingface_hub or an HTTP client.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .bounds import MAX_TREE_DEPTH
from .errors import UsageError

KINDS = ("tokenizer", "model", "all")

#: The repo types hfcache warms (huggingface_hub constants.py ``REPO_TYPES_WITH_KERNEL``, less ``space``): each is
#: cached as ``{type}s--ORG--NAME`` and asked under the URL prefix ``{type}s/`` (none for models).
REPO_TYPES = ("model", "dataset", "kernel")

# Same rule as huggingface_hub.utils._validators.REPO_ID_REGEX / validate_repo_id (copied: importing it loads
# huggingface_hub.utils and its HTTP stack, which the light lock path must not pay for).
_REPO_ID_RE = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)
#: Longest repo path component / whole repo path accepted, in UTF-8 bytes (Linux NAME_MAX / PATH_MAX).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
#: Longest revision accepted (bytes): huggingface_hub stores a ref as the file ``refs/<revision>``, and Linux
#: file names hold at most 255 bytes (``NAME_MAX``, <linux/limits.h>).
MAX_REVISION_BYTES = 255
#: The largest file size accepted from an endpoint, a lock or a cache's record: 2**53 - 1 bytes (8 PiB), the largest
#: integer a JSON number carries exactly (RFC 8259, section 6; the Hub answers in JSON). Past it, arithmetic on the
#: size (download parts, ranges, the mirror's deadline for a file) overflows a float: exit 70 before this check.
MAX_FILE_SIZE = 2**53 - 1
MAX_GLOBS = 100  #: most include (or exclude) globs of one request
MAX_GLOB_CHARS = 256  #: longest glob accepted
_BAD_REVISION = re.compile(r"(^|/)\.\.?(/|$)|^/|\\|\s|\x00")


@dataclass(frozen=True)
class WarmRequest:
    """One repo to warm.

    Attributes:
        repo_id (str): ``org/name`` or a legacy id; the cache folder is named after it, as loaders will ask for it.
        revision (str): branch, tag or 40-hex commit (default ``main``).
        repo_type (str): ``model``, ``dataset`` or ``kernel`` (:data:`REPO_TYPES`).
        kind (str): ``tokenizer`` (default), ``model`` or ``all`` (see :func:`hfcache.warming.selection.select`).
        include (tuple[str, ...]): globs added to the kind's selection.
        exclude (tuple[str, ...]): globs removed from it.
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
        if len(self.revision.encode()) > MAX_REVISION_BYTES:  # a ref is a file under refs/: NAME_MAX on Linux
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
            # fnmatch's translation and matching cost grows with the square of a pattern (a glob of 100,000 '['
            # kept warm busy for minutes, a manifest's for hours): globs are as short as the paths they match.
            if len(globs) > MAX_GLOBS or any(len(g) > MAX_GLOB_CHARS for g in globs):
                raise UsageError(f"{name}: at most {MAX_GLOBS} globs of at most {MAX_GLOB_CHARS} characters each",
                                 hint="match with shorter patterns (e.g. '*.json', 'onnx/*')")
            object.__setattr__(self, name, tuple(globs))

    @classmethod
    def parse(cls, spec: str, **options) -> WarmRequest:
        """Build a request from ``REPO_ID[@REVISION]``; ``options`` are the other fields.

        Raises:
            UsageError: malformed repo id, revision, type or kind.
        """
        repo_id, sep, revision = spec.partition("@")
        if sep and not revision:
            raise UsageError(f"invalid repo spec {shown(spec)}: empty revision after '@'", hint="use REPO_ID@REVISION")
        return cls(repo_id=repo_id, revision=revision or "main", **options)

    @property
    def spec(self) -> str:
        return self.repo_id if self.revision == "main" else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class WarmedFile:
    """A file of a warmed repo.

    Attributes:
        path (str): path in the repo.
        size (int): bytes.
        hash (str): ``sha256:<hex>`` (LFS) or ``git-sha1:<hex>``.
        source (str): ``downloaded`` (fetched and hashed now), ``cached`` (blob already present, size checked) or
            ``linked`` (hardlinked from an identical, re-hashed blob of another repo folder).
    """

    path: str
    size: int
    hash: str
    source: str


@dataclass(frozen=True)
class RepoResult:
    """The outcome for one :class:`WarmRequest`.

    Attributes:
        request: what was asked.
        endpoint (str | None): the endpoint that served it (of several, the one whose answers were used; when every
            endpoint failed, the last one tried); None when no request was made for it (a lock the cache already
            satisfies), so nothing names an endpoint that was never asked.
        canonical_id (str | None): the id the endpoint answered with; None when resolution failed.
        commit_hash (str | None): the resolved commit.
        files (tuple[WarmedFile, ...]): the selected files, sorted by path.
        absent (tuple[str, ...]): optional tokenizer names the repo lacks, recorded as ``.no_exist`` markers.
        bytes_downloaded (int): bytes received from the network for this repo.
        retries (int): transient failures (429, 502-504, connections cut) retried for this repo, all endpoints.
        requests (int): HTTP requests sent for this repo, all endpoints: metadata (repo info, tree pages, HEADs) and
            file bodies, each retry and each redirect hop (to a CDN) included; 0 when the cache satisfied it.
        metadata (str | None): where sizes and hashes came from: ``model-info``, ``tree``, ``head`` or ``lock``.
        seconds (float): wall time.
        error (str | None): one-line reason when the repo failed.
        hint (str | None): what to do about it.
        exit_code (int): 0, or the documented exit code of the error.
        notes (tuple[str, ...]): one-line warnings: what warm changed beyond the requested repo, e.g. the ref of a
            legacy id's canonical folder moved to another commit; custom code in another repo, a file too large to
            parse (``custom_code.Followed.notes``).
        error_type (str | None): the error's class in :mod:`hfcache.errors` (``IntegrityError``,
            ``EndpointUnreachable``, ``RepoNotFound``...;
            ``Interrupted`` with exit 130 when Ctrl-C stopped it), for callers that answer each kind differently
            (the mirror).
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
    """The outcome of one :func:`warm` call.

    Attributes:
        cache_dir (str): the cache written.
        repos (tuple[RepoResult, ...]): one result per request, in request order.
        seconds (float): total wall time.
        endpoints (tuple[str, ...]): the endpoints configured, in order of preference.
    """

    cache_dir: str
    repos: tuple[RepoResult, ...]
    seconds: float
    endpoints: tuple[str, ...] = ()

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
        """HTTP requests sent for all repos (:attr:`RepoResult.requests`); 0: the cache alone answered."""
        return sum(r.requests for r in self.repos)

    @property
    def satisfied_by_cache(self) -> bool:
        """True when every repo succeeded from a lock without a single request (``warm --lock`` on a warm cache)."""
        return bool(self.repos) and self.ok and self.requests == 0 and all(r.metadata == "lock" for r in self.repos)


class ProgressSink(Protocol):
    """Receives progress events from :func:`warm` (from worker threads). ``key`` is the request's index."""

    def repo_started(self, key: int, label: str, files: int, total_bytes: int) -> None: ...

    def advance(self, key: int, nbytes: int) -> None: ...

    def repo_finished(self, key: int, result: RepoResult) -> None: ...


class NoProgress:
    def repo_started(self, key: int, label: str, files: int, total_bytes: int) -> None:
        pass

    def advance(self, key: int, nbytes: int) -> None:
        pass

    def repo_finished(self, key: int, result: RepoResult) -> None:
        pass




def parse_specs(specs: Iterable[str]) -> dict[str, set[str]]:
    """``REPO_ID[@REVISION]`` arguments of the reading commands (``check``, ``verify``), parsed as ``warm`` parses
    them: repo id -> the revisions named (an empty set: every cached revision of that repo).

    Raises:
        UsageError: a malformed id or revision.
    """
    wanted: dict[str, set[str]] = {}
    for spec in specs:
        request = WarmRequest.parse(spec)
        revisions = wanted.setdefault(request.repo_id, set())
        if "@" in spec:
            revisions.add(request.revision)
    return wanted


def shown(value: object, limit: int = 80) -> str:
    """``value`` quoted for a one-line message about a document a user, cache or peer supplied: ``repr`` (control
    characters and newlines escaped), cut to ``limit`` characters; an integer of more than ``limit`` digits is
    described, not printed (``repr`` of one over 4,300 digits raises ValueError on Python 3.11).

    Args:
        value (object): what the document held. limit (int): longest result.

    Returns:
        str: one line, at most ``limit`` characters.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def valid_size(value: object) -> bool:
    """Whether ``value`` is a file size: an ``int`` (not a ``bool``) from 0 to :data:`MAX_FILE_SIZE`.

    Args:
        value (object): a size as a JSON or TOML document gave it.

    Returns:
        bool: False for a float, string, bool, None, a negative or a larger number.
    """
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FILE_SIZE


def valid_repo_id(repo_id: str) -> bool:
    """True when ``repo_id`` passes huggingface_hub's local repo id rules (``utils/_validators.py``)."""
    return (
        isinstance(repo_id, str)
        and repo_id.count("/") <= 1
        and _REPO_ID_RE.fullmatch(repo_id) is not None
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    )


def folder_ids(repo_id: str, canonical_id: str | None) -> tuple[str, ...]:
    """The repo ids whose cache folders a warmed repo occupies, canonical first.

    The canonical id an endpoint answers is followed only where the Hub itself renames: a legacy id without an org
    (``bert-base-uncased``) answered as ``ORG/<the same name>`` (``google-bert/bert-base-uncased``) fills both
    folders, since loaders ask for either. Any other answer (an ``org/name`` request answered with another id, as
    after a 307 rename, or by a hostile endpoint) is stored only under the requested id, which is also where
    huggingface_hub stores it (the folder is named after the id as the caller typed it, huggingface_hub ``file_download.py`` ``repo_folder_name``): an endpoint can
    never write into the folder of a repo that was not requested.
    """
    if (canonical_id and canonical_id != repo_id and "/" not in repo_id
            and canonical_id.count("/") == 1 and canonical_id.split("/")[1] == repo_id):
        return canonical_id, repo_id
    return (repo_id,)


class UnsafePath(ValueError):
    """A repo path that could escape the repo folder: absolute, ``..``, backslashes, empty parts."""


def validate_repo_path(path: str) -> str:
    """Return ``path`` if it is a safe relative repo path, else raise UnsafePath (a ValueError).

    A listing from a hostile or broken endpoint must not make hfcache write outside the repo folder, nor write a
    path the other commands refuse to walk: at most :data:`hfcache.bounds.MAX_TREE_DEPTH` components (the folder
    bound of verify, export and doctor), each at most :data:`MAX_NAME_BYTES` bytes of UTF-8 (NAME_MAX of Linux
    file systems), the whole at most :data:`MAX_PATH_BYTES` bytes (PATH_MAX).

    Raises:
        UnsafePath: the path is unsafe or too deep/long; the one-line message names it (cut to 200 characters).
    """
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
