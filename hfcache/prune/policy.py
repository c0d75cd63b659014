"""prune's policy: which revisions go, and why (pins, detached, age, size budget), as one frozen :class:`PrunePlan`
(the order: :mod:`hfcache.prune`); what each removal implies is :mod:`.inventory`'s business.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ..cache.root import access_error, describe_cache_dir, resolve_cache_dir
from ..cache.scan import RepoInfo, RevisionInfo, scan_cache
from ..errors import CacheError, UsageError
from ..units import format_duration
from ..warming.lockfile import Lockfile, pinned_revisions, read_lock
from .housekeeping import age, empty_folder, housekeeping, lock_items
from .inventory import Ledger, RepoBook
from .plan import DEFAULT_GRACE, KINDS, GraceKept, KeepSpec, PrunePlan, PrunePolicy


def plan_prune(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    older_than: float | None = None,
    max_size: int | None = None,
    keep: Iterable[str | KeepSpec] = (),
    keep_locks: Iterable[str | os.PathLike[str] | Lockfile] = (),
    grace: float = DEFAULT_GRACE,
    now: float | None = None,
    missing_ok: bool = False,
    superseded: bool = False,
) -> PrunePlan:
    """Compute what a prune removes, from metadata only (no hashing, no writes, no network).

    Args:
        cache_dir: the cache root (default: ``HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``).
        older_than: seconds; unpinned revisions whose last use is older go. max_size: bytes; then least-recently-
            used unpinned revisions go until the cache is at most this. None: no such policy.
        keep: ``REPO_ID[@REVISION]`` (or KeepSpec) pinned: every revision of the repo, or the one a ref name or
            40-hex commit names. keep_locks: lock file paths (or Lockfile): every revision they pin, in every repo
            folder holding that commit (a legacy id and its canonical repo).
        grace: seconds (see :class:`PrunePolicy`). now: the time ages are measured against (default: now).
        missing_ok: a missing ``cache_dir`` is an empty plan with a warning (``prune --missing-ok``).
        superseded: a detached revision of a repo whose refs name another revision goes at once, not after ``grace``
            (``prune --superseded``).

    Returns a PrunePlan (``kept``: what only the grace period keeps; an existing empty folder: an empty plan with
    ``empty`` set).

    Raises:
        UsageError: a malformed ``keep`` spec, an unreadable or invalid lock, a negative duration or size.
        CacheError: (exit 5) ``cache_dir`` does not exist, is a file, is no hub cache
            (:func:`hfcache.cache.root.describe_cache_dir`: an ``HF_HOME`` names its ``hub``), or cannot be listed.
    """
    policy, locks = _policy(older_than, max_size, keep, keep_locks, grace)
    policy = replace(policy, superseded=superseded)
    root = resolve_cache_dir(cache_dir)
    now = time.time() if now is None else now
    kind = _cache_kind(root, missing_ok)
    if kind == "missing":  # --missing-ok: a CronJob scheduled before the first warm
        return _plan(str(root), (), 0, policy, locks, now, warnings=(f"no cache at {root} (nothing to prune)",))
    if kind == "empty":
        return replace(_plan(str(root), (), 0, policy, locks, now), empty=True)
    return _plan_cache(root, policy, locks, now)


def _cache_kind(root: Path, missing_ok: bool) -> str:
    """``"cache"``, ``"empty"`` or (with ``missing_ok``) ``"missing"``; CacheError as :func:`plan_prune`."""
    try:
        os.lstat(root)
    except FileNotFoundError:
        # A mistyped --cache-dir must not exit 0 ("nothing to prune"): a fresh volume is an existing, empty folder.
        if missing_ok:
            return "missing"
        raise CacheError(f"the cache {root} does not exist: nothing was pruned",
                         hint="check --cache-dir (or HF_HUB_CACHE/HF_HOME); a job that may run before the first "
                              "warm: add --missing-ok") from None
    except PermissionError:  # exists or not, this user cannot tell: never "no cache"
        raise access_error(root) from None
    except NotADirectoryError:
        pass
    if not os.path.isdir(root):
        raise CacheError(f"{root} is not a directory", hint="pass the cache root as --cache-dir")
    found = describe_cache_dir(root)  # never delete in a folder that is not a cache (an HF_HOME: DIR/hub is)
    if not found.is_cache:
        raise found.error()
    return found.kind


def _policy(older_than: float | None, max_size: int | None, keep: Iterable[str | KeepSpec],
            keep_locks: Iterable[str | os.PathLike[str] | Lockfile],
            grace: float) -> tuple[PrunePolicy, list[tuple[str, Lockfile]]]:
    if older_than is not None and older_than < 0:
        raise UsageError(f"--older-than must not be negative, got {older_than}")
    if max_size is not None and max_size < 0:
        raise UsageError(f"--max-size must not be negative, got {max_size}")
    specs = tuple(k if isinstance(k, KeepSpec) else KeepSpec.parse(k) for k in keep)
    locks = [("<lock>", lock) if isinstance(lock, Lockfile) else (str(lock), read_lock(lock)) for lock in keep_locks]
    policy = PrunePolicy(older_than=older_than, max_size=max_size, keep=specs,
                         keep_locks=tuple(name for name, _ in locks), grace=grace)
    return policy, locks


def _plan_cache(root: Path, policy: PrunePolicy, locks: Sequence[tuple[str, Lockfile]], now: float) -> PrunePlan:
    """Scan the cache directory ``root`` and plan over the repos this user can read that hold no planted link."""
    with _gc_paused():
        info = scan_cache(root)
        # A repo folder with a planted link (blobs/, refs/, snapshots/, .locks/<folder> ...) is left alone whole:
        # deleting "its" orphan blobs would delete whatever the link points to.
        readable = tuple(r for r in info.repos if not r.unreadable and not r.unsafe)
        denied = tuple(f"{r.folder}/{part}" for r in info.repos for part in r.unreadable)
        unsafe = tuple(f"{r.folder}: left alone: {'; '.join(r.unsafe)}" for r in info.repos if r.unsafe)
        plan = _plan(str(root), readable, info.size_on_disk, policy, locks, now,
                     warnings=unsafe + tuple(f"left alone: {d} cannot be read by this user (permission denied)"
                                             for d in denied))
        return replace(plan, unreadable=denied)


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while a cache is scanned and planned: it would traverse ~10 objects per file
    again and again to find no cycle (a third of the time on a 10,000-repo cache)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _plan(root: str, repos: Sequence[RepoInfo], size_on_disk: int, policy: PrunePolicy,
          locks: Sequence[tuple[str, Lockfile]], now: float, warnings: Sequence[str] = ()) -> PrunePlan:
    """The policy over a scanned cache, in order: housekeeping, detached, age, budget; then what follows."""
    ledger = Ledger(root, repos, size_on_disk, now, policy.grace)
    pinned_commits, pin_warnings = _pins(ledger.repos, policy.keep, locks)
    ledger.warnings = [*warnings, *pin_warnings]
    pinned = []
    pinned_inodes: dict[tuple[int, int], int] = {}
    candidates: list[tuple[RepoBook, RevisionInfo]] = []
    for repo in ledger.repos:
        for rev in repo.info.revisions:
            if rev.commit_hash in pinned_commits:
                pinned.append((repo.info.repo_type, repo.info.repo_id, rev.commit_hash))
                pinned_inodes.update((f.inode, f.size) for f in rev.files if f.inode is not None)
            else:
                candidates.append((repo, rev))
    # 1. housekeeping: orphan blobs, stale partial downloads, leftovers of an interrupted prune
    for repo in ledger.repos:
        if repo.detailed:
            housekeeping(ledger, repo)
    ledger.orphan_payloads()
    _remove_revisions(ledger, policy, candidates)
    repos_removed = 0
    for repo in ledger.repos:
        if repo.detailed:
            lock_items(ledger, repo)
            repos_removed += empty_folder(ledger, repo)
    ledger.payload_items()
    return _finish(ledger, policy, pinned, sum(pinned_inodes.values()), repos_removed)


def _remove_revisions(ledger: Ledger, policy: PrunePolicy,
                      candidates: Sequence[tuple[RepoBook, RevisionInfo]]) -> None:
    """Steps 2 to 4 of the policy over the unpinned revisions: detached, older than, over budget."""
    # 2. detached revisions (not those used within the grace period: huggingface_hub creates the snapshot folder
    # of a download by commit hash, which has no ref, before its first file arrives), unless --superseded names
    # them: no ref names them any more, another revision has the repo's refs (the executor skips one a ref names
    # by then, under the repo lock: a warm publishing it holds that lock)
    graced = []
    for repo, rev in candidates:
        if repo.refs_to.get(rev.commit_hash):
            continue
        if policy.superseded and any(refs for commit, refs in repo.refs_to.items() if commit != rev.commit_hash):
            ledger.remove_revision(repo, rev, "superseded", "no ref names it any more (--superseded: no grace)")
        elif rev.last_used < ledger.now - policy.grace:
            ledger.remove_revision(repo, rev, "detached", "no ref points to it")
        else:
            graced.append((repo, rev))
    # 3. age
    if policy.older_than is not None:
        cutoff = ledger.now - policy.older_than
        for repo, rev in candidates:
            if rev.commit_hash not in repo.removed and rev.last_used < cutoff:
                ledger.remove_revision(repo, rev, "older_than",
                                       f"not used for more than {format_duration(policy.older_than)}")
    # 4. size, least recently used first
    max_size = policy.max_size
    if max_size is not None and ledger.bytes_before - ledger.freed > max_size:
        order = sorted(candidates, key=lambda c: (c[1].last_used, c[0].info.repo_type, c[0].info.repo_id.lower(),
                                                  c[1].commit_hash))
        for repo, rev in order:
            if ledger.bytes_before - ledger.freed <= max_size:
                break
            if rev.commit_hash not in repo.removed:
                ledger.remove_revision(repo, rev, "over_budget",
                                       "least recently used while the cache is over --max-size")
    for repo, rev in graced:
        if rev.commit_hash not in repo.removed:
            ledger.kept.append(GraceKept(
                repo.info.repo_id, repo.info.repo_type, "revision", f"{repo.info.folder}/snapshots/{rev.commit_hash}",
                rev.commit_hash, rev.last_used, f"detached (no ref), used {age(ledger.now - rev.last_used)} ago: "
                f"kept for the {age(policy.grace)} grace (a download may be running)"
                + ("; --superseded removes it" if any(repo.refs_to.values()) else "")))


def _finish(ledger: Ledger, policy: PrunePolicy, pinned: list[tuple[str, str, str]], bytes_pinned: int,
            repos_removed: int) -> PrunePlan:
    """The frozen plan: items grouped by folder in execution order, and the warnings about what stays."""
    max_size = policy.max_size
    kept = ledger.bytes_before - ledger.freed
    if max_size is not None and kept > max_size:
        ledger.warnings.append(
            f"cannot reach --max-size {max_size} bytes: the cache stays at {kept} bytes; pinned revisions hold "
            f"{bytes_pinned} bytes" + (" and live downloads or outside hardlinks hold the rest"
                                      if kept > bytes_pinned else ""))
    if ledger.outside_kept:
        ledger.warnings.append(f"{ledger.outside_kept} bytes stay on disk: removed blobs are hardlinked outside the "
                               "cache")
    order_of = {kind: i for i, kind in enumerate(KINDS)}
    items = [item for repo in sorted(ledger.repos, key=lambda r: r.info.folder) if repo.items
             for item in sorted(repo.items, key=lambda i: order_of[i.kind])] + ledger.store_items
    return PrunePlan(
        cache_dir=ledger.root,
        now=ledger.now,
        policy=policy,
        items=tuple(items),
        revisions=tuple(ledger.removals),
        pinned=tuple(sorted(pinned)),
        repos_before=len(ledger.repos),
        revisions_before=sum(len(r.info.revisions) for r in ledger.repos),
        repos_removed=repos_removed,
        bytes_before=ledger.bytes_before,
        bytes_freed=sum(i.bytes_freed for i in items),
        bytes_pinned=bytes_pinned,
        warnings=tuple(ledger.warnings),
        kept=tuple(sorted(ledger.kept, key=lambda k: k.path)),
    )


def _pins(repos: Sequence[RepoBook], keep: Sequence[KeepSpec],
          locks: Sequence[tuple[str, Lockfile]]) -> tuple[set[str], list[str]]:
    """Pinned commit hashes, and warnings for pins that match nothing."""
    commits: set[str] = set()
    warnings = []
    present = {(r.info.repo_type, r.info.repo_id, rev.commit_hash) for r in repos for rev in r.info.revisions}
    for name, lock in locks:
        pins = pinned_revisions(lock)
        commits |= {c for _, _, c in pins}
        missing = pins - present
        if missing:
            shown = ", ".join(sorted(f"{i}@{c[:12]}" for _, i, c in missing)[:3])
            warnings.append(f"--keep-lock {name}: {len(missing)} pinned revision(s) not in the cache ({shown}"
                            + (", ..." if len(missing) > 3 else "") + ")")
    by_id: dict[str, list[RepoBook]] = {}
    for repo in repos:
        by_id.setdefault(repo.info.repo_id, []).append(repo)
    for spec in keep:
        matches = by_id.get(spec.repo_id, [])
        if not matches:
            warnings.append(f"--keep {spec}: no such repo in the cache")
            continue
        found = False
        for repo in matches:
            for rev in repo.info.revisions:
                if spec.revision is None or spec.revision == rev.commit_hash \
                        or spec.revision in repo.refs_to.get(rev.commit_hash, ()):
                    commits.add(rev.commit_hash)
                    found = True
        if not found:
            warnings.append(f"--keep {spec}: no revision or ref {spec.revision!r} of {spec.repo_id} in the cache")
    return commits, warnings
