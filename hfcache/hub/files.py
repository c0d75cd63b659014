"""What an endpoint publishes about a repo at a commit: :class:`RemoteFile` and :class:`RepoRevision`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..cache.content import BlobHash


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit: ``path`` (``/``-separated), ``size`` (bytes), ``blob_id`` (git blob sha1,
    40 hex), ``lfs_sha256`` (64 hex for LFS files, else None)."""

    path: str
    size: int
    blob_id: str
    lfs_sha256: str | None = None

    @property
    def etag(self) -> str:
        """The blob name in the cache: sha256 for LFS files, git blob sha1 otherwise (docs/cache-layout.md)."""
        return self.lfs_sha256 or self.blob_id

    def hasher(self) -> BlobHash:
        """A fresh hash of this file's content as its etag names it (:class:`hfcache.cache.content.BlobHash`)."""
        return BlobHash.for_etag(self.etag, self.size)

    @property
    def hash(self) -> str:
        """Algorithm-prefixed expected hash: ``sha256:<hex>`` or ``git-sha1:<hex>``."""
        return f"sha256:{self.lfs_sha256}" if self.lfs_sha256 else f"git-sha1:{self.blob_id}"


@dataclass(frozen=True)
class RepoRevision:
    """A repo resolved to a commit: ``repo_id`` as requested (maybe a legacy id, ``bert-base-uncased``),
    ``canonical_id`` as the endpoint answered; ``files`` whose size and hash are known and ``paths`` (every file of
    the commit; default: those of ``files``), sorted; ``metadata``, where sizes and hashes came from: ``model-info``
    (``?blobs=true``), ``tree`` (the tree API), ``head`` (:meth:`HubClient.describe`) or ``lock``."""

    repo_id: str
    canonical_id: str
    repo_type: str
    revision: str
    commit_hash: str
    files: tuple[RemoteFile, ...]
    paths: tuple[str, ...] = ()
    metadata: str = "model-info"

    def __post_init__(self) -> None:
        if not self.paths:
            object.__setattr__(self, "paths", tuple(sorted(f.path for f in self.files)))

    @functools.cached_property
    def by_path(self) -> dict[str, RemoteFile]:
        """The described files by path, built once (a lookup per file made ``warm --lock`` quadratic)."""
        return {f.path: f for f in self.files}
