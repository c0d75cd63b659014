"""``hfcache sync``: make a node cache hold exactly the union of the locks in a folder (a mounted ConfigMap), one pass
at a time (:func:`sync_once`).

A pass reads every ``*.lock`` of the folder, warms what each lock pins that the cache lacks (``warm --lock``'s engine:
from the endpoints, or from a bucket's ``blobs/<etag>`` when ``bucket`` is given, since a lock already names every
file's commit, size and hash), verifies each lock's snapshots (``verify --fast``: a blob hashed right before and
unchanged since is not hashed again), then prunes every revision no lock pins that was not used within the grace
period (``prune --older-than GRACE --keep-lock ...``; last use as docs/ls.md defines it). A lock is *ready* only
when its content is complete and verified; its readiness file (``<ready_dir>/<lock name>.json``) is written after the
check and removed as soon as a pass finds it not ready or the lock gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cache.atomic import atomic_write
from ..cache.root import ensure_cache_root, resolve_cache_dir
from ..errors import HfcacheError, UsageError
from ..records import HubOptions
from ..warming.lockfile import LOCK_NAME, Lockfile, read_lock

MAX_LOCKS = 1000  #: locks one folder may hold
MAX_LOCK_BYTES = 64 * 1024 * 1024
DEFAULT_GRACE = 3600.0  #: seconds an unpinned revision must have gone unused before a pass removes it


@dataclass(frozen=True)
class LockState:
    """One lock of a pass: ``name`` (its file name), ``sha256`` of its bytes, ``repos`` it pins, ``ready`` (complete
    and verified), ``error`` (why not; None when ready), ``exit_code`` (0 when ready)."""

    name: str
    sha256: str
    repos: int
    ready: bool
    error: str | None = None
    exit_code: int = 0


@dataclass(frozen=True)
class SyncReport:
    """One pass of :func:`sync_once`: ``locks`` in name order, ``revisions_removed``/``bytes_freed`` by its prune,
    ``bytes_downloaded``, ``seconds``, ``notes`` (what the prune kept within its grace, warnings)."""

    cache_dir: str
    locks: tuple[LockState, ...]
    revisions_removed: int
    bytes_freed: int
    bytes_downloaded: int
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(lock.ready for lock in self.locks)

    @property
    def exit_code(self) -> int:
        return max((lock.exit_code for lock in self.locks), default=0)

    def as_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def read_locks(folder: str | os.PathLike[str]) -> list[tuple[str, bytes]]:
    """(file name, bytes) of every ``*.lock`` in ``folder`` (and ``hfcache.lock``), sorted by name; names starting
    with ``.`` (a ConfigMap's ``..data`` machinery) are skipped, links followed (a ConfigMap's files are links).
    Raises UsageError (exit 2): not a folder, more than :data:`MAX_LOCKS`, a lock over :data:`MAX_LOCK_BYTES`."""
    path = Path(folder)
    try:
        names = sorted(n for n in os.listdir(path) if not n.startswith(".") and (n.endswith(".lock") or n == LOCK_NAME))
    except OSError as exc:
        raise UsageError(f"--locks {folder}: cannot list it ({exc.strerror})",
                         hint="mount the ConfigMap of locks there") from None
    if len(names) > MAX_LOCKS:
        raise UsageError(f"--locks {folder}: {len(names)} locks, more than {MAX_LOCKS}")
    found = []
    for name in names:
        try:
            with open(path / name, "rb") as f:
                data = f.read(MAX_LOCK_BYTES + 1)
        except IsADirectoryError:
            continue
        except OSError as exc:
            raise UsageError(f"--locks {folder}: cannot read {name} ({exc.strerror})") from None
        if len(data) > MAX_LOCK_BYTES:
            raise UsageError(f"--locks {folder}: {name} is larger than {MAX_LOCK_BYTES} bytes")
        found.append((name, data))
    return found


def sync_once(locks_dir: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None, hub: HubOptions, *,
              bucket: str | None = None, grace: float = DEFAULT_GRACE, ready_dir: str | os.PathLike[str] | None = None,
              lock_timeout: float = 10.0, prune: bool = True) -> SyncReport:
    """One pass (see the module docstring). ``bucket``: ``s3://BUCKET/PREFIX`` to take file bodies from (as
    ``push s3://`` lays them out) instead of ``hub``'s endpoints; ``grace``: seconds; ``prune`` False: nothing removed.

    A lock that cannot be read or warmed is not ready (its error in the report); the other locks go on. The prune
    runs only when every lock could be read (a lock missing from the union must not make its repos look unpinned).

    Raises:
        UsageError: ``locks_dir`` unreadable, ``ready_dir`` inside the cache, a bad bucket URL, no boto3 or
            credentials for a bucket.
        CacheError: the cache cannot be created or written.
    """
    from ..move.destination import refuse_dest_inside
    from ..warming.run import warm_lock

    started = time.monotonic()
    root = resolve_cache_dir(cache_dir)
    ensure_cache_root(root)
    if ready_dir is not None:  # written by path: never below the cache root (a group member could swap it)
        refuse_dest_inside(root, ready_dir, "sync --ready-dir")
    clients = _bucket_clients(bucket, hub) if bucket else None
    states, pinned, downloaded = [], [], 0
    for name, data in read_locks(locks_dir):
        digest = hashlib.sha256(data).hexdigest()
        try:
            lock = read_lock(Path(locks_dir) / name, data)  # the bytes hashed: a ConfigMap swap cannot split them
        except HfcacheError as exc:
            states.append(LockState(name, digest, 0, False, exc.message, exc.exit_code))
            continue
        pinned.append(lock)
        state, received = _sync_lock(name, digest, lock, root, hub, clients, lock_timeout, warm_lock)
        states.append(state)
        downloaded += received
    removed, freed, notes = (0, 0, ())
    if prune and all(s.error is None or s.exit_code != 2 for s in states):
        removed, freed, notes = _prune(root, pinned, grace, lock_timeout)
    if ready_dir is not None:
        _write_readiness(Path(ready_dir), states)
    return SyncReport(cache_dir=str(root), locks=tuple(states), revisions_removed=removed, bytes_freed=freed,
                      bytes_downloaded=downloaded, seconds=time.monotonic() - started, notes=tuple(notes))


def _bucket_clients(bucket: str, hub: HubOptions) -> list:
    """The one client of a bucket's blobs (presigned GETs), as ``pull s3://`` makes it."""
    from ..bucket.layout import blob_key
    from ..bucket.store import Bucket, parse_bucket_url
    from ..hub.bodies_client import BodiesClient
    from ..hub.session import prepare_session

    store = Bucket(parse_bucket_url(bucket), timeout=hub.timeout, retries=hub.retries, max_workers=hub.max_workers)
    prepare_session()
    return [BodiesClient(str(store.url), lambda etag: store.presigned_get(blob_key(store.url, etag)),
                         timeout=hub.timeout, retries=hub.retries,
                         missing_hint="push the lock's repos to the bucket (hfcache push s3://... --lock FILE)")]


