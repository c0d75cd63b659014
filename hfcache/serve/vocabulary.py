"""What the stores and the HTTP layer share: repo files, snapshots, misses, how the Hub names content (git blob sha1,
LFS pointers and sha256, which files go to LFS) and the safe open of a served file. Imports nothing else of
:mod:`hfcache.serve` (docs/architecture.md)."""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO, Protocol

from ..cache import safefs
from ..cache.content import GIT_SHA1, SHA256, git_blob_sha1, hash_fd, lfs_pointer
from ..names import UnsafeName

__all__ = ["DEFAULT_BRANCH", "LFS_PATTERNS", "LFS_SIZE_THRESHOLD", "REPO_NAME_RE", "HashMemo", "RepoFile",
           "RepoSnapshot", "Store", "StoreMiss", "is_lfs_file", "open_beneath", "regular_file"]

#: The default .gitattributes the Hub creates for new repos (text formats such as *.tiktoken or *.json stay in git),
#: matched against a file's base name as git does for patterns without a slash.
LFS_PATTERNS: tuple[str, ...] = (
    "*.model", "*.bin", "*.safetensors", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx",
    "*.ot", "*.gguf", "*.tflite", "*.npz", "*.zip", "*.tar.gz", "*.pkl", "*.joblib",
)  # fmt: skip
#: The Hub rejects plain-git files of 10 MiB or more, so anything that big is always LFS.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
#: Hub repo names: letters, digits, '-', '_', '.'; never starting with '.' (which also rules out '..').
REPO_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
DEFAULT_BRANCH = "main"


@dataclass(frozen=True)
class RepoFile:
    """A file of a served repo, with the hashes the Hub publishes for it: ``path`` (POSIX, inside the repo),
    ``local_path`` (resolved inside ``root``; in a cache the blob or snapshot entry), ``size`` and ``pointer_size``
    (of the LFS pointer text) in bytes, ``blob_id`` (git blob sha1 of the content, or for LFS files of the pointer),
    ``sha256`` of the content (None when unknown without hashing: a cache's non-LFS blob)."""

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
    """The content of one repo (``repo_id``: the canonical id) at one 40-hex ``commit``: ``files`` served, by path,
    sorted; ``absent``, paths known not to exist (a cache's ``.no_exist`` markers); ``listing``, every path of the
    repo when known (a plain folder, a ``trees/<commit>.json``), None when the store may hold only part of it."""

    repo_type: str
    repo_id: str
    commit: str
    files: Mapping[str, RepoFile]
    absent: frozenset[str] = frozenset()
    listing: frozenset[str] | None = None

    @cached_property
    def directories(self) -> list[str]:
        """Every folder that holds a file, at any depth, sorted (``"a"``, ``"a/b"``...)."""
        return sorted({path.rsplit("/", i)[0] for path in self.files for i in range(1, path.count("/") + 1)})

    def knows_absent(self, path: str) -> bool:
        """True when ``path`` (a file or folder) is known not to exist at this commit: only then may a 404 carry
        ``X-Repo-Commit``, which makes huggingface_hub write a permanent ``.no_exist`` marker (file_download.py)."""
        if path in self.files:
            return False
        if path in self.absent:
            return True
        if self.listing is None:
            return False
        prefix = path + "/"
        return path not in self.listing and not any(p.startswith(prefix) for p in self.listing)


class StoreMiss(Exception):
    """A store has no such repo or revision, or cannot get what was asked (a pull-through store's upstream failed):
    ``code``, the ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``RepoNotAllowed``...); ``repo_id``, the
    canonical id for ``RevisionNotFound``; ``commit`` for ``X-Repo-Commit``; ``status`` (HTTP); ``retry_after`` s."""

    def __init__(self, code: str, message: str, *, repo_id: str | None = None, commit: str | None = None,
                 status: int = 404, retry_after: int | None = None):
        super().__init__(message)
        self.code, self.message, self.repo_id, self.commit = code, message, repo_id, commit
        self.status, self.retry_after = status, retry_after

    def headers(self) -> dict[str, str]:
        """The extra headers of the error answer: ``X-Repo-Commit``, ``Retry-After`` when set."""
        headers = {"X-Repo-Commit": self.commit} if self.commit else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


