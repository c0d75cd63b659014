"""repair: fix exactly what :func:`hfcache.integrity.verify.verify_cache` found broken, and nothing else.

A ref holding a commit plus whitespace is rewritten; an absolute snapshot link to a healthy blob of the repo is
rewritten as huggingface_hub's relative link; broken content is downloaded again at the snapshot's commit, hashed,
and published in huggingface_hub's order (blob, then link); a link whose file the endpoint no longer has is removed;
a corrupt blob no snapshot uses is removed. A healthy link into the shared Xet store stays a link; a broken one is
replaced by a regular blob. Each repo is repaired under warm's repo lock; where from: :class:`RepairEndpoints`.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from ..cache import safefs
from ..cache.layout import RepoFolder
from ..cache.locking import DEFAULT_LOCK_TIMEOUT
from ..cache.published import RecordRefused, read_record, remove_record
from ..cache.root import cache_error, symlinks_supported
from ..cache.scan import parse_folder_name, scan_repo
from ..errors import HfcacheError, HubError, OfflineViolation, RevisionNotFound
from ..hub.client import DEFAULT_ENDPOINT, HubClient
from ..hub.files import RemoteFile, RepoRevision
from ..hub.retry import RetryCounter
from ..hub.slots import Slots
from ..hub.transfer import TransferOptions, download_blob
from ..hub.urls import origin
from ..names import is_commit
from ..records import HubOptions, folder_ids
from ..warming.lockfile import Lockfile
from ..warming.orchestrate import user_client
from .verify import HashProgress, verify_cache
from .verify_report import Problem, VerifyReport

_REPAIR_CONNECTIONS = 4  # ranges of one large blob fetched at once
_UNSERVED_CODES = (HubError.exit_code, OfflineViolation.exit_code)  # no endpoint could serve it: 3 network, 4 offline


@dataclass(frozen=True)
class RepairAction:
    """One thing repair did or could not do: ``repo_id``, ``revision``, ``path`` as in :class:`.verify_report.Problem`;
    ``action``: ``rewrote ref``, ``relinked``, ``downloaded``, ``removed link``, ``removed blob``, ``removed record``
    or ``failed``; ``detail``: one line; ``exit_code``: :func:`_cause`'s."""

    repo_id: str
    revision: str
    path: str
    action: str
    detail: str
    exit_code: int = 0

    @property
    def ok(self) -> bool:
        return self.action != "failed"


class RepairEndpoints:
    """Which endpoints repair asks for a revision, in order, and which get the token. ``user``: the endpoint the
    user configured (``--endpoint``, else ``HF_ENDPOINT``, else the public Hub) with the user's token; ``given``:
    named with ``--endpoint``, it serves every revision whatever the cache's records say."""

    def __init__(self, user: HubClient, given: bool) -> None:
        self.user = user
        self.given = given
        self._clients: dict[str, HubClient] = {user.endpoint: user}

    def for_revision(self, recorded: str | None) -> list[HubClient]:
        """The clients to try, in order, for a revision whose warm record names ``recorded`` (None: no usable
        record): ``[--endpoint]``; else ``[recorded, HF_ENDPOINT]`` (``HF_ENDPOINT`` only when set and another);
        else ``[HF_ENDPOINT or the public Hub]``. A recorded endpoint (anyone who can write the cache writes it)
        gets the token only on the origin of ``HF_ENDPOINT`` or of the public Hub (as a manifest's endpoint:
        :func:`hfcache.warming.manifest.withheld_endpoints`)."""
        if self.given or not recorded:
            return [self.user]
        order = [recorded]
        if os.environ.get("HF_ENDPOINT") and self.user.endpoint != recorded:
            order.append(self.user.endpoint)
        return [self._client(e) for e in order]

    def _client(self, endpoint: str) -> HubClient:
        if endpoint not in self._clients:
            bound = {origin(DEFAULT_ENDPOINT)} | ({origin(os.environ["HF_ENDPOINT"])}
                                                  if os.environ.get("HF_ENDPOINT") else set())
            self._clients[endpoint] = self.user.sibling(endpoint, with_token=origin(endpoint) in bound)
        return self._clients[endpoint]