def _sync_lock(name: str, digest: str, lock: Lockfile, root: Path, hub: HubOptions, clients, lock_timeout: float,
               warm_lock) -> tuple[LockState, int]:
    """Warm ``lock`` into ``root``, then verify its snapshots: its state and the bytes downloaded."""
    from ..integrity.verify import verify_cache

    report = warm_lock(lock, hub, cache_dir=root, lock_timeout=lock_timeout, clients=clients)
    received = sum(r.bytes_downloaded for r in report.repos)
    failed = [r for r in report.repos if not r.ok]
    if failed:
        return LockState(name, digest, len(lock.repos), False, failed[0].error, failed[0].exit_code or 1), received
    specs = sorted({f"{r.request.repo_id}@{r.commit_hash}" for r in lock.repos})
    verified = verify_cache(root, specs, lock=lock, fast=True)
    if not verified.ok:
        problem = verified.errors[0]
        return LockState(name, digest, len(lock.repos), False, f"{problem.repo_id}: {problem.path}: {problem.detail}",
                         1), received
    return LockState(name, digest, len(lock.repos), True), received


def _prune(root: Path, pinned: list[Lockfile], grace: float, lock_timeout: float) -> tuple[int, int, list[str]]:
    """Remove the revisions no lock pins and unused for ``grace`` seconds: (revisions, bytes freed, notes)."""
    from ..prune import execute, plan_prune

    plan = plan_prune(root, older_than=grace, keep_locks=pinned, grace=min(grace, DEFAULT_GRACE))
    result = execute(plan, lock_timeout=lock_timeout)
    revisions = len({(o.item.folder, o.item.revision) for o in result.outcomes
                     if o.status == "removed" and o.item.kind == "snapshot"})
    return revisions, result.bytes_freed, list(plan.warnings)


def _write_readiness(folder: Path, states: list[LockState]) -> None:
    """``<folder>/<lock name>.json`` for each ready lock (written atomically), removed for the others; files of
    locks no longer listed are removed too."""
    folder.mkdir(parents=True, exist_ok=True)
    ready = {f"{s.name}.json": s for s in states if s.ready}
    for entry in os.listdir(folder):
        if entry.endswith(".lock.json") and entry not in ready:
            (folder / entry).unlink(missing_ok=True)
    for file_name, state in ready.items():
        document = {"lock": state.name, "sha256": state.sha256, "repos": state.repos, "ready": True}
        atomic_write(folder / file_name, (json.dumps(document, sort_keys=True) + "\n").encode())
