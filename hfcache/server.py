"""A Hub-compatible, read-only HTTP server over a store of repos: plain repo folders or a warmed HF cache.

It speaks the subset of the Hugging Face Hub protocol that huggingface_hub's downloaders use
(DESIGN.md section 2), so tests, benchmarks, air-gapped mirrors and ``hfcache serve`` can point
``endpoint=`` at it:

- ``GET /api/{models|datasets}/{repo_id}[/revision/{rev}]``            repo info (``HfApi.repo_info``)
- ``GET /api/{models|datasets}/{repo_id}/tree/{rev}[/{path}]``         tree listing (``HfApi.list_repo_tree``)
- ``HEAD|GET /[datasets/]{repo_id}/resolve/{rev}/{path}``              file metadata and bytes (``hf_hub_download``)
- ``HEAD|GET {cdn_endpoint}/lfs/[datasets/]{repo_id}/{sha256}``        LFS bytes on a second origin, like the Hub's CDN
  (only with ``lfs_redirect=True``; otherwise LFS files are answered directly by the main origin)
- ``GET /healthz``                                                     liveness probe

Two stores sit behind the same HTTP layer:

``layout="repos"`` (:class:`FolderStore`), a directory of plain repo folders::

    <root>/<org>/<name>/<files...>          model repo "org/name"
    <root>/<name>/<files...>                org-less model repo "name" (a top folder holding files directly)
    <root>/datasets/<org>/<name>/<files...> dataset repo
    <root>/legacy_ids.json                  {"bert-base-uncased": "google-bert/bert-base-uncased", ...}

  Each repo has one branch, ``main``, whose commit is derived from the content, so editing a file
  on disk yields a new commit and the old one answers ``RevisionNotFound``.

``layout="cache"`` (:class:`hfcache.cache_store.CacheStore`), a Hugging Face hub cache (what ``hfcache warm``
writes): every repo folder at the commits of its snapshots and refs, see that module.

Two server stacks run the same protocol: werkzeug's threaded server (``backend="werkzeug"``, the default:
in-process, instant start, used by the tests) and uvicorn (``backend="uvicorn"``, what ``hfcache serve`` runs;
see README "Mirror: hfcache serve" for the measurement behind the choice).

Run it: ``python -m hfcache.server ROOT [--host 127.0.0.1] [--port 8080] [--throttle-bps N] [--layout cache]
[--backend uvicorn] [--no-cdn] [--fault NAME[=VALUE]]...`` (``hfcache serve`` is the production entry point:
:mod:`hfcache.mirror`). Faults (:mod:`hfcache.faults`) make it behave like a poorer mirror or a flaky network: no
``?blobs=true`` metadata, no tree API, unquoted ETags, leading 429s, failing bodies, no ``Range``.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import hmac
import io
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol
from urllib.parse import quote, unquote, urlencode, urlsplit

from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from .faults import Faults, FaultState, parse_faults, reset_midway

__all__ = [
    "LFS_PATTERNS",
    "LFS_SIZE_THRESHOLD",
    "FolderStore",
    "HubServer",
    "RepoFile",
    "RepoSnapshot",
    "RequestRecord",
    "Store",
    "StoreMiss",
    "git_blob_sha1",
    "is_lfs_file",
    "lfs_pointer",
    "main",
]

logger = logging.getLogger(__name__)

# The patterns of the default .gitattributes the Hub creates for new repos (text formats such as
# *.tiktoken or *.json stay in git). Matched against the file's base name, as git does for
# patterns without a slash.
LFS_PATTERNS: tuple[str, ...] = (
    "*.model", "*.bin", "*.safetensors", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx",
    "*.ot", "*.gguf", "*.tflite", "*.npz", "*.zip", "*.tar.gz", "*.pkl", "*.joblib",
)  # fmt: skip
# The Hub rejects plain-git files of 10 MiB or more, so anything that big is always LFS.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024

# Hub repo names: letters, digits, '-', '_', '.'; never starting with '.' (which also rules out '..').
_REPO_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_URL_REPO_TYPES = {"models": "model", "datasets": "dataset"}
_DEFAULT_BRANCH = "main"
_HASH_CHUNK = 1024 * 1024
# Body reads: 256 KiB per read. werkzeug's 8 KiB default halved throughput (benchmarks/bench_serve.py).
BODY_CHUNK = 256 * 1024
_BACKENDS = ("werkzeug", "uvicorn")
_PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))  # what an access log line may hold verbatim
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
_LAYOUTS = ("repos", "cache")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (main or CDN origin).

    Attributes:
        origin (str): ``"hub"`` (main origin) or ``"cdn"`` (LFS origin).
        method (str): HTTP method, e.g. ``"HEAD"``.
        path (str): raw request target as sent: path and query string, still URL-encoded.
        status (int): HTTP status code answered.
        authorized (bool): whether the request carried an ``Authorization`` header (any value).
        bytes_sent (int): body bytes handed to the socket (0 for HEAD and redirects).
        range (str | None): the ``Range`` header as sent, e.g. ``"bytes=1048576-"``; None without one.
    """

    origin: str
    method: str
    path: str
    status: int
    authorized: bool
    bytes_sent: int
    range: str | None = None


@dataclass(frozen=True)
class RepoFile:
    """A file of a served repo, with the hashes the Hub publishes for it.

    Attributes:
        path (str): POSIX path inside the repo, e.g. ``"1_Pooling/config.json"``.
        local_path (Path): the file on disk (for ``FolderStore`` symlinks resolved, always inside ``root``; for
            the cache store the blob or snapshot entry, never a symlink).
        size (int): size in bytes.
        blob_id (str): git blob sha1 of what git stores: the content, or for LFS files the pointer text.
        sha256 (str | None): sha256 of the content; None when it is not known without hashing (a non-LFS blob of
            a cache, which is named by its git blob sha1).
        is_lfs (bool): stored with LFS.
        pointer_size (int): byte size of the LFS pointer text (meaningful for LFS files only).
    """

    path: str
    local_path: Path
    size: int
    blob_id: str
    sha256: str | None
    is_lfs: bool
    pointer_size: int

    @property
    def etag(self) -> str:
        """The Hub's ETag for the file: sha256 for LFS files, the git blob sha1 for others."""
        return self.sha256 if self.is_lfs and self.sha256 else self.blob_id


