"""The manifest (``hfcache.toml``) users write and the lock (``hfcache.lock``) hfcache writes.

Light on purpose (standard library, tomli-w and hfcache's records only): ``warm --lock`` on a warm cache reads the
lock and checks the cache with this module alone, without importing huggingface_hub or an HTTP client.

The lock is deterministic, in the manner of pip-tools' ``writer.py`` and ``uv.lock``: sorted entries, stable
formatting, LF, trailing newline, a header naming the command that regenerates it, a schema ``version``; no
timestamps, hostnames, absolute paths or tokens. Every file has a size and an algorithm-prefixed hash.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..cache import safefs
from ..cache.layout import RepoFolder, atomic_write, cache_error, resolve_cache_dir
from ..errors import CacheError, UsageError
from ..records import KINDS, REPO_TYPES, UnsafePath, WarmRequest, folder_ids, valid_repo_id, validate_repo_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LOCK_VERSION = 1
MANIFEST_NAME = "hfcache.toml"
LOCK_NAME = "hfcache.lock"
_HASH_RE = re.compile(r"^(sha256:[0-9a-f]{64}|git-sha1:[0-9a-f]{40})$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_MANIFEST_KEYS = {"endpoint", "cache_dir", "repos"}
_ENTRY_KEYS = {"repo_id", "revision", "kind", "include", "exclude", "repo_type"}


class ManifestNotFound(UsageError):
    """No manifest where one was looked for."""


@dataclass(frozen=True)
class Manifest:
    """What the user asked for.

    Attributes:
        path (Path): the file it was read from.
        endpoints (tuple[str, ...]): Hub endpoints in order of preference (``endpoint`` may be a string or a list
            in the file); empty when the manifest sets none.
        cache_dir (Path | None): cache root, resolved relative to the manifest's folder.
        repos (tuple[WarmRequest, ...]): the entries, in file order.
    """

    path: Path
    endpoints: tuple[str, ...]
    cache_dir: Path | None
    repos: tuple[WarmRequest, ...]


@dataclass(frozen=True)
class LockedFile:
    """One file pinned by the lock: ``hash`` is ``sha256:<hex>`` (LFS) or ``git-sha1:<hex>``."""

    path: str
    size: int
    hash: str

    @property
    def etag(self) -> str:
        """The blob name in the cache (DESIGN §1): the hex part of the hash."""
        return self.hash.split(":", 1)[1]


@dataclass(frozen=True)
class LockedRepo:
    """One repo pinned by the lock.

    Attributes:
        request: the manifest entry it was resolved from (repo id as written, revision, kind, globs, type).
        canonical_id (str): the id the endpoint answered with.
        commit_hash (str): the 40-hex commit.
        files (tuple[LockedFile, ...]): the selected files, sorted by path.
        absent (tuple[str, ...]): optional tokenizer names the repo lacks (written as ``.no_exist`` markers).
        notes (tuple[str, ...]): one-line warnings found while resolving it (custom code in another repo, a file
            too large to parse: ``selection.Followed.notes``); reported by ``hfcache lock``, not written.
    """

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
        return next((r for r in self.repos if _key(r.request) == _key(request)), None)


@dataclass(frozen=True)
class CacheStatus:
    """Whether a cache already holds a locked repo, from ``stat`` calls only (no hashing, no network).

    Attributes:
        repo: the locked repo.
        missing (tuple[str, ...]): what is absent or wrong, e.g. ``"snapshots/<commit>/vocab.txt: missing"``;
            empty when the cache satisfies the lock for this repo.
    """

    repo: LockedRepo
    missing: tuple[str, ...] = field(default=())

    @property
    def satisfied(self) -> bool:
        return not self.missing


def _key(request: WarmRequest) -> tuple[str, str, str]:
    return (request.repo_id, request.revision, request.repo_type)


# ------------------------------------------------------------------------------------------------ manifest


def find_manifest(path: str | os.PathLike[str] | None = None, start: Path | None = None) -> Path:
    """Return the manifest to use: ``path`` when given, else ``hfcache.toml`` or a ``pyproject.toml`` with a
    ``[tool.hfcache]`` table in ``start`` (default: the working directory).

    Raises:
        UsageError: nothing found.
    """
    if path is not None:
        return Path(path)
    folder = start or Path.cwd()
    if (folder / MANIFEST_NAME).is_file():
        return folder / MANIFEST_NAME
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
            data = {}
        if "hfcache" in data.get("tool", {}):
            return pyproject
    raise ManifestNotFound(f"no {MANIFEST_NAME} (or pyproject.toml with [tool.hfcache]) in {folder}",
                           hint="write one (see README 'Pinning') or pass --manifest FILE")


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}", hint=f"fix the {what}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise UsageError(f"{path}: invalid TOML: nested too deep", hint=f"fix the {what}") from None


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate a manifest.

    The shape (README "Pinning")::

        endpoint = "https://huggingface.co"   # optional; or a list, tried in order
        cache_dir = "/opt/hf-cache"            # optional, relative to the manifest's folder
        [[repos]]
        repo_id = "bert-base-uncased"
        revision = "main"      # optional
        kind = "tokenizer"     # optional: tokenizer | model | all
        include = []           # optional globs
        exclude = []           # optional globs
        repo_type = "model"    # optional: model | dataset

    Raises:
        UsageError: unreadable file, invalid TOML, unknown key, wrong type or value, duplicate entry; the message
            names the file, the entry and the field.
    """
    path = Path(path)
    data = _read_toml(path, "manifest")
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("hfcache")
        if not isinstance(data, dict):
            raise UsageError(f"{path}: no [tool.hfcache] table", hint="add one, or write hfcache.toml")
    where = str(path) if path.name != "pyproject.toml" else f"{path} [tool.hfcache]"
    unknown = sorted(set(data) - _MANIFEST_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}", hint=f"allowed: {', '.join(sorted(_MANIFEST_KEYS))}")
    endpoint = data.get("endpoint")
    if isinstance(endpoint, str):
        endpoint = [endpoint]
    if endpoint is not None and (not isinstance(endpoint, list) or not endpoint
                                 or not all(isinstance(e, str) and e for e in endpoint)):
        raise UsageError(f"{where}: field 'endpoint' must be a URL or a list of URLs, got {data.get('endpoint')!r}")
    cache_dir = _optional_str(data, "cache_dir", where)
    entries = data.get("repos", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{where}: 'repos' must be an array of tables ([[repos]])")
    if not entries:
        raise UsageError(f"{where}: no [[repos]] entries", hint="add at least one [[repos]] with a repo_id")
    repos = []
    seen: dict[tuple[str, str, str], int] = {}
    for index, entry in enumerate(entries):
        request = _manifest_entry(entry, f"{where}: repos[{index}]")
        if _key(request) in seen:
            raise UsageError(f"{where}: repos[{index}] ({request.spec}) repeats repos[{seen[_key(request)]}]")
        seen[_key(request)] = index
        repos.append(request)
    return Manifest(
        path=path,
        endpoints=tuple(e.rstrip("/") for e in endpoint or ()),
        cache_dir=(path.parent / os.path.expandvars(os.path.expanduser(cache_dir))) if cache_dir else None,
        repos=tuple(repos),
    )


def _optional_str(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise UsageError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
    return value


def _str_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where}: field {key!r} must be an array of non-empty strings, got {value!r}")
    return tuple(value)


def _manifest_entry(entry: dict[str, Any], where: str) -> WarmRequest:
    repo_id = entry.get("repo_id")
    if not isinstance(repo_id, str) or not repo_id:
        raise UsageError(f"{where}: field 'repo_id' is required and must be a string")
    where = f"{where} ({repo_id})"
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r}", hint=f"allowed: {', '.join(sorted(_ENTRY_KEYS))}")
    for key, allowed in (("kind", KINDS), ("repo_type", REPO_TYPES)):
        if key in entry and entry[key] not in allowed:
            raise UsageError(f"{where}: field {key!r} must be one of {', '.join(allowed)}, got {entry[key]!r}")
    revision = entry.get("revision", "main")
    if not isinstance(revision, str):
        raise UsageError(f"{where}: field 'revision' must be a string, got {revision!r}")
    include = _str_list(entry.get("include", []), where, "include")
    exclude = _str_list(entry.get("exclude", []), where, "exclude")
    try:
        return WarmRequest(
            repo_id=repo_id,
            revision=revision,
            kind=entry.get("kind", "tokenizer"),
            repo_type=entry.get("repo_type", "model"),
            include=include,
            exclude=exclude,
        )
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", hint=exc.hint) from None


