"""repair: fix exactly what :func:`hfcache.integrity.verify.verify_cache` found broken, and nothing else.

- A malformed ref whose content is a commit plus whitespace (a hand-written trailing newline) is rewritten.
- An absolute or escaping snapshot link whose target is a healthy blob of the repo is rewritten as the relative
  link huggingface_hub writes.
- Broken content (a blob whose hash does not match its name, a blob that is a symlink or not a file, a link to a
  missing blob, a file the lock lists but the snapshot lacks, a snapshot entry that differs from the lock) is
  downloaded again from the endpoint at the snapshot's commit, hashed, and published in huggingface_hub's order
  (blob renamed into place, then the link). A link whose file the endpoint says no longer exists is removed.
- A corrupt blob no snapshot uses is removed.

Healthy blobs and links are never rewritten; a repo blob that is huggingface_hub 2.4's link into the shared Xet
store (exact shape, marked store, regular payload) is a healthy blob and stays a link. A broken one (a corrupt or
missing payload, a refused store) is downloaded again into a regular blob, replacing the link itself (``os.replace``,
never written through); the store's payload is left to the library. Each repo is repaired under the same repo lock warm takes.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from ..cache import safefs
from ..cache.layout import RepoFolder
from ..cache.published import remove_record
from ..cache.root import cache_error, symlinks_supported
from ..hub.retry import RetryCounter
from ..errors import HfcacheError, RevisionNotFound
from ..cache.locking import DEFAULT_LOCK_TIMEOUT
from ..hub.client import HubClient
from ..hub.files import RemoteFile, RepoRevision
from ..hub.transfer import Slots, TransferOptions, download_blob
from ..warming.lockfile import Lockfile
from ..records import folder_ids
from ..cache.scan import parse_folder_name, scan_repo
from .hashing import HashProgress, algorithm_of
from .verify import verify_cache
from .verify_report import Problem, VerifyReport

_REPAIR_CONNECTIONS = 4  # ranges of one large blob fetched at once
_CONTENT_KINDS = {"blob_mismatch", "blob_not_file", "link_broken", "file_missing", "file_mismatch"}


@dataclass(frozen=True)
class RepairAction:
    """One thing repair did or could not do.

    Attributes:
        repo_id (str), revision (str), path (str): what it concerns (as in
            :class:`hfcache.integrity.verify_report.Problem`).
        action (str): ``rewrote ref``, ``relinked``, ``downloaded``, ``removed link``, ``removed blob``,
            ``removed record`` (warm's record past its bounds), or ``failed``.
        detail (str): one line for people.
    """

    repo_id: str
    revision: str
    path: str
    action: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.action != "failed"


def repair(
    report: VerifyReport,
    *,
    client: HubClient | None,
    lock: Lockfile | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_lock_wait=None,
) -> tuple[RepairAction, ...]:
    """Repair the integrity errors of ``report`` in place.

    Args:
        report: a verify report of the cache to repair.
        client: the endpoint to download from (None: only offline repairs: refs and links).
        lock: when given, downloaded files must also match the lock's hashes.
        lock_timeout: seconds to wait at most for a repo's or blob's lock; a repo whose lock stays held is a
            ``failed`` action naming the lock.
        on_lock_wait: called with a :class:`hfcache.cache.locking.LockWait` when a wait lasts a few seconds.

    Returns:
        The actions taken, sorted; a ``failed`` action names what could not be fixed and why.
    """
    cache_dir = Path(report.cache_dir)
    by_folder: dict[str, list[Problem]] = defaultdict(list)
    for problem in report.errors:
        by_folder[problem.folder].append(problem)
    actions: list[RepairAction] = []
    symlinks = symlinks_supported(cache_dir)
    for folder_name, problems in sorted(by_folder.items()):
        parsed = parse_folder_name(folder_name)
        if parsed is None:
            continue
        folder = RepoFolder(cache_dir, parsed[0], parsed[1], lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
        try:
            with folder.repo_lock():  # raises UnsafeLayout first for a repo folder with a planted link
                actions.extend(_repair_repo(folder, problems, client, lock, symlinks))
        except OSError as exc:
            actions.append(RepairAction(parsed[0], "", "", "failed", cache_error(exc, folder_name).message))
        except HfcacheError as exc:  # LockTimeout
            actions.append(RepairAction(parsed[0], "", "", "failed", exc.message))
    return tuple(sorted(actions, key=lambda a: (a.repo_id, a.revision, a.path, a.action)))


def _repair_repo(folder: RepoFolder, problems: list[Problem], client: HubClient | None, lock: Lockfile | None,
                 symlinks: bool) -> list[RepairAction]:
    actions: list[RepairAction] = []
    info = scan_repo(folder.root, folder.repo_id, folder.repo_type)
    links = {(rev.commit_hash, f.path): f for rev in info.revisions for f in rev.files}
    bad_blobs = {p.path.removeprefix("blobs/") for p in problems if p.kind in ("blob_mismatch", "blob_not_file")}
    wanted: dict[str, set[str]] = defaultdict(set)  # commit -> paths whose content must be fetched again

    for p in problems:
        if p.kind == "ref_malformed":
            actions.append(_fix_ref(folder, p, {r.commit_hash for r in info.revisions}))
        elif p.kind in ("link_absolute", "link_outside"):
            target = os.readlink(folder.pointer_path(p.revision, p.path))
            etag = os.path.basename(target)
            if p.kind == "link_absolute" and os.path.dirname(target) == str(folder.root / "blobs") \
                    and _healthy_blob(folder, etag) and etag not in bad_blobs:
                folder.link(p.revision, p.path, etag, symlinks=symlinks)
                actions.append(RepairAction(p.repo_id, p.revision, p.path, "relinked",
                                            f"relative link to blobs/{etag[:16]}…"))
            else:
                wanted[p.revision].add(p.path)
        elif p.kind in ("link_broken", "file_missing", "file_mismatch"):
            wanted[p.revision].add(p.path)
        elif p.kind == "ref_dangling":
            actions.append(RepairAction(p.repo_id, p.revision, "", "failed",
                                        "the ref's snapshot is gone; run `hfcache warm` for this revision"))
        elif p.kind == "record_refused":  # past its bounds (planted): removed, never parsed; trees/ checks it now
            remove_record(folder.cache_dir, folder.name, p.revision)
            actions.append(RepairAction(p.repo_id, p.revision, p.path, "removed record",
                                        "warm's record was past its bounds; re-warm the revision to record it again"))

    # Corrupt blobs: every snapshot path that uses one is fetched again; a blob nobody uses is removed.
    for etag in sorted(bad_blobs):
        users = [(commit, path) for (commit, path), f in links.items() if f.etag == etag]
        for commit, path in users:
            wanted[commit].add(path)
        if not users:
            safefs.unlink(folder.cache_dir, (folder.name, "blobs", safefs.check_etag(etag)), missing_ok=True)
            actions.append(RepairAction(folder.repo_id, "", f"blobs/{etag}", "removed blob",
                                        "corrupt and used by no snapshot"))
    for commit, paths in sorted(wanted.items()):
        actions.extend(_refetch(folder, commit, sorted(paths), client, lock, symlinks, bad_blobs))
    return actions


def _healthy_blob(folder: RepoFolder, etag: str) -> bool:
    """Whether ``blobs/<etag>`` is a regular file, or huggingface_hub 2.4's link of the exact shape into the marked
    shared Xet store to a regular payload (:func:`hfcache.cache.safefs.open_blob`; no other link followed): such a
    link is kept, never replaced by a copy."""
    try:
        fd = safefs.open_blob(folder.cache_dir, folder.name, safefs.check_etag(etag))
    except (OSError, HfcacheError):
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _fix_ref(folder: RepoFolder, problem: Problem, snapshots: set[str]) -> RepairAction:
    name = problem.revision.removeprefix("refs/")
    value = (folder.read_ref(name) or b"").decode("utf-8", "replace").strip()
    if algorithm_of(value) == "git-sha1" and value in snapshots:
        folder.write_ref(name, value)
        return RepairAction(problem.repo_id, problem.revision, "", "rewrote ref", f"{name} -> {value}")
    return RepairAction(problem.repo_id, problem.revision, "", "failed",
                        "the ref holds no commit of a cached snapshot; run `hfcache warm` for it")


def _refetch(folder: RepoFolder, commit: str, paths: list[str], client: HubClient | None, lock: Lockfile | None,
             symlinks: bool, bad_blobs: set[str]) -> list[RepairAction]:
    """Download ``paths`` at ``commit`` again (verified) and relink them."""
    if client is None:
        return [RepairAction(folder.repo_id, commit, p, "failed", "needs the endpoint (--endpoint) to re-download")
                for p in paths]
    counter = client.counter()
    try:
        remote = client.resolve(folder.repo_id, commit, folder.repo_type, counter=counter)
        # Same fallbacks as warm: files the listing did not describe get one HEAD each.
        remote = client.describe(remote, [p for p in paths if p in remote.paths], counter)
    except RevisionNotFound:
        return [_remove_link(folder, commit, p, "the endpoint no longer has this commit") for p in paths]
    except HfcacheError as exc:
        return [RepairAction(folder.repo_id, commit, p, "failed", exc.message) for p in paths]
    by_path = remote.by_path
    locked = _locked_files(lock, folder, commit)
    actions = []
    for path in paths:
        file = by_path.get(path)
        if file is None:
            actions.append(_remove_link(folder, commit, path, "the endpoint has no such file at this commit"))
            continue
        if locked is not None and path in locked and locked[path] != file.hash:
            actions.append(RepairAction(folder.repo_id, commit, path, "failed",
                                        f"the endpoint publishes {file.hash}, the lock pins {locked[path]}"))
            continue
        try:
            _download_blob(folder, remote, file, client, counter, force=file.etag in bad_blobs)
            folder.link(commit, path, file.etag, symlinks=symlinks)
        except HfcacheError as exc:
            actions.append(RepairAction(folder.repo_id, commit, path, "failed", exc.message))
            continue
        except OSError as exc:
            actions.append(RepairAction(folder.repo_id, commit, path, "failed", cache_error(exc, path).message))
            continue
        actions.append(RepairAction(folder.repo_id, commit, path, "downloaded",
                                    f"{file.size} bytes, {file.hash[:24]}… verified"))
    return actions


def _download_blob(folder: RepoFolder, repo: RepoRevision, file: RemoteFile, client: HubClient,
                   counter: RetryCounter, force: bool) -> None:
    """Warm's download path (resume, ranges, retries); publishing os.replace()s a corrupt blob or a symlink."""
    with folder.blob_lock(file.etag):
        if not force and folder.blob_ok(file.etag, file.size):
            return
        download_blob(client, folder, repo, file, TransferOptions(slots=Slots(_REPAIR_CONNECTIONS), counter=counter))


def _remove_link(folder: RepoFolder, commit: str, path: str, why: str) -> RepairAction:
    folder.pointer_path(commit, path)  # checks the commit and path
    if safefs.unlink(folder.cache_dir, (folder.name, "snapshots", commit, *path.split("/")), missing_ok=True):
        return RepairAction(folder.repo_id, commit, path, "removed link", why)
    return RepairAction(folder.repo_id, commit, path, "failed", why)


def _locked_files(lock: Lockfile | None, folder: RepoFolder, commit: str) -> dict[str, str] | None:
    for repo in lock.repos if lock else ():
        ids = set(folder_ids(repo.request.repo_id, repo.canonical_id))
        if repo.commit_hash == commit and folder.repo_id in ids and repo.request.repo_type == folder.repo_type:
            return {f.path: f.hash for f in repo.files}
    return None



@dataclass(frozen=True)
class RepairRun:
    """What ``verify --repair`` did.

    Attributes:
        report (VerifyReport): the final verification (after the repair when one ran).
        actions (tuple[RepairAction, ...]): the repairs taken (empty when nothing was broken).
        before (VerifyReport | None): the verification that led to the repair, or None when none was needed.
    """

    report: VerifyReport
    actions: tuple[RepairAction, ...]
    before: VerifyReport | None


def verify_and_repair(
    cache_dir: str | os.PathLike[str],
    repo_ids: Iterable[str] | None,
    *,
    client_factory: Callable[[], HubClient],
    lock: Lockfile | None = None,
    max_workers: int | None = None,
    fast: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_lock_wait=None,
    progress: Callable[[], AbstractContextManager[HashProgress | None]] | None = None,
) -> RepairRun:
    """Verify, repair what is broken, then verify again (``hfcache verify --repair``).

    Args:
        cache_dir, repo_ids, lock, max_workers, fast: as for :func:`hfcache.integrity.verify.verify_cache`.
        client_factory: builds the endpoint client, called only when something needs repairing (no request otherwise).
        lock_timeout, on_lock_wait: as for :func:`repair`.
        progress: returns a fresh progress context for each verification pass (None: no progress).

    Returns:
        RepairRun with the final report, the actions and the report that led to them.
    """
    from contextlib import nullcontext

    new_progress = progress or (lambda: nullcontext(None))
    ids = list(repo_ids) if repo_ids else None
    with new_progress() as sink:
        report = verify_cache(cache_dir, ids, lock=lock, max_workers=max_workers, progress=sink, fast=fast)
    if report.ok:
        return RepairRun(report, (), None)
    actions = repair(report, client=client_factory(), lock=lock, lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
    with new_progress() as sink:
        after = verify_cache(cache_dir, ids, lock=lock, max_workers=max_workers, progress=sink, fast=fast)
    return RepairRun(after, actions, report)
