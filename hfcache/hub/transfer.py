"""Blob downloads into a cache: resumed from every byte on disk, in parallel ranges sized to the free connections
(:class:`Slots`: a fair share at the start, an idle slot takes half of the largest part left), hashed once in order
by the calling thread while they arrive, published only when verified. Resume: the extents each part completed are
recorded beside the download (:mod:`hfcache.cache.extents`). The behaviour and its numbers: docs/warm.md, "Resume"
and "Large files in parallel ranges". Library gap: huggingface_hub resumes only its own ``.incomplete`` unhashed,
in one stream (``file_download.http_get``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import pools
from ..cache import extents
from ..cache.content import BlobHash
from ..cache.incomplete import IncompleteBlob
from ..cache.layout import RepoFolder
from ..errors import HubError, IntegrityError
from .bodies import iter_body, slow_body
from .client import HubClient
from .files import RemoteFile, RepoRevision
from .retry import Budget, Interrupted, RetryCounter, ShortBody, counting
from .slots import Slots

PARALLEL_THRESHOLD = 16 * 1024 * 1024  # bytes left to fetch above which a file is fetched in parts
MIN_PART = 8 * 1024 * 1024  # a file is split at its start only into parts of at least this much
STEAL_MIN = 4 * 1024 * 1024  # an idle connection takes half of a part only when both halves get at least this much
DEFAULT_PART_CAP = 8  # parts of one file at once
RECORD_EVERY = 1024 * 1024  # bytes of a file received between two saves of its extent record (a crash loses less)
_HASH_PIECE = 1024 * 1024  # bytes read back per pread when hashing what another part wrote
_HANDOVER = 1024 * 1024  # bytes of chunks waiting in memory for the hashing thread, per file, at most
_STEAL_EVERY = 0.05  # seconds between two looks for an idle slot


@dataclass(frozen=True)
class TransferOptions:
    """How blob downloads run: ``slots`` shared by the whole run; ``counter``, the repo's retry counter (its stop event
    stops every download); ``on_bytes(n)`` per chunk (negative: bytes discarded); ``on_kept(n)`` once per attempt, the
    bytes kept from a leftover; ``part_cap`` parts of one file at once (1: never split); ``threshold``, the bytes left
    to fetch above which a file is fetched in parts."""

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
    Raises IntegrityError: not the published size or hash; OSError: a local failure (disk full...): the partial file
    is deleted. Interrupted, EndpointUnreachable, HubError...: it and its extent record stay for the next run."""
    received = 0
    for attempt in (1, 2):
        incomplete = folder.resume_incomplete(file.etag)
        job = _Job(client, folder, repo, file, incomplete, options)
        try:
            with client.mapped(repo, file.path):
                job.run()
        except IntegrityError:
            received += job.received
            incomplete.unlink(missing_ok=True)
            extents.remove(folder, file.etag)
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
            extents.remove(folder, file.etag)
            raise
        received += job.received
        folder.publish_blob(incomplete, file.etag)
        extents.remove(folder, file.etag)
        return received
    raise AssertionError("unreachable")


@dataclass
class _Part:
    """Bytes ``[start, end)`` of the file; ``pos``: received up to here; ``asked``: the end of the request in
    flight. A done part (kept from a leftover) has ``pos == end`` and no worker. ``end`` shrinks when the part is
    split, never below ``asked``: no request is cut, so no byte is sent twice."""

    start: int
    end: int
    pos: int = field(default=-1)
    asked: int = 0

    def __post_init__(self) -> None:
        if self.pos < 0:
            self.pos = self.start


