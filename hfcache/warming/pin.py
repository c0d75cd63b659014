"""pin: resolve a manifest into a lock (``hfcache lock``), each entry as warm resolves it (configs and sharded indexes
read into memory, hash-checked); unchanged entries keep their locked commit unless ``--upgrade`` names them.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import pools
from ..errors import HfcacheError, HubError, IntegrityError
from ..hub.client import HubClient
from ..hub.retry import RetryCounter
from ..records import HubOptions, WarmRequest
from .custom_code import BAD_FILE_HINT, MAX_PARSE_BYTES, finish_selection
from .lockfile import LockedFile, LockedRepo, Lockfile, filter_upgrade, lock_relative_name, write_lock
from .manifest import Manifest, request_key, with_manifest_endpoints
from .orchestrate import make_clients
from .project import open_project
from .selection import check_index_size, select, shards_from_index


@dataclass(frozen=True)
class LockFailure:
    """A manifest entry that could not be resolved: ``error`` is one line, ``exit_code`` the documented code."""

    spec: str
    error: str
    hint: str | None
    exit_code: int


@dataclass(frozen=True)
class PinResult:
    """The outcome of :func:`pin`: the new ``lock`` (complete only without ``failures``, in manifest order), the specs
    ``resolved`` in this run and those ``kept`` without a request."""

    lock: Lockfile
    resolved: tuple[str, ...]
    kept: tuple[str, ...]
    failures: tuple[LockFailure, ...]


@dataclass(frozen=True)
class LockRun:
    """The outcome of :func:`lock_project`: the :class:`PinResult`, the ``lock_path``, and whether the file was
    ``written`` (not when it had these bytes already, nor when an entry failed)."""

    result: PinResult
    lock_path: Path
    written: bool


def resolve_entry(client: HubClient, request: WarmRequest) -> LockedRepo:
    """One manifest entry resolved to a locked repo. Raises HfcacheError: the client's; IntegrityError for a
    malformed config or sharded index."""
    counter = client.counter()
    repo = client.resolve(request.repo_id, request.revision, request.repo_type, counter=counter)
    selection = select(repo.paths, request.kind, request.include, request.exclude)
    repo = client.describe(repo, selection.needs_config + selection.needs_index, counter)

    def read(path: str) -> bytes | None:
        nonlocal repo
        repo = client.describe(repo, [path], counter)  # one HEAD where the listing gave no hash
        return _download(client, repo, repo.by_path[path], counter)

    # custom code (auto_map), module folders: read in memory, hash-checked, never run
    paths, absent, needs_index, notes = finish_selection(selection, read, repo.paths, request)
    repo = client.describe(repo, needs_index, counter)
    for index in needs_index:
        try:
            check_index_size(index, repo.by_path[index].size)
            paths |= shards_from_index(_download(client, repo, repo.by_path[index], counter, limit=None), repo.paths,
                                       index)
        except ValueError as exc:
            raise IntegrityError(f"{request.repo_id}: {exc}", hint=BAD_FILE_HINT) from None
    repo = client.describe(repo, paths, counter)
    by_path = repo.by_path
    files = tuple(LockedFile(path=p, size=by_path[p].size, hash=by_path[p].hash) for p in sorted(paths))
    return LockedRepo(request=request, canonical_id=repo.canonical_id, commit_hash=repo.commit_hash,
                      files=files, absent=absent, notes=notes)


def _download(client: HubClient, repo, file, counter: RetryCounter,
              limit: int | None = MAX_PARSE_BYTES) -> bytes | None:
    """A small file's bytes, in memory, size and hash checked (``HubClient.download``); None above ``limit``."""
    if limit is not None and file.size > limit:
        return None
    buffer = io.BytesIO()
    client.download(repo, file, buffer, counter)
    return buffer.getvalue()


def pin(manifest: Manifest, clients: Sequence[HubClient], existing: Lockfile | None = None,
        upgrade: set[tuple[str, str, str]] | None = None, max_workers: int = 8) -> PinResult:
    """The lock for ``manifest``: each entry resolved on ``clients`` in order (a Hub-side failure moves on to the
    next), ``max_workers`` at once, except those ``existing`` locks unchanged and ``upgrade`` does not name (keys
    ``(repo_id, revision, repo_type)``). The lock lists every entry that resolved, kept or new."""
    upgrade = upgrade or set()
    kept: list[LockedRepo] = []
    todo: list[WarmRequest] = []
    for request in manifest.repos:
        previous = existing.find(request) if existing else None
        if previous is not None and previous.request == request and request_key(request) not in upgrade:
            kept.append(previous)
        else:
            todo.append(request)

    def attempt(request: WarmRequest) -> LockedRepo | LockFailure:
        failure = None
        for client in clients:
            try:
                return resolve_entry(client, request)
            except HubError as exc:
                failure = LockFailure(request.spec, exc.message, exc.hint, exc.exit_code)
            except HfcacheError as exc:
                return LockFailure(request.spec, exc.message, exc.hint, exc.exit_code)
        return failure

    with pools.pool(min(max_workers, len(todo) or 1), "hfcache-pin") as executor:
        outcomes = list(pools.ordered([executor.submit(attempt, request) for request in todo]))  # Ctrl-C: pools.py
    resolved = [o for o in outcomes if isinstance(o, LockedRepo)]
    failures = tuple(o for o in outcomes if isinstance(o, LockFailure))
    return PinResult(lock=Lockfile(repos=tuple(kept + resolved)), resolved=tuple(r.request.spec for r in resolved),
                     kept=tuple(r.request.spec for r in kept), failures=failures)


def lock_project(manifest: str | os.PathLike[str] | None = None, *, lock_path: str | os.PathLike[str] | None = None,
                 upgrade: bool = False, upgrade_ids: Sequence[str] = (), hub: HubOptions | None = None,
                 trust_manifest_endpoint: bool = False, on_notice: Callable[[str], None] | None = None) -> LockRun:
    """``hfcache lock``: resolve a project's manifest (``manifest``, ``lock_path``: as :func:`.project.open_project`)
    and write its lock (only when every entry resolved), keeping unchanged entries' commits unless ``upgrade`` (those
    named by ``upgrade_ids``, all when it is empty); ``hub``'s endpoints win over the manifest's. Raises UsageError:
    no or invalid manifest or lock, an unknown ``upgrade_ids`` name, a bad endpoint or token file; CacheError."""
    hub = (hub or HubOptions()).read_token()
    found, path, existing = open_project(manifest, lock_path)
    upgrade_keys = filter_upgrade(found.repos, upgrade_ids) if upgrade else set()
    clients = make_clients(with_manifest_endpoints(hub, found.endpoints, trust_manifest_endpoint), on_notice=on_notice)
    result = pin(found, clients, existing=existing, upgrade=upgrade_keys, max_workers=hub.max_workers)
    written = not result.failures and write_lock(result.lock, path, lock_relative_name(found.path, path))
    return LockRun(result=result, lock_path=path, written=written)
