"""The lock (``hfcache.lock``), written from the manifest: deterministic as ``uv.lock`` (sorted, a regenerate header,
a schema ``version``; no timestamps, hosts, absolute paths or tokens), every file with its size and prefixed hash.
Also: the manifest that goes with a lock, drift, and the stat-only check of a cache against it (no huggingface_hub).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..cache import safefs
from ..cache.atomic import atomic_write
from ..cache.fsops import list_entries
from ..cache.layout import RepoFolder
from ..cache.root import cache_error, resolve_cache_dir
from ..errors import CacheError, UsageError
from ..names import is_commit, is_prefixed_hash
from ..records import (
    MAX_FILE_SIZE,
    UnsafePath,
    WarmRequest,
    folder_ids,
    shown,
    valid_repo_id,
    valid_size,
    validate_repo_path,
)
from .manifest import (
    ENTRY_KEYS,
    MANIFEST_NAME,
    Manifest,
    ManifestNotFound,
    find_manifest,
    load_manifest,
    manifest_entry,
    read_toml,
    request_key,
    str_list,
    unique_entries,
)

LOCK_VERSION = 1
LOCK_NAME = "hfcache.lock"
_CORRUPT = "the lock is corrupt; regenerate it"
_HOSTILE = "the lock is corrupt or hostile; regenerate it"


@dataclass(frozen=True)
class LockedFile:
    """One file pinned by the lock: ``hash`` is ``sha256:<hex>`` (LFS) or ``git-sha1:<hex>``."""

    path: str
    size: int
    hash: str

    @property
    def etag(self) -> str:
        """The blob name in the cache (docs/cache-layout.md): the hex part of the hash."""
        return self.hash.split(":", 1)[1]


@dataclass(frozen=True)
class LockedRepo:
    """One repo pinned by the lock: the manifest entry it was resolved from (``request``), the ``canonical_id`` the
    endpoint answered, the 40-hex ``commit_hash``, the ``files`` sorted by path, the ``absent`` names (``.no_exist``
    markers), and ``notes`` found while resolving it (reported by ``hfcache lock``, not written)."""

    request: WarmRequest
    canonical_id: str
    commit_hash: str
    files: tuple[LockedFile, ...]
    absent: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    def folders(self, cache_dir: Path) -> list[RepoFolder]:
        """The cache folders this repo occupies: the canonical id, and the requested id when it differs."""
        return [RepoFolder(cache_dir, name, self.request.repo_type)
                for name in folder_ids(self.request.repo_id, self.canonical_id)]


@dataclass(frozen=True)
class Lockfile:
    """A parsed or computed lock: ``repos`` sorted by (repo_id, revision, repo_type)."""

    repos: tuple[LockedRepo, ...]
    version: int = LOCK_VERSION

    def find(self, request: WarmRequest) -> LockedRepo | None:
        return next((r for r in self.repos if request_key(r.request) == request_key(request)), None)


@dataclass(frozen=True)
class CacheStatus:
    """Whether a cache holds a locked ``repo``: ``missing`` lists what is absent or wrong (empty: satisfied)."""

    repo: LockedRepo
    missing: tuple[str, ...] = field(default=())

    @property
    def satisfied(self) -> bool:
        return not self.missing


def lock_manifest(lock_path: str | os.PathLike[str], manifest_path: str | os.PathLike[str] | None = None, *,
                  required: bool = False) -> Manifest | None:
    """The manifest that goes with a lock: ``manifest_path`` (``--manifest``), else one in the lock's folder; None
    when there is none and none is ``required``. UsageError: given or required but missing, or invalid."""
    if manifest_path is not None or required:
        return load_manifest(find_manifest(manifest_path, start=Path(lock_path).parent))
    try:
        return load_manifest(find_manifest(None, start=Path(lock_path).parent))
    except ManifestNotFound:
        return None


def lock_cache_dir(lock_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, *,
                   manifest: Manifest | None = None) -> Path:
    """The cache every ``--lock`` command works on (docs/warm.md "Which cache a --lock command uses"), absolute, unchecked:
    ``cache_dir``, else the lock's manifest's, else the environment's. UsageError as :func:`lock_manifest`."""
    if cache_dir is not None:
        return resolve_cache_dir(cache_dir)
    if manifest is None:
        manifest = lock_manifest(lock_path)
    return resolve_cache_dir(manifest.cache_dir if manifest is not None and manifest.cache_dir else None)