# ------------------------------------------------------------------------------------------------ lock


def lock_manifest(lock_path: str | os.PathLike[str], manifest_path: str | os.PathLike[str] | None = None, *,
                  required: bool = False) -> Manifest | None:
    """The manifest that goes with a lock: ``manifest_path`` when given (``--manifest``), else ``hfcache.toml`` or a
    ``pyproject.toml`` with ``[tool.hfcache]`` in the lock's folder.

    Returns:
        Manifest, or None when there is none beside the lock and none is ``required`` (a lock alone, e.g. copied
        into an image, is enough).

    Raises:
        UsageError: the manifest is given or required but missing, or it exists but is invalid.
    """
    if manifest_path is not None or required:
        return load_manifest(find_manifest(manifest_path, start=Path(lock_path).parent))
    try:
        return load_manifest(find_manifest(None, start=Path(lock_path).parent))
    except ManifestNotFound:
        return None


def lock_cache_dir(lock_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, *,
                   manifest: Manifest | None = None, manifest_path: str | os.PathLike[str] | None = None) -> Path:
    """The cache every ``--lock`` command works on (README "Which cache a --lock command uses"): ``cache_dir``
    (``--cache-dir``) when given; else the ``cache_dir`` of the lock's manifest (``manifest`` if already loaded,
    else :func:`lock_manifest`); else the environment's (``HF_HUB_CACHE``, ``$HF_HOME/hub``,
    ``~/.cache/huggingface/hub``).

    Returns:
        Path: absolute; not checked for existence.

    Raises:
        UsageError: the manifest is given but missing, or exists but is invalid.
    """
    if cache_dir is not None:
        return resolve_cache_dir(cache_dir)
    if manifest is None:
        manifest = lock_manifest(lock_path, manifest_path)
    return resolve_cache_dir(manifest.cache_dir if manifest is not None and manifest.cache_dir else None)


