"""Blob downloads into a cache: resumed, in parallel ranges for large files, hashed, published only when verified.

One blob at a time, under its download lock: a leftover ``.incomplete`` is resumed from its trusted prefix
(:func:`trusted_prefix`, re-hashed); more than ``threshold`` bytes left are fetched in up to ``part_cap`` ranges written
in place, hashed in order as they land; every chunk is checked against the throughput floor; a stop keeps the contiguous
prefix. The behaviour and its numbers: docs/warm.md, "Any mirror, any network, any file size". Library gap:
huggingface_hub resumes only its own ``.incomplete`` unhashed, in one stream (``file_download.http_get``).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import pools
from ..cache.content import BlobHash
from ..cache.incomplete import IncompleteBlob
from ..cache.layout import RepoFolder
from ..errors import HubError, IntegrityError
from .bodies import iter_body, slow_body
from .client import HubClient
from .files import RemoteFile, RepoRevision
from .retry import Budget, Interrupted, RetryCounter, ShortBody, counting

PARALLEL_THRESHOLD = 16 * 1024 * 1024  # bytes left to fetch above which a file is split into ranges
MIN_PART = 8 * 1024 * 1024
DEFAULT_PART_CAP = 8  # parallel ranges per file
_RESUME_GRAIN = 1024 * 1024  # a hole-bounded prefix is trusted down to this grain (>= any filesystem block)
_HASH_PIECE = 1024 * 1024


class Slots:
    """Connections the whole warm may hold at once (``--max-workers``); waiting honours the stop event."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._sem = threading.BoundedSemaphore(self.size)

    def acquire(self, stop: threading.Event, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait for a slot (Interrupted when ``stop`` is set); False, no slot taken, once ``give_up()`` is true."""
        while not self._sem.acquire(timeout=0.1):
            if stop.is_set():
                raise Interrupted("interrupted while waiting for a connection slot")
            if give_up():
                return False
        return True

    def release(self) -> None:
        self._sem.release()

    @contextmanager
    def held(self, stop: threading.Event) -> Iterator[None]:
        """One slot for the block (a repo's resolution request); Interrupted when ``stop`` is set while waiting."""
        self.acquire(stop)
        try:
            yield
        finally:
            self.release()


@dataclass(frozen=True)
class TransferOptions:
    """How blob downloads run: ``slots`` shared by the whole run; ``counter``, the repo's retry counter (its stop event
    stops every download); ``on_bytes(n)`` per chunk (negative: bytes discarded); ``on_kept(n)`` once per attempt, the
    bytes kept from a leftover; ``part_cap`` parallel ranges per file (1: never split); ``threshold``, the bytes left to
    fetch above which a file is split."""

    slots: Slots
    counter: RetryCounter
    on_bytes: Callable[[int], None] | None = None
    on_kept: Callable[[int], None] | None = None
    part_cap: int = DEFAULT_PART_CAP
    threshold: int = PARALLEL_THRESHOLD


def download_blob(client: HubClient, folder: RepoFolder, repo: RepoRevision, file: RemoteFile,
                  options: TransferOptions) -> int:
    """Download ``file`` into ``folder``'s ``blobs/<etag>`` (resuming a leftover), verified, under the blob lock the
    caller holds; a resumed file failing its hash is fetched once more from byte 0. Returns the bytes received.

    Raises:
        IntegrityError: bytes that do not match the published size or hash (the partial file is deleted).
        Interrupted, EndpointUnreachable, HubError...: the partial file is kept for the next run.
        OSError: a local failure (disk full...); the partial file is deleted.
    """
    received = 0
    for attempt in (1, 2):
        incomplete = folder.resume_incomplete(file.etag)
        job = _Job(client, repo, file, incomplete, options)
        try:
            with client.mapped(repo, file.path):
                job.run()
        except IntegrityError:
            received += job.received
            incomplete.unlink(missing_ok=True)
            if options.on_bytes:
                options.on_bytes(-job.received)
            if attempt == 2:
                raise
            continue
        except (HubError, Interrupted):
            incomplete.close()
            raise  # a network failure or a stop: the partial file stays for the next run to resume
        except BaseException:
            incomplete.unlink(missing_ok=True)  # a local failure (disk full...): free the space
            raise
        received += job.received
        folder.publish_blob(incomplete, file.etag)
        return received
    raise AssertionError("unreachable")


def trusted_prefix(fd: int, size: int) -> int:
    """The bytes at the start of a leftover that hold what was received: all when written in order; with holes (parallel
    parts), up to the first hole rounded down to 1 MiB (the block before a hole may be partly written); 0 when larger
    than ``size``. The hash check catches the rest."""
    length = os.fstat(fd).st_size
    if length == 0 or length > size:
        return 0
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:  # no SEEK_HOLE here: every byte counts as data
        hole = length
    if hole >= length:
        return length
    return max(0, (hole - 1) // _RESUME_GRAIN * _RESUME_GRAIN)


@dataclass
class _Part:
    start: int
    end: int
    pos: int = field(init=False)

    def __post_init__(self) -> None:
        self.pos = self.start


class _Job:
    """One file: one stream fetched and hashed by the calling thread, or parts streamed by worker threads and hashed
    in order by the calling thread."""

    def __init__(self, client: HubClient, repo: RepoRevision, file: RemoteFile, path: IncompleteBlob,
                 options: TransferOptions) -> None:
        self.client, self.repo, self.file, self.path, self.options = client, repo, file, path, options
        self.stop = options.counter.stop
        self.budget: Budget = options.counter.budget()
        self.what = f"{repo.repo_id}: {file.path}"
        self.received = 0
        self.parts: list[_Part] = []
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.whole_body = False  # the server ignored Range: one stream from byte 0
        self.ranged = False  # the server answered a Range request with 206 at least once
        self.probed = threading.Event()
        self.threads: list[threading.Thread] = []
        self.inline: BlobHash | None = None  # one stream: the hash of the bytes so far (_one_stream)

    def run(self) -> None:
        # Relative to the blobs/ fd resume_incomplete opened (cache.IncompleteBlob): never through a swapped link.
        fd = self.path.open_fd(os.O_RDWR)
        try:
            kept = trusted_prefix(fd, self.file.size)
            os.ftruncate(fd, kept)
            if self.options.on_kept:  # also 0: the caller may have counted a leftover this run discarded
                self.options.on_kept(kept)
            self.fd = fd
            self._fetch_and_hash(kept)
        finally:
            pools.join(self.threads)
            os.close(fd)

    def _fetch_and_hash(self, kept: int) -> None:
        file = self.file
        rest = file.size - kept
        count = 1
        if rest > self.options.threshold and self.options.part_cap > 1:
            count = max(1, min(self.options.part_cap, self.options.slots.size, math.ceil(rest / MIN_PART)))
        bounds = [kept + rest * i // count for i in range(count + 1)]
        self.parts = [_Part(bounds[i], bounds[i + 1]) for i in range(count)] if rest > 0 else []
        if count == 1:
            self._one_stream(kept)
            return
        if self.parts:
            self._start(self.parts[0])
            while not self.probed.wait(0.1):  # the first answer says whether ranges work
                self._check()
            self._check()
            if self.whole_body:
                kept = 0
                self.parts[0].end = file.size
                self.parts = self.parts[:1]
            for part in self.parts[1:]:
                self._start(part)
        try:
            self._hash(kept)
        except BaseException as exc:  # every part stops at its next chunk
            self._fail(Interrupted(f"{self.what}: interrupted") if self.stop.is_set() else exc)
            pools.join(self.threads)  # the parts stop at their next chunk; a second Ctrl-C still interrupts this
            self._keep_prefix()
            raise

    def _one_stream(self, kept: int) -> None:
        """The bytes after ``kept`` as one stream in this thread, hashed as written (most files are small)."""
        self.inline = self.file.hasher()
        self._hash_from_disk(self.inline, 0, kept)
        try:
            if self.parts:
                self._fetch_part(self.parts[0])
                self._check()
        except BaseException as exc:
            if self.stop.is_set() and not isinstance(exc, Interrupted):
                exc = Interrupted(f"{self.what}: interrupted")
            self._keep_prefix()
            raise exc from None
        if not self.inline.matches():
            raise IntegrityError(f"{self.what} does not match its expected hash "
                                 f"(expected {self.file.hash}, got {self.inline.hexdigest()})")

    def _hash_from_disk(self, hasher: BlobHash, offset: int, end: int) -> None:
        while offset < end:
            piece = os.pread(self.fd, min(_HASH_PIECE, end - offset), offset)
            if not piece:
                raise IntegrityError(f"{self.what}: the partial file shrank while hashing")
            hasher.update(piece)
            offset += len(piece)

    def _hash(self, kept: int) -> None:
        """Hash the file in order as its bytes land; raise the first worker error or an integrity error."""
        hasher = self.file.hasher()
        offset = 0
        while offset < self.file.size:
            ready = self._ready(offset, kept)
            self._hash_from_disk(hasher, offset, ready)
            offset = max(offset, ready)
            if offset < self.file.size:
                with self.cond:
                    if self._ready(offset, kept) == offset:
                        self.cond.wait(0.1)
            self._check()
        if not hasher.matches():
            raise IntegrityError(f"{self.what} does not match its expected hash "
                                 f"(expected {self.file.hash}, got {hasher.hexdigest()})")

    def _ready(self, offset: int, kept: int) -> int:
        """The end of the contiguous bytes on disk starting at ``offset``."""
        end = kept if not self.whole_body else 0
        if offset < end:
            return end
        for part in self.parts:
            if part.start <= offset < part.end or (offset == part.start == part.end):
                return part.pos
        return offset

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.stop.is_set():
            raise Interrupted(f"{self.what}: interrupted")

    def _fail(self, error: BaseException | None) -> None:
        with self.cond:
            if self.error is None and error is not None:
                self.error = error
            self.cond.notify_all()
        self.probed.set()

    def _keep_prefix(self) -> None:
        """After a stop or a network failure: cut the file to its contiguous prefix, so the next run resumes it."""
        if not self.parts:
            return
        prefix = self.parts[0].start  # the kept bytes (0 after a switch to one whole-body stream)
        for part in self.parts:
            if part.start != prefix:
                break
            prefix = part.pos
            if part.pos < part.end:
                break
        os.ftruncate(self.fd, prefix)

    # -- workers

    def _start(self, part: _Part) -> None:
        thread = threading.Thread(target=self._worker, args=(part,), daemon=True,
                                  name=f"hfcache-part:{self.file.path}@{part.start}")
        self.threads.append(thread)
        thread.start()

    def _worker(self, part: _Part) -> None:
        try:
            self._fetch_part(part)
        except BaseException as exc:  # handed to the hashing thread, which raises it
            self._fail(exc)
        finally:
            self.probed.set()

    def _fetch_part(self, part: _Part) -> None:
        """Stream ``part`` under a slot, retrying transient failures from where it stopped (returns early on a stop)."""
        if not self.options.slots.acquire(self.stop, give_up=lambda: self.error is not None):
            return  # another part failed while this one waited
        try:
            while part.pos < part.end and self.error is None and not self.stop.is_set():
                try:
                    with counting(self.options.counter):  # this thread's requests are the repo's (retry.py)
                        self._stream(part)
                except (HubError, Interrupted, IntegrityError):
                    raise
                except Exception as exc:  # transient ones are retried, others re-raised
                    if self.error is not None or not self.budget.backoff(exc, self.what):
                        raise
        finally:
            self.options.slots.release()

    def _stream(self, part: _Part) -> None:
        first = part is self.parts[0] and not self.probed.is_set()
        with self.client.open_body(self.repo, self.file, part.pos, part.end) as response:
            if response.status_code == 200 and (part.pos > 0 or part.end < self.file.size):
                # A server without Range support (it never answered 206) gets one stream from byte 0, on the first
                # request or on a retry after a cut; one that honoured Range and then ignores it is broken.
                if self.ranged or len(self.parts) > 1 and not first:
                    raise HubError(f"{self.what}: the endpoint ignored Range after honouring it",
                                   hint="the endpoint is broken")
                if self.options.on_bytes and part.pos:
                    self.options.on_bytes(-part.pos)  # progress: those bytes come again
                self.whole_body = True
                part.start = part.pos = 0
                part.end = self.file.size
                if self.inline is not None:  # the kept bytes are not used: hash from byte 0
                    self.inline = self.file.hasher()
            elif response.status_code == 206:
                self._check_range(response, part)
                self.ranged = True
            announced = response.headers.get("Content-Length")
            if announced is not None and announced.strip() != str(part.end - part.pos):
                raise IntegrityError(f"{self.what}: the endpoint announced {announced.strip()!r} bytes for "
                                     f"{part.end - part.pos} published bytes (of {self.file.size})")
            if first:
                self.probed.set()
            # A floor per stream, checked at every raw chunk (one byte too): a drip is cut within RATE_WINDOW
            # seconds plus --timeout and retried (SlowBody) within the file's retry budget.
            floor = self.client.throughput(self.what)
            for chunk in iter_body(response, lambda n: slow_body(floor, n)):
                if self.error is not None or self.stop.is_set():
                    return
                if part.pos + len(chunk) > part.end:
                    raise IntegrityError(f"{self.what} is larger than the {self.file.size} bytes the endpoint "
                                         "published")
                _write_all(self.fd, chunk, part.pos)
                if self.inline is not None:
                    self.inline.update(chunk)
                with self.cond:
                    part.pos += len(chunk)
                    self.received += len(chunk)
                    self.cond.notify_all()
                if self.options.on_bytes:
                    self.options.on_bytes(len(chunk))
        if part.pos < part.end:
            raise ShortBody(f"{self.what}: body ended at byte {part.pos} of {part.end}")

    def _check_range(self, response, part: _Part) -> None:
        expected = f"bytes {part.pos}-{part.end - 1}/{self.file.size}"
        got = response.headers.get("Content-Range", "")
        if got.replace(" ", "") != expected.replace(" ", ""):
            raise IntegrityError(f"{self.what}: asked for {expected}, the endpoint answered Content-Range {got!r}")


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """``os.pwrite`` every byte: after a short write the next call raises the real error (ENOSPC), no gap."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
