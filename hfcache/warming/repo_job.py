"""One repo of a warm (:class:`RepoJob`), endpoint after endpoint: resolved (or taken from the lock), selected, every
blob put in place (cached, hardlinked, or downloaded), and published only when every blob is there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import pools
from ..cache import safefs
from ..cache.content import fd_matches
from ..cache.layout import RepoFolder
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from ..cache.root import cache_error, find_blob_elsewhere
from ..cache.shared_store import StoreProblem, open_payload
from ..errors import HfcacheError, HubError, IntegrityError, InternalError, UsageError
from ..hub.answers import check_asked_commit
from ..hub.client import HubClient
from ..hub.files import RemoteFile, RepoRevision
from ..hub.retry import RetryCounter
from ..hub.slots import Slots
from ..hub.transfer import PARALLEL_THRESHOLD, TransferOptions, download_blob
from ..records import ProgressSink, RepoResult, WarmedFile, WarmRequest, folder_clash, folder_ids
from . import undo
from .custom_code import BAD_FILE_HINT, MAX_PARSE_BYTES, finish_selection
from .publish import check_publishable, copy_blob, publish
from .selection import Selection, check_index_size, select, shards_from_index
from .undo import Undone

if TYPE_CHECKING:  # the lock file's module (and tomllib) is not needed to warm by name (docs/benchmarks.md)
    from .lockfile import LockedRepo



class _Cancelled(HfcacheError):
    """A file task skipped because another file of the same repo already failed."""


def pinned_revision(locked: LockedRepo) -> RepoRevision:
    """A locked repo as if the endpoint had just resolved it: the lock's commit, files, sizes and hashes."""
    files = []
    for f in locked.files:
        algorithm, digest = f.hash.split(":", 1)
        if algorithm == "sha256":
            files.append(RemoteFile(path=f.path, size=f.size, blob_id="", lfs_sha256=digest))
        else:
            files.append(RemoteFile(path=f.path, size=f.size, blob_id=digest))
    return RepoRevision(repo_id=locked.request.repo_id, canonical_id=locked.canonical_id,
                        repo_type=locked.request.repo_type, revision=locked.request.revision,
                        commit_hash=locked.commit_hash, files=tuple(files), metadata="lock")