@dataclass(frozen=True)
class RepoSnapshot:
    """The content of one repo at one commit.

    Attributes:
        repo_type (str): ``"model"`` or ``"dataset"``.
        repo_id (str): canonical id, e.g. ``"google-bert/bert-base-uncased"``.
        commit (str): 40-hex commit.
        files (Mapping[str, RepoFile]): the files served, by path, sorted by path.
        absent (frozenset[str]): paths known not to exist at this commit (a cache's ``.no_exist`` markers).
        listing (frozenset[str] | None): every path of the repo at this commit when known (a plain folder is the
            whole repo; a cache's ``trees/<commit>.json``); None when the store may hold only part of the repo.
    """

    repo_type: str
    repo_id: str
    commit: str
    files: Mapping[str, RepoFile]
    absent: frozenset[str] = frozenset()
    listing: frozenset[str] | None = None

    @cached_property
    def directories(self) -> list[str]:
        """Every folder that holds a file, at any depth, sorted (``"a"``, ``"a/b"``...)."""
        found = {path.rsplit("/", i)[0] for path in self.files for i in range(1, path.count("/") + 1)}
        return sorted(found)

    def file_by_sha256(self, sha256: str) -> RepoFile | None:
        """The LFS file whose content hash is ``sha256``, or None."""
        return next((f for f in self.files.values() if f.is_lfs and f.sha256 == sha256), None)

    def knows_absent(self, path: str) -> bool:
        """True when ``path`` (a file or folder) is known not to exist in the repo at this commit.

        Only then may a 404 carry ``X-Repo-Commit``, which makes huggingface_hub write a permanent ``.no_exist``
        marker (file_download.py); a file the store merely does not hold must not be reported that way.
        """
        if path in self.files:
            return False
        if path in self.absent:
            return True
        if self.listing is None:
            return False
        prefix = path + "/"
        return path not in self.listing and not any(p.startswith(prefix) for p in self.listing)


class StoreMiss(Exception):
    """A store has no such repo or revision.

    Attributes:
        code (str): the Hub's ``X-Error-Code``: ``"RepoNotFound"`` or ``"RevisionNotFound"``.
        repo_id (str | None): the canonical id, for ``RevisionNotFound``.
        commit (str | None): a commit to send as ``X-Repo-Commit`` with the error, if any.
    """

    def __init__(self, code: str, message: str, *, repo_id: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.code, self.message, self.repo_id, self.commit = code, message, repo_id, commit


class Store(Protocol):
    """What the HTTP layer needs from a store of repos (``FolderStore``, ``CacheStore``)."""

    root: Path

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        """The id to redirect ``repo_id`` to (itself when it is not a legacy alias)."""

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision`` (legacy ids resolved). Raises StoreMiss."""

    def lfs_file(self, repo_type: str, repo_id: str, sha256: str) -> tuple[RepoSnapshot, RepoFile] | None:
        """An LFS file of the repo by content hash, for the CDN origin."""

    def open(self, repo_file: RepoFile) -> BinaryIO:
        """Open the file's bytes, refusing anything outside ``root``. Raises OSError."""


class _HttpError(Exception):
    """An error answer: status, Hub ``X-Error-Code`` and extra headers (DESIGN §2.4)."""

    def __init__(self, status: int, code: str | None, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})

    def response(self) -> Response:
        headers = dict(self.headers)
        if self.code is not None:
            headers["X-Error-Code"] = self.code
            headers["X-Error-Message"] = self.message
        headers = {k: header_value(v) for k, v in headers.items()}
        body = json.dumps({"error": self.message})
        return Response(body, status=self.status, mimetype="application/json", headers=headers)


# --- content: files, hashes, commits -------------------------------------------------------------


def header_value(value: str) -> str:
    """``value`` as a header value every stack sends: printable ASCII as is, anything else percent-escaped.

    Messages can hold request paths (``"<path> is not held by this mirror"``): a name in another script cannot be
    encoded as Latin-1 (uvicorn answered 500 with a ``UnicodeEncodeError`` after logging 404) and a ``%0D%0A`` in
    the path would be a newline (werkzeug refuses to build the response: 500 again).
    """
    if all(" " <= c <= "~" for c in value):
        return value
    return quote(value, safe=_PRINTABLE + " ")


def is_lfs_file(path: str, size: int) -> bool:
    """Whether the Hub would store ``path`` (a repo path) of ``size`` bytes with LFS."""
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_SIZE_THRESHOLD or any(fnmatch.fnmatchcase(name, pattern) for pattern in LFS_PATTERNS)


