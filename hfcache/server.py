"""A Hub-compatible, read-only HTTP server over a directory of plain repo folders.

It speaks the subset of the Hugging Face Hub protocol that huggingface_hub's downloaders use
(DESIGN.md section 2), so tests, benchmarks and air-gapped mirrors can point ``endpoint=`` at it:

- ``GET /api/{models|datasets}/{repo_id}[/revision/{rev}]``            repo info (``HfApi.repo_info``)
- ``GET /api/{models|datasets}/{repo_id}/tree/{rev}[/{path}]``         tree listing (``HfApi.list_repo_tree``)
- ``HEAD|GET /[datasets/]{repo_id}/resolve/{rev}/{path}``              file metadata and bytes (``hf_hub_download``)
- ``HEAD|GET {cdn_endpoint}/lfs/[datasets/]{repo_id}/{sha256}``        LFS bytes on a second origin, like the Hub's CDN
- ``GET /healthz``                                                     liveness probe

Layout served (``root``)::

    <root>/<org>/<name>/<files...>          model repo "org/name"
    <root>/<name>/<files...>                org-less model repo "name" (a top folder holding files directly)
    <root>/datasets/<org>/<name>/<files...> dataset repo
    <root>/legacy_ids.json                  {"bert-base-uncased": "google-bert/bert-base-uncased", ...}

Each repo has one branch, ``main``, whose commit is derived from the content, so editing a file
on disk yields a new commit and the old one answers ``RevisionNotFound``.

Run it: ``python -m hfcache.server ROOT [--host 127.0.0.1] [--port 8080] [--throttle-bps N]``.
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
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote, urlencode, urlsplit

from werkzeug.exceptions import RequestedRangeNotSatisfiable
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response
from werkzeug.wsgi import wrap_file

__all__ = [
    "LFS_PATTERNS",
    "LFS_SIZE_THRESHOLD",
    "HubServer",
    "RepoFile",
    "RepoSnapshot",
    "RequestRecord",
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
    """

    origin: str
    method: str
    path: str
    status: int
    authorized: bool
    bytes_sent: int


@dataclass(frozen=True)
class RepoFile:
    """A file of a served repo, with the hashes the Hub publishes for it.

    Attributes:
        path (str): POSIX path inside the repo, e.g. ``"1_Pooling/config.json"``.
        local_path (Path): the file on disk, symlinks resolved (always inside ``root``).
        size (int): size in bytes.
        blob_id (str): git blob sha1 of what git stores: the content, or for LFS files the pointer text.
        sha256 (str): sha256 of the content.
        is_lfs (bool): stored with LFS (see ``LFS_PATTERNS`` / ``LFS_SIZE_THRESHOLD``).
        pointer_size (int): byte size of the LFS pointer text (meaningful for LFS files only).
    """

    path: str
    local_path: Path
    size: int
    blob_id: str
    sha256: str
    is_lfs: bool
    pointer_size: int


@dataclass(frozen=True)
class RepoSnapshot:
    """The current content of one repo.

    Attributes:
        repo_type (str): ``"model"`` or ``"dataset"``.
        repo_id (str): canonical id, e.g. ``"google-bert/bert-base-uncased"``.
        commit (str): 40-hex commit: sha1 over the sorted ``(path, blob_id)`` pairs.
        files (Mapping[str, RepoFile]): by path, sorted by path.
    """

    repo_type: str
    repo_id: str
    commit: str
    files: Mapping[str, RepoFile]

    @cached_property
    def directories(self) -> list[str]:
        """Every folder that holds a file, at any depth, sorted (``"a"``, ``"a/b"``...)."""
        found = {path.rsplit("/", i)[0] for path in self.files for i in range(1, path.count("/") + 1)}
        return sorted(found)

    def file_by_sha256(self, sha256: str) -> RepoFile | None:
        """The LFS file whose content hash is ``sha256``, or None."""
        return next((f for f in self.files.values() if f.is_lfs and f.sha256 == sha256), None)


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
        body = json.dumps({"error": self.message})
        return Response(body, status=self.status, mimetype="application/json", headers=headers)


# --- content: files, hashes, commits -------------------------------------------------------------


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