@dataclass
class RepoJob:
    """One repo of a warm: :meth:`run` tries the endpoints in order and returns the repo's RepoResult (a failure is
    a failed result, never raised)."""

    key: int
    request: WarmRequest
    cache_dir: Path
    clients: list[HubClient]
    pool: ThreadPoolExecutor
    sink: ProgressSink
    symlinks: bool
    slots: Slots
    pinned: LockedRepo | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    inflight: InFlight = field(default_factory=lambda: InFlight())
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    on_lock_wait: Callable[[LockWait], None] | None = None
    client: HubClient | None = field(default=None, init=False)  # the endpoint being tried
    counter: RetryCounter | None = field(default=None, init=False)  # its retries
    _retries: int = 0  # retries on the endpoints tried before
    _requests: int = 0  # requests sent to the endpoints tried before
    _downloaded: int = 0
    _count_lock: threading.Lock = field(default_factory=threading.Lock)
    _failed: threading.Event = field(default_factory=threading.Event)
    _read_sources: dict[str, str] = field(default_factory=dict)  # files fetched to be parsed: path -> source
    # The first selection's files, started while configs and indexes are read (their bytes are counted by the
    # progress bar only once its total is known): path -> future of _ensure_blob.
    _early: dict[str, Future] = field(default_factory=dict)
    # Leftover bytes counted when the bar was added (etag -> bytes), before their download (queued behind others)
    # reported what it keeps: that report then advances by the difference (see _precount_kept).
    _prekept: dict[str, int] = field(default_factory=dict)
    _kept_seen: set[str] = field(default_factory=set)  # etags whose kept bytes (or blob) were reported
    _undone: Undone | None = None  # what the last attempt's roll-back did (undo.roll_back)

    def run(self) -> RepoResult:
        started = time.monotonic()
        failures: list[str] = []
        for n, client in enumerate(self.clients):
            self.client = client
            self.counter = client.counter(self.stop)
            self._failed.clear()
            result = self._attempt(client)
            self._retries += self.counter.count
            self._requests += self.counter.requests
            # A Hub-side failure (not found, unreachable, bad bytes, gated) moves on to the next endpoint.
            if result.ok or result.exit_code != HubError.exit_code or self.stop.is_set() or n == len(self.clients) - 1:
                break
            failures.append(f"{client.endpoint}: {result.error}")
        if not result.ok and self.stop.is_set():  # Ctrl-C: not a failure of the repo or the endpoint
            result = replace(result, error=f"{self.request.spec}: interrupted", hint=None, exit_code=130,
                             error_type="Interrupted")
        elif not result.ok and failures:
            # Every endpoint was tried: say what each one answered, the last one's error first.
            result = replace(result, error=f"{result.error} (also tried: {'; '.join(failures)})")
        # No request at all (a pinned repo whose blobs were all in the cache): no endpoint served it.
        result = replace(result, bytes_downloaded=self._downloaded, retries=self._retries, requests=self._requests,
                         endpoint=result.endpoint if self._requests else None, seconds=time.monotonic() - started)
        self.sink.repo_finished(self.key, result)
        return result

    def _attempt(self, client: HubClient) -> RepoResult:
        """Warm the repo from one endpoint; return its result (an error is a failed result, never raised; what its
        roll-back gave back or kept is a note)."""
        base = RepoResult(request=self.request, endpoint=client.endpoint)
        repo: RepoRevision | None = None
        self._undone = None
        try:
            if self.pinned is not None:
                repo = pinned_revision(self.pinned)
                check_asked_commit("the lock", repo.repo_id, repo.revision, repo.commit_hash)
            else:
                with self.slots.held(self.stop):
                    repo = client.resolve(self.request.repo_id, self.request.revision, self.request.repo_type,
                                          counter=self.counter)
            result = self._warm(repo, base)
        except HfcacheError as exc:
            result = _failed(base, repo, exc)
        except OSError as exc:
            result = _failed(base, repo, cache_error(exc, self.request.repo_id))
        except Exception as exc:  # one repo's bug must not lose the other repos' results
            result = _failed(base, repo, InternalError(
                f"{self.request.repo_id}: internal error: {type(exc).__name__}: {exc}",
                hint="rerun with HFCACHE_DEBUG=1 and report it"))
        if not result.ok and self._undone is not None and (note := self._undone.note()):
            result = replace(result, notes=(*result.notes, note))
        return result

    def _warm(self, repo: RepoRevision, base: RepoResult) -> RepoResult:
        """Warm the resolved ``repo`` from :attr:`client` under the repo locks of its folders; return its result."""
        req = self.request
        selection = self._selection(repo)
        locking = {"lock_timeout": self.lock_timeout, "on_lock_wait": self.on_lock_wait}
        # The endpoint's canonical id picks a second folder only for a legacy id (records.folder_ids): an endpoint
        # answering another repo's id for an org/name request cannot write into that repo's folder.
        folders = [RepoFolder(self.cache_dir, i, req.repo_type, **locking)
                   for i in folder_ids(req.repo_id, repo.canonical_id)]
        with ExitStack() as held:
            # One repo lock per folder, taken in name order so that concurrent warms never deadlock; a lock that
            # times out releases those already taken.
            for folder in sorted(folders, key=lambda f: f.name):
                held.enter_context(folder.repo_lock(stop=self.stop))
            marks = [undo.mark(folder, repo.commit_hash, req.revision) for folder in folders]
            try:
                repo, paths, absent, read_notes = self._describe_and_read(repo, folders, selection)
                by_path = repo.by_path
                files = [by_path[p] for p in sorted(paths)]
                sources = self._fetch_into(folders, repo, files)
                notes = list(read_notes) + self._publish_all(folders, repo, files, absent)
            except BaseException as exc:  # still under the repo locks: nothing half-published, the space given back
                stopped = self.stop.is_set() or not isinstance(exc, Exception)
                self._undone = undo.roll_back(marks, keep_partials=stopped or undo.resumable(exc), keep_blobs=stopped)
                raise
        return replace(
            base,
            canonical_id=repo.canonical_id,
            commit_hash=repo.commit_hash,
            files=tuple(WarmedFile(f.path, f.size, f.hash, sources[f.path]) for f in files),
            absent=absent,
            metadata=repo.metadata,
            notes=tuple(notes),
        )

    def _selection(self, repo: RepoRevision) -> Selection:
        """The files of ``repo`` the request (or the lock) selects; UsageError when none matches."""
        req = self.request
        if self.pinned is not None:
            selection = Selection(paths=repo.paths, absent=self.pinned.absent)
        else:
            selection = select(repo.paths, req.kind, req.include, req.exclude)
        if not selection.paths:
            raise UsageError(f"{req.repo_id}: no file matches the selection (kind {req.kind}"
                             + (f", include {list(req.include)}" if req.include else "")
                             + (f", exclude {list(req.exclude)}" if req.exclude else "") + ")",
                             hint="a kernel repo has no tokenizer or weights: warm it with --kind all"
                             if req.repo_type == "kernel" else "check --kind, --include, --exclude and --repo-type")
        return selection

    def _describe_and_read(self, repo: RepoRevision, folders: list[RepoFolder],
                           selection: Selection) -> tuple[RepoRevision, set[str], tuple[str, ...], tuple[str, ...]]:
        """:meth:`_complete` while the files already selected download into ``folders[0]`` (repo locks held)."""
        canonical = folders[0]
        conflict = folder_clash(repo.paths)
        if conflict is not None:  # before any download: a refused repo leaves no blob behind either
            raise HubError(f"{self.request.repo_id}: {conflict!r} is both a file and a folder in the listing",
                           hint="the endpoint or lock is broken or hostile")
        # Every selected file described now (one HEAD each where the listing gave no hash), to be checked
        # before any download; the files the configs and indexes add are described in _complete.
        repo = self.client.describe(repo, selection.paths, self.counter)
        for folder in folders:
            check_publishable(folder, repo, [repo.by_path[p] for p in selection.paths])
        self._read_sources.clear()
        self._early = {}
        if selection.needs_config or selection.needs_index:
            # Configs and indexes only add files: fetch the ones already selected while they are read, so a repo
            # costs one round of requests, not two (docs/benchmarks.md).
            self._early = {p: self.pool.submit(self._ensure_blob, repo, canonical, repo.by_path[p], True)
                           for p in selection.paths}
        try:
            return self._complete(repo, canonical, selection)
        except BaseException as exc:
            self._failed.set()  # files not started yet are not started
            # Every early file waited for; the first failure that is not a cancellation stopped the reading: the error.
            failed = [e for e in (f.exception() for f in self._early.values()) if e and not isinstance(e, _Cancelled)]
            if isinstance(exc, _Cancelled) and failed:
                raise failed[0] from None
            raise

    def _fetch_into(self, folders: list[RepoFolder], repo: RepoRevision, files: list[RemoteFile]) -> dict[str, str]:
        """Every file's blob in every folder (the canonical one first, hardlinked into the others): path -> source."""
        canonical = folders[0]
        self.sink.advance(self.key, self._precount_kept(canonical, files))  # shown as done when the bar is added
        self.sink.repo_started(self.key, self.request.spec, len(files), sum(f.size for f in files))
        sources = self._fetch(repo, canonical, files)
        sources.update({p: s for p, s in self._read_sources.items() if p in sources})  # not "cached" by itself
        for alias in folders[1:]:
            for f in files:
                copy_blob(canonical, alias, f)
        return sources

    def _publish_all(self, folders: list[RepoFolder], repo: RepoRevision, files: list[RemoteFile],
                     absent: Sequence[str]) -> list[str]:
        if self.stop.is_set():
            raise _Cancelled(f"{self.request.repo_id}: interrupted before publishing")
        for folder in folders:  # every check before the first link: a refused repo leaves nothing published
            check_publishable(folder, repo, files)
        notes: list[str] = []
        # The endpoint recorded as this commit's source (repair fetches from it): this attempt's, if it was asked
        # anything; else (every blob already in the cache) the record keeps the endpoint it names.
        served = self.client.endpoint if self.client is not None and self.counter and self.counter.requests else None
        for folder in folders:
            notes.extend(publish(folder, repo, files, absent, request=self.request, cache_dir=self.cache_dir,
                                 symlinks=self.symlinks, endpoint=served))
        return notes

    def _complete(self, repo: RepoRevision, canonical: RepoFolder,
                  selection: Selection) -> tuple[RepoRevision, set[str], tuple[str, ...], tuple[str, ...]]:
        """``(repo described, paths, absent, notes)``: the selection finished from configs, then sharded indexes (each
        fetched and hash-checked into the cache first, never executed)."""
        req = self.request
        current = self.client.describe(repo, selection.needs_config + selection.needs_index, self.counter)

        def read(path: str) -> bytes | None:
            nonlocal current
            current = self.client.describe(current, [path], self.counter)
            return self._read(current, canonical, current.by_path[path])

        paths, absent, needs_index, notes = finish_selection(selection, read, current.paths, req)
        if needs_index:
            # The shard list is inside the index file: fetch (or find) the index first, if its size is sane.
            current = self.client.describe(current, needs_index, self.counter)
            by_path = current.by_path
            try:
                for index in needs_index:
                    check_index_size(index, by_path[index].size)
            except ValueError as exc:
                raise IntegrityError(f"{req.repo_id}: {exc}", hint="--exclude the index to skip these weights, or "
                                     "use --kind all") from None
            self._fetch(current, canonical, [by_path[p] for p in needs_index], progress=False)
            for index in needs_index:
                data = canonical.read_blob(by_path[index].etag, by_path[index].size)
                try:
                    paths |= shards_from_index(data, current.paths, index)
                except ValueError as exc:
                    raise IntegrityError(f"{req.repo_id}: {exc}", hint=BAD_FILE_HINT) from None
        return self.client.describe(current, paths, self.counter), paths, absent, notes

    def _read(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile) -> bytes | None:
        """A small file's verified bytes, fetched into the cache first; None above ``MAX_PARSE_BYTES``."""
        if file.size > MAX_PARSE_BYTES:
            return None
        self._fetch(repo, folder, [file], progress=False)
        return folder.read_blob(file.etag, file.size)

    def _precount_kept(self, folder: RepoFolder, files: list[RemoteFile]) -> int:
        """Leftover download bytes of ``files`` not reported yet, counted now (a resumed repo's bar starts there)."""
        sizes = folder.leftover_sizes()
        total = 0
        with self._count_lock:
            for f in files:
                kept = sizes.get(f.etag, 0)
                if f.etag in self._kept_seen or f.etag in self._prekept or not 0 < kept <= f.size:
                    continue
                self._prekept[f.etag] = kept
                total += kept
        return total

    def _settle_kept(self, etag: str, n: int) -> int:
        """``n`` kept bytes of ``etag`` less what :meth:`_precount_kept` counted (may be negative)."""
        with self._count_lock:
            self._kept_seen.add(etag)
            return n - self._prekept.pop(etag, 0)

    def _fetch(self, repo: RepoRevision, folder: RepoFolder, files: Iterable[RemoteFile],
               progress: bool = True) -> dict[str, str]:
        """Every file's blob in ``folder``, in parallel (first error wins): path -> source."""
        files = list(files)
        large = sum(f.size > PARALLEL_THRESHOLD and f.path not in self._early for f in files)
        sources: dict[str, str] = {}
        error: BaseException | None = None
        with self.slots.expect(large) as arrived:  # a large file takes its share of the free connections, not all
            futures = {f.path: self._early.get(f.path)
                       or self.pool.submit(self._ensure_blob, repo, folder, f, progress, arrived)
                       for f in files}
            for path, future in futures.items():
                try:
                    sources[path] = future.result()
                except BaseException as exc:  # re-raised below after every download settled
                    if error is None or isinstance(error, _Cancelled):
                        error = exc
        if error is not None:
            raise error
        if not progress:
            self._read_sources.update(sources)
        return sources

    def _ensure_blob(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile, progress: bool = True,
                     arrived: Callable[[], None] = lambda: None) -> str:
        if file.size > PARALLEL_THRESHOLD:
            arrived()  # (transfer.Slots.expect; a small file was never announced)
        if self._failed.is_set() or self.stop.is_set():
            raise _Cancelled(f"{repo.repo_id}: cancelled")
        advance = self.sink.advance if progress else lambda key, n: None
        try:
            with folder.blob_lock(file.etag, stop=self.stop):  # Ctrl-C is not stuck behind another download
                source = self._obtain(repo, folder, file, advance)
                if source != "downloaded":
                    # Leftovers of an earlier attempt (another endpoint of this run, an interrupted run) are of no
                    # use beside the blob: a download reuses or deletes them, this path deletes them too.
                    folder.discard_incomplete(file.etag)
                return source
        except BaseException:
            self._failed.set()
            raise

    def _obtain(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile,
                advance: Callable[[int, int], None]) -> str:
        """Put the blob in ``folder`` (the caller holds its blob lock); return how: cached, linked or downloaded."""
        if folder.blob_ok(file.etag, file.size):
            advance(self.key, self._settle_kept(file.etag, file.size))
            return "cached"
        if self._link_from_elsewhere(folder, file):
            advance(self.key, self._settle_kept(file.etag, file.size))
            return "linked"
        pending = self.inflight.claim(file.etag)
        if pending is not None:  # another repo of this warm is downloading the same blob: link it after
            while not pending.wait(pools.POLL_SECONDS):
                if self._failed.is_set() or self.stop.is_set():
                    raise _Cancelled(f"{repo.repo_id}: cancelled")
            if self._link_from_elsewhere(folder, file):
                advance(self.key, self._settle_kept(file.etag, file.size))
                return "linked"
            self._download(repo, folder, file, advance)  # that download failed: fetch it here
            return "downloaded"
        try:
            self._download(repo, folder, file, advance)
        finally:
            self.inflight.done(file.etag)
        return "downloaded"

    def _link_from_elsewhere(self, folder: RepoFolder, file: RemoteFile) -> bool:
        """Hardlink the blob from another repo folder of the cache when one holds exactly this content."""
        other = find_blob_elsewhere(self.cache_dir, file.etag, file.size, exclude=folder.name)
        return (other is not None and _same_content(self.cache_dir, other, file)
                and folder.adopt_blob(other, file.etag))

    def _download(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile,
                  advance: Callable[[int, int], None]) -> None:
        """Download (resuming a leftover), hash and publish one blob (:func:`hfcache.hub.transfer.download_blob`)."""

        def on_bytes(n: int) -> None:
            if n > 0:
                self._count(n)
            advance(self.key, n)

        options = TransferOptions(slots=self.slots, counter=self.counter, on_bytes=on_bytes,
                                  on_kept=lambda n: advance(self.key, self._settle_kept(file.etag, n)))
        download_blob(self.client, folder, repo, file, options)

    def _count(self, n: int) -> None:
        with self._count_lock:
            self._downloaded += n


