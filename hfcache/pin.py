"""pin: resolve a manifest against an endpoint into a lock (``hfcache lock``).

Every entry is resolved like warm resolves it (:meth:`hfcache.hub.HubClient.resolve`, then ``describe`` for the
selected files where the endpoint's listing gave no sizes or hashes: the tree API or one HEAD per file);
sharded weight indexes are downloaded (into memory, hash-checked) to learn the shard list. Entries whose manifest
entry is unchanged keep their locked commit unless ``--upgrade`` names them: no request is made for them.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import HfcacheError, HubError, IntegrityError
from .hub import HubClient
from .lockfile import LockedFile, LockedRepo, Lockfile, Manifest
from .records import WarmRequest
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
    """The outcome of :func:`pin`.

    Attributes:
        lock: the new lock (complete only when ``failures`` is empty).
        resolved (tuple[str, ...]): specs resolved against the endpoint in this run.
        kept (tuple[str, ...]): specs whose locked commit was kept without a request.
        failures (tuple[LockFailure, ...]): entries that failed, in manifest order.
    """

    lock: Lockfile
    resolved: tuple[str, ...]
    kept: tuple[str, ...]
    failures: tuple[LockFailure, ...]


def resolve_entry(client: HubClient, request: WarmRequest) -> LockedRepo:
    """Resolve one manifest entry to a locked repo (commit, selected files with size and hash, absent names).

    Raises:
        HfcacheError subclasses from :class:`HubClient`; IntegrityError for a malformed sharded index.
    """
    counter = client.counter()
    repo = client.resolve(request.repo_id, request.revision, request.repo_type, counter=counter)
    selection = select(repo.paths, request.kind, request.include, request.exclude)
    paths = set(selection.paths)
    repo = client.describe(repo, selection.needs_index, counter)
    for index in selection.needs_index:
        buffer = io.BytesIO()
        try:
            check_index_size(index, repo.by_path[index].size)
        except ValueError as exc:
            raise IntegrityError(f"{request.repo_id}: {exc}") from None
        client.download(repo, repo.by_path[index], buffer, counter)
        try:
            paths |= shards_from_index(buffer.getvalue(), repo.paths, index)
        except ValueError as exc:
            raise IntegrityError(f"{request.repo_id}: {exc}") from None
    repo = client.describe(repo, paths, counter)
    by_path = repo.by_path
    files = tuple(LockedFile(path=p, size=by_path[p].size, hash=by_path[p].hash) for p in sorted(paths))
    return LockedRepo(request=request, canonical_id=repo.canonical_id, commit_hash=repo.commit_hash,
                      files=files, absent=selection.absent)


def pin(
    manifest: Manifest,
    clients: HubClient | Sequence[HubClient],
    existing: Lockfile | None = None,
    upgrade: set[tuple[str, str, str]] | None = None,
    max_workers: int = 8,
) -> PinResult:
    """Compute the lock for ``manifest``.

    Args:
        manifest: the entries to pin.
        clients: the endpoint connection, or several tried in order per entry (the first that resolves it wins;
            a Hub-side failure moves on to the next).
        existing: the current lock, whose commits are kept for unchanged entries.
        upgrade: keys ``(repo_id, revision, repo_type)`` to re-resolve even if unchanged (``--upgrade``).
        max_workers: parallel resolutions.

    Returns:
        PinResult; the lock lists every entry that resolved (kept or new).
    """
    upgrade = upgrade or set()
    kept: list[LockedRepo] = []
    todo: list[WarmRequest] = []
    for request in manifest.repos:
        previous = existing.find(request) if existing else None
        key = (request.repo_id, request.revision, request.repo_type)
        if previous is not None and previous.request == request and key not in upgrade:
            kept.append(previous)
        else:
            todo.append(request)

    clients = [clients] if isinstance(clients, HubClient) else list(clients)

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

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(todo) or 1))) as pool:
        outcomes = list(pool.map(attempt, todo))
    resolved = [o for o in outcomes if isinstance(o, LockedRepo)]
    failures = tuple(o for o in outcomes if isinstance(o, LockFailure))
    return PinResult(
        lock=Lockfile(repos=tuple(kept + resolved)),
        resolved=tuple(r.request.spec for r in resolved),
        kept=tuple(r.request.spec for r in kept),
        failures=failures,
    )