def default_lock_path(manifest_path: Path) -> Path:
    return manifest_path.parent / LOCK_NAME


def render_lock(lock: Lockfile, manifest_name: str = MANIFEST_NAME) -> bytes:
    """The lock's exact bytes: header comment, then TOML from tomli-w with keys in a fixed order.

    Args:
        lock: the lock to render.
        manifest_name: the manifest path shown in the regenerate command (relative; never absolute).
    """
    document = {
        "version": lock.version,
        "repos": [
            {
                "repo_id": r.request.repo_id,
                "revision": r.request.revision,
                "repo_type": r.request.repo_type,
                "kind": r.request.kind,
                "include": list(r.request.include),
                "exclude": list(r.request.exclude),
                "canonical_id": r.canonical_id,
                "commit_hash": r.commit_hash,
                "absent": list(r.absent),
                "files": [{"path": f.path, "size": f.size, "hash": f.hash} for f in r.files],
            }
            for r in sorted(lock.repos, key=lambda r: _key(r.request))
        ],
    }
    regenerate = "hfcache lock" + ("" if manifest_name == MANIFEST_NAME else f" --manifest {manifest_name}")
    header = (
        "# This file is generated by hfcache; do not edit it by hand.\n"
        f"# Regenerate it with: {regenerate}\n"
        "# It pins every repo to a commit and every file to its size and hash.\n\n"
    )
    return (header + tomli_w.dumps(document)).encode("utf-8")