def git_blob_sha1(data: bytes) -> str:
    """Git's object id for a blob holding ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer text git stores in place of an LFS file (git-lfs spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _hash_file(path: Path, size: int) -> tuple[str, str]:
    """(git blob sha1 of the content, sha256) of a file, read once in chunks."""
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            sha1.update(chunk)
            sha256.update(chunk)
    return sha1.hexdigest(), sha256.hexdigest()


def _is_inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class HashMemo:
    """Hashes of files on disk, computed once per (path, size, mtime): a file is re-hashed only when it changes."""

    def __init__(self) -> None:
        self._hashes: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._lock = threading.Lock()

    def describe(self, path: str, local: Path, *, lfs: bool | None = None) -> RepoFile:
        """A RepoFile for ``local`` served as repo path ``path``; ``lfs`` None decides by the Hub's defaults."""
        stat = local.stat()
        key = (str(local), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            hashes = self._hashes.get(key)
        if hashes is None:
            hashes = _hash_file(local, stat.st_size)  # outside the lock: other requests keep flowing
            with self._lock:
                self._hashes[key] = hashes
        content_sha1, sha256 = hashes
        if lfs is None:
            lfs = is_lfs_file(path, stat.st_size)
        pointer = lfs_pointer(sha256, stat.st_size)
        return RepoFile(
            path=path,
            local_path=local,
            size=stat.st_size,
            # The Hub's blobId of an LFS file is the git id of its pointer, not of the content.
            blob_id=git_blob_sha1(pointer) if lfs else content_sha1,
            sha256=sha256,
            is_lfs=lfs,
            pointer_size=len(pointer),
        )


class FolderStore:
    """A directory of plain repo folders (see the module docstring), snapshotted on every request.

    Args:
        root (str | Path): the directory.
        legacy_ids (Mapping[str, str]): legacy id -> canonical id (model repos).
    """

    def __init__(self, root: str | Path, legacy_ids: Mapping[str, str]):
        self.root = Path(root).resolve()
        self.legacy_ids = dict(legacy_ids)
        self._memo = HashMemo()

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        return self.legacy_ids.get(repo_id, repo_id) if repo_type == "model" else repo_id

    def current(self, repo_type: str, repo_id: str) -> RepoSnapshot | None:
        """The current content of a repo (legacy ids resolved), or None if there is no such repo."""
        repo_id = self.canonical_id(repo_type, repo_id)
        repo_dir = self._repo_dir(repo_type, repo_id)
        if repo_dir is None:
            return None
        files = {path: self._memo.describe(path, real) for path, real in sorted(self._scan(repo_dir).items())}
        if not files:
            return None
        listing = "".join(f"{path}\0{f.blob_id}\n" for path, f in files.items())
        commit = hashlib.sha1(listing.encode()).hexdigest()
        return RepoSnapshot(repo_type=repo_type, repo_id=repo_id, commit=commit, files=files,
                            listing=frozenset(files))

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision``: ``main`` or the current commit (older content is gone from disk).

        Raises:
            StoreMiss: no such repo, or another revision (with the current commit as ``X-Repo-Commit``).
        """
        snapshot = self.current(repo_type, repo_id)
        if snapshot is None:
            raise StoreMiss("RepoNotFound", "Repository not found")
        if revision not in (_DEFAULT_BRANCH, snapshot.commit):
            raise StoreMiss("RevisionNotFound", "Invalid rev id", repo_id=snapshot.repo_id, commit=snapshot.commit)
        return snapshot

    def lfs_file(self, repo_type: str, repo_id: str, sha256: str) -> tuple[RepoSnapshot, RepoFile] | None:
        snapshot = self.current(repo_type, repo_id)
        repo_file = snapshot.file_by_sha256(sha256) if snapshot is not None else None
        return (snapshot, repo_file) if repo_file is not None else None

    def open(self, repo_file: RepoFile) -> BinaryIO:
        """Open the file, re-checking containment: a symlink may have been swapped since the scan.

        Raises:
            FileNotFoundError: gone, or now resolving outside ``root``.
        """
        real = repo_file.local_path.resolve()
        if not _is_inside(real, self.root):
            raise FileNotFoundError(str(repo_file.local_path))
        return open(real, "rb")

    def _repo_dir(self, repo_type: str, repo_id: str) -> Path | None:
        parts = repo_id.split("/")
        if len(parts) > 2 or not all(_REPO_NAME_RE.match(p) for p in parts):
            return None
        if repo_type == "model" and parts[0] == "datasets":
            return None  # <root>/datasets holds dataset repos, never an org of models
        base = self.root / "datasets" if repo_type == "dataset" else self.root
        top, repo_dir = base / parts[0], base.joinpath(*parts)
        # A top folder holding files directly is an org-less repo; one holding only folders is an org.
        if (len(parts) == 1) != _has_direct_files(top):
            return None
        if not repo_dir.is_dir() or not _is_inside(repo_dir.resolve(), self.root):
            return None
        return repo_dir

    def _scan(self, repo_dir: Path) -> dict[str, Path]:
        """Repo path -> resolved file, skipping hidden entries and anything resolving outside root."""
        found: dict[str, Path] = {}
        # followlinks=False: a symlinked folder could loop or leave root; symlinked files are checked below.
        for dirpath, dirnames, filenames in os.walk(repo_dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                full = Path(dirpath, name)
                real = full.resolve()
                if _is_inside(real, self.root) and real.is_file():
                    found[full.relative_to(repo_dir).as_posix()] = real
        return found


def _has_direct_files(folder: Path) -> bool:
    try:
        return any(e.is_file() and not e.name.startswith(".") for e in os.scandir(folder))
    except OSError:  # missing or not a folder
        return False


# --- request parsing --------------------------------------------------------------------------------


def _raw_target(environ: Mapping[str, Any]) -> str:
    """The request target exactly as sent (path + query, still encoded)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return raw
    query = environ.get("QUERY_STRING")
    return quote(environ.get("PATH_INFO", "/")) + (f"?{query}" if query else "")


def _segments(environ: Mapping[str, Any]) -> list[str]:
    """Path segments, each URL-decoded on its own.

    Splitting before decoding keeps ``refs%2Fpr%2F1`` one segment (huggingface_hub quotes revisions
    with ``safe=""``, hf_api.py), which werkzeug's PATH_INFO (decoded as a whole) would lose.
    """
    path = _raw_target(environ).split("?", 1)[0]
    if path.startswith(("http://", "https://")):  # absolute-form request target
        path = urlsplit(path).path
    return [unquote(segment) for segment in path.split("/")[1:]]


def _split_repo_id(segments: list[str], keywords: set[str]) -> tuple[str, list[str]]:
    """(repo_id, rest): a route keyword in second place ends a one-part (org-less) id.

    Same rule as huggingface_hub's ``_parse_repo_info_from_url`` (utils/_http.py).
    """
    size = 1 if len(segments) < 2 or segments[1] in keywords else 2
    return "/".join(segments[:size]), segments[size:]


def _repo_path(parts: list[str]) -> str:
    """A repo-relative file path from decoded segments; refuses anything that could climb out."""
    # Segments may themselves hold '/' (list_repo_tree quotes the folder with safe=""), so split again.
    pieces = "/".join(parts).split("/")
    if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in pieces):
        raise _HttpError(400, None, "Invalid path")
    return "/".join(pieces)


