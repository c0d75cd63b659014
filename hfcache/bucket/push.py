"""``hfcache push s3://BUCKET/PREFIX``: the cache's snapshots into a bucket (:mod:`.layout`). Each blob is uploaded
once, only if the bucket does not hold it, with its bytes hashed against its name while they are read (a corrupt blob
is never completed in the bucket); then each snapshot's manifest, then the refs.

Concurrent pushers of the same blob: every write of a blob the bucket lacked is conditional (``If-None-Match: *`` on
the PUT or on CompleteMultipartUpload; a 412 means another pusher finished it first). A store that ignores the
condition gets an overwrite with the same verified bytes. Library gap: boto3's ``upload_fileobj`` (s3transfer) has no
hook between the last part and CompleteMultipartUpload, and its single PUT of a stream never reads to its end, so a
blob's hash could not be checked before the object appears: the multipart upload is driven here.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import pools
from ..errors import CacheError, HubError
from ..move.export import Entry, ExportPlan, plan_export
from ..move.export_store import entry_reader
from ..names import is_sha256, parse_folder_name
from ..warming.lockfile import LockedFile, LockedRepo, read_lock
from .layout import blob_key, ref_key, render_manifest, snapshot, snapshot_key
from .store import Bucket, parse_bucket_url

SINGLE_PUT_MAX = 16 * 1024 * 1024  #: blobs up to this size go up in one PUT, larger ones as multipart uploads
MIN_PART = 16 * 1024 * 1024  #: multipart part size, raised so that no upload needs more than 9,000 parts
_MAX_PARTS = 9000  # S3 allows 10,000
PART_UPLOADS = 4  #: parts of one blob uploaded at once


@dataclass(frozen=True)
class BucketPushReport:
    """The outcome of :func:`push_bucket`: ``url`` (``s3://BUCKET/PREFIX``), ``snapshots`` (``<folder>@<commit>``
    sorted) and ``refs`` (``<folder>/<ref>``) written, ``blobs_uploaded``/``blobs_present`` (distinct blobs sent / the
    bucket already held), ``bytes_uploaded``/``bytes_total`` (bytes sent / of every distinct blob), ``seconds``."""

    url: str
    snapshots: tuple[str, ...]
    refs: tuple[str, ...]
    blobs_uploaded: int
    blobs_present: int
    bytes_uploaded: int
    bytes_total: int
    seconds: float


@dataclass
class _Content:
    blobs: dict[str, Entry]  # etag -> the file entry holding it
    snapshots: dict[tuple[str, str], LockedRepo]  # (folder, commit) -> manifest
    refs: dict[tuple[str, str], str]  # (folder, ref) -> commit


def push_bucket(url: str, cache_dir: str | os.PathLike[str], specs: Iterable[str] = (), *,
                lock_path: str | os.PathLike[str] | None = None, timeout: float = 60.0, retries: int = 5,
                max_workers: int = 8, sink=None) -> BucketPushReport:
    """Push the snapshots of ``cache_dir`` that ``specs`` (``REPO_ID[@REVISION]``, every revision without ``@``) or
    the lock at ``lock_path`` name (default: every snapshot) with their refs to ``url``, ``max_workers`` uploads at
    once; ``sink`` (:class:`hfcache.oci.registry.TransferSink`) sees each upload.

    Raises:
        UsageError: a bad URL or spec, a repo not in the cache, no boto3, no credentials (exit 2).
        CacheError: the cache cannot be read, a blob does not match its name (nothing of it is published; exit 5).
        HubError: the store refused or failed a request (exit 3; blobs already sent stay, no manifest names them).
    """
    started = time.monotonic()
    target = parse_bucket_url(url)
    lock = read_lock(lock_path) if lock_path is not None else None
    content = _collect(plan_export(Path(cache_dir), specs, lock))
    bucket = Bucket(target, timeout=timeout, retries=retries, max_workers=max_workers)
    sent = _upload_blobs(bucket, content.blobs, max_workers, sink)
    for (folder, commit), repo in sorted(content.snapshots.items()):
        bucket.put_bytes(snapshot_key(target, folder, commit), render_manifest(repo))
    for (folder, ref), commit in sorted(content.refs.items()):
        bucket.put_bytes(ref_key(target, folder, ref), commit.encode())
    return BucketPushReport(
        url=str(target), snapshots=tuple(f"{f}@{c}" for f, c in sorted(content.snapshots)),
        refs=tuple(f"{f}/{r}" for f, r in sorted(content.refs)), blobs_uploaded=sum(1 for n in sent if n),
        blobs_present=sum(1 for n in sent if not n), bytes_uploaded=sum(sent),
        bytes_total=sum(e.size for e in content.blobs.values()), seconds=time.monotonic() - started)


def _collect(plan: ExportPlan) -> _Content:
    """The blobs, snapshot manifests and refs of an export plan (the cache's layout, checked by the plan)."""
    by_name = {e.name: e for e in plan.entries}
    blobs: dict[str, Entry] = {}
    linked: dict[tuple[str, str], dict[str, str]] = {}  # (folder, commit) -> path -> etag
    absent: dict[tuple[str, str], list[str]] = {}
    refs: dict[tuple[str, str], str] = {}
    sizes: dict[str, int] = {}
    for e in plan.entries:
        parts = e.name.split("/")
        if len(parts) < 3 or parse_folder_name(parts[0]) is None:
            continue
        folder, section = parts[0], parts[1]
        if section == "blobs" and e.kind in ("file", "hardlink"):
            source = e if e.kind == "file" else by_name[e.target]
            blobs.setdefault(parts[2], source)
            sizes[parts[2]] = source.size
        elif section == "refs" and e.kind == "data":
            refs[(folder, "/".join(parts[2:]))] = e.target.strip()
        elif section == "snapshots" and len(parts) >= 4 and e.kind != "dir":
            if e.kind != "symlink":
                raise CacheError(f"{e.name}: not a link to a blob: push to a bucket needs the standard layout",
                                 hint="warm the repo into a cache on a filesystem with symlinks")
            linked.setdefault((folder, parts[2]), {})["/".join(parts[3:])] = e.target.rsplit("/", 1)[-1]
        elif section == ".no_exist" and len(parts) >= 4 and e.kind == "empty":
            absent.setdefault((folder, parts[2]), []).append("/".join(parts[3:]))
    snapshots = {}
    for (folder, commit), files in linked.items():
        locked = [LockedFile(path, sizes[etag], f"sha256:{etag}" if is_sha256(etag) else f"git-sha1:{etag}")
                  for path, etag in files.items()]
        snapshots[(folder, commit)] = snapshot(folder, commit, locked, absent.get((folder, commit), ()))
    refs = {key: commit for key, commit in refs.items() if (key[0], commit) in snapshots}
    return _Content(blobs, snapshots, refs)


def _upload_blobs(bucket: Bucket, blobs: dict[str, Entry], workers: int, sink) -> list[int]:
    """Upload each blob the bucket lacks, ``workers`` at once; the bytes sent per blob (0: already there)."""
    lock = threading.Lock()

    def one(etag: str) -> int:
        entry = blobs[etag]
        key = blob_key(bucket.url, etag)
        held = bucket.head(key)
        if held == entry.size:
            return 0
        if sink is not None:
            with lock:
                sink.begin(f"{entry.name.split('/', 1)[0]}: {etag[:12]}", entry.size)
        with entry_reader(entry) as reader:
            upload_blob(bucket, key, reader, entry.size, create_only=held is None)
        if sink is not None:
            with lock:
                sink.advance(entry.size)
        return entry.size

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="hfcache-s3-put") as pool:
        return list(pools.ordered([pool.submit(one, etag) for etag in sorted(blobs)]))