def render_lock(lock: Lockfile, manifest_name: str = MANIFEST_NAME) -> bytes:
    """The lock's exact bytes: the header (``manifest_name`` in the regenerate command), then TOML in a fixed order."""
    repos = [lock_entry(r) for r in sorted(lock.repos, key=lambda r: request_key(r.request))]
    document = {"version": lock.version, "repos": repos}
    regenerate = "hfcache lock" + ("" if manifest_name == MANIFEST_NAME else f" --manifest {manifest_name}")
    header = ("# This file is generated by hfcache; do not edit it by hand.\n"
              f"# Regenerate it with: {regenerate}\n"
              "# It pins every repo to a commit and every file to its size and hash.\n\n")
    return (header + tomli_w.dumps(document)).encode("utf-8")


def lock_entry(r: LockedRepo) -> dict[str, Any]:
    """One locked repo as the lock writes it (a bucket's snapshot manifest too, :mod:`hfcache.bucket.layout`)."""
    return {"repo_id": r.request.repo_id, "revision": r.request.revision, "repo_type": r.request.repo_type,
            "kind": r.request.kind, "include": list(r.request.include), "exclude": list(r.request.exclude),
            "canonical_id": r.canonical_id, "commit_hash": r.commit_hash, "absent": list(r.absent),
            "files": [{"path": f.path, "size": f.size, "hash": f.hash} for f in r.files]}


def write_lock(lock: Lockfile, path: Path, manifest_name: str = MANIFEST_NAME) -> bool:
    """Write the lock atomically; return False (and touch nothing) when the file already has these bytes."""
    data = render_lock(lock, manifest_name)
    with suppress(OSError):
        if path.read_bytes() == data:
            return False
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise cache_error(exc, f"writing {path}") from exc
    return True