class Store(Protocol):
    """What the HTTP layer needs from a store of repos (``FolderStore``, ``CacheStore``, ``PullThroughStore``)."""

    root: Path

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        """The id to redirect ``repo_id`` to (itself when it is not a legacy alias)."""

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision`` (legacy ids resolved). Raises StoreMiss."""

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot, *, head: bool = False) -> BinaryIO:
        """Open the file's bytes (of ``snapshot``), refusing anything outside ``root``. ``head``: only the metadata
        is wanted (a pull-through store then fetches nothing). Raises OSError, or StoreMiss (upstream failed)."""


def is_lfs_file(path: str, size: int) -> bool:
    """Whether the Hub would store ``path`` (a repo path) of ``size`` bytes with LFS."""
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_SIZE_THRESHOLD or any(fnmatch.fnmatchcase(name, pattern) for pattern in LFS_PATTERNS)


def open_beneath(root: str | os.PathLike[str], parts: Sequence[str]) -> BinaryIO:
    """Open the regular file ``root/parts...`` for reading (:func:`hfcache.cache.safefs.open_file`: no link followed
    at any component, a FIFO never blocks). Raises OSError: missing, a link on the way, not a regular file, a part
    that is empty, ``.`` or ``..``."""
    shown = os.path.join(root, *parts)
    try:
        fd = safefs.open_file(root, parts, os.O_RDONLY | os.O_NONBLOCK)
    except (safefs.UnsafeLayout, UnsafeName) as exc:
        raise OSError(f"{shown}: {exc}") from None
    return regular_file(fd, shown)


def regular_file(fd: int, shown: str) -> BinaryIO:
    """The open ``fd`` (opened ``O_NONBLOCK``) as a blocking binary file when it is a regular file; else it is closed
    and OSError names ``shown``."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{shown} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class HashMemo:
    """Hashes of files on disk, computed once per (path, size, mtime, inode): a file is re-hashed when it changes."""

    def __init__(self) -> None:
        self._hashes: dict[tuple[str, int, int, int], tuple[str, str]] = {}
        self._lock = threading.Lock()

    def describe(self, path: str, local: Path, *, lfs: bool | None = None, opened: BinaryIO | None = None) -> RepoFile:
        """A RepoFile for ``local`` served as repo path ``path``; ``lfs`` None decides by the Hub's defaults.
        ``opened``: ``local`` already opened safely, whose descriptor gives size and hashes (else the path does)."""
        stat_result = os.fstat(opened.fileno()) if opened is not None else local.stat()
        key = (str(local), stat_result.st_size, stat_result.st_mtime_ns, stat_result.st_ino)
        with self._lock:
            hashes = self._hashes.get(key)
        if hashes is None:  # hashed outside the lock: other requests keep flowing
            if opened is not None:
                hashes = _hash_open(opened)
            else:
                with open(local, "rb") as f:
                    hashes = _hash_open(f)
            with self._lock:
                self._hashes[key] = hashes
        content_sha1, sha256 = hashes
        lfs = is_lfs_file(path, stat_result.st_size) if lfs is None else lfs
        pointer = lfs_pointer(sha256, stat_result.st_size)
        # The Hub's blobId of an LFS file is the git id of its pointer, not of the content.
        return RepoFile(path=path, local_path=local, size=stat_result.st_size,
                        blob_id=git_blob_sha1(pointer) if lfs else content_sha1, sha256=sha256, is_lfs=lfs,
                        pointer_size=len(pointer))


def _hash_open(f: BinaryIO) -> tuple[str, str]:
    """(git blob sha1, sha256) of the open file ``f`` from its start."""
    digests, _ = hash_fd(f.fileno(), (GIT_SHA1, SHA256), close=False, offset=0)
    return digests[GIT_SHA1], digests[SHA256]
