"""warm: download a selection of repo files into a cache, verified, in huggingface_hub's own layout.

Per repo: one request resolves the revision and lists every file with its hash (``hub.HubClient.resolve``);
:mod:`hfcache.warming.selection` picks the files (``HubClient.describe`` fills in sizes and hashes with one HEAD per file
where the endpoint's listing has none); each missing blob is downloaded by :mod:`hfcache.hub.transfer` to
``blobs/<etag>.<random>.incomplete`` (resuming a leftover; large files in parallel ranges), hashed in order, and
renamed into place only when size and hash match. Only when every blob of the repo
is in place does the repo become visible, in huggingface_hub's order: snapshot links, ``.no_exist`` markers, and
the ref last. A failed repo leaves no snapshot entry and no ref behind.

Library gap: ``hf_hub_download``/``snapshot_download`` publish a file as soon as its bytes arrive and check only
its size (DESIGN §1, §4); they also never write ``.no_exist`` markers for files a repo lacks, which transformers 5
needs to load a tokenizer offline (DESIGN §3).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from huggingface_hub.utils import get_token

from .. import pools
from ..cache.layout import (RepoFolder, cache_error, ensure_cache_root, find_blob_elsewhere, resolve_cache_dir,
                            symlinks_supported)
from ..errors import HfcacheError, HubError, IntegrityError, InternalError, UsageError
from ..hub.client import HubClient, RemoteFile, RepoRevision, hash_file
from ..cache.published import write_record
from ..records import NoProgress, ProgressSink, RepoResult, WarmedFile, WarmReport, WarmRequest, folder_ids
from ..cache import safefs
from ..hub.retry import DEFAULT_RETRIES, RetryCounter
from ..cache.safefs import UnsafeLayout
from ..hub.transfer import Slots, TransferOptions, download_blob
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait
from .selection import (MAX_PARSE_BYTES, Selection, check_index_size, file_folder_conflict, follow_configs, select,
                        shards_from_index)

if TYPE_CHECKING:  # the lock file's module (and tomllib) is not needed to warm by name (issue 18)
    from .lockfile import LockedRepo

_PUBLISH_GRACE = 0.5  # seconds an interrupted warm waits for repos in the middle of publishing


def resolve_token(token: str | bool | None) -> str | None:
    """``None`` -> the token huggingface_hub would use (``HF_TOKEN``, then the token file); ``False`` -> none."""
    if token is False:
        return None
    if token is None or token is True:
        return get_token()
    return token


def warm(
    requests: Sequence[WarmRequest],
    *,
    cache_dir: str | Path | None = None,
    endpoint: str | Sequence[str] | None = None,
    token: str | bool | None = None,
    max_workers: int = 8,
    timeout: float = 10.0,
    progress: ProgressSink | None = None,
    pinned: Sequence[LockedRepo] | None = None,
    retries: int = DEFAULT_RETRIES,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_lock_wait: Callable[[LockWait], None] | None = None,
) -> WarmReport:
    """Warm every request into ``cache_dir``; a failed repo never stops the others.

    Args:
        requests: the repos to warm.
        cache_dir: cache root (default: ``HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``).
        endpoint: Hub base URL, or several tried in order per repo (an in-cluster mirror first): a repo that an
            endpoint cannot serve (not found, unreachable, bytes failing the hash check, gated) is tried on the next,
            with the same checks; ``RepoResult.endpoint`` says which one served it. Default: ``HF_ENDPOINT`` or the
            public Hub.
        token: Hub token; None reads it as huggingface_hub does, False sends none. Never logged or stored.
        max_workers: connections at once (repo resolutions, files and the ranges of large files, across all repos),
            >= 1.
        timeout: seconds to wait for a connection or for any byte of an answer.
        retries: retries of a transient failure (429, 502-504, a cut connection) per request or file download,
            with exponential backoff and jitter, honouring ``Retry-After`` (:mod:`hfcache.hub.retry`); >= 0.
        progress: optional receiver of progress events.
        pinned: one locked repo per request (``warm --lock``): no resolution request; the lock's commit, files
            and hashes are used, so bytes that differ from the lock are refused.
        lock_timeout: seconds to wait at most for a lock another process holds (a repo another warm or prune
            changes, a blob another process downloads); then that repo fails with exit 5 naming the lock.
        on_lock_wait: told (once per lock, after a few seconds) which lock a repo waits for and who holds it.

    Returns:
        WarmReport with one RepoResult per request, in request order.

    Raises:
        UsageError: ``max_workers`` < 1, ``timeout`` <= 0 or ``retries`` < 0.
        CacheError: the cache root cannot be created or written (no repo is attempted then).
    """
    if retries < 0:
        raise UsageError(f"--retries must be at least 0, got {retries}")
    if max_workers < 1:
        raise UsageError(f"--max-workers must be at least 1, got {max_workers}")
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout}")
    if lock_timeout < 0:
        raise UsageError(f"--lock-timeout must not be negative, got {lock_timeout}")
    started = time.monotonic()
    root = resolve_cache_dir(cache_dir)
    ensure_cache_root(root)
    clients = make_clients(endpoint, token, timeout, retries)
    sink = progress or NoProgress()
    use_symlinks = symlinks_supported(root)
    stop = threading.Event()  # set on Ctrl-C/SIGTERM: downloads abort at their next chunk, nothing more is published
    slots = Slots(max_workers)
    files_pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hfcache-file")
    # One thread per repo (up to _REPO_THREADS): a repo's thread mostly waits for its files, and a repo beyond the
    # first max_workers must not wait for a whole repo to finish before it is even resolved. Connections stay bounded
    # by ``slots`` (resolution requests and file transfers alike).
    repos_pool = ThreadPoolExecutor(max_workers=min(len(requests), _REPO_THREADS) or 1,
                                    thread_name_prefix="hfcache-repo")
    inflight = _InFlight()
    futures = [
        repos_pool.submit(_RepoJob(i, req, root, clients, files_pool, sink, use_symlinks, slots,
                                   pinned=pinned[i] if pinned else None, stop=stop, inflight=inflight,
                                   lock_timeout=lock_timeout, on_lock_wait=on_lock_wait).run)
        for i, req in enumerate(requests)
    ]
    try:
        results = tuple(pools.ordered(futures))  # never a wait Ctrl-C/SIGTERM cannot interrupt (pools.py)
    except BaseException:
        # Interrupted: workers stop at their next chunk and keep their partial files; do not wait for a worker
        # blocked on a silent socket (the process is about to exit, SIGTERM must take effect within a second).
        stop.set()
        for pool in (repos_pool, files_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        # A repo already publishing (links, markers, ref: milliseconds) gets to finish it, so that an exit right
        # after this never leaves half a snapshot; the others stop at their next chunk.
        wait_futures(futures, timeout=_PUBLISH_GRACE)
        raise
    for pool in (repos_pool, files_pool):
        pool.shutdown(wait=True)
    return WarmReport(cache_dir=str(root), repos=results, seconds=time.monotonic() - started,
                      endpoints=tuple(c.endpoint for c in clients))


def make_clients(endpoint: str | Sequence[str] | None, token: str | bool | None, timeout: float,
                 retries: int = DEFAULT_RETRIES) -> list[HubClient]:
    """One HubClient per endpoint, in order of preference (an in-cluster mirror first, then the Hub).

    Args:
        endpoint: one URL, several, or None (``HF_ENDPOINT`` or the public Hub).
        retries: retries of a transient failure per request (:mod:`hfcache.hub.retry`).

    Raises:
        UsageError: an endpoint is not an http(s) URL.
    """
    endpoints = [endpoint] if endpoint is None or isinstance(endpoint, str) else list(endpoint) or [None]
    resolved = resolve_token(token)
    return [HubClient(endpoint=e, token=resolved, timeout=timeout, retries=retries) for e in endpoints]


def resolve_revision(request: WarmRequest, clients: Sequence[HubClient]) -> RepoRevision:
    """Resolve ``request``'s revision on the endpoints in order, as a warm repo job does: a Hub-side failure (not
    found, unreachable, gated, malformed) moves on to the next endpoint.

    Args:
        request: the repo and revision (selection fields are ignored: every file is listed).
        clients: endpoints in order of preference (:func:`make_clients`).

    Returns:
        RepoRevision: the commit, the canonical id and every file with its size and hash: from repo info, else the
        tree API, else one ``HEAD`` per file (:meth:`HubClient.describe`, for endpoints that list names only).

    Raises:
        HubError (RepoNotFound, RevisionNotFound, GatedRepo, EndpointUnreachable...): the last endpoint's error, its
        message naming what the others answered.
    """
    failures: list[str] = []
    for n, client in enumerate(clients):
        try:
            counter = client.counter()
            repo = client.resolve(request.repo_id, request.revision, request.repo_type, counter=counter)
            return client.describe(repo, repo.paths, counter)
        except HubError as exc:
            if n < len(clients) - 1:
                failures.append(f"{client.endpoint}: {exc.message}")
                continue
            if failures:
                raise type(exc)(f"{exc.message} (also tried: {'; '.join(failures)})", hint=exc.hint) from None
            raise
    raise UsageError("no endpoint to resolve from")


def fetch_pinned(locked: LockedRepo, *, cache_dir: str | Path, endpoint: Sequence[str], token: str | bool | None,
                 timeout: float = 10.0, max_workers: int = 4) -> RepoResult:
    """Fetch the files of ``locked`` (a commit and files with known hashes) into the cache: :func:`warm` with a pin.

    The pull-through mirror's per-file fetch (``hfcache serve --upstream``): the same code path as ``warm --lock``
    (endpoints in order, hash checks, the repo and blob locks, the legacy-id folder, huggingface_hub's publishing
    order, the snapshot touched as a use), for just the files a client asked for.

    Args:
        locked: the request (its revision becomes the ref written), the canonical id, commit and files to fetch.
        cache_dir: the cache root.
        endpoint: the endpoints, in order of preference.
        token: the Hub token (False: none).
        timeout: seconds to wait for a connection or for any byte of an answer.
        max_workers: parallel downloads.

    Returns:
        RepoResult: ``error_type`` says what failed (``IntegrityError``: bytes that failed the hash check on every
        endpoint; nothing of them is kept).

    Raises:
        CacheError: the cache root cannot be created or written.
    """
    report = warm([locked.request], cache_dir=cache_dir, endpoint=list(endpoint), token=token,
                  max_workers=max_workers, timeout=timeout, pinned=[locked])
    return report.repos[0]


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


#: Repos warmed at once (threads; their connections are bounded by ``max_workers``).
_REPO_THREADS = 64

#: The hint of a repo file hfcache cannot parse (selection.RepoDataError, a malformed sharded index).
_BAD_FILE_HINT = "the repo's file is malformed (a loader fails on it too): fix the repo, or --exclude that file"


class _Cancelled(HfcacheError):
    """A file task skipped because another file of the same repo already failed."""


@dataclass
class _RepoJob:
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
    inflight: _InFlight = field(default_factory=lambda: _InFlight())
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    on_lock_wait: Callable[[LockWait], None] | None = None
    client: HubClient | None = field(default=None, init=False)  # the endpoint being tried
    counter: RetryCounter | None = field(default=None, init=False)  # its retries
    _retries: int = 0  # retries on the endpoints tried before
    _downloaded: int = 0
    _count_lock: threading.Lock = field(default_factory=threading.Lock)
    _failed: threading.Event = field(default_factory=threading.Event)
    _read_sources: dict[str, str] = field(default_factory=dict)  # files fetched to be parsed: path -> source
    # The first selection's files, started while configs and indexes are read (their bytes are counted by the
    # progress bar only once its total is known): path -> future of _ensure_blob.
    _early: dict[str, Future] = field(default_factory=dict)

    def run(self) -> RepoResult:
        started = time.monotonic()
        failures: list[str] = []
        for n, client in enumerate(self.clients):
            self.client = client
            self.counter = client.counter(self.stop)
            self._failed.clear()
            result = self._attempt(client)
            self._retries += self.counter.count
            if result.ok or not self._fall_through(result) or n == len(self.clients) - 1:
                break
            failures.append(f"{client.endpoint}: {result.error}")
        if not result.ok and self.stop.is_set():  # Ctrl-C: not a failure of the repo or the endpoint
            result = replace(result, error=f"{self.request.spec}: interrupted", hint=None, exit_code=130,
                             error_type="Interrupted")
        elif not result.ok and failures:
            # Every endpoint was tried: say what each one answered, the last one's error first.
            result = replace(result, error=f"{result.error} (also tried: {'; '.join(failures)})")
        result = replace(result, bytes_downloaded=self._downloaded, retries=self._retries,
                         seconds=time.monotonic() - started)
        self.sink.repo_finished(self.key, result)
        return result

    def _fall_through(self, result: RepoResult) -> bool:
        """A Hub-side failure (not found, unreachable, bad bytes, gated) moves on to the next endpoint."""
        return result.exit_code == HubError.exit_code and not self.stop.is_set()

    def _attempt(self, client: HubClient) -> RepoResult:
        """Warm the repo from one endpoint; return its result (an error is a failed result, never raised)."""
        base = RepoResult(request=self.request, endpoint=client.endpoint)
        repo: RepoRevision | None = None
        try:
            if self.pinned is not None:
                repo = pinned_revision(self.pinned)
            else:
                with self.slots.held(self.stop):
                    repo = client.resolve(self.request.repo_id, self.request.revision, self.request.repo_type,
                                          counter=self.counter)
            result = self._warm(repo, base)
        except HfcacheError as exc:
            result = _failed(base, repo, exc)
        except OSError as exc:
            result = _failed(base, repo, cache_error(exc, self.request.repo_id))
        except Exception as exc:  # noqa: BLE001 - one repo's bug must not lose the other repos' results
            result = _failed(base, repo, InternalError(
                f"{self.request.repo_id}: internal error: {type(exc).__name__}: {exc}",
                hint="rerun with HFCACHE_DEBUG=1 and report it"))
        return result

    def _warm(self, repo: RepoRevision, base: RepoResult) -> RepoResult:
        req = self.request
        if self.pinned is not None:
            selection = Selection(paths=repo.paths, absent=self.pinned.absent)
        else:
            selection = select(repo.paths, req.kind, req.include, req.exclude)
        if not selection.paths:
            raise UsageError(f"{req.repo_id}: no file matches the selection (kind {req.kind}"
                             + (f", include {list(req.include)}" if req.include else "")
                             + (f", exclude {list(req.exclude)}" if req.exclude else "") + ")",
                             hint="check --kind, --include, --exclude and --repo-type")
        locking = {"lock_timeout": self.lock_timeout, "on_lock_wait": self.on_lock_wait}
        # The endpoint's canonical id picks a second folder only for a legacy id (records.folder_ids): an endpoint
        # answering another repo's id for an org/name request cannot write into that repo's folder.
        folders = [RepoFolder(self.cache_dir, i, req.repo_type, **locking)
                   for i in folder_ids(req.repo_id, repo.canonical_id)]
        canonical = folders[0]
        with ExitStack() as held:
            # One repo lock per folder, taken in name order so that concurrent warms never deadlock; a lock that
            # times out releases those already taken.
            for folder in sorted(folders, key=lambda f: f.name):
                held.enter_context(folder.repo_lock(stop=self.stop))
            conflict = file_folder_conflict(repo.paths)
            if conflict is not None:  # before any download: a refused repo leaves no blob behind either
                raise HubError(f"{req.repo_id}: {conflict!r} is both a file and a folder in the listing",
                               hint="the endpoint or lock is broken or hostile")
            # Every selected file described now (one HEAD each where the listing gave no hash), to be checked
            # before any download; the files the configs and indexes add are described in _complete.
            repo = self.client.describe(repo, selection.paths, self.counter)
            for folder in folders:
                _check_publishable(folder, repo, [repo.by_path[p] for p in selection.paths])
            self._read_sources.clear()
            self._early = {}
            if selection.needs_config or selection.needs_index:
                # Configs and indexes only add files: fetch the ones already selected while they are read, so a repo
                # costs one round of requests, not two (issue 18).
                self._early = {p: self.pool.submit(self._ensure_blob, repo, canonical, repo.by_path[p], False)
                               for p in selection.paths}
            try:
                repo, paths, absent, read_notes = self._complete(repo, canonical, selection)
            except BaseException as exc:
                self._failed.set()  # files not started yet are not started
                first = self._settle_early()
                if isinstance(exc, _Cancelled) and first is not None:
                    raise first from None  # another file's failure stopped the reading: that failure is the error
                raise
            by_path = repo.by_path
            files = [by_path[p] for p in sorted(paths)]
            self.sink.repo_started(self.key, req.spec, len(files), sum(f.size for f in files))
            sources = self._fetch(repo, canonical, files)
            sources.update({p: s for p, s in self._read_sources.items() if p in sources})  # not "cached" by itself
            for alias in folders[1:]:
                for f in files:
                    _copy_blob(canonical, alias, f)
            if self.stop.is_set():
                raise _Cancelled(f"{req.repo_id}: interrupted before publishing")
            for folder in folders:  # every check before the first link: a refused repo leaves nothing published
                _check_publishable(folder, repo, files)
            notes = list(read_notes)
            for folder in folders:
                notes.extend(self._publish(folder, repo, files, absent))
        return replace(
            base,
            canonical_id=repo.canonical_id,
            commit_hash=repo.commit_hash,
            files=tuple(WarmedFile(f.path, f.size, f.hash, sources[f.path]) for f in files),
            absent=absent,
            metadata=repo.metadata,
            notes=tuple(notes),
        )

    def _complete(self, repo: RepoRevision, canonical: RepoFolder,
                  selection: Selection) -> tuple[RepoRevision, set[str], tuple[str, ...], tuple[str, ...]]:
        """Finish a selection that needs file contents: configs first (custom code named by ``auto_map``,
        sentence-transformers module folders), then sharded indexes (their shards). Returns ``(repo with every
        selected file described, paths, absent, notes)`` (notes: one-line warnings, :attr:`selection.Followed.notes`).
        The files read here are fetched without moving the progress bar: its total is known only afterwards, and
        they are counted then (as cached). Every file read is described (one HEAD where the listing gave no hash),
        fetched and hash-checked into the cache first; nothing is executed."""
        req = self.request
        paths, absent, needs_index = set(selection.paths), selection.absent, selection.needs_index
        notes: tuple[str, ...] = ()
        current = self.client.describe(repo, selection.needs_config + needs_index, self.counter)

        def read(path: str) -> bytes | None:
            nonlocal current
            current = self.client.describe(current, [path], self.counter)
            return self._read(current, canonical, current.by_path[path])

        if selection.needs_config:
            try:
                followed = follow_configs(selection.needs_config, read, current.paths, req.kind, req.exclude)
            except ValueError as exc:  # RepoDataError: a config no parser can read (transformers' neither)
                raise IntegrityError(f"{req.repo_id}: {exc}", hint=_BAD_FILE_HINT) from None
            notes = followed.notes
            paths |= set(followed.paths)
            absent = tuple(sorted(set(absent) | set(followed.absent)))
            needs_index += followed.needs_index
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
                data = canonical.blob_path(by_path[index].etag).read_bytes()
                try:
                    paths |= shards_from_index(data, current.paths, index)
                except ValueError as exc:
                    raise IntegrityError(f"{req.repo_id}: {exc}", hint=_BAD_FILE_HINT) from None
        return self.client.describe(current, paths, self.counter), paths, absent, notes

    def _read(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile) -> bytes | None:
        """A small file's verified bytes (a config or custom code to parse): fetched into the cache first if needed;
        None (not parsed, reported in the notes) above ``selection.MAX_PARSE_BYTES``."""
        if file.size > MAX_PARSE_BYTES:
            return None
        self._fetch(repo, folder, [file], progress=False)
        return folder.blob_path(file.etag).read_bytes()

    def _fetch(self, repo: RepoRevision, folder: RepoFolder, files: Iterable[RemoteFile],
               progress: bool = True) -> dict[str, str]:
        """Ensure every file's blob is in ``folder``, in parallel; return path -> source. First error wins.
        ``progress=False``: the bytes do not move the progress bar."""
        files = list(files)
        futures = {f.path: self._early.get(f.path) or self.pool.submit(self._ensure_blob, repo, folder, f, progress)
                   for f in files}
        sources: dict[str, str] = {}
        error: BaseException | None = None
        for path, future in futures.items():
            try:
                sources[path] = future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below after every download settled
                if error is None or isinstance(error, _Cancelled):
                    error = exc
        if error is not None:
            raise error
        if progress:  # files started early were fetched without moving the bar: count them now
            for f in files:
                if f.path in self._early:
                    self.sink.advance(self.key, f.size)
        if not progress:
            self._read_sources.update(sources)
        return sources

    def _settle_early(self) -> BaseException | None:
        """Wait for every early file; return the first failure that is not a cancellation, or None."""
        first = None
        for future in self._early.values():
            exc = future.exception()
            if exc is not None and first is None and not isinstance(exc, _Cancelled):
                first = exc
        return first

    def _ensure_blob(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile, progress: bool = True) -> str:
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
            advance(self.key, file.size)
            return "cached"
        if self._link_from_elsewhere(folder, file):
            advance(self.key, file.size)
            return "linked"
        pending = self.inflight.claim(file.etag)
        if pending is not None:  # another repo of this warm is downloading the same blob: link it after
            while not pending.wait(pools.POLL_SECONDS):
                if self._failed.is_set() or self.stop.is_set():
                    raise _Cancelled(f"{repo.repo_id}: cancelled")
            if self._link_from_elsewhere(folder, file):
                advance(self.key, file.size)
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
        return other is not None and _same_content(other, file) and folder.adopt_blob(other, file.etag)

    def _download(self, repo: RepoRevision, folder: RepoFolder, file: RemoteFile,
                  advance: Callable[[int, int], None]) -> None:
        """Download (resuming a leftover), hash and publish one blob (:func:`hfcache.hub.transfer.download_blob`)."""

        def on_bytes(n: int) -> None:
            if n > 0:
                self._count(n)
            advance(self.key, n)

        options = TransferOptions(slots=self.slots, counter=self.counter, on_bytes=on_bytes,
                                  on_kept=lambda n: advance(self.key, n))
        download_blob(self.client, folder, repo, file, options)

    def _count(self, n: int) -> None:
        with self._count_lock:
            self._downloaded += n

    def _publish(self, folder: RepoFolder, repo: RepoRevision, files: list[RemoteFile],
                 absent: Sequence[str]) -> list[str]:
        """Make the repo visible: links, then markers, the record of what was published (:mod:`hfcache.cache.published`),
        then the ref last (huggingface_hub's order). Returns notes: the ref of a folder other than the requested
        one (a legacy id's canonical folder) that moved to another commit."""
        for f in files:
            folder.link(repo.commit_hash, f.path, f.etag, symlinks=self.symlinks)
        for name in absent:
            folder.mark_absent(repo.commit_hash, name)
        write_record(self.cache_dir, folder.name, repo.commit_hash, ((f.path, f.size, f.hash) for f in files), absent)
        notes = []
        revision = self.request.revision
        if folder.repo_id != self.request.repo_id and revision != repo.commit_hash:
            before = folder.read_ref(revision)
            if before is not None and before != repo.commit_hash.encode():
                notes.append(f"moved refs/{revision} of {folder.repo_id} (not requested; the canonical id of "
                             f"{self.request.repo_id}) from {before.decode('utf-8', 'replace')[:12]} to "
                             f"{repo.commit_hash[:12]}")
        folder.write_ref(revision, repo.commit_hash)
        folder.touch_snapshot(repo.commit_hash)
        return notes


def _check_publishable(folder: RepoFolder, repo: RepoRevision, files: Sequence[RemoteFile]) -> None:
    """Refuse, before anything is fetched or published, what could only be published halfway: a repo folder with a
    planted link, or a snapshot where a path's folder is already a file or link (or the path a folder).

    Raises:
        UnsafeLayout (CacheError, exit 5): the cache conflicts with the listing.
    """
    folder.ensure_safe()
    for f in files:
        pointer = folder.pointer_path(repo.commit_hash, f.path)
        parts = f.path.split("/")
        for i in range(len(parts) - 1):
            part = pointer.parents[len(parts) - 2 - i]
            if os.path.lexists(part) and (os.path.islink(part) or not part.is_dir()):
                raise UnsafeLayout(f"{folder.name}: snapshots/{repo.commit_hash[:12]}/{'/'.join(parts[:i + 1])} is "
                                   f"a file or link where {f.path} needs a folder: nothing published",
                                   hint="remove that snapshot (hfcache prune or rm -r) and rerun")
        if pointer.is_dir() and not pointer.is_symlink():
            raise UnsafeLayout(f"{folder.name}: snapshots/{repo.commit_hash[:12]}/{f.path} is a folder: nothing "
                               "published", hint="remove that snapshot and rerun")


class _InFlight:
    """The blobs this warm is downloading, by etag: a second repo with the same file (one vocab in several repos)
    waits for the first download and hardlinks it, so identical files are fetched once per run (issue 18)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def claim(self, etag: str) -> threading.Event | None:
        """None: the caller downloads ``etag`` and then calls :meth:`done`; else the event set when the download
        in flight ends (successfully or not)."""
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


def _same_content(path: Path, file: RemoteFile) -> bool:
    """True when another repo's blob has ``file``'s exact content; False also when it vanished meanwhile (a
    concurrent prune): the file is then simply downloaded."""
    try:
        return hash_file(str(path), file)
    except OSError:
        return False


def _copy_blob(source: RepoFolder, dest: RepoFolder, file: RemoteFile) -> None:
    """Give a legacy-id folder the canonical folder's blob: a hardlink, so the bytes are stored once."""
    with dest.blob_lock(file.etag):
        dest.discard_incomplete(file.etag)  # an earlier attempt's leftovers: the blob comes from the canonical folder
        if dest.blob_ok(file.etag, file.size):
            return
        if not dest.adopt_blob(source.blob_path(file.etag), file.etag):
            # No hardlinks on this filesystem: store a second copy rather than fail.
            incomplete, out = dest.open_incomplete(file.etag)
            try:
                src_fd = safefs.open_file(source.cache_dir, (source.name, "blobs", file.etag),
                                          os.O_RDONLY | os.O_NONBLOCK)
                with out, os.fdopen(src_fd, "rb") as src:
                    if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                        raise UnsafeLayout(f"{source.name}/blobs/{file.etag} is not a regular file: left alone")
                    shutil.copyfileobj(src, out)
                dest.publish_blob(incomplete, file.etag)
            finally:
                incomplete.unlink(missing_ok=True)


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
