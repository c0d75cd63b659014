"""Pull-through into a bucket (``serve --store s3://... --upstream URL``): what the bucket lacks is fetched from
upstream once across every replica, verified, and written to the bucket, where the other replicas find it.

What upstream said lives under ``<prefix>/upstream/`` (never under ``snapshots/``/``refs/``, which ``pull s3://`` reads
and whose blobs are all present):

    upstream/snapshots/<folder>/<commit>.json   upstream's listing at a commit (a lock entry: every file, size, hash)
    upstream/refs/<folder>/<revision>           {"commit": ..., "resolved": <epoch seconds>}, asked again after
                                                --revalidate
    upstream/leases/<etag>                      {"owner": ..., "expires": <epoch seconds>}: a replica is fetching it

A blob is fetched under a lease: a conditional create (``If-None-Match: *``) that one replica wins; the others wait
for the blob to appear. A fetch runs in the background: a request waits for it at most :data:`ANSWER_WITHIN` seconds,
then gets a 503 with ``Retry-After: 1`` (hfcache and huggingface_hub retry it) while the fetch goes on. The winner renews the lease every :data:`RENEW_EVERY` seconds while it fetches; a replica that
dies mid-fetch leaves a lease that expires after :data:`LEASE_SECONDS`, and the next request takes it over with a
conditional overwrite (``If-Match`` on the stale lease's ETag: only one taker wins), then fetches from byte 0 (the
dead replica's partial upload is never completed, so it is never seen). The fetched bytes are hashed twice before the
blob is completed: by the download (size and hash of the listing) and by the upload's reader.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from ..bucket.layout import blob_key, parse_manifest, render_manifest, snapshot
from ..bucket.push import upload_blob
from ..bucket.store import Bucket
from ..cache.content import HashingReader
from ..errors import HfcacheError
from ..names import is_commit, repo_folder_name
from ..records import HubOptions, WarmRequest
from ..warming.lockfile import LockedFile, LockedRepo
from .pullthrough import PullThroughConfig
from .upstream_errors import inert, store_miss
from .vocabulary import RepoFile, RepoSnapshot, StoreMiss

LEASE_SECONDS = 60.0  #: a fetch's lease lasts this long unless renewed
RENEW_EVERY = 20.0  #: seconds between two renewals of a lease while its fetch runs
WAIT_POLL = 0.2  #: seconds between two looks for a blob another replica fetches
ANSWER_WITHIN = 5.0  #: seconds a request waits for a fetch before a 503 + Retry-After (clients' idle timeout: 10)
MAX_LISTING_BYTES = 64 * 1024 * 1024
_REF_BYTES = 4096
REF_MEMORY = 5.0  #: seconds a replica trusts a ref it resolved without reading the bucket's record again


class BucketFill:
    """Fetch what a :class:`hfcache.serve.bucket_store.BucketStore` lacks from ``config``'s upstreams (its ``allow``
    globs, ``token``, ``timeout``, ``revalidate``; ``max_size`` is refused by the CLI: a bucket has lifecycle rules)."""

    def __init__(self, bucket: Bucket, config: PullThroughConfig) -> None:
        from ..hub.session import prepare_session
        from ..warming.orchestrate import make_clients

        prepare_session()
        self.bucket, self.config = bucket, config
        self.upstream_slots = config.upstream_slots
        self.owner = uuid.uuid4().hex
        self.clients = make_clients(HubOptions(endpoints=config.upstreams, token=config.token or False,
                                               timeout=config.timeout))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=config.upstream_slots, thread_name_prefix="hfcache-fill")
        self._tasks: dict[str, Future] = {}  # etag -> the fetch this replica runs or waits for
        self._refs: dict[tuple[str, str], tuple[str, float]] = {}  # (folder, revision) -> (commit, trusted until)

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def known_ref(self, folder: str, revision: str) -> str | None:
        """The commit this replica resolved ``revision`` to, while it is trusted (at most :data:`REF_MEMORY`
        seconds, and never past --revalidate); None otherwise."""
        with self._lock:
            known = self._refs.get((folder, revision))
        return known[0] if known is not None and known[1] > time.monotonic() else None

    def resolve(self, repo_type: str, repo_id: str, revision: str) -> LockedRepo:
        """``repo_id`` at ``revision`` as upstream lists it (from the bucket's upstream record while fresh). Raises
        StoreMiss: not allowed (403 ``RepoNotAllowed``), or upstream's failure (404/403/502/503)."""
        self._check_allowed(repo_id)
        folder = repo_folder_name(repo_id, repo_type)
        commit = revision if is_commit(revision) else self._fresh_ref(folder, revision)
        if commit is not None and (known := self._listing(folder, commit)) is not None:
            self._remember_ref(folder, revision, commit)
            return known
        from ..warming.orchestrate import resolve_revision

        try:
            resolved = resolve_revision(WarmRequest(repo_id, revision=revision, repo_type=repo_type), self.clients)
        except HfcacheError as exc:
            raise store_miss(type(exc).__name__, exc.message) from None
        files = [LockedFile(f.path, f.size, f.hash) for f in resolved.files]
        locked = snapshot(folder, resolved.commit_hash, files)
        self.bucket.put_bytes(self._key("snapshots", folder, f"{resolved.commit_hash}.json"), render_manifest(locked))
        if not is_commit(revision):
            record = {"commit": resolved.commit_hash, "resolved": time.time()}
            self.bucket.put_bytes(self._key("refs", folder, revision), json.dumps(record).encode())
            self._remember_ref(folder, revision, resolved.commit_hash)
        return locked

    def _check_allowed(self, repo_id: str) -> None:
        """StoreMiss (403 ``RepoNotAllowed``) unless ``--allow`` lets ``repo_id`` be fetched from upstream."""
        if self.config.allow and not any(fnmatch.fnmatchcase(repo_id, g) for g in self.config.allow):
            raise StoreMiss("RepoNotAllowed", f"{repo_id} is not in this mirror's bucket, and this mirror's --allow "
                            "list does not let it be fetched from upstream", status=403)

    def _remember_ref(self, folder: str, revision: str, commit: str) -> None:
        if not is_commit(revision):
            with self._lock:
                self._refs[(folder, revision)] = (commit, time.monotonic() + min(REF_MEMORY, self.config.revalidate))

    def ensure_blob(self, snap: RepoSnapshot, repo_file: RepoFile) -> None:
        """Make the bucket hold ``repo_file``'s blob: present, or fetched in the background (under a lease, or by
        another replica) while this request waits at most :data:`ANSWER_WITHIN` seconds, so that no client's
        idle timeout fires. Raises StoreMiss: upstream failed (502/503), or still fetching (503 with
        ``Retry-After``: the client retries and finds it)."""
        if self.bucket.head(blob_key(self.bucket.url, repo_file.etag)) == repo_file.size:
            return
        self._check_allowed(snap.repo_id)  # a blob the bucket lost (a lifecycle rule) of a repo not allowed
        with self._lock:
            task = self._tasks.get(repo_file.etag)
            if task is None or task.done():
                task = self._pool.submit(self._obtain, snap, repo_file)
                self._tasks[repo_file.etag] = task
        try:
            task.result(timeout=ANSWER_WITHIN)
        except FutureTimeout:
            raise StoreMiss("UpstreamUnavailable", f"{snap.repo_id}: {inert(repo_file.path)} is being fetched from "
                            "upstream; retry", status=503, retry_after=1) from None
        finally:
            with self._lock:
                if task.done() and self._tasks.get(repo_file.etag) is task:
                    del self._tasks[repo_file.etag]

    def _obtain(self, snap: RepoSnapshot, repo_file: RepoFile) -> None:
        """The blob in the bucket: fetched here under its lease, or by the replica holding the lease."""
        key = blob_key(self.bucket.url, repo_file.etag)
        lease = self._key("leases", repo_file.etag)
        deadline = time.monotonic() + max(600.0, repo_file.size / (1024 * 1024))  # at least 1 MiB/s
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.bucket.head(key) == repo_file.size:
                return
            etag = self._acquire(lease)
            if etag is not None:
                try:
                    held = self.bucket.head(key)
                    if held != repo_file.size:  # not finished by a replica that just released
                        self._fetch(snap, repo_file, key, lease, etag, overwrite=held is not None)
                finally:
                    self._release(lease)
                return
            time.sleep(WAIT_POLL)
        raise StoreMiss("UpstreamUnavailable", f"{snap.repo_id}: {inert(repo_file.path)} was not fetched in time; "
                        "retry", status=503, retry_after=5)

    def _fetch(self, snap: RepoSnapshot, repo_file: RepoFile, key: str, lease: str, etag: str, *,
               overwrite: bool) -> None:
        """Download the file from upstream into a temporary file (size and hash checked), then upload it, hashed
        again, renewing the lease (held as ``etag``) meanwhile; ``overwrite``: replace the object of another size
        the bucket holds under the blob's name (a truncated or foreign object)."""
        from ..hub.files import RemoteFile, RepoRevision

        remote = RemoteFile(repo_file.path, repo_file.size, repo_file.blob_id, repo_file.sha256 if repo_file.is_lfs
                            else None)
        repo = RepoRevision(snap.repo_id, snap.repo_id, snap.repo_type, snap.commit, snap.commit, (remote,))
        renewing = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(lease, etag, renewing), daemon=True,
                                   name="hfcache-lease")
        renewer.start()
        try:
            with tempfile.TemporaryFile(prefix="hfcache-fill-") as spool:
                failures = []
                for client in self.clients:
                    try:
                        client.download(repo, remote, spool)
                        break
                    except HfcacheError as exc:
                        failures.append(exc)
                else:
                    raise store_miss(type(failures[-1]).__name__, failures[-1].message, fetch=True)
                spool.seek(0)
                reader = HashingReader(os.fdopen(os.dup(spool.fileno()), "rb"), repo_file.size, etag=repo_file.etag,
                                       shown=f"{snap.repo_id}: {repo_file.path}")
                with reader:
                    written = upload_blob(self.bucket, key, reader, repo_file.size, create_only=not overwrite)
                if not written and self.bucket.head(key) != repo_file.size:
                    raise StoreMiss("UpstreamError", f"{snap.repo_id}: {inert(repo_file.path)}: the bucket holds "
                                    "another object under its blob's name", status=502)
        except HfcacheError as exc:
            raise store_miss(type(exc).__name__, exc.message, fetch=True) from None
        finally:
            renewing.set()
            renewer.join()

    def _acquire(self, lease: str) -> str | None:
        """Take the lease: create it, or take over an expired one (``If-Match`` its ETag: one taker wins). Returns the
        lease object's ETag while it is ours, else None. An expiry further than 2 leases ahead is a forged one."""
        body = self._lease_body()
        name = self.bucket.url.bucket
        try:
            with self.bucket.errors(lease):
                return self.bucket.client.put_object(Bucket=name, Key=lease, Body=body, IfNoneMatch="*")["ETag"]
        except HfcacheError as exc:
            if "PreconditionFailed" not in exc.message:
                return None
        try:
            with self.bucket.errors(lease):
                held = self.bucket.client.get_object(Bucket=name, Key=lease)
                record, etag = json.loads(held["Body"].read(_REF_BYTES)), held["ETag"]
        except (HfcacheError, ValueError):
            return None  # released meanwhile (the blob is there, or the next look takes it), or garbled
        expires = record.get("expires") if isinstance(record, dict) else None
        now = time.time()
        if isinstance(expires, (int, float)) and now < expires <= now + 2 * LEASE_SECONDS:
            return None  # held, and not forged to last for ever
        try:
            with self.bucket.errors(lease):
                return self.bucket.client.put_object(Bucket=name, Key=lease, Body=body, IfMatch=etag)["ETag"]
        except HfcacheError:
            return None  # another replica took it over first (412)

    def _lease_body(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires": time.time() + LEASE_SECONDS}).encode()

    def _renew(self, lease: str, etag: str, done: threading.Event) -> None:
        """Renew the lease while it is ours (``If-Match`` the ETag we wrote); once another replica took it over, stop
        (its fetch and ours write the same verified bytes)."""
        while not done.wait(RENEW_EVERY):
            try:
                with self.bucket.errors(lease):
                    etag = self.bucket.client.put_object(Bucket=self.bucket.url.bucket, Key=lease,
                                                         Body=self._lease_body(), IfMatch=etag)["ETag"]
            except HfcacheError as exc:
                if "PreconditionFailed" in exc.message:
                    return
                # another failure: the next renewal tries again; a lease that expires is taken over

    def _release(self, lease: str) -> None:
        """Delete the lease if it is still ours (else it was taken over: leave it to its holder)."""
        with contextlib.suppress(HfcacheError, ValueError), self.bucket.errors(lease):
            held = self.bucket.client.get_object(Bucket=self.bucket.url.bucket, Key=lease)
            if json.loads(held["Body"].read(_REF_BYTES)).get("owner") == self.owner:
                self.bucket.client.delete_object(Bucket=self.bucket.url.bucket, Key=lease)

    def _fresh_ref(self, folder: str, revision: str) -> str | None:
        try:
            record = json.loads(self.bucket.get_bytes(self._key("refs", folder, revision), _REF_BYTES))
        except (HfcacheError, ValueError):
            return None
        if not isinstance(record, dict) or not is_commit(record.get("commit")) \
                or not isinstance(record.get("resolved"), (int, float)) \
                or time.time() - record["resolved"] > self.config.revalidate:
            return None
        return record["commit"]

    def _listing(self, folder: str, commit: str) -> LockedRepo | None:
        key = self._key("snapshots", folder, f"{commit}.json")
        try:
            return parse_manifest(self.bucket.get_bytes(key, MAX_LISTING_BYTES), folder, commit, commit, key)
        except HfcacheError:
            return None  # absent or garbled: asked again upstream, and rewritten

    def _key(self, *parts: str) -> str:
        return self.bucket.url.key("upstream", *parts)