def write_lock(lock: Lockfile, path: Path, manifest_name: str = MANIFEST_NAME) -> bool:
    """Write the lock atomically; return False (and touch nothing) when the file already has these bytes."""
    data = render_lock(lock, manifest_name)
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise cache_error(exc, f"writing {path}") from exc
    return True


def read_lock(path: str | os.PathLike[str]) -> Lockfile:
    """Read and validate a lock.

    Raises:
        UsageError: unreadable, invalid TOML, a schema version newer than this hfcache understands, a missing or
            malformed field, a file path that escapes the repo; the message names the file, entry and field.
    """
    path = Path(path)
    data = _read_toml(path, "lock")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"{path}: field 'version' must be an integer, got {version!r}")
    if version > LOCK_VERSION:
        raise UsageError(f"{path}: lock schema version {version} is newer than this hfcache understands "
                         f"({LOCK_VERSION})", hint="upgrade hfcache")
    if version < 1:
        raise UsageError(f"{path}: invalid lock schema version {version}")
    entries = data.get("repos", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{path}: 'repos' must be an array of tables")
    unknown = sorted(set(data) - {"version", "repos"})
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r}", hint="the lock is corrupt; regenerate it")
    repos = []
    seen: dict[tuple[str, str, str], int] = {}
    for i, entry in enumerate(entries):
        repo = _locked_repo(entry, f"{path}: repos[{i}]")
        if _key(repo.request) in seen:
            raise UsageError(f"{path}: repos[{i}] ({repo.request.spec}) repeats repos[{seen[_key(repo.request)]}]",
                             hint="the lock is corrupt; regenerate it")
        seen[_key(repo.request)] = i
        repos.append(repo)
    return Lockfile(repos=tuple(repos), version=version)


_LOCK_ENTRY_KEYS = _ENTRY_KEYS | {"canonical_id", "commit_hash", "absent", "files"}


def _locked_repo(entry: dict[str, Any], where: str) -> LockedRepo:
    request = _manifest_entry({k: entry[k] for k in _ENTRY_KEYS if k in entry}, where)
    where = f"{where} ({request.repo_id})"
    unknown = sorted(set(entry) - _LOCK_ENTRY_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r}", hint="the lock is corrupt; regenerate it")
    canonical_id = entry.get("canonical_id")
    commit = entry.get("commit_hash")
    if not isinstance(canonical_id, str) or not valid_repo_id(canonical_id):
        raise UsageError(f"{where}: field 'canonical_id' must be a valid repo id, got {canonical_id!r}",
                         hint="the lock is corrupt or hostile; regenerate it")
    if not isinstance(commit, str) or not _COMMIT_RE.fullmatch(commit):
        raise UsageError(f"{where}: field 'commit_hash' must be 40 hex characters, got {commit!r}")
    files = entry.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise UsageError(f"{where}: field 'files' must be an array of {{path, size, hash}} tables")
    locked = []
    for j, f in enumerate(files):
        fwhere = f"{where}: files[{j}]"
        try:
            file_path = validate_repo_path(f.get("path") if isinstance(f.get("path"), str) else "")
        except UnsafePath as exc:
            raise UsageError(f"{fwhere}: {exc}", hint="the lock is corrupt or hostile; regenerate it") from None
        size, digest = f.get("size"), f.get("hash")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UsageError(f"{fwhere} ({file_path}): field 'size' must be a non-negative integer")
        if not isinstance(digest, str) or not _HASH_RE.fullmatch(digest):
            raise UsageError(f"{fwhere} ({file_path}): field 'hash' must be sha256:<64 hex> or git-sha1:<40 hex>")
        locked.append(LockedFile(path=file_path, size=size, hash=digest))
    absent = entry.get("absent", [])
    absent_t = _str_list(absent, where, "absent") if absent else ()
    for name in absent_t:
        try:
            validate_repo_path(name)
        except UnsafePath as exc:
            raise UsageError(f"{where}: absent: {exc}", hint="the lock is corrupt or hostile; regenerate it") from None
    return LockedRepo(request=request, canonical_id=canonical_id, commit_hash=commit,
                      files=tuple(sorted(locked, key=lambda f: f.path)), absent=absent_t)