def upload_blob(bucket: Bucket, key: str, reader, size: int, *, create_only: bool) -> bool:
    """Write ``size`` bytes of ``reader`` (a reader that checks the content at its end, e.g.
    :class:`hfcache.cache.content.HashingReader`) as object ``key``, completed only once the reader reached its end:
    one PUT up to :data:`SINGLE_PUT_MAX`, else a multipart upload. ``create_only``: a conditional write that leaves an
    object another writer completed first. Returns False when it did so (HTTP 412). Raises what the reader raises
    (nothing is completed), HubError."""
    if size <= SINGLE_PUT_MAX:
        data = reader.read()  # read to its end: the content is checked before the PUT
        return bucket.put_bytes(key, data, create_only=create_only)
    return _multipart(bucket, key, reader, size, create_only=create_only)


def _multipart(bucket: Bucket, key: str, reader, size: int, *, create_only: bool) -> bool:
    """Upload ``size`` bytes of ``reader`` as a multipart upload, :data:`PART_UPLOADS` parts at once, completed only
    once the reader reached its checked end; aborted on any failure. ``create_only``: complete with
    ``If-None-Match: *`` (412: another pusher won)."""
    part_size = max(MIN_PART, -(-size // _MAX_PARTS))
    client, name = bucket.client, bucket.url.bucket
    with bucket.errors(key):
        upload_id = client.create_multipart_upload(Bucket=name, Key=key)["UploadId"]

    def send(number: int, chunk: bytes) -> dict:
        try:
            with bucket.errors(f"{key} part {number}"):
                answer = client.upload_part(Bucket=name, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk)
        finally:
            room.release()
        return {"ETag": answer["ETag"], "PartNumber": number}

    room = threading.BoundedSemaphore(PART_UPLOADS)  # parts in memory at once: PART_UPLOADS x part_size
    try:
        with ThreadPoolExecutor(max_workers=PART_UPLOADS, thread_name_prefix="hfcache-s3-part") as pool:
            futures = []
            while chunk := _read_full(reader, part_size):
                room.acquire()
                futures.append(pool.submit(send, len(futures) + 1, chunk))
                if any(f.done() and f.exception() for f in futures):
                    break
            parts = list(pools.ordered(futures))
        _read_full(reader, 1)  # the checked end (the loop may stop at a part boundary without reading it)
        extra = {"IfNoneMatch": "*"} if create_only else {}
        try:
            with bucket.errors(key):
                client.complete_multipart_upload(Bucket=name, Key=key, UploadId=upload_id,
                                                 MultipartUpload={"Parts": parts}, **extra)
        except HubError as exc:
            if not (create_only and "PreconditionFailed" in exc.message):
                raise
            _abort(bucket, key, upload_id)
            return False
    except BaseException:
        _abort(bucket, key, upload_id)
        raise
    return True


def _read_full(reader, n: int) -> bytes:
    """Up to ``n`` bytes of ``reader``, fewer only at its end (a part other than the last must be whole)."""
    chunks, left = [], n
    while left and (chunk := reader.read(left)):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _abort(bucket: Bucket, key: str, upload_id: str) -> None:
    # A failed abort is left to the store's lifecycle rule for abandoned uploads: the error that led here matters.
    with contextlib.suppress(Exception):
        bucket.client.abort_multipart_upload(Bucket=bucket.url.bucket, Key=key, UploadId=upload_id)