def repair(report: VerifyReport, *, endpoints: RepairEndpoints, lock: Lockfile | None = None,
           lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_lock_wait=None) -> tuple[RepairAction, ...]:
    """Repair the integrity errors of ``report`` in place; the actions taken, sorted (a ``failed`` one says why).
    ``endpoints``: which to ask per revision; ``lock``: downloads must match its hashes too; ``lock_timeout``: seconds
    to wait at most for a repo's or blob's lock (a repo whose lock stays held is a ``failed`` action naming it);
    ``on_lock_wait``: called with a :class:`hfcache.cache.locking.LockWait`."""
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
                actions.extend(_repair_repo(folder, problems, endpoints, lock, symlinks))
        except OSError as exc:
            actions.append(RepairAction(parsed[0], "", "", "failed", cache_error(exc, folder_name).message))
        except HfcacheError as exc:  # LockTimeout
            actions.append(RepairAction(parsed[0], "", "", "failed", exc.message))
    return tuple(sorted(actions, key=lambda a: (a.repo_id, a.revision, a.path, a.action)))


def _repair_repo(folder: RepoFolder, problems: list[Problem], endpoints: RepairEndpoints,
                 lock: Lockfile | None, symlinks: bool) -> list[RepairAction]:
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
        actions.extend(_refetch(folder, commit, sorted(paths), endpoints, lock, symlinks, bad_blobs))
    return actions


def _healthy_blob(folder: RepoFolder, etag: str) -> bool:
    """Whether ``blobs/<etag>`` is a regular file, or a shared Xet store link to a regular payload
    (:func:`hfcache.cache.safefs.open_blob`; no other link followed): such a link is kept, never replaced by a copy."""
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
    if is_commit(value) and value in snapshots:
        folder.write_ref(name, value)
        return RepairAction(problem.repo_id, problem.revision, "", "rewrote ref", f"{name} -> {value}")
    return RepairAction(problem.repo_id, problem.revision, "", "failed",
                        "the ref holds no commit of a cached snapshot; run `hfcache warm` for it")


def _resolve_anywhere(folder: RepoFolder, commit: str, paths: list[str],
                      clients: list[HubClient]) -> tuple[HubClient, RepoRevision, RetryCounter]:
    """(client, listing, retry counter) of the first of ``clients`` that resolves ``commit`` and describes
    ``paths`` (a Hub-side failure moves on, as warm does). HubError: the last one's, naming the others' answers."""
    failures: list[str] = []
    for n, client in enumerate(clients):
        counter = client.counter()
        try:
            remote = client.resolve(folder.repo_id, commit, folder.repo_type, counter=counter)
            # Same fallbacks as warm: files the listing did not describe get one HEAD each.
            return client, client.describe(remote, [p for p in paths if p in remote.paths], counter), counter
        except HubError as exc:
            if n == len(clients) - 1:
                if failures:
                    raise type(exc)(f"{exc.message} (also tried: {'; '.join(failures)})", hint=exc.hint) from None
                raise
            failures.append(f"{client.endpoint}: {exc.message}")
    raise AssertionError("no endpoint to repair from")


