"""import's staging: content hashed while it streams and parked under ``<cache>/.locks/`` (ignored by huggingface_hub's
scanner, on the cache's filesystem: publishing is a rename), never past its declared size or the free space.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import BinaryIO

from ..cache import safefs
from ..cache.content import GIT_SHA1, SHA256, BlobHash
from ..cache.fsops import create_at
from ..cache.locking import via_dir_fd
from ..cache.sharing import cache_policy, make_dirs
from ..errors import CacheError, UsageError

_CHUNK = 1024 * 1024


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem (``statvfs``: ``f_bavail * f_frsize``)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class _Staging:
    """The staging folder, every file written, read and renamed relative to its fd (a ``.locks`` swapped for a link is
    not followed); ``files``: member -> (staged, size, sha256, git-sha1)."""

    def __init__(self, cache_dir: Path) -> None:
        locks = cache_dir / ".locks"
        if os.path.islink(locks) or (os.path.lexists(locks) and not locks.is_dir()):
            raise CacheError(f"{locks} is a symlink or not a folder; nothing is staged through it",
                             hint="remove it (huggingface_hub recreates .locks)")
        self.cache_dir = cache_dir
        self.name = f"hfcache-import-{uuid.uuid4().hex[:12]}"
        make_dirs(locks, cache_dir, cache_policy(cache_dir))  # .locks/ is shared in a group-shared cache
        safefs.check_existing(cache_dir, (".locks",))
        with safefs.dir_fd(cache_dir, (".locks",)) as locks_fd:
            os.mkdir(self.name, 0o700, dir_fd=locks_fd)  # relative to the checked .locks: no link followed
        self.fd = safefs.open_dir(cache_dir, (".locks", self.name))
        self.dir = via_dir_fd(locks / self.name / "x", self.fd).parent
        self.files: dict[str, tuple[Path, int, str, str]] = {}

    def add(self, name: str, stream: BinaryIO, size: int) -> tuple[Path, int, str, str]:
        """Stage exactly ``size`` bytes of ``stream``, hashed; CacheError: no room, UsageError: not that size."""
        free = free_bytes(self.dir)
        if size > free:
            raise CacheError(f"refused entry {name!r}: its {size} bytes do not fit in the {free} bytes free on the "
                             "cache's filesystem (nothing was imported)", hint="free disk space or import elsewhere")
        path = self.dir / uuid.uuid4().hex
        sha256, sha1 = BlobHash(SHA256), BlobHash(GIT_SHA1, size)
        left = size
        with os.fdopen(create_at(self.fd, path.name), "wb") as out:
            while left and (chunk := stream.read(min(_CHUNK, left))):
                sha256.update(chunk)
                sha1.update(chunk)
                out.write(chunk)
                left -= len(chunk)
            if left or stream.read(1):
                raise UsageError(f"refused entry {name!r}: its content is not the {size} bytes it declares")
        record = self.files[name] = (path, size, sha256.hexdigest(), sha1.hexdigest())
        return record

    def holds(self, staged: Path) -> bool:
        """Whether the staged file is still there (not yet renamed into a repo)."""
        try:
            os.stat(staged.name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def remove(self) -> None:
        """Remove the staging folder (from the cache root, no link followed)."""
        with contextlib.suppress(OSError, CacheError):
            safefs.rmtree(self.cache_dir, (".locks", self.name))
        with contextlib.suppress(OSError):
            os.close(self.fd)
