"""signed_snapshot: the ``{path: sha256}`` of one cached snapshot, what a model-signing bundle signs and is checked
against (:mod:`hfcache.integrity.signatures`).

An LFS file's blob is named by its sha256 (the Hugging Face etag): that name is the digest, unread, unless ``rehash``
asks for the bytes to be hashed (plain ``hfcache verify`` proves names against bytes). Any other file (a git-sha1
blob, a real file in a cache written without symlinks) is hashed with sha256: such files are small. Bytes that are
hashed are checked against the name they are stored under in the same read (:func:`hfcache.integrity.hashing.
fd_hashes`): the blob name, or for a real file the name warm's record gives it; a file that does not match is
:class:`NameMismatch`, never signed or checked (a group member's edit to a shared cache's blob is what plain
``hfcache verify`` refuses). Every file is opened through :func:`hfcache.cache.safefs.open_repo_file` (a snapshot
link resolved inside the repo folder, no link followed, a FIFO never opened blocking, ``S_ISREG`` checked on the
fd), never by walking the snapshot's path.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from pathlib import Path

from ..cache import safefs
from ..cache.published import read_record
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, RevisionInfo, scan_cache
from ..errors import CacheError, CheckFailed
from ..records import WarmRequest
from .hashing import algorithm_of, fd_hashes

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class NameMismatch(CacheError):
    """A cached file whose bytes do not hash to the name it is stored under (changed on disk): exit 5, as ``export``
    and ``push`` refuse a corrupt source cache; ``verify --signature`` reports it as a changed file (exit 1).

    Attributes:
        snapshot (str): ``REPO_ID@COMMIT``. path (str): the file in the snapshot. name (str): the blob name (or
            recorded digest) its bytes miss.
    """

    def __init__(self, message: str, *, snapshot: str, path: str, name: str) -> None:
        super().__init__(message, hint="`hfcache verify` names the damaged files; `hfcache verify --repair` restores "
                                       "them from the endpoint")
        self.snapshot, self.path, self.name = snapshot, path, name


@dataclass(frozen=True)
class SnapshotDigests:
    """One snapshot's files as a model-signing manifest sees them.

    Attributes:
        repo_id (str): the repo; commit (str): the snapshot's commit (40 hex); folder (str): the repo folder name.
        files (dict[str, str]): ``/``-separated path -> sha256 hex.
        hashed (int): files whose bytes were hashed (the others' digests are their LFS blob names).
        snapshot (Path): ``<cache>/<folder>/snapshots/<commit>`` (the folder ``model_signing`` is pointed at).
    """

    repo_id: str
    commit: str
    folder: str
    files: dict[str, str]
    hashed: int
    snapshot: Path


def resolve_snapshot(cache_dir: Path, spec: str, repo_type: str = "model") -> tuple[RepoInfo, RevisionInfo]:
    """The repo and snapshot ``REPO_ID[@REVISION]`` (a ref or a commit; default ``main``) names in the cache
    (``repo_type``: ``model``, ``dataset``, ``kernel``).

    Raises:
        UsageError: a malformed spec. CheckFailed: the repo or revision is not in the cache (exit 1).
        CacheError: the repo folder's layout is unsafe (a planted link: left alone).
    """
    request = WarmRequest.parse(spec, repo_type=repo_type)
    info = scan_cache(cache_dir, {request.repo_id})
    repos = [r for r in info.repos if r.repo_id == request.repo_id and r.repo_type == request.repo_type]
    if not repos:
        raise CheckFailed(f"{request.repo_id} is not in the cache {cache_dir}", hint="warm it first")
    repo = repos[0]
    if repo.unsafe:
        raise CacheError(f"{cache_dir}/{repo.folder}: {', '.join(repo.unsafe)} is a link or not a folder: left alone",
                         hint="remove it, then rerun")
    commit = repo.refs.get(request.revision, request.revision).strip()
    for revision in repo.revisions:
        if revision.commit_hash == commit:
            return repo, revision
    raise CheckFailed(f"{request.repo_id}@{request.revision} is not in the cache {cache_dir}"
                      + ("" if request.revision in repo.refs or len(commit) == 40 else " (no such ref)"),
                      hint="warm it first")


def snapshot_digests(cache_dir: Path, spec: str, *, rehash: bool = False, on_bytes=None,
                     repo_type: str = "model") -> SnapshotDigests:
    """The sha256 of every file of the snapshot ``spec`` (``REPO_ID[@REVISION]``) names.

    Args:
        cache_dir: the cache root. spec: ``REPO_ID[@REVISION]``. repo_type: as :func:`resolve_snapshot`.
        rehash: hash every file's bytes (default: an LFS blob's sha256 name is its digest).
        on_bytes: called with the size of every chunk hashed (progress).

    Returns:
        SnapshotDigests. A broken link (its blob gone) is left out: a bundle then names it missing.

    Raises:
        UsageError, CheckFailed: as :func:`resolve_snapshot`.
        NameMismatch: a file hashed does not match its blob name (or warm's record of a real file): exit 5.
        CacheError: an entry links outside its repo folder, is a FIFO/device/folder where a file belongs, a folder
            chain is deeper than 64 levels, or an entry cannot be read (exit 5, naming it).
    """
    repo, revision = resolve_snapshot(cache_dir, spec, repo_type)
    hazards = [text for text in revision.problems if text.endswith((SPECIAL_FILE, TOO_DEEP))]
    if hazards:  # what the scan did not list: a signature over the rest would not be the snapshot's
        raise CacheError(f"{cache_dir}/{repo.folder}/snapshots/{revision.commit_hash}: {hazards[0]}: left alone",
                         hint="remove it, then rerun")
    record = None
    if any(entry.form == "file" for entry in revision.files):  # a real file is named by warm's record only
        record = read_record(cache_dir, repo.folder, revision.commit_hash)
    files: dict[str, str] = {}
    hashed = 0
    for entry in revision.files:
        if entry.form == "broken":
            continue
        if not rehash and entry.form == "link" and entry.etag and _SHA256.fullmatch(entry.etag):
            files[entry.path] = entry.etag
            continue
        name = entry.etag if entry.form == "link" else _recorded(record, entry.path)
        try:
            files[entry.path] = _hash_entry(cache_dir, repo.folder, revision.commit_hash, entry.path, name, on_bytes)
        except NameMismatch as exc:
            exc.snapshot = f"{repo.repo_id}@{revision.commit_hash}"
            raise
        hashed += 1
    return SnapshotDigests(repo_id=repo.repo_id, commit=revision.commit_hash, folder=repo.folder, files=files,
                           hashed=hashed, snapshot=Path(cache_dir) / repo.folder / "snapshots" / revision.commit_hash)


def _recorded(record, path: str) -> str | None:
    """The blob name warm's record gives a real snapshot file (``sha256:<hex>`` or ``git-sha1:<hex>``), or None."""
    entry = record.files.get(path) if record is not None else None
    return entry[1].partition(":")[2] if entry else None


def _hash_entry(cache_dir: Path, folder: str, commit: str, path: str, name: str | None, on_bytes) -> str:
    """The sha256 of one snapshot file, its bytes checked against ``name`` (its blob name) in the same read.

    Raises:
        NameMismatch: the bytes do not hash to ``name``. CacheError: unreadable, gone, not a regular file."""
    shown = f"{cache_dir}/{folder}/snapshots/{commit}/{path}"
    algorithm = algorithm_of(name) if name else None
    try:
        fd = safefs.open_repo_file(cache_dir, folder, (commit, *path.split("/")))
    except FileNotFoundError:
        raise CacheError(f"{shown}: gone while it was read", hint="rerun") from None
    except OSError as exc:
        raise CacheError(f"cannot read {shown}: {exc.strerror or exc}") from None
    try:
        digests, _ = fd_hashes(fd, tuple(dict.fromkeys(("sha256", algorithm or "sha256"))), on_bytes, shown)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise CacheError(f"{shown} is not a regular file (a FIFO, device or folder): left alone",
                             hint="remove it, then rerun") from None
        raise CacheError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if algorithm is not None and digests[algorithm] != name:
        raise NameMismatch(f"{shown}: its content does not match its blob name {name} (changed on disk)",
                           snapshot="", path=path, name=str(name))
    return digests["sha256"]


def commit_of(cache_dir: Path, spec: str, repo_type: str = "model") -> str:
    """The commit ``REPO_ID[@REVISION]`` names in the cache (see :func:`resolve_snapshot`)."""
    return resolve_snapshot(cache_dir, spec, repo_type)[1].commit_hash