def _refetch(folder: RepoFolder, commit: str, paths: list[str], endpoints: RepairEndpoints,
             lock: Lockfile | None, symlinks: bool, bad_blobs: set[str]) -> list[RepairAction]:
    """Download ``paths`` at ``commit`` again (verified), from the endpoints :class:`RepairEndpoints` picks for
    the revision (from warm's record of its source, unless refused), and relink them."""
    try:
        record = read_record(folder.cache_dir, folder.name, commit)
    except RecordRefused:
        record = None
    try:
        client, remote, counter = _resolve_anywhere(folder, commit, paths, endpoints.for_revision(
            record.endpoint if record is not None else None))
    except RevisionNotFound:
        return [_remove_link(folder, commit, p, "the endpoint no longer has this commit") for p in paths]
    except HfcacheError as exc:
        return [RepairAction(folder.repo_id, commit, p, "failed", exc.message, _cause(exc)) for p in paths]
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
            actions.append(RepairAction(folder.repo_id, commit, path, "failed", exc.message, _cause(exc)))
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


def _cause(exc: HfcacheError) -> int:
    """A failed action's exit code: 3 when no endpoint could serve it (network), 4 when this process may not go
    online; else 0 (the verification after it says why)."""
    return exc.exit_code if exc.exit_code in _UNSERVED_CODES else 0


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
    """What ``verify --repair`` did: the final ``report`` (after the repair when one ran), the ``actions`` taken,
    and the report ``before`` them (None when nothing needed repairing)."""

    report: VerifyReport
    actions: tuple[RepairAction, ...]
    before: VerifyReport | None

    @property
    def unserved(self) -> tuple[RepairAction, ...]:
        """One failed action per revision no endpoint could serve (exit code 3 or 4), in order."""
        seen: dict[tuple[str, str], RepairAction] = {}
        for a in self.actions:
            if not a.ok and a.exit_code in _UNSERVED_CODES:
                seen.setdefault((a.repo_id, a.revision), a)
        return tuple(seen.values())

    def error_lines(self) -> tuple[tuple[str, str], ...]:
        """``(message, hint)`` per revision in :attr:`unserved`, one line each, naming the endpoints tried."""
        hint = ("check the network and the endpoint (a revision's is the one warm recorded as its source unless "
                "--endpoint is given), or repair from another one: hfcache verify --repair --endpoint URL")
        return tuple((f"not repaired: {a.detail}", hint) for a in self.unserved)

    @property
    def exit_code(self) -> int:
        """0 when the cache verifies after the repair; else 3 (or 4) when something stays broken because no endpoint
        could serve it (:attr:`unserved`: not the cache's fault), else the final report's (1)."""
        if self.report.ok:
            return 0
        codes = {a.exit_code for a in self.unserved}
        return min(codes) if codes else self.report.exit_code


def verify_and_repair(cache_dir: str | os.PathLike[str], repo_ids: Iterable[str] | None, *,
                      hub: HubOptions, lock: Lockfile | None = None,
                      max_workers: int | None = None, fast: bool = False,
                      lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_lock_wait=None,
                      progress: Callable[[], AbstractContextManager[HashProgress | None]] | None = None) -> RepairRun:
    """Verify, repair what is broken, then verify again (``hfcache verify --repair``).

    Args:
        cache_dir, repo_ids, lock, max_workers, fast: as for :func:`hfcache.integrity.verify.verify_cache`.
        hub: the Hub options (:class:`RepairEndpoints`; its client is made only when something needs repairing).
        lock_timeout, on_lock_wait: as for :func:`repair`.
        progress: returns a fresh progress context for each verification pass (None: no progress).
    """
    new_progress = progress or (lambda: nullcontext(None))
    ids = list(repo_ids) if repo_ids else None
    with new_progress() as sink:
        report = verify_cache(cache_dir, ids, lock=lock, max_workers=max_workers, progress=sink, fast=fast)
    if report.ok:
        return RepairRun(report, (), None)
    user = user_client(hub)
    actions = repair(report, endpoints=RepairEndpoints(user, given=bool(hub.endpoints)), lock=lock,
                     lock_timeout=lock_timeout, on_lock_wait=on_lock_wait)
    with new_progress() as sink:
        after = verify_cache(cache_dir, ids, lock=lock, max_workers=max_workers, progress=sink, fast=fast)
    return RepairRun(after, actions, report)
