"""A bucket as a store of repos (``hfcache serve --store s3://BUCKET/PREFIX``): the snapshots and refs ``push s3://``
wrote (:mod:`hfcache.bucket.layout`), answered with no state of the mirror's own, so N replicas behind one Service
share one copy. Metadata comes from the manifests (read once per commit: a commit's content never changes) and the
refs (re-read after :data:`REF_TTL` seconds); a file body is a ``302`` to a presigned GET URL of its blob, valid
:data:`hfcache.bucket.store.PRESIGN_SECONDS` (as the Hub sends clients to its CDN: huggingface_hub and hfcache follow
it and drop the ``Authorization`` header on the other origin, httpx's rule).

With ``fill`` (:class:`hfcache.serve.bucket_fill.BucketFill`), a repo or file the bucket lacks is fetched from
upstream, verified and written to the bucket once across replicas.
"""

from __future__ import annotations

import io
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO

from ..bucket.layout import (
    MAX_MANIFEST_BYTES,
    MAX_REF_BYTES,
    blob_key,
    parse_manifest,
    parse_ref,
    ref_key,
    snapshot_key,
)
from ..bucket.store import Bucket
from ..cache.content import git_blob_sha1, lfs_pointer
from ..errors import HfcacheError, RepoNotFound
from ..names import is_commit, repo_folder_name
from ..warming.lockfile import LockedRepo
from .vocabulary import RepoFile, RepoSnapshot, StoreMiss

REF_TTL = 5.0  #: seconds a ref read from the bucket is trusted before it is read again
MAX_SNAPSHOTS = 4096  #: parsed manifests kept in memory (least recently used first out)
_NOWHERE = Path("/nonexistent")  # a bucket's files have no local path


class BucketStore:
    """The snapshots of ``bucket`` (:class:`hfcache.bucket.store.Bucket`); ``fill``: pull through on a miss."""

    def __init__(self, bucket: Bucket, fill=None) -> None:
        self.bucket, self.fill = bucket, fill
        self.upstream_slots = fill.upstream_slots if fill is not None else 0  # threads for requests waiting on it
        self.root = Path(str(bucket.url))  # only named (Store's attribute): nothing is read from the filesystem
        self._lock = threading.Lock()
        self._snapshots: OrderedDict[tuple[str, str], RepoSnapshot] = OrderedDict()
        self._refs: dict[tuple[str, str], tuple[str | None, float]] = {}

    def close(self) -> None:
        """Stop the fill's work (the bucket keeps what was written)."""
        if self.fill is not None:
            self.fill.close()

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        return repo_id  # a legacy id's folder is pushed as it is named: no redirect

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo at ``revision`` (a ref or a commit the bucket holds). Raises StoreMiss: RepoNotFound,
        RevisionNotFound, or (with ``fill``) what the upstream answered."""
        folder = repo_folder_name(repo_id, repo_type)
        commit = revision if is_commit(revision) else self._ref(folder, revision)
        if commit is None and self.fill is not None:
            commit = self.fill.known_ref(folder, revision)
        found = self._snapshot(folder, commit, repo_type, repo_id) if commit else None
        if found is not None:
            return found
        if self.fill is not None:
            locked = self.fill.resolve(repo_type, repo_id, revision)
            return self._remember(folder, locked.commit_hash, repo_type, repo_id, locked)
        if commit is None and not any(True for _ in self.bucket.list_keys("snapshots", folder)):
            raise StoreMiss("RepoNotFound", "Repository not found")
        raise StoreMiss("RevisionNotFound", "Invalid rev id", repo_id=repo_id)

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot | None = None, *, head: bool = False) -> BinaryIO:
        """Only HEAD reaches here (a GET is answered by :meth:`redirect`): no bytes, the metadata is the snapshot's."""
        return io.BytesIO(b"")

    def redirect(self, repo_file: RepoFile, snapshot: RepoSnapshot) -> str:
        """The presigned GET URL of the file's blob (fetched into the bucket first, with ``fill``, when missing).
        Raises StoreMiss: the upstream failed."""
        if self.fill is not None:
            self.fill.ensure_blob(snapshot, repo_file)
        return self.bucket.presigned_get(blob_key(self.bucket.url, repo_file.etag))

    def _ref(self, folder: str, ref: str) -> str | None:
        now = time.monotonic()
        with self._lock:
            cached = self._refs.get((folder, ref))
        if cached is not None and now - cached[1] < REF_TTL:
            return cached[0]
        key = ref_key(self.bucket.url, folder, ref)
        try:
            commit = parse_ref(self.bucket.get_bytes(key, MAX_REF_BYTES), key)
        except RepoNotFound:
            commit = None
        except HfcacheError as exc:
            raise _unavailable(exc) from None
        with self._lock:
            self._refs[(folder, ref)] = (commit, now)
        return commit

    def _snapshot(self, folder: str, commit: str, repo_type: str, repo_id: str) -> RepoSnapshot | None:
        with self._lock:
            if (folder, commit) in self._snapshots:
                self._snapshots.move_to_end((folder, commit))
                return self._snapshots[(folder, commit)]
        key = snapshot_key(self.bucket.url, folder, commit)
        try:
            locked = parse_manifest(self.bucket.get_bytes(key, MAX_MANIFEST_BYTES), folder, commit, commit, key)
        except RepoNotFound:
            return None
        except HfcacheError as exc:
            raise _unavailable(exc) from None
        return self._remember(folder, commit, repo_type, repo_id, locked)

    def _remember(self, folder: str, commit: str, repo_type: str, repo_id: str, locked: LockedRepo) -> RepoSnapshot:
        found = RepoSnapshot(repo_type=repo_type, repo_id=repo_id, commit=commit,
                             files={f.path: repo_file(f.path, f.size, f.hash) for f in locked.files},
                             absent=frozenset(locked.absent))
        with self._lock:
            self._snapshots[(folder, commit)] = found
            while len(self._snapshots) > MAX_SNAPSHOTS:
                self._snapshots.popitem(last=False)
        return found


def repo_file(path: str, size: int, prefixed: str) -> RepoFile:
    """A served file from a lock's ``sha256:``/``git-sha1:`` hash: an LFS file's git blob id is its pointer's."""
    algorithm, digest = prefixed.split(":", 1)
    if algorithm == "sha256":
        pointer = lfs_pointer(digest, size)
        return RepoFile(path, _NOWHERE, size, git_blob_sha1(pointer), digest, True, len(pointer))
    return RepoFile(path, _NOWHERE, size, digest, None, False, 0)


def _unavailable(exc: HfcacheError) -> StoreMiss:
    """A failure of the bucket as a 503 the client retries (never its credentials: the message names the key)."""
    return StoreMiss("StoreUnavailable", f"the mirror's bucket failed: {exc.message}", status=503, retry_after=5)