# --- response bodies --------------------------------------------------------------------------------


class FileBody:
    """A file, or one byte range of it, as a response body read in ``BODY_CHUNK`` pieces (constant memory).

    Both server stacks stream it: werkzeug iterates it; the uvicorn adapter calls :meth:`read` in a worker thread.
    """

    def __init__(self, file: BinaryIO, start: int, length: int) -> None:
        self.file, self.start, self.length = file, start, length
        self.fault_reset = False  # hfcache.faults: cut the connection midway
        self.remaining = length
        self._positioned = False

    def read(self) -> bytes:
        """The next piece, ``b""`` at the end (also when the file shrank under us: the client sees a short body)."""
        if self.remaining <= 0:
            return b""
        if not self._positioned:
            self.file.seek(self.start + self.length - self.remaining)
            self._positioned = True
        data = self.file.read(min(BODY_CHUNK, self.remaining))
        self.remaining = self.remaining - len(data) if data else 0
        return data

    def read_cached(self) -> bytes | None:
        """The next piece if the kernel has it in the page cache, without blocking on the disk; None if a read
        would wait for the device (then call :meth:`read` from a worker thread). Linux ``preadv(RWF_NOWAIT)``;
        elsewhere, and for in-memory bodies, always None."""
        if self.remaining <= 0:
            return b""
        if _RWF_NOWAIT is None:
            return None
        try:
            fd = self.file.fileno()
        except (OSError, AttributeError, io.UnsupportedOperation):
            return None
        buffer = bytearray(min(BODY_CHUNK, self.remaining))
        try:
            n = os.preadv(fd, [buffer], self.start + self.length - self.remaining, _RWF_NOWAIT)
        except OSError:  # EAGAIN: not cached; EOPNOTSUPP: filesystem without RWF_NOWAIT
            return None
        if n == 0:
            self.remaining = 0
            return b""
        self.remaining -= n
        self._positioned = False  # read() seeks again before continuing
        return bytes(memoryview(buffer)[:n])

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read():
            yield chunk

    def close(self) -> None:
        self.file.close()


# --- the server -------------------------------------------------------------------------------------


class _LogEntry:
    """Mutable while its body streams; frozen into a RequestRecord when read."""

    __slots__ = ("origin", "method", "path", "status", "authorized", "bytes_sent", "started", "wall", "range")

    def __init__(self, origin: str, environ: Mapping[str, Any]):
        self.origin = origin
        self.method = environ["REQUEST_METHOD"]
        self.path = _raw_target(environ)
        self.authorized = "HTTP_AUTHORIZATION" in environ
        self.range = environ.get("HTTP_RANGE")
        self.status = 0
        self.bytes_sent = 0
        self.started = time.monotonic()
        self.wall = time.time()

    def freeze(self) -> RequestRecord:
        return RequestRecord(self.origin, self.method, self.path, self.status, self.authorized, self.bytes_sent,
                             self.range)

    def access_line(self) -> str:
        """``TIME METHOD PATH STATUS BYTES SECONDS``: never a header, so never the Authorization token."""
        when = datetime.fromtimestamp(self.wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        # The target is attacker-controlled: percent-escape whitespace and control bytes so a line stays a line.
        path = quote(self.path, safe=_PRINTABLE) or "-"
        seconds = time.monotonic() - self.started
        return f"{when} {self.method} {path} {self.status} {self.bytes_sent} {seconds:.3f}\n"


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """HubServer.requests and the access log are the logs; werkzeug's would spam stderr."""


class _WerkzeugOrigin:
    """One origin on werkzeug's threaded server, in a background thread."""

    def __init__(self, host: str, port: int, app: Any) -> None:
        try:
            self.server = make_server(host, port, app, threaded=True, request_handler=_QuietHandler)
        except SystemExit as exc:  # werkzeug exits the process on bind errors; a library must raise
            raise OSError(f"cannot listen on {host}:{port}") from exc
        self.port = self.server.port
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name=f"HubServer:{self.port}", daemon=True)
        self.thread.start()

    def close_listener(self, grace: float) -> None:
        self.server.shutdown()
        self.server.server_close()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=timeout)


