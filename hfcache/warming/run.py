"""``hfcache warm``'s one core function, :func:`run`: repos by name, or exactly what a lock pins (``--lock``). On a
cache that holds the lock it costs ``stat`` calls only (huggingface_hub is imported only when something is missing).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from ..cache.root import refuse_misplaced_cache, resolve_cache_dir
from ..errors import CheckFailed, UsageError
from ..records import HubOptions, NoProgress, ProgressSink, RepoResult, WarmedFile, WarmReport, WarmRequest
from .lockfile import CacheStatus, Lockfile, cache_statuses, drift, lock_cache_dir, lock_manifest, read_lock
from .manifest import with_manifest_endpoints


@dataclass(frozen=True)
class WarmJob:
    """What ``hfcache warm`` was asked: ``specs`` (``REPO_ID[@REVISION]``) with ``kind``, ``include``, ``exclude``,
    ``repo_type``; or a ``lock_file`` to install exactly, its ``manifest`` (default: beside the lock, optional unless
    given or ``locked``: refuse a lock out of date, exit 1), ``trust_manifest_endpoint``; the ``cache_dir`` (a lock's
    default: its manifest's); ``hub`` (its endpoints override a manifest's); ``lock_timeout`` (seconds)."""

    specs: tuple[str, ...] = ()
    kind: str = "tokenizer"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    repo_type: str = "model"
    lock_file: str | None = None
    manifest: str | None = None
    locked: bool = False
    trust_manifest_endpoint: bool = False
    cache_dir: str | None = None
    hub: HubOptions = field(default_factory=HubOptions)
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT


def run(job: WarmJob, *, progress: ProgressSink | None = None, on_lock_wait: Callable[[LockWait], None] | None = None,
        on_notice: Callable[[str], None] | None = None) -> WarmReport:
    """Warm what ``job`` asks (``hfcache warm``); a failed repo never stops the others. ``progress`` gets ``planned``
    first; the callbacks: as :func:`.orchestrate.warm`. Returns a WarmReport (a lock's in lock order) with each ok
    repo's selection notes and the run's warnings (a lock that drifted, a root umask hiding the cache from others).
    Raises UsageError: REPO_IDs and ``--lock``, lock options without it, nothing to warm, a malformed spec, lock or
    manifest, an unreadable token file; CheckFailed: ``locked`` and the lock drifted; CacheError: the cache is
    misplaced (an ``HF_HOME``, a repo folder) or cannot be written."""
    hub = job.hub.read_token()
    sink = progress or NoProgress()
    locking = {"lock_timeout": job.lock_timeout, "on_lock_wait": on_lock_wait, "on_notice": on_notice}
    drifted = None
    if job.lock_file:
        if job.specs:
            raise UsageError("give REPO_ID arguments or --lock, not both",
                             hint="add the repos to the manifest and run `hfcache lock`, or drop --lock")
        lock = read_lock(job.lock_file)
        found = lock_manifest(job.lock_file, job.manifest, required=job.locked)
        problems = drift(found, lock) if found is not None else ()
        if problems:
            drifted = (f"{job.lock_file} is out of date with {found.path}: {problems[0]}"
                       + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            if job.locked:
                raise CheckFailed(drifted, hint="run `hfcache lock` and commit the new lock")
            drifted += ("; installed the lock as written (run `hfcache lock` to update it, or --locked to refuse a "
                        "lock that drifted)")
        root = lock_cache_dir(job.lock_file, job.cache_dir, manifest=found)
        hub = with_manifest_endpoints(hub, found.endpoints if found else (), job.trust_manifest_endpoint)
        refuse_misplaced_cache(resolve_cache_dir(root))
        report = warm_lock(lock, hub, cache_dir=root, progress=sink, **locking)
    else:
        if job.locked or job.manifest or job.trust_manifest_endpoint:
            raise UsageError("--locked, --manifest and --trust-manifest-endpoint go with --lock",
                             hint="add --lock hfcache.lock")
        if not job.specs:
            raise UsageError("nothing to warm", hint="give REPO_ID arguments or --lock FILE")
        requests = [WarmRequest.parse(spec, repo_type=job.repo_type, kind=job.kind, include=tuple(job.include),
                                      exclude=tuple(job.exclude)) for spec in job.specs]
        warm_repos = _network()
        root = resolve_cache_dir(job.cache_dir)
        refuse_misplaced_cache(root)
        sink.planned(str(root), requests, ())
        report = warm_repos(requests, hub, cache_dir=job.cache_dir, progress=sink, **locking)
    return _with_warnings(report, drifted)


def warm_lock(lock: Lockfile, hub: HubOptions, *, cache_dir: str | Path | None = None,
              progress: ProgressSink | None = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
              on_lock_wait: Callable[[LockWait], None] | None = None,
              on_notice: Callable[[str], None] | None = None, clients: Sequence | None = None) -> WarmReport:
    """Make ``cache_dir`` hold exactly what ``lock`` pins: repos the cache satisfies (sizes only) cost no request, the
    others are downloaded by commit (from ``clients`` when given, else ``hub``'s endpoints). Returns a WarmReport in
    lock order; raises as :func:`.orchestrate.warm`."""
    started = time.monotonic()
    root = resolve_cache_dir(cache_dir)
    statuses = cache_statuses(lock, root)
    results: list[RepoResult | None] = [_satisfied_result(s) if s.satisfied else None for s in statuses]
    sink = progress or NoProgress()
    sink.planned(str(root), [r.request for r in lock.repos], [r for r in results if r is not None])
    todo = [s.repo for s in statuses if not s.satisfied]
    endpoints = hub.named()  # as a report names them (none is asked anything when the cache satisfies the lock)
    if todo:
        report = _network()([r.request for r in todo], hub, cache_dir=root, progress=sink, pinned=todo,
                            lock_timeout=lock_timeout, on_lock_wait=on_lock_wait, on_notice=on_notice,
                            clients=clients)
        endpoints = report.endpoints
        fetched = iter(report.repos)
        results = [r if r is not None else next(fetched) for r in results]
    return WarmReport(cache_dir=str(root), repos=tuple(r for r in results if r is not None),
                      seconds=time.monotonic() - started, endpoints=endpoints)


def _network():
    """:func:`.orchestrate.warm_repos`, huggingface_hub imported only now (hub/session.py)."""
    from ..hub.session import prepare_session

    prepare_session()
    from .orchestrate import warm_repos

    return warm_repos


def _satisfied_result(status: CacheStatus) -> RepoResult:
    """A repo the cache already holds: no request was made, so no endpoint is named."""
    repo = status.repo
    return RepoResult(request=repo.request, endpoint=None, canonical_id=repo.canonical_id,
                      commit_hash=repo.commit_hash, absent=repo.absent, metadata="lock",
                      files=tuple(WarmedFile(f.path, f.size, f.hash, "cached") for f in repo.files))


def _with_warnings(report: WarmReport, drifted: str | None) -> WarmReport:
    """``report`` with each ok repo's selection notes and the run's warnings (``drifted``, a root umask)."""
    warnings: list[str] = [drifted] if drifted else []
    repos = []
    for r in report.repos:
        req = r.request
        if r.ok and (req.kind == "model" or req.include):
            from .selection import selection_notes

            r = dataclasses.replace(r, notes=r.notes + selection_notes(req.kind, req.include, req.exclude,
                                                                       [f.path for f in r.files]))
        repos.append(r)
    mask = process_umask() or 0
    if os.geteuid() == 0 and mask & 0o044 and report.bytes_downloaded:
        warnings.append(f"umask {mask:04o}: what this warm wrote into {report.cache_dir} is unreadable by other users "
                        "(a pod's non-root uid cannot load it); warm under `umask 022`, or fix it now: "
                        f"chmod -R a+rX {report.cache_dir}")
    return dataclasses.replace(report, repos=tuple(repos), warnings=tuple(warnings))


def process_umask() -> int | None:
    """This process's umask, or None: ``/proc/self/status`` ``Umask:`` (Linux 4.7+), else ``os.umask`` set and restored
    at once (no read-only call; a file created meanwhile gets ``0o077``, never looser)."""
    with suppress(OSError, ValueError, IndexError), open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    try:
        previous = os.umask(0o077)
    except (OSError, AttributeError):
        return None
    os.umask(previous)
    return previous