class _RepoStore:
    """Finds repo folders under ``root`` and snapshots them, re-hashing only files that changed."""

    def __init__(self, root: Path, legacy_ids: Mapping[str, str]):
        self.root = root.resolve()
        self.legacy_ids = dict(legacy_ids)
        # (resolved path, size, mtime_ns) -> (content git sha1, sha256): a file is re-hashed only when it changes.
        self._hashes: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._lock = threading.Lock()

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        return self.legacy_ids.get(repo_id, repo_id) if repo_type == "model" else repo_id

    def snapshot(self, repo_type: str, repo_id: str) -> RepoSnapshot | None:
        """The current content of a repo (legacy ids resolved), or None if there is no such repo."""
        repo_id = self.canonical_id(repo_type, repo_id)
        repo_dir = self._repo_dir(repo_type, repo_id)
        if repo_dir is None:
            return None
        files = {path: self._describe(path, real) for path, real in sorted(self._scan(repo_dir).items())}
        if not files:
            return None
        listing = "".join(f"{path}\0{f.blob_id}\n" for path, f in files.items())
        commit = hashlib.sha1(listing.encode()).hexdigest()
        return RepoSnapshot(repo_type=repo_type, repo_id=repo_id, commit=commit, files=files)

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

    def _describe(self, path: str, real: Path) -> RepoFile:
        stat = real.stat()
        key = (str(real), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            hashes = self._hashes.get(key)
        if hashes is None:
            hashes = _hash_file(real, stat.st_size)  # outside the lock: other requests keep flowing
            with self._lock:
                self._hashes[key] = hashes
        content_sha1, sha256 = hashes
        lfs = is_lfs_file(path, stat.st_size)
        pointer = lfs_pointer(sha256, stat.st_size)
        return RepoFile(
            path=path,
            local_path=real,
            size=stat.st_size,
            # The Hub's blobId of an LFS file is the git id of its pointer, not of the content.
            blob_id=git_blob_sha1(pointer) if lfs else content_sha1,
            sha256=sha256,
            is_lfs=lfs,
            pointer_size=len(pointer),
        )


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


# --- the server -------------------------------------------------------------------------------------


class _LogEntry:
    """Mutable while its body streams; frozen into a RequestRecord when read."""

    __slots__ = ("origin", "method", "path", "status", "authorized", "bytes_sent")

    def __init__(self, origin: str, environ: Mapping[str, Any]):
        self.origin = origin
        self.method = environ["REQUEST_METHOD"]
        self.path = _raw_target(environ)
        self.authorized = "HTTP_AUTHORIZATION" in environ
        self.status = 0
        self.bytes_sent = 0

    def freeze(self) -> RequestRecord:
        return RequestRecord(self.origin, self.method, self.path, self.status, self.authorized, self.bytes_sent)


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """HubServer.requests is the access log; werkzeug's would spam stderr in tests."""


class HubServer:
    """A Hub-compatible read-only HTTP server (main origin + CDN origin) over ``root``.

    Protocol per DESIGN.md §2, checked against huggingface_hub 2.4.0 (file_download.py
    ``get_hf_file_metadata`` / ``_get_metadata_or_catch_error``, utils/_http.py ``hf_raise_for_status``).

    Args:
        root (str | Path): folder of repo folders (see the module docstring).
        host (str): interface for both origins.
        port (int): main origin port; 0 picks a free one. The CDN origin always picks a free port.
        legacy_ids (dict[str, str] | None): legacy id -> canonical id; None reads
            ``<root>/legacy_ids.json`` if present.
        token (str | None): if set, every main-origin request except ``/healthz`` must carry
            ``Authorization: Bearer <token>``, else 401 ``RepoNotFound`` (as the Hub answers for private repos).
            The CDN origin never checks it (it stands for the Hub's signed CDN URLs).
        gated (Iterable[str]): canonical repo ids answered with 403 ``GatedRepo`` on API and resolve routes.
        throttle_bps (int | None): if set, file bodies are paced to about this many bytes per second.
        overrides (dict[tuple[str, str], bytes] | None): ``(canonical repo_id, path) -> bytes`` served as that
            file's body while listings and ETags keep the real file's hashes (to test client hash checks).
        page_size (int): entries per tree listing page before a ``Link: rel="next"`` header.

    Raises:
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
    ) -> None:
        root = Path(root)
        if legacy_ids is None:
            legacy_file = root / "legacy_ids.json"
            legacy_ids = json.loads(legacy_file.read_text()) if legacy_file.is_file() else {}
        if throttle_bps is not None and throttle_bps <= 0:
            raise ValueError("throttle_bps must be a positive number of bytes per second")
        self.root = root
        self.host, self.port = host, port
        self.token = token
        self.gated = frozenset(gated)
        self.throttle_bps = throttle_bps
        self.overrides = dict(overrides or {})
        self.page_size = max(1, page_size)
        self._store = _RepoStore(root, legacy_ids)
        self._log: list[_LogEntry] = []
        self._log_lock = threading.Lock()
        self._stopping = threading.Event()
        self._servers: list[BaseWSGIServer] = []
        self._threads: list[threading.Thread] = []
        self._cdn_port = 0
        self.endpoint = ""
        self.cdn_endpoint = ""

    # -- lifecycle

    def start(self) -> HubServer:
        """Bind both origins and serve them from background threads; returns self."""
        if self._servers:
            raise RuntimeError("HubServer already started")
        self._stopping.clear()
        try:
            hub = self._serve(self.port, self._logged("hub", self._hub_app))
            cdn = self._serve(0, self._logged("cdn", self._cdn_app))
        except BaseException:
            self.stop()
            raise
        self._cdn_port = cdn.port
        self.endpoint = f"http://{_url_host(self.host)}:{hub.port}"
        self.cdn_endpoint = f"http://{_url_host(self.host)}:{cdn.port}"
        return self

    def stop(self) -> None:
        """Stop both origins; bodies still streaming are cut short, as when a real server dies."""
        self._stopping.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(self, port: int, app: Any) -> BaseWSGIServer:
        try:
            server = make_server(self.host, port, app, threaded=True, request_handler=_QuietHandler)
        except SystemExit as exc:  # werkzeug exits the process on bind errors; a library must raise
            raise OSError(f"cannot listen on {self.host}:{port}") from exc
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name=f"HubServer:{server.port}", daemon=True
        )
        thread.start()
        self._servers.append(server)
        self._threads.append(thread)
        return server

    # -- request log and content

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request on both origins so far, in the order their responses started (a copy)."""
        with self._log_lock:
            return [entry.freeze() for entry in self._log]

    def clear_log(self) -> None:
        """Forget the requests logged so far."""
        with self._log_lock:
            self._log.clear()

    def commit_of(self, repo_id: str, repo_type: str = "model") -> str:
        """The 40-hex commit of the repo's current content (legacy ids accepted).

        Raises:
            KeyError: no such repo under root.
        """
        snapshot = self._store.snapshot(repo_type, repo_id)
        if snapshot is None:
            raise KeyError(repo_id)
        return snapshot.commit

    def _logged(self, origin: str, handler: Any) -> Any:
        """WSGI app around ``handler(request) -> Response`` that records every request."""

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            entry = _LogEntry(origin, environ)
            try:
                response = handler(Request(environ))
            except _HttpError as error:
                response = error.response()
            except Exception:
                logger.exception("HubServer failed on %s %s", entry.method, entry.path)
                response = _HttpError(500, None, "Internal server error").response()
            entry.status = response.status_code
            with self._log_lock:
                self._log.append(entry)
            return self._metered(response(environ, start_response), entry)

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

    # -- main origin

    def _hub_app(self, request: Request) -> Response:
        segments = _segments(request.environ)
        if segments == ["healthz"]:
            return Response("ok", mimetype="text/plain")
        self._check_token(request)
        if request.method not in ("GET", "HEAD"):
            raise _HttpError(405, None, "Method not allowed", {"Allow": "GET, HEAD"})
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

    def _snapshot(self, repo_type: str, repo_id: str) -> RepoSnapshot:
        snapshot = self._store.snapshot(repo_type, repo_id)
        if snapshot is None:
            raise _HttpError(404, "RepoNotFound", "Repository not found")
        if snapshot.repo_id in self.gated:
            message = (
                f"Access to {repo_type} {snapshot.repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{snapshot.repo_id} to ask for access."
            )
            raise _HttpError(403, "GatedRepo", message)
        return snapshot

    @staticmethod
    def _check_revision(snapshot: RepoSnapshot, revision: str) -> None:
        # One branch; a commit is valid only while it is current (older content is gone from disk).
        if revision not in (_DEFAULT_BRANCH, snapshot.commit):
            raise _HttpError(404, "RevisionNotFound", "Invalid rev id", {"X-Repo-Commit": snapshot.commit})

    def _api(self, request: Request, repo_type: str, segments: list[str]) -> Response:
        repo_id, rest = _split_repo_id(segments, {"revision", "tree"})
        snapshot = self._snapshot(repo_type, repo_id)
        if not rest:
            return self._repo_info(request, snapshot, _DEFAULT_BRANCH)
        if rest[0] == "revision" and len(rest) == 2:
            return self._repo_info(request, snapshot, rest[1])
        if rest[0] == "tree" and len(rest) >= 2:
            return self._tree(request, snapshot, rest[1], _repo_path(rest[2:]) if len(rest) > 2 else "")
        raise _HttpError(404, None, "Not found")

    def _repo_info(self, request: Request, snapshot: RepoSnapshot, revision: str) -> Response:
        """Repo info as ``HfApi.repo_info`` parses it (hf_api.py ``ModelInfo``/``RepoSibling``)."""
        self._check_revision(snapshot, revision)
        with_blobs = request.args.get("blobs", "").lower() in ("true", "1")
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

    def _tree(self, request: Request, snapshot: RepoSnapshot, revision: str, folder: str) -> Response:
        """A page of ``list_repo_tree`` entries, with a ``Link: <...>; rel="next"`` header like the Hub's."""
        self._check_revision(snapshot, revision)
        if folder and folder not in snapshot.directories:
            raise _HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
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
        snapshot = self._snapshot(repo_type, repo_id)
        self._check_revision(snapshot, rest[1])
        path = _repo_path(rest[2:])
        repo_file = snapshot.files.get(path)
        if repo_file is None:
            # X-Repo-Commit is what makes huggingface_hub write the .no_exist marker (file_download.py).
            raise _HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
        if repo_file.is_lfs:
            return self._lfs_redirect(request, snapshot, repo_file)
        return self._file_response(request, snapshot, repo_file, repo_file.blob_id, {"X-Repo-Commit": snapshot.commit})

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
            "X-Linked-Etag": f'"{repo_file.sha256}"',
            "X-Linked-Size": str(repo_file.size),
            "ETag": f'"{repo_file.sha256}"',
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
        snapshot = self._store.snapshot(repo_type, repo_id) if _SHA256_RE.match(sha256) else None
        repo_file = snapshot.file_by_sha256(sha256) if snapshot is not None else None
        if snapshot is None or repo_file is None:
            raise _HttpError(404, None, "Not found")
        return self._file_response(request, snapshot, repo_file, sha256, {})

    # -- file bodies

    def _file_response(
        self, request: Request, snapshot: RepoSnapshot, repo_file: RepoFile, etag: str, headers: dict[str, str]
    ) -> Response:
        """200/206 streaming the file (or its override) in constant memory; Range via werkzeug."""
        body, length = self._open_body(snapshot, repo_file)
        try:
            response = Response(
                wrap_file(request.environ, body),
                direct_passthrough=True,
                mimetype="application/octet-stream",
                headers=headers,
            )
            response.set_etag(etag)
            response.content_length = length
            response.make_conditional(request, accept_ranges=True, complete_length=length)
        except RequestedRangeNotSatisfiable as error:
            body.close()
            return error.get_response(request.environ)
        except BaseException:
            body.close()
            raise
        if self.throttle_bps is not None:
            response.response = _throttled(response.response, self.throttle_bps, self._stopping)
        return response

    def _open_body(self, snapshot: RepoSnapshot, repo_file: RepoFile) -> tuple[BinaryIO, int]:
        """(open body, its length): the override bytes if any, else the file on disk."""
        override = self.overrides.get((snapshot.repo_id, repo_file.path))
        if override is not None:
            return io.BytesIO(override), len(override)
        gone = _HttpError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": snapshot.commit})
        # Re-check containment at open time: a symlink may have been swapped since the scan.
        real = repo_file.local_path.resolve()
        if not _is_inside(real, self._store.root):
            raise gone
        try:
            body = open(real, "rb")
        except OSError:  # deleted since the scan
            raise gone from None
        # The size on disk now, so the framing stays right even if the file changed since the scan.
        return body, os.fstat(body.fileno()).st_size


# --- helpers ----------------------------------------------------------------------------------------


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
    parser.add_argument("root", type=Path, help="folder of <org>/<name> repo folders")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="main origin port (0 = any free port)")
    parser.add_argument("--throttle-bps", type=int, default=None, help="pace file bodies to N bytes/s")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' on the main origin")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    server = HubServer(args.root, host=args.host, port=args.port, throttle_bps=args.throttle_bps, token=args.token)
    with server:
        print(f"serving {args.root} at {server.endpoint}", flush=True)
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
