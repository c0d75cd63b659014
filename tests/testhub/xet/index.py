"""Which served files go through Xet (:class:`XetMode`), and the memo of their chunked form (:class:`XetIndex`).

On the Hub, files tracked with LFS pointers are stored in Xet (huggingface/hub-docs docs/hub/xet/legacy-git-lfs.md:
LFS uploads are migrated to Xet in the background; legacy clients download through an LFS bridge URL), and their
resolve answer carries ``X-Xet-Hash`` (docs/xet/file-id.md). :class:`XetMode` does the same for every LFS file by
default, or for every file from a size on, so that the small text files of test repos can go through Xet too. A file
is chunked and hashed once per content (keyed by path, size and Hub ETag, itself a content hash); the index then
finds it, and its xorbs, by hash for the CAS origin (:mod:`.cas`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from hfcache.serve.vocabulary import RepoFile

from .xorb import MAX_XORB_BYTES, XetFile, Xorb, build_xet_file

__all__ = ["Opener", "XetIndex", "XetMode"]

#: Opens a served file's bytes from offset 0 (the store's ``open`` for one file of one snapshot).
Opener = Callable[[], BinaryIO]


@dataclass(frozen=True)
class XetMode:
    """How the server speaks Xet.

    Attributes:
        min_size (int | None): None: every LFS file goes through Xet, as on the Hub. N: every file of at least
            N bytes, LFS or not (git-stored files then carry ``X-Xet-Hash`` too). Empty files never do.
        max_xorb_bytes (int): serialized size limit of one xorb in bytes (the spec's 64 MiB; lower it to have
            files span several xorbs).
        token_ttl (int): lifetime of the Xet access tokens handed out, in seconds.
    """

    min_size: int | None = None
    max_xorb_bytes: int = MAX_XORB_BYTES
    token_ttl: int = 3600

    def __post_init__(self) -> None:
        if self.min_size is not None and self.min_size < 0:
            raise ValueError("xet min_size must be >= 0 bytes")
        if not 1024 <= self.max_xorb_bytes <= MAX_XORB_BYTES:
            raise ValueError(f"max_xorb_bytes must be between 1024 and {MAX_XORB_BYTES}")
        if self.token_ttl <= 60:
            raise ValueError("token_ttl must exceed 60 s (huggingface_hub refreshes tokens 60 s before expiry)")

    def serves(self, repo_file: RepoFile) -> bool:
        """Whether ``repo_file`` is answered as a Xet file."""
        if repo_file.size == 0:
            return False
        if self.min_size is None:
            return repo_file.is_lfs
        return repo_file.size >= self.min_size


class XetIndex:
    """Xet forms of served files, computed once per content and found again by file or xorb hash (thread-safe)."""

    def __init__(self, max_xorb_bytes: int = MAX_XORB_BYTES) -> None:
        self.max_xorb_bytes = max_xorb_bytes
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, int, str], threading.Lock] = {}
        self._by_key: dict[tuple[str, int, str], XetFile] = {}
        self._files: dict[str, tuple[XetFile, Opener]] = {}
        self._xorbs: dict[str, tuple[Xorb, Opener]] = {}

    def describe(self, repo_file: RepoFile, opener: Opener) -> XetFile:
        """The Xet form of ``repo_file``, chunked from ``opener`` the first time (single-flight per content).

        Raises:
            OSError: the file cannot be read.
        """
        key = (str(repo_file.local_path), repo_file.size, repo_file.etag)
        with self._lock:
            known = self._by_key.get(key)
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        if known is not None:
            return known
        with key_lock:
            with self._lock:
                known = self._by_key.get(key)
            if known is not None:
                return known
            with opener() as stream:
                xet_file = build_xet_file(stream, max_xorb_bytes=self.max_xorb_bytes)
            with self._lock:
                self._by_key[key] = xet_file
                self._files[xet_file.hash] = (xet_file, opener)
                for xorb in xet_file.xorbs:
                    self._xorbs[xorb.hash] = (xorb, opener)
            return xet_file

    def file(self, file_hash: str) -> tuple[XetFile, Opener] | None:
        """A described file by its file hash, with an opener of its bytes; None if unknown."""
        with self._lock:
            return self._files.get(file_hash)

    def xorb(self, xorb_hash: str) -> tuple[Xorb, Opener] | None:
        """A xorb of a described file by its hash, with an opener of that file's bytes; None if unknown."""
        with self._lock:
            return self._xorbs.get(xorb_hash)