def read_lock(path: str | os.PathLike[str], content: bytes | None = None) -> Lockfile:
    """Read and validate a lock (``content``: its bytes, already read). Raises UsageError: unreadable, invalid TOML, a
    newer schema, a missing or malformed field, a path escaping the repo; naming the file, entry and field."""
    path = Path(path)
    data = read_toml(path, "lock", content)
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"{path}: field 'version' must be an integer, got {shown(version)}")
    if version > LOCK_VERSION:
        raise UsageError(f"{path}: lock schema version {shown(version)} is newer than this hfcache understands "
                         f"({LOCK_VERSION})", hint="upgrade hfcache")
    if version < 1:
        raise UsageError(f"{path}: invalid lock schema version {version}")
    entries = data.get("repos", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{path}: 'repos' must be an array of tables")
    if unknown := sorted(set(data) - {"version", "repos"}):
        raise UsageError(f"{path}: unknown key {shown(unknown[0])}", hint=_CORRUPT)
    repos = unique_entries((locked_repo(e, f"{path}: repos[{i}]") for i, e in enumerate(entries)), str(path),
                           lambda r: r.request, hint=_CORRUPT)
    return Lockfile(repos=tuple(repos), version=version)


_LOCK_ENTRY_KEYS = ENTRY_KEYS | {"canonical_id", "commit_hash", "absent", "files"}


def locked_repo(entry: dict[str, Any], where: str) -> LockedRepo:
    """One lock entry (a table of the lock, or a bucket's snapshot manifest) checked and parsed; errors name
    ``where``. Raises UsageError: a missing, unknown or malformed field, a path escaping the repo."""
    request = manifest_entry({k: entry[k] for k in ENTRY_KEYS if k in entry}, where)
    where = f"{where} ({request.repo_id})"
    if unknown := sorted(set(entry) - _LOCK_ENTRY_KEYS):
        raise UsageError(f"{where}: unknown field {shown(unknown[0])}", hint=_CORRUPT)
    canonical_id = _canonical_id(entry.get("canonical_id", request.repo_id), request.repo_id, where)
    commit = entry.get("commit_hash")
    if not is_commit(commit):
        raise UsageError(f"{where}: field 'commit_hash' must be 40 hex characters, got {shown(commit)}")
    if is_commit(request.revision) and request.revision != commit:
        # A full commit pins itself: refs/<C> -> D would make an offline load of revision C fail.
        raise UsageError(f"{where}: revision {request.revision} is a commit, but 'commit_hash' is {commit}",
                         hint=_HOSTILE)
    files = entry.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise UsageError(f"{where}: field 'files' must be an array of {{path, size, hash}} tables")
    locked = []
    for j, f in enumerate(files):
        fwhere = f"{where}: files[{j}]"
        file_path = _lock_repo_path(f.get("path") if isinstance(f.get("path"), str) else "", fwhere)
        size, digest = f.get("size"), f.get("hash")
        if not valid_size(size):
            raise UsageError(f"{fwhere} ({file_path}): field 'size' must be an integer from 0 to {MAX_FILE_SIZE}, "
                             f"got {shown(size)}")
        if not is_prefixed_hash(digest):
            raise UsageError(f"{fwhere} ({file_path}): field 'hash' must be sha256:<64 hex> or git-sha1:<40 hex>")
        locked.append(LockedFile(path=file_path, size=size, hash=digest))
    absent = entry.get("absent", [])
    absent_t = str_list(absent, where, "absent") if absent else ()
    for name in absent_t:
        _lock_repo_path(name, f"{where}: absent")
    return LockedRepo(request=request, canonical_id=canonical_id, commit_hash=commit,
                      files=tuple(sorted(locked, key=lambda f: f.path)), absent=absent_t)


def _canonical_id(canonical_id: Any, repo_id: str, where: str) -> str:
    """The entry's ``canonical_id`` if it keeps :func:`hfcache.records.folder_ids`' rule (the lock is no authority for
    which repo its commits are of), else UsageError naming the entry."""
    if not isinstance(canonical_id, str) or not valid_repo_id(canonical_id):
        raise UsageError(f"{where}: field 'canonical_id' must be a valid repo id, got {shown(canonical_id)}",
                         hint=_HOSTILE)
    if canonical_id != repo_id and folder_ids(repo_id, canonical_id)[0] != canonical_id:
        allowed = repr(repo_id) if "/" in repo_id else f"{repo_id!r} or 'ORG/{repo_id}'"
        raise UsageError(f"{where}: field 'canonical_id' is {canonical_id!r}, another repo than {repo_id!r} "
                         f"(allowed: {allowed})",
                         hint="the lock is corrupt or hostile; regenerate it and review its diff")
    return canonical_id


def _lock_repo_path(path: str, where: str) -> str:
    """A lock's file path or absent name, if a safe repo path (``validate_repo_path``), else UsageError at ``where``."""
    try:
        return validate_repo_path(path)
    except UnsafePath as exc:
        raise UsageError(f"{where}: {exc}", hint=_HOSTILE) from None


def drift(manifest: Manifest, lock: Lockfile) -> tuple[str, ...]:
    """Where the lock no longer matches the manifest, one line per difference, sorted; empty when it matches."""
    problems = []
    wanted = {request_key(r): r for r in manifest.repos}
    locked = {request_key(r.request): r for r in lock.repos}
    for key, request in wanted.items():
        if key not in locked:
            problems.append(f"{request.spec}: in the manifest but not in the lock")
        elif locked[key].request != request:
            changed = [f"{name} {getattr(locked[key].request, name)!r} -> {getattr(request, name)!r}"
                       for name in ("revision", "repo_type", "kind", "include", "exclude")
                       if getattr(locked[key].request, name) != getattr(request, name)]
            problems.append(f"{request.spec}: manifest entry changed since the lock was written"
                            + (f" ({', '.join(changed)})" if changed else ""))
    for key, repo in locked.items():
        if key not in wanted:
            problems.append(f"{repo.request.spec}: in the lock but not in the manifest")
    return tuple(sorted(problems))


def lock_relative_name(manifest_path: Path, lock_path: Path) -> str:
    """The manifest's path as the lock header shows it: relative to the lock's folder, never absolute."""
    try:
        return os.path.relpath(manifest_path.resolve(), lock_path.resolve().parent)
    except ValueError:
        return manifest_path.name


def cache_status(repo: LockedRepo, cache_dir: Path) -> CacheStatus:
    """Whether ``cache_dir`` holds ``repo`` as locked, from ``stat`` calls only (hashes are ``verify``'s job): in
    every folder, the ref, a regular file of the locked size per file, a ``.no_exist`` marker per absent name."""
    missing = []
    for folder in repo.folders(cache_dir):
        rel = folder.name
        unsafe = folder.layout_problems()
        if unsafe:  # never stat through a planted link; warm then refuses the folder (exit 5)
            missing.append(f"{rel}: unsafe layout: {'; '.join(unsafe)}")
            continue
        if repo.request.revision != repo.commit_hash:
            try:
                ref = folder.read_ref(repo.request.revision)
            except (OSError, CacheError):
                ref = None
            if ref != repo.commit_hash.encode():
                missing.append(f"{rel}/refs/{repo.request.revision}: " + ("missing" if ref is None else "differs"))
        for f in repo.files:
            pointer = folder.pointer_path(repo.commit_hash, f.path)
            try:
                st = os.stat(pointer)
            except OSError:
                missing.append(f"{rel}/snapshots/{repo.commit_hash[:12]}/{f.path}: missing")
                continue
            if st.st_size != f.size or not stat.S_ISREG(st.st_mode):  # the one stat answers both
                missing.append(f"{rel}/snapshots/{repo.commit_hash[:12]}/{f.path}: size {st.st_size} != {f.size}")
        # The regular files directly in .no_exist/<commit> (one scandir, not a stat per name).
        markers = {e.name for e in list_entries(folder.root / ".no_exist" / safefs.check_commit(repo.commit_hash))
                   if e.is_file(follow_symlinks=False)}
        for name in repo.absent:
            if name not in markers and not folder.marker_path(repo.commit_hash, name).exists():
                missing.append(f"{rel}/.no_exist/{repo.commit_hash[:12]}/{name}: missing")
    return CacheStatus(repo=repo, missing=tuple(missing))


def cache_statuses(lock: Lockfile, cache_dir: Path) -> list[CacheStatus]:
    return [cache_status(r, cache_dir) for r in lock.repos]


def filter_upgrade(repos: Iterable[WarmRequest], names: Sequence[str]) -> set[tuple[str, str, str]]:
    """The keys of the entries ``--upgrade NAME...`` selects (all: no names); UsageError: a name not in ``repos``."""
    repos = list(repos)
    known = {r.repo_id for r in repos}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--upgrade {unknown[0]}: not a repo_id of the manifest")
    return {request_key(r) for r in repos if not names or r.repo_id in names}


def pinned_revisions(lock: Lockfile) -> set[tuple[str, str, str]]:
    """``(repo_type, repo_id, commit_hash)`` of every folder and commit the lock pins (requested and canonical ids)."""
    return {(repo.request.repo_type, repo_id, repo.commit_hash)
            for repo in lock.repos for repo_id in folder_ids(repo.request.repo_id, repo.canonical_id)}