def drift(manifest: Manifest, lock: Lockfile) -> tuple[str, ...]:
    """Where the lock no longer matches the manifest (no network); empty when it matches.

    Returns:
        One line per difference, sorted: an entry missing from the lock, an entry locked but no longer in the
        manifest, or an entry whose kind/include/exclude changed.
    """
    problems = []
    wanted = {_key(r): r for r in manifest.repos}
    locked = {_key(r.request): r for r in lock.repos}
    for key, request in wanted.items():
        if key not in locked:
            problems.append(f"{request.spec}: in the manifest but not in the lock")
        elif locked[key].request != request:
            problems.append(f"{request.spec}: manifest entry changed since the lock was written")
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


# ------------------------------------------------------------------------------------------------ cache check


def cache_status(repo: LockedRepo, cache_dir: Path) -> CacheStatus:
    """Check with ``stat`` only that ``cache_dir`` holds ``repo`` exactly as locked.

    For every folder of the repo (the requested id and the canonical id): ``refs/<revision>`` equals the commit,
    every file's snapshot entry resolves to a regular file of the locked size, and every absent name has its
    ``.no_exist`` marker. Hashes are not computed (that is ``verify``'s job); this keeps a warm rebuild in
    milliseconds.
    """
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
        markers = _top_level_markers(folder.root / ".no_exist" / safefs.check_commit(repo.commit_hash))
        for name in repo.absent:
            if name not in markers and not folder.marker_path(repo.commit_hash, name).exists():
                missing.append(f"{rel}/.no_exist/{repo.commit_hash[:12]}/{name}: missing")
    return CacheStatus(repo=repo, missing=tuple(missing))


def _top_level_markers(folder: Path) -> set[str]:
    """The names of the regular files directly in a ``.no_exist/<commit>`` folder, from one ``scandir`` (absent
    names are mostly top-level: this replaces a stat per name). Others (links, subfolders) are checked one by one."""
    try:
        with os.scandir(folder) as entries:
            return {e.name for e in entries if e.is_file(follow_symlinks=False)}
    except OSError:
        return set()


def cache_statuses(lock: Lockfile, cache_dir: Path) -> list[CacheStatus]:
    return [cache_status(r, cache_dir) for r in lock.repos]



def filter_upgrade(repos: Iterable[WarmRequest], names: Sequence[str]) -> set[tuple[str, str, str]]:
    """The keys of manifest entries that ``--upgrade NAME...`` selects (all of them when ``names`` is empty).

    Raises:
        UsageError: a name is not a repo id of the manifest.
    """
    repos = list(repos)
    known = {r.repo_id for r in repos}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--upgrade {unknown[0]}: not a repo_id of the manifest")
    return {_key(r) for r in repos if not names or r.repo_id in names}


def pinned_revisions(lock: Lockfile) -> set[tuple[str, str, str]]:
    """``(repo_type, repo_id, commit_hash)`` of every folder and commit the lock pins (requested and canonical ids)."""
    pinned = set()
    for repo in lock.repos:
        for repo_id in folder_ids(repo.request.repo_id, repo.canonical_id):
            pinned.add((repo.request.repo_type, repo_id, repo.commit_hash))
    return pinned