class InFlight:
    """The blobs this warm is downloading, by etag: a second repo with the same file waits for the first download and
    hardlinks it, so identical files are fetched once per run (docs/benchmarks.md)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def claim(self, etag: str) -> threading.Event | None:
        """None: the caller downloads ``etag``, then :meth:`done`; else the event set when that download ends."""
        with self._lock:
            event = self._events.get(etag)
            if event is None:
                self._events[etag] = threading.Event()
            return event

    def done(self, etag: str) -> None:
        with self._lock:
            event = self._events.pop(etag, None)
        if event is not None:
            event.set()


def _same_content(cache_dir: Path, path: Path, file: RemoteFile) -> bool:
    """Whether another repo's blob (or the Xet payload it links to) at ``path`` has ``file``'s exact content, read
    through descriptors; False when it vanished or is no regular file (then it is downloaded)."""
    try:
        if path.parent.parent == cache_dir / "blobs":  # a store payload (huggingface_hub 2.4's Xet store)
            fd = open_payload(cache_dir, path.name)
        else:
            fd = safefs.open_blob(cache_dir, path.parent.parent.name, file.etag)
        return fd_matches(fd, file.etag, file.size)
    except (OSError, safefs.UnsafeLayout, StoreProblem):
        return False


def _failed(base: RepoResult, repo: RepoRevision | None, exc: HfcacheError) -> RepoResult:
    return replace(
        base,
        canonical_id=repo.canonical_id if repo else None,
        commit_hash=repo.commit_hash if repo else None,
        error=exc.message,
        hint=exc.hint,
        exit_code=exc.exit_code,
        error_type=type(exc).__name__,
    )
