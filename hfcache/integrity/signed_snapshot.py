"""signed_snapshot: the ``{path: sha256}`` of one cached snapshot, what a model-signing bundle signs and is checked
against (:mod:`.signatures`).

An LFS file's blob name is its sha256, used unread unless ``rehash``; any other file is hashed. Bytes hashed are
checked against the name they are stored under (the blob name, or warm's record for a real file) in the same read
(:func:`hfcache.cache.content.hash_fd`): a file that misses it is :class:`NameMismatch`, never signed or checked.
Files are opened with :func:`hfcache.cache.safefs.open_repo_file` (no link followed out of the repo folder, no FIFO).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from ..cache import safefs
from ..cache.content import SHA256, algorithm_of, hash_fd
from ..cache.published import read_record
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, RevisionInfo, scan_cache
from ..errors import CacheError, CheckFailed
from ..names import is_sha256
from ..records import WarmRequest


class NameMismatch(CacheError):
    """A cached file whose bytes do not hash to the ``name`` it is stored under (blob name or recorded digest): exit
    5, as ``export`` and ``push`` refuse a corrupt source; ``snapshot``: ``REPO_ID@COMMIT``; ``path``: the file."""

    def __init__(self, message: str, *, snapshot: str, path: str, name: str) -> None:
        super().__init__(message, hint="`hfcache verify` names the damaged files; `hfcache verify --repair` restores "
                                       "them from the endpoint")
        self.snapshot, self.path, self.name = snapshot, path, name


@dataclass(frozen=True)
class SnapshotDigests:
    """One snapshot's ``files`` (``/``-separated path -> sha256 hex) as a model-signing manifest sees them, with
    the repo, its commit and folder, the files ``hashed``, and the ``snapshot`` folder ``model_signing`` reads."""

    repo_id: str
    commit: str
    folder: str
    files: dict[str, str]
    hashed: int
    snapshot: Path


def resolve_snapshot(cache_dir: Path, spec: str, repo_type: str = "model") -> tuple[RepoInfo, RevisionInfo]:
    """The repo and snapshot ``REPO_ID[@REVISION]`` (a ref or a commit; default ``main``) names in the cache.

    Raises:
        UsageError: a malformed spec. CheckFailed: the repo or revision is not in the cache (exit 1).
        CacheError: the repo folder's layout is unsafe (a planted link: left alone).
    """
    request = WarmRequest.parse(spec, repo_type=repo_type)
    info = scan_cache(cache_dir, {request.repo_id})
    repo = next((r for r in info.repos if r.repo_id == request.repo_id and r.repo_type == request.repo_type), None)
    if repo is None:
        raise CheckFailed(f"{request.repo_id} is not in the cache {cache_dir}", hint="warm it first")
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
    """The sha256 of every file of the snapshot ``spec`` (``REPO_ID[@REVISION]``) names; a broken link (its blob
    gone) is left out (a bundle then names it missing).

    Args:
        rehash: hash every file's bytes (default: an LFS blob's sha256 name is its digest).
        on_bytes: called with the size of every chunk hashed. repo_type: as :func:`resolve_snapshot`.

    Raises:
        UsageError, CheckFailed: as :func:`resolve_snapshot`.
        NameMismatch: a file hashed does not match its blob name (or warm's record of a real file): exit 5.
        CacheError: an entry links outside its repo folder, is a FIFO/device/folder where a file belongs, a folder
            chain is deeper than 64 levels, or an entry cannot be read (exit 5, naming it).
    """
    repo, revision = resolve_snapshot(cache_dir, spec, repo_type)
    commit = revision.commit_hash
    hazards = [text for text in revision.problems if text.endswith((SPECIAL_FILE, TOO_DEEP))]
    if hazards:  # what the scan did not list: a signature over the rest would not be the snapshot's
        raise CacheError(f"{cache_dir}/{repo.folder}/snapshots/{commit}: {hazards[0]}: left alone",
                         hint="remove it, then rerun")
    record = None
    if any(entry.form == "file" for entry in revision.files):  # a real file is named by warm's record only
        record = read_record(cache_dir, repo.folder, commit)
    files: dict[str, str] = {}
    hashed = 0
    for entry in revision.files:
        if entry.form == "broken":
            continue
        if not rehash and entry.form == "link" and is_sha256(entry.etag):
            files[entry.path] = entry.etag
            continue
        recorded = record.files.get(entry.path) if record is not None else None
        name = entry.etag if entry.form == "link" else recorded[1].partition(":")[2] if recorded else None
        try:
            files[entry.path] = _hash_entry(cache_dir, repo.folder, commit, entry.path, name, on_bytes)
        except NameMismatch as exc:
            exc.snapshot = f"{repo.repo_id}@{commit}"
            raise
        hashed += 1
    return SnapshotDigests(repo_id=repo.repo_id, commit=commit, folder=repo.folder, files=files, hashed=hashed,
                           snapshot=Path(cache_dir) / repo.folder / "snapshots" / commit)


def _hash_entry(cache_dir: Path, folder: str, commit: str, path: str, name: str | None, on_bytes) -> str:
    """The sha256 of one snapshot file, its bytes checked against ``name`` (its blob name) in the same read:
    NameMismatch when they miss it; CacheError: unreadable, gone, not a regular file."""
    shown = f"{cache_dir}/{folder}/snapshots/{commit}/{path}"
    algorithm = algorithm_of(name)
    try:
        fd = safefs.open_repo_file(cache_dir, folder, (commit, *path.split("/")))
    except FileNotFoundError:
        raise CacheError(f"{shown}: gone while it was read", hint="rerun") from None
    except OSError as exc:
        raise CacheError(f"cannot read {shown}: {exc.strerror or exc}") from None
    try:
        digests, _ = hash_fd(fd, tuple(dict.fromkeys((SHA256, algorithm or SHA256))), on_bytes=on_bytes, shown=shown)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise CacheError(f"{shown} is not a regular file (a FIFO, device or folder): left alone",
                             hint="remove it, then rerun") from None
        raise CacheError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if algorithm is not None and digests[algorithm] != name:
        raise NameMismatch(f"{shown}: its content does not match its blob name {name} (changed on disk)",
                           snapshot="", path=path, name=str(name))
    return digests[SHA256]