class _Job:
    """One file: one stream fetched and hashed by the calling thread, or parts streamed by worker threads and hashed
    in order by the calling thread (module docstring)."""

    def __init__(self, client: HubClient, folder: RepoFolder, repo: RepoRevision, file: RemoteFile,
                 path: IncompleteBlob, options: TransferOptions) -> None:
        self.client, self.folder, self.repo, self.file, self.path = client, folder, repo, file, path
        self.options = options
        self.stop = options.counter.stop
        self.budget: Budget = options.counter.budget()
        self.what = f"{repo.repo_id}: {file.path}"
        self.received = self.kept = 0
        self.parts: list[_Part] = []
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.whole_body = False  # the server ignored Range: one stream from byte 0
        self.ranged = False  # the server answered a Range request with 206 at least once
        self.probed = threading.Event()
        self.threads: list[threading.Thread] = []
        self.inline: BlobHash | None = None  # one stream in this thread: the hash of the bytes so far
        self.hashed = 0  # parts: the hashing thread's frontier
        self.handover: deque[tuple[int, int, bytes | None]] = deque()
        self.handover_bytes = 0
        self.unrecorded = 0
        self.record_lock = threading.Lock()
        self.recorder: extents.Recorder | None = None

    def run(self) -> None:
        # Relative to the blobs/ fd resume_incomplete opened (cache.IncompleteBlob): never through a swapped link.
        self.fd = self.path.open_fd(os.O_RDWR)
        self.recorder = extents.Recorder(self.folder, self.file.etag, self.path.name, self.fd, self.file.size)
        try:
            done = self._resume()
            self.kept = sum(end - start for start, end in done)
            if self.options.on_kept:  # also 0: the caller may have counted a leftover this run discarded
                self.options.on_kept(self.kept)
            gaps = extents.gaps(done, self.file.size)
            if len(gaps) <= 1 and sum(end - start for start, end in gaps) <= self.options.threshold \
                    or self.options.part_cap <= 1:
                self._one_stream(done, gaps)
            else:
                self._parts(done, gaps)
        finally:
            pools.join(self.threads)
            self.recorder.close()
            os.close(self.fd)

    def _resume(self) -> list[tuple[int, int]]:
        """The extents of the leftover to keep: its record's, else its trusted prefix (the file cut there)."""
        recorded = extents.load(self.folder, self.file.etag, self.path.name, self.fd, self.file.size)
        if recorded is not None:
            return recorded
        kept = extents.trusted_prefix(self.fd, self.file.size)
        os.ftruncate(self.fd, kept)
        return [(0, kept)] if kept else []

    # -- one stream

    def _one_stream(self, done: list[tuple[int, int]], gaps: list[tuple[int, int]]) -> None:
        """The missing bytes as streams in this thread, in order, hashed as written (most files are small)."""
        self.inline = self.file.hasher()
        self.parts = [_Part(start, end, end) for start, end in done] + [_Part(start, end) for start, end in gaps]
        self.parts.sort(key=lambda p: p.start)
        try:
            for part in self.parts:
                if part.pos == part.end:
                    self._read_back(self.inline, part.start, part.end)
                    continue
                self._fetch_part(part, held=False)
                self._check()
                if self.whole_body:
                    break
        except BaseException as exc:
            if self.stop.is_set() and not isinstance(exc, Interrupted):
                exc = Interrupted(f"{self.what}: interrupted")
            self._keep_on_disk()
            raise exc from None
        self._verify(self.inline)

    # -- parts

    def _parts(self, done: list[tuple[int, int]], gaps: list[tuple[int, int]]) -> None:
        """Fetch ``gaps`` in parts (the first probes whether the endpoint honours ``Range``), hash in order."""
        slots = self.options.slots
        self.parts = [_Part(start, end, end) for start, end in done]
        if not slots.acquire(self.stop):
            return
        extra = slots.fair_share(self.options.part_cap - 1)
        pending = _split([_Part(start, end) for start, end in gaps], 1 + extra)
        held = min(len(pending), 1 + extra)  # more gaps than slots (a record's): the rest wait for a slot
        for _ in range(1 + extra - held):
            slots.release()  # the gaps were too small to use every slot taken
        self.parts = sorted(self.parts + pending, key=lambda p: p.start)
        try:
            self._start(pending[0])
            while not self.probed.wait(0.1):  # the first answer says whether ranges work
                self._check()
            self._check()
            if self.whole_body:
                for _ in range(held - 1):
                    slots.release()
            else:
                for i, part in enumerate(pending[1:], 1):
                    self._start(part, held=i < held)
            self._hash()
        except BaseException as exc:  # every part stops at its next chunk
            self._fail(Interrupted(f"{self.what}: interrupted") if self.stop.is_set() else exc)
            pools.join(self.threads)  # the parts stop at their next chunk; a second Ctrl-C still interrupts this
            self._keep_on_disk()
            raise

    def _hash(self) -> None:
        """Hash the file in order as its bytes land (handed over in memory at the frontier, else read back); split a
        part when a slot is idle; raise the first worker error or an integrity error."""
        hasher = self.file.hasher()
        size, next_steal = self.file.size, 0.0
        while self.hashed < size:
            with self.cond:
                while True:
                    self._check()
                    if self.handover:
                        start, end, chunk = self.handover.popleft()
                        self.handover_bytes -= len(chunk) if chunk is not None else 0
                        break
                    ready = self._ready(self.hashed)
                    if ready > self.hashed:
                        start, end, chunk = self.hashed, ready, None
                        break
                    if not any(t.is_alive() for t in self.threads):  # not expected: every part ends complete
                        raise HubError(f"{self.what}: the parts ended at byte {self.hashed} of {size}")
                    now = time.monotonic()
                    if now >= next_steal:
                        self._steal()
                        next_steal = now + _STEAL_EVERY
                    self.cond.wait(_STEAL_EVERY)
            if end <= self.hashed:
                continue
            if start > self.hashed:  # bytes of this part written before it reached the frontier
                self._read_back(hasher, self.hashed, start)
            if chunk is not None:
                hasher.update(memoryview(chunk)[max(0, self.hashed - start):])
            else:
                self._read_back(hasher, max(start, self.hashed), end)
            with self.cond:
                self.hashed = end
        self._verify(hasher)

    def _steal(self) -> None:
        """Under ``cond``: give the second half of the largest remaining part to an idle slot (module docstring)."""
        if self.whole_body or not self.ranged or self.error is not None:
            return
        running = [p for p in self.parts if p.pos < p.end]
        if not running or len(running) >= self.options.part_cap:
            return
        part = max(running, key=lambda p: p.end - p.pos)
        if part.end - part.pos < 2 * STEAL_MIN or not self.options.slots.try_spare():
            return
        middle = max(part.asked, part.pos + (part.end - part.pos) // 2)
        if part.end - middle < STEAL_MIN:
            self.options.slots.release()
            return
        new = _Part(middle, part.end)
        part.end = middle
        self.parts = sorted([*self.parts, new], key=lambda p: p.start)
        self._start(new, held=True)

    def _ready(self, offset: int) -> int:
        """Under ``cond``: the end of the contiguous bytes on disk from ``offset``."""
        end = offset
        for part in self.parts:  # sorted by start
            if part.start <= end < part.end or part.start == end == part.end:
                end = part.pos
                if part.pos < part.end:
                    break
        return max(end, offset)

    # -- workers

    def _start(self, part: _Part, held: bool = True) -> None:
        thread = threading.Thread(target=self._worker, args=(part, held), daemon=True,
                                  name=f"hfcache-part:{self.file.path}@{part.start}")
        self.threads.append(thread)
        thread.start()

    def _worker(self, part: _Part, held: bool) -> None:
        try:
            self._fetch_part(part, held)
        except BaseException as exc:  # handed to the hashing thread, which raises it
            self._fail(exc)
        finally:
            self.probed.set()
            with self.cond:
                self.cond.notify_all()

    def _fetch_part(self, part: _Part, held: bool) -> None:
        """Stream ``part`` under a slot (``held``: already taken), retrying transient failures from where it stopped
        (returns early on a stop)."""
        slots = self.options.slots
        if not held and not slots.acquire(self.stop, give_up=lambda: self.error is not None):
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
            slots.release()

    def _stream(self, part: _Part) -> None:
        first = not self.probed.is_set()
        with self.cond:  # parts ask for half of what is left (8 MiB at least): the other half can be split off
            start = part.pos
            end = part.end if self.inline is not None else \
                min(part.end, start + max(MIN_PART, (part.end - start + 1) // 2))
            part.asked = end
        with self.client.open_body(self.repo, self.file, start, end, ranged=self.inline is None) as response:
            if response.status_code == 200 and (start > 0 or end < self.file.size):
                # A server without Range support (it never answered 206) gets one stream from byte 0, on the first
                # request or on a retry after a cut; one that honoured Range and then ignores it is broken.
                if self.ranged or not first and len([p for p in self.parts if p.pos < p.end]) > 1:
                    raise HubError(f"{self.what}: the endpoint ignored Range after honouring it",
                                   hint="the endpoint is broken")
                self._whole_body(part)
                start, end = 0, self.file.size
            elif response.status_code == 206:
                self._check_range(response, start, end)
                self.ranged = True
            announced = response.headers.get("Content-Length")
            if announced is not None and announced.strip() != str(end - start):
                raise IntegrityError(f"{self.what}: the endpoint announced {announced.strip()!r} bytes for "
                                     f"{end - start} published bytes (of {self.file.size})")
            self.probed.set()
            # A floor per stream, checked at every raw chunk (one byte too): a drip is cut within RATE_WINDOW
            # seconds plus --timeout and retried (SlowBody) within the file's retry budget.
            floor = self.client.throughput(self.what)
            for chunk in iter_body(response, lambda n: slow_body(floor, n)):
                if self.error is not None or self.stop.is_set() or not self._take(part, chunk):
                    return
        if part.pos < min(end, part.end):
            raise ShortBody(f"{self.what}: body ended at byte {part.pos} of {min(end, part.end)}")

    def _take(self, part: _Part, chunk: bytes) -> bool:
        """Write ``chunk`` at ``part.pos``, hash or hand it over, count it; False once the part (split meanwhile)
        is complete: the rest of the body belongs to another part."""
        with self.cond:
            room = part.end - part.pos
        if len(chunk) > room:
            if part.end == self.file.size or self.whole_body:
                raise IntegrityError(f"{self.what} is larger than the {self.file.size} bytes the endpoint published")
            chunk = chunk[:room]
        start = part.pos
        _write_all(self.fd, chunk, start)
        if self.inline is not None:
            self.inline.update(chunk)
        with self.cond:
            part.pos += len(chunk)
            self.received += len(chunk)
            self.unrecorded += len(chunk)
            if self.inline is None and self._ready(self.hashed) >= part.pos:  # at the frontier: hand it over
                keep = self.handover_bytes + len(chunk) <= _HANDOVER
                self.handover.append((start, part.pos, chunk if keep else None))
                self.handover_bytes += len(chunk) if keep else 0
            self.cond.notify_all()
            save = self.inline is None and self.unrecorded >= RECORD_EVERY
        if self.options.on_bytes:
            self.options.on_bytes(len(chunk))
        if save:
            self._record()
        return part.pos < part.end

    def _whole_body(self, part: _Part) -> None:
        """The endpoint answered 200 to a range: this part becomes the whole file from byte 0 (alone: the others
        start only after this first answer)."""
        if self.options.on_bytes and self.received + self.kept:
            self.options.on_bytes(-(self.received + self.kept))  # progress: those bytes come again
        with self.cond:
            self.whole_body = True
            self.received = self.kept = 0
            part.start = part.pos = 0
            part.end = self.file.size
            self.parts = [part]
        if self.inline is not None:  # the kept bytes are not used: hash from byte 0
            self.inline = self.file.hasher()

    def _check_range(self, response, start: int, end: int) -> None:
        expected = f"bytes {start}-{end - 1}/{self.file.size}"
        got = response.headers.get("Content-Range", "")
        if got.replace(" ", "") != expected.replace(" ", ""):
            raise IntegrityError(f"{self.what}: asked for {expected}, the endpoint answered Content-Range {got!r}")

    # -- shared

    def _read_back(self, hasher: BlobHash, offset: int, end: int) -> None:
        while offset < end:
            piece = os.pread(self.fd, min(_HASH_PIECE, end - offset), offset)
            if not piece:
                raise IntegrityError(f"{self.what}: the partial file shrank while hashing")
            hasher.update(piece)
            offset += len(piece)

    def _verify(self, hasher: BlobHash) -> None:
        if not hasher.matches():
            raise IntegrityError(f"{self.what} does not match its expected hash "
                                 f"(expected {self.file.hash}, got {hasher.hexdigest()})")

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

    def _record(self) -> None:
        """Save the extents received so far (:mod:`hfcache.cache.extents`); one thread at a time, others skip."""
        if not self.record_lock.acquire(blocking=False):
            return
        try:
            with self.cond:
                done = [(p.start, p.pos) for p in self.parts if p.pos > p.start]
                self.unrecorded = 0
            self.recorder.save(done)
        finally:
            self.record_lock.release()

    def _keep_on_disk(self) -> None:
        """After a stop or a network failure: keep every extent received for the next run, as a prefix (the file cut
        there: no record needed) or in the extent record."""
        with self.record_lock:
            with self.cond:
                done = extents.merged([(p.start, p.pos) for p in self.parts if p.pos > p.start])
            if len(done) == 1 and done[0][0] == 0:
                os.ftruncate(self.fd, done[0][1])
                extents.remove(self.folder, self.file.etag)
            elif done:
                self.recorder.save(done)


def _split(parts: list[_Part], count: int) -> list[_Part]:
    """``parts`` split into ``count`` at most, the largest halved each time while both halves get :data:`MIN_PART`;
    sorted by start."""
    parts = list(parts)
    while len(parts) < count:
        largest = max(parts, key=lambda p: p.end - p.start)
        if largest.end - largest.start < 2 * MIN_PART:
            break
        pieces = min(count - len(parts) + 1, math.ceil((largest.end - largest.start) / MIN_PART))
        bounds = [largest.start + (largest.end - largest.start) * i // pieces for i in range(pieces + 1)]
        parts.remove(largest)
        parts += [_Part(bounds[i], bounds[i + 1]) for i in range(pieces)]
    return sorted(parts, key=lambda p: p.start)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """``os.pwrite`` every byte: after a short write the next call raises the real error (ENOSPC), no gap."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