class HubServer:
    """A Hub-compatible read-only HTTP server (main origin, and a CDN origin for LFS files) over ``root``.

    Protocol per DESIGN.md §2, checked against huggingface_hub 2.4.0 (file_download.py
    ``get_hf_file_metadata`` / ``_get_metadata_or_catch_error``, utils/_http.py ``hf_raise_for_status``).

    Args:
        root (str | Path): folder of repo folders (``layout="repos"``) or a hub cache (``layout="cache"``).
        host (str): interface for both origins.
        port (int): main origin port; 0 picks a free one. The CDN origin always picks a free port.
        legacy_ids (dict[str, str] | None): legacy id -> canonical id; None reads
            ``<root>/legacy_ids.json`` if present. ``layout="repos"`` only (a cache's aliases come from its folders).
        token (str | None): if set, every main-origin request except ``/healthz`` must carry
            ``Authorization: Bearer <token>``, else 401 ``RepoNotFound`` (as the Hub answers for private repos).
            The CDN origin never checks it (it stands for the Hub's signed CDN URLs).
        gated (Iterable[str]): canonical repo ids answered with 403 ``GatedRepo`` on API and resolve routes.
        throttle_bps (int | None): if set, file bodies are paced to about this many bytes per second
            (werkzeug backend only).
        overrides (dict[tuple[str, str], bytes] | None): ``(canonical repo_id, path) -> bytes`` served as that
            file's body while listings and ETags keep the real file's hashes (to test client hash checks).
        page_size (int): entries per tree listing page before a ``Link: rel="next"`` header.
        layout (str): ``"repos"`` (:class:`FolderStore`) or ``"cache"`` (:class:`hfcache.cache_store.CacheStore`).
        backend (str): ``"werkzeug"`` (threaded, default) or ``"uvicorn"`` (asyncio; what ``hfcache serve`` runs).
        lfs_redirect (bool): True: LFS files answer 302 to the CDN origin, as the Hub does. False: no CDN origin;
            the main origin serves LFS bytes itself with ``X-Linked-Etag``/``X-Linked-Size`` (one port to expose).
        record_requests (bool): keep every request in memory for :attr:`requests` (tests); False for long runs.
        access_log (IO[str] | None): a text stream receiving one line per finished request
            (``TIME METHOD PATH STATUS BYTES SECONDS``); headers, and so tokens, are never written.
        faults (Faults | None): misbehaviours to inject, as mirrors and flaky networks do (:mod:`hfcache.faults`;
            werkzeug backend only).

    Raises:
        ValueError: an unknown layout or backend, a bad throttle, legacy_ids with a cache, throttle on uvicorn.
        FileNotFoundError: ``layout="cache"`` and ``root`` is not a directory.
        OSError: from ``start()`` if a port cannot be bound.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        legacy_ids: dict[str, str] | None = None,
        token: str | None = None,
        gated: Iterable[str] = (),
        throttle_bps: int | None = None,
        overrides: dict[tuple[str, str], bytes] | None = None,
        page_size: int = 50,
        layout: str = "repos",
        backend: str = "werkzeug",
        lfs_redirect: bool = True,
        record_requests: bool = True,
        access_log: IO[str] | None = None,
        faults: Faults | None = None,
    ) -> None:
        root = Path(root)
        if faults is not None and faults != Faults() and backend != "werkzeug":
            raise ValueError("faults are supported by the werkzeug backend only")
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        if throttle_bps is not None and throttle_bps <= 0:
            raise ValueError("throttle_bps must be a positive number of bytes per second")
        if throttle_bps is not None and backend != "werkzeug":
            raise ValueError("throttle_bps is supported by the werkzeug backend only")
        if layout == "cache":
            if legacy_ids is not None:
                raise ValueError("legacy_ids apply to layout='repos'; a cache's legacy folders are found by commit")
            from .cache_store import CacheStore

            self._store: Store = CacheStore(root)
        else:
            if legacy_ids is None:
                legacy_file = root / "legacy_ids.json"
                legacy_ids = json.loads(legacy_file.read_text()) if legacy_file.is_file() else {}
            self._store = FolderStore(root, legacy_ids)
        self.root = root
        self.layout, self.backend = layout, backend
        self.host, self.port = host, port
        self.token = token
        self.gated = frozenset(gated)
        self.throttle_bps = throttle_bps
        self.overrides = dict(overrides or {})
        self.page_size = max(1, page_size)
        self.lfs_redirect = lfs_redirect
        self.record_requests = record_requests
        self.access_log = access_log
        self.faults = faults or Faults()
        self._faults = FaultState(self.faults)
        self._log: list[_LogEntry] = []
        self._log_lock = threading.Lock()
        self._active = 0
        self._active_cond = threading.Condition()
        self._stopping = threading.Event()
        self._origins: list[Any] = []
        self._cdn_port = 0
        self.endpoint = ""
        self.cdn_endpoint = ""

    # -- lifecycle

    def start(self) -> HubServer:
        """Bind the origin(s) and serve them from background threads; returns self.

        Raises:
            OSError: a port cannot be bound.
        """
        if self._origins:
            raise RuntimeError("HubServer already started")
        self._stopping.clear()
        try:
            hub = self._serve(self.port, "hub")
            if self.lfs_redirect:
                cdn = self._serve(0, "cdn")
                self._cdn_port = cdn.port
                self.cdn_endpoint = f"http://{_url_host(self.host)}:{cdn.port}"
        except BaseException:
            self.stop()
            raise
        self.endpoint = f"http://{_url_host(self.host)}:{hub.port}"
        return self

    def stop(self, grace: float = 0.0) -> int:
        """Stop serving. New connections are refused at once; responses still streaming get up to ``grace``
        seconds to finish, then are cut short, as when a real server dies. Setting :attr:`stopping` from another
        thread ends the grace period early.

        Args:
            grace (float): seconds to let in-flight responses finish (0: cut them now).

        Returns:
            int: responses still streaming when they were cut short.
        """
        origins, self._origins = self._origins, []
        if grace <= 0:
            self._stopping.set()
        for origin in origins:
            origin.close_listener(grace)
        deadline = time.monotonic() + max(0.0, grace)
        with self._active_cond:
            while self._active and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._active_cond.wait(min(left, 0.2))
            cut = self._active
        self._stopping.set()
        for origin in origins:
            origin.join(timeout=5)
        return cut

    @property
    def active(self) -> int:
        """Responses started and not finished yet."""
        with self._active_cond:
            return self._active

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(self, port: int, origin: str) -> Any:
        if self.backend == "uvicorn":
            from .asgi import UvicornOrigin

            served = UvicornOrigin(self.host, port, self, origin)
        else:
            served = _WerkzeugOrigin(self.host, port, self._wsgi_app(origin))
        self._origins.append(served)
        return served

    # -- request log and content

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request on both origins so far, in the order their responses started (a copy; empty when
        ``record_requests`` is False)."""
        with self._log_lock:
            return [entry.freeze() for entry in self._log]

    def clear_log(self) -> None:
        """Forget the requests logged so far."""
        with self._log_lock:
            self._log.clear()

    def commit_of(self, repo_id: str, repo_type: str = "model", revision: str = _DEFAULT_BRANCH) -> str:
        """The 40-hex commit ``revision`` of the repo resolves to (legacy ids accepted).

        Raises:
            KeyError: no such repo or revision in the store.
        """
        try:
            return self._store.snapshot(repo_type, repo_id, revision).commit
        except StoreMiss:
            raise KeyError(repo_id) from None

    # -- one request, for both stacks

    def respond(self, origin: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[bytes],
                                                                      _LogEntry]:
        """Answer one request given as a WSGI environ: (status line, headers, body, log entry).

        The body is a :class:`FileBody` for file bytes, else a short iterable. The caller streams it, adds to
        ``entry.bytes_sent`` and calls :meth:`finish` exactly once, after the last byte or on failure.
        """
        entry = _LogEntry(origin, environ)
        handler = self._hub_app if origin == "hub" else self._cdn_app
        try:
            response = handler(Request(environ))
        except _HttpError as error:
            response = error.response()
        except Exception:
            logger.exception("HubServer failed on %s %s", entry.method, entry.path)
            response = _HttpError(500, None, "Internal server error").response()
        entry.status = response.status_code
        if self.record_requests:
            with self._log_lock:
                self._log.append(entry)
        # A FileBody comes back as is (direct_passthrough); HEAD/304 get an empty iterable that closes the file.
        app_iter, status, headers = response.get_wsgi_response(environ)
        headers = [(k, header_value(v)) for k, v in headers]
        with self._active_cond:
            self._active += 1
        return status, list(headers), app_iter, entry

    def finish(self, entry: _LogEntry) -> None:
        """A response is over (complete, cut short or failed): write its access log line."""
        if self.access_log is not None:
            line = entry.access_line()
            with self._log_lock:
                try:
                    self.access_log.write(line)
                    self.access_log.flush()
                except (OSError, ValueError):
                    logger.warning("cannot write the access log", exc_info=True)
        with self._active_cond:
            self._active -= 1
            self._active_cond.notify_all()

    @property
    def stopping(self) -> threading.Event:
        """Set when responses still streaming must end now."""
        return self._stopping

    def _wsgi_app(self, origin: str) -> Any:
        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            status, headers, body, entry = self.respond(origin, environ)
            start_response(status, headers)
            chunks: Iterable[bytes] = body
            if self.throttle_bps is not None and isinstance(body, FileBody):
                chunks = _throttled(body, self.throttle_bps, self._stopping)
            if getattr(body, "fault_reset", False):
                chunks = reset_midway(chunks, body.length, environ)
            return self._metered(chunks, entry)

        return app

    def _metered(self, chunks: Iterable[bytes], entry: _LogEntry) -> Iterator[bytes]:
        try:
            for chunk in chunks:
                if self._stopping.is_set():
                    return
                # Counted before the write, so the count is final by the time a client has every byte.
                entry.bytes_sent += len(chunk)
                yield chunk
        finally:
            _close(chunks)
            self.finish(entry)

    # -- main origin

    def _hub_app(self, request: Request) -> Response:
        segments = _segments(request.environ)
        if segments == ["healthz"]:
            return Response("ok", mimetype="text/plain")
        self._check_token(request)
        if request.method not in ("GET", "HEAD"):
            raise _HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        if self._faults.take_rate_limit():
            raise _HttpError(429, None, "Too many requests", {"Retry-After": str(self.faults.retry_after)})
        if len(segments) >= 3 and segments[0] == "api" and segments[1] in _URL_REPO_TYPES:
            return self._api(request, _URL_REPO_TYPES[segments[1]], segments[2:])
        if segments and segments[0] == "datasets":
            return self._resolve(request, "dataset", segments[1:])
        return self._resolve(request, "model", segments)

    def _check_token(self, request: Request) -> None:
        if self.token is None:
            return
        sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(sent, f"Bearer {self.token}".encode()):
            # The Hub answers 401 + RepoNotFound for private repos, so clients raise RepositoryNotFoundError.
            raise _HttpError(401, "RepoNotFound", "Invalid username or password.")

    def _check_gated(self, repo_type: str, repo_id: str) -> None:
        if repo_id in self.gated:
            message = (
                f"Access to {repo_type} {repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo_id} to ask for access."
            )
            raise _HttpError(403, "GatedRepo", message)

    def _snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at a revision, or the Hub's error: RepoNotFound, then GatedRepo, then RevisionNotFound."""
        try:
            snapshot = self._store.snapshot(repo_type, repo_id, revision)
        except StoreMiss as miss:
            if miss.code == "RevisionNotFound" and miss.repo_id:
                self._check_gated(repo_type, miss.repo_id)
            headers = {"X-Repo-Commit": miss.commit} if miss.commit else {}
            raise _HttpError(404, miss.code, miss.message, headers) from None
        self._check_gated(repo_type, snapshot.repo_id)
        return snapshot

    def _api(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        repo_id, rest = _split_repo_id(segments, {"revision", "tree"})
        if not rest:
            if self.faults.info_needs_revision:
                raise _HttpError(404, None, "Not found")
            return self._repo_info(request, self._snapshot(repo_type, repo_id, _DEFAULT_BRANCH))
        if rest[0] == "revision" and len(rest) == 2:
            return self._repo_info(request, self._snapshot(repo_type, repo_id, rest[1]))
        if rest[0] == "tree" and len(rest) >= 2 and not self.faults.no_tree:
            folder = _repo_path(rest[2:]) if len(rest) > 2 else ""
            return self._tree(request, self._snapshot(repo_type, repo_id, rest[1]), folder)
        self._snapshot(repo_type, repo_id, _DEFAULT_BRANCH)  # RepoNotFound before a plain 404
        raise _HttpError(404, None, "Not found")

    def _repo_info(self, request: Request, snapshot: RepoSnapshot) -> Response:
        """Repo info as ``HfApi.repo_info`` parses it (hf_api.py ``ModelInfo``/``RepoSibling``)."""
        with_blobs = request.args.get("blobs", "").lower() in ("true", "1") and not self.faults.no_blobs
        siblings = [_sibling(f, with_blobs) for f in snapshot.files.values()]
        info = {
            "_id": snapshot.commit[:24],
            # The canonical id even when asked by a legacy id, as the Hub does.
            "id": snapshot.repo_id,
            "modelId": snapshot.repo_id,
            "author": snapshot.repo_id.split("/")[0] if "/" in snapshot.repo_id else None,
            "sha": snapshot.commit,
            "private": False,
            "gated": False,
            "disabled": False,
            "lastModified": "2024-01-01T00:00:00.000Z",
            "tags": [],
            "siblings": siblings,
        }
        return _json(info)

    def _tree(self, request: Request, snapshot: RepoSnapshot, folder: str) -> Response:
        """A page of ``list_repo_tree`` entries, with a ``Link: <...>; rel="next"`` header like the Hub's."""
        if folder and folder not in snapshot.directories:
            raise _not_found(snapshot, folder)
        recursive = request.args.get("recursive", "").lower() in ("true", "1")
        entries = _tree_entries(snapshot, folder, recursive)
        raw_cursor = request.args.get("cursor", "0")  # an offset into the listing, opaque to clients
        if not raw_cursor.isdigit():
            raise _HttpError(400, None, "Invalid cursor")
        cursor = int(raw_cursor)
        page = entries[cursor : cursor + self.page_size]
        response = _json(page)
        if cursor + self.page_size < len(entries):
            query = {**request.args.to_dict(), "cursor": str(cursor + self.page_size)}
            path = _raw_target(request.environ).split("?", 1)[0]
            response.headers["Link"] = f'<{request.host_url.rstrip("/")}{path}?{urlencode(query)}>; rel="next"'
        return response

    def _resolve(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        """``/{repo_id}/resolve/{rev}/{path}``: bytes, a redirect to the CDN (LFS), or an error."""
        repo_id, rest = _split_repo_id(segments, {"resolve"})
        if len(rest) < 3 or rest[0] != "resolve":
            raise _HttpError(404, None, "Not found")
        canonical = self._store.canonical_id(repo_type, repo_id)
        if canonical != repo_id:
            return _legacy_redirect(request, repo_type, canonical, rest)
        path = _repo_path(rest[2:])
        snapshot = self._snapshot(repo_type, repo_id, rest[1])
        repo_file = snapshot.files.get(path)
        if repo_file is None:
            raise _not_found(snapshot, path)
        headers = {"X-Repo-Commit": snapshot.commit}
        if repo_file.is_lfs and repo_file.sha256:
            if self.lfs_redirect:
                return self._lfs_redirect(request, snapshot, repo_file)
            # Served here: the metadata a CDN redirect would carry rides on the answer itself (file_download.py
            # reads X-Linked-Etag / X-Linked-Size before ETag / Content-Length).
            headers.update({"X-Linked-Etag": self.faults.etag(repo_file.sha256), "X-Linked-Size": str(repo_file.size)})
        return self._file_response(request, snapshot, repo_file, repo_file.etag, headers)

    def _lfs_redirect(self, request: Request, snapshot: RepoSnapshot, repo_file: RepoFile) -> Response:
        """302 to the CDN origin; the file metadata rides on the 302 itself.

        ``get_hf_file_metadata`` stops at a cross-origin redirect and reads X-Repo-Commit, X-Linked-Etag
        and X-Linked-Size from it; the download then goes to ``Location`` without Authorization.
        """
        prefix = "datasets/" if snapshot.repo_type == "dataset" else ""
        # Same host name the client used for the main origin, so the CDN is reachable wherever the hub is.
        location = f"http://{_url_host(urlsplit(request.host_url).hostname or self.host)}:{self._cdn_port}"
        location += f"/lfs/{prefix}{snapshot.repo_id}/{repo_file.sha256}"
        headers = {
            "Location": location,
            "X-Repo-Commit": snapshot.commit,
            "X-Linked-Etag": self.faults.etag(repo_file.sha256),
            "X-Linked-Size": str(repo_file.size),
            "ETag": self.faults.etag(repo_file.sha256),
        }
        return Response(b"", status=302, headers=headers)

    # -- CDN origin

    def _cdn_app(self, request: Request) -> Response:
        """``/lfs/[datasets/]{repo_id}/{sha256}``: LFS bytes by content hash, no auth (a signed-URL stand-in)."""
        segments = _segments(request.environ)
        if request.method not in ("GET", "HEAD"):
            raise _HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
        if len(segments) < 3 or segments[0] != "lfs":
            raise _HttpError(404, None, "Not found")
        repo_type, segments = ("dataset", segments[2:]) if segments[1] == "datasets" else ("model", segments[1:])
        repo_id, sha256 = "/".join(segments[:-1]), segments[-1]
        found = self._store.lfs_file(repo_type, repo_id, sha256) if _SHA256_RE.match(sha256) else None
        if found is None:
            raise _HttpError(404, None, "Not found")
        snapshot, repo_file = found
        return self._file_response(request, snapshot, repo_file, sha256, {})

    # -- file bodies

    def _file_response(
        self, request: Request, snapshot: RepoSnapshot, repo_file: RepoFile, etag: str, headers: dict[str, str]
    ) -> Response:
        """200/206/304/416 for a file, its body a :class:`FileBody` (constant memory).

        ``If-None-Match`` (weak comparison) gives 304; one satisfiable ``Range`` gives 206, an unsatisfiable one 416;
        several ranges, or an ``If-Range`` naming another version, give the whole file (RFC 9110 allows both).
        """
        reset = False
        if request.method == "GET" and self._faults.take_body_failure():
            if self.faults.body_failure != "reset":
                raise _HttpError(int(self.faults.body_failure), None, "fault: bad gateway or unavailable")
            reset = True
        body, length = self._open_body(snapshot, repo_file)
        headers = {**headers, "ETag": self.faults.etag(etag)}
        if not self.faults.no_range:
            headers["Accept-Ranges"] = "bytes"
        try:
            if request.if_none_match and request.if_none_match.contains_weak(etag):
                body.close()
                return Response(status=304, headers=headers)
            start, size, status = 0, length, 200
            ranges = None if self.faults.no_range else request.range
            if_range = request.if_range
            if ranges is not None and (if_range.etag is None and if_range.date is None or if_range.etag == etag):
                bounds = ranges.range_for_length(length)
                if bounds is not None:
                    start, stop = bounds
                    size, status = stop - start, 206
                    headers["Content-Range"] = f"bytes {start}-{stop - 1}/{length}"
                elif ranges.units == "bytes" and len(ranges.ranges) == 1:
                    body.close()
                    headers = {"Content-Range": f"bytes */{length}", "ETag": headers["ETag"]}
                    return Response(b"", status=416, headers=headers)
            file_body = FileBody(body, start, size)
            file_body.fault_reset = reset
            response = Response(file_body, status=status, headers=headers,
                                mimetype="application/octet-stream", direct_passthrough=True)
            response.content_length = size
            return response
        except BaseException:
            body.close()
            raise

    def _open_body(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> tuple[BinaryIO, int]:
        """(open body, its length): the override bytes if any, else the file through the store."""
        override = self.overrides.get((snapshot.repo_id, repo_file.path))
        if override is not None:
            return io.BytesIO(override), len(override)
        try:
            body = self._store.open(repo_file)
        except OSError:  # deleted since the scan, or refused (a link leaving the served directory)
            raise _HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit}) from None
        # The size on disk now, so the framing stays right even if the file changed since the scan.
        return body, os.fstat(body.fileno()).st_size


# --- helpers ----------------------------------------------------------------------------------------


def _not_found(snapshot: RepoSnapshot, path: str) -> _HttpError:
    """404 EntryNotFound; with ``X-Repo-Commit`` only when the path is known not to exist at that commit.

    X-Repo-Commit is what makes huggingface_hub write a ``.no_exist`` marker (file_download.py); a file a cache
    does not hold may well exist upstream, so it gets the error without the header (no marker, nothing lied).
    """
    if snapshot.knows_absent(path):
        return _HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
    return _HttpError(404, "EntryNotFound", f"{path} is not held by this mirror")


def _sibling(repo_file: RepoFile, with_blobs: bool) -> dict[str, Any]:
    sibling: dict[str, Any] = {"rfilename": repo_file.path}
    if with_blobs:
        sibling.update(size=repo_file.size, blobId=repo_file.blob_id)
        if repo_file.is_lfs:
            sibling["lfs"] = {"sha256": repo_file.sha256, "size": repo_file.size, "pointerSize": repo_file.pointer_size}
    return sibling


def _tree_entries(snapshot: RepoSnapshot, folder: str, recursive: bool) -> list[dict[str, Any]]:
    """Tree entries under ``folder`` ("" = root) as ``RepoFile``/``RepoFolder`` parse them (hf_api.py)."""
    prefix = f"{folder}/" if folder else ""

    def wanted(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    entries: list[dict[str, Any]] = [
        {"type": "directory", "oid": _folder_oid(snapshot.commit, d), "size": 0, "path": d}
        for d in snapshot.directories
        if wanted(d)
    ]
    for f in snapshot.files.values():
        if wanted(f.path):
            entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.is_lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            entries.append(entry)
    return sorted(entries, key=lambda e: e["path"])


def _folder_oid(commit: str, folder: str) -> str:
    """A stable 40-hex id for a folder; it only has to look like a git tree id, nothing downloads by it."""
    return hashlib.sha1(f"tree {commit} {folder}".encode()).hexdigest()


def _legacy_redirect(request: Request, repo_type: str, canonical: str, rest: list[str]) -> Response:
    """307 to the canonical id's URL, as the Hub answers renamed repos.

    A relative Location on the same origin is followed by ``_httpx2_follow_hub_redirects_with_backoff``
    (utils/_http.py), so X-Repo-Commit and ETag come from the canonical response.
    """
    prefix = ["datasets"] if repo_type == "dataset" else []
    path = "/" + "/".join(quote(s, safe="") for s in [*prefix, *canonical.split("/"), *rest])
    query = request.environ.get("QUERY_STRING")
    return Response(b"", status=307, headers={"Location": path + (f"?{query}" if query else "")})


def _json(data: Any) -> Response:
    return Response(json.dumps(data), mimetype="application/json")


def _url_host(host: str) -> str:
    """A host usable in a URL: wildcard binds become loopback, IPv6 gets brackets."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


def _close(iterable: object) -> None:
    close = getattr(iterable, "close", None)
    if close is not None:
        close()


def _throttled(chunks: Iterable[bytes], bps: int, stopping: threading.Event) -> Iterator[bytes]:
    """Re-chunk a body and pace it to about ``bps`` bytes/s; ends early when the server stops."""
    step = max(1, min(64 * 1024, bps // 20))  # ~20 writes a second keeps the rate smooth
    start, sent = time.monotonic(), 0
    try:
        for chunk in chunks:
            for offset in range(0, len(chunk), step):
                piece = chunk[offset : offset + step]
                yield piece
                sent += len(piece)
                # Event.wait instead of sleep: stop() must not wait for a slow transfer to finish.
                if stopping.wait(max(0.0, start + sent / bps - time.monotonic())):
                    return
    finally:
        _close(chunks)


# --- CLI --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m hfcache.server ROOT``: serve until Ctrl-C or SIGTERM, then shut down cleanly."""
    parser = argparse.ArgumentParser(prog="python -m hfcache.server", description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder of <org>/<name> repo folders (or a hub cache, --layout cache)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="main origin port (0 = any free port)")
    parser.add_argument("--throttle-bps", type=int, default=None, help="pace file bodies to N bytes/s")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' on the main origin")
    parser.add_argument("--layout", choices=_LAYOUTS, default="repos", help="what ROOT is (default: repos)")
    parser.add_argument("--backend", choices=_BACKENDS, default="werkzeug", help="server stack (default: werkzeug)")
    parser.add_argument("--no-cdn", action="store_true", help="serve LFS files from the main origin (one port)")
    parser.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]",
                        help="inject a fault (hfcache.faults.Faults field), e.g. no_blobs, no_tree, rate_limit=3, "
                             "failing_bodies=2, body_failure=reset (repeatable)")
    args = parser.parse_args(argv)
    try:
        faults = parse_faults(args.fault)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    server = HubServer(args.root, host=args.host, port=args.port, throttle_bps=args.throttle_bps, token=args.token,
                       layout=args.layout, backend=args.backend, lfs_redirect=not args.no_cdn, record_requests=False,
                       faults=faults)
    with server:
        print(f"serving {args.root} at {server.endpoint}", flush=True)
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
