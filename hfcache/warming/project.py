"""A project's manifest and lock together, before any request: the cache a reading command works on, the manifest
and lock of ``hfcache lock``, and whether they agree (``lock --check``). Light like the lock's module."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..cache.root import existing_cache_dir, require_hub_cache
from ..errors import CheckFailed
from .lockfile import LOCK_NAME, Lockfile, drift, lock_cache_dir, read_lock
from .manifest import Manifest, find_manifest, load_manifest

__all__ = ["LockCheck", "check_lock", "open_project", "reading_cache_dir"]


def reading_cache_dir(cache_dir: str | os.PathLike[str] | None = None,
                      lock_file: str | os.PathLike[str] | None = None) -> Path:
    """The existing hub cache (absolute) a reading command (``ls``, ``verify``, ``export``...) works on: with a lock,
    the one ``warm --lock`` picks (:func:`.lockfile.lock_cache_dir`), else ``cache_dir`` or the environment's.
    Raises CacheError: missing, or not a hub cache; UsageError: the lock's manifest is invalid."""
    root = existing_cache_dir(lock_cache_dir(lock_file, cache_dir) if lock_file else cache_dir)
    require_hub_cache(root)
    return root


def open_project(manifest: str | os.PathLike[str] | None = None,
                 lock_path: str | os.PathLike[str] | None = None) -> tuple[Manifest, Path, Lockfile | None]:
    """(the manifest given or found, the lock's path (given or ``hfcache.lock`` beside it), the lock if it exists) for
    ``hfcache lock``. Raises UsageError: no manifest, or an invalid manifest or lock."""
    found = load_manifest(find_manifest(manifest))
    path = Path(lock_path) if lock_path else found.path.parent / LOCK_NAME
    return found, path, read_lock(path) if path.exists() else None


@dataclass(frozen=True)
class LockCheck:
    """Whether a lock matches its manifest (``lock --check``): the ``manifest`` and ``lock_path`` compared, one
    ``drift`` line per difference (a missing lock is one too)."""

    manifest: Path
    lock_path: Path
    drift: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.drift

    def error(self) -> CheckFailed:
        """The error to raise when the lock does not match (exit 1)."""
        return CheckFailed(f"{self.lock_path} does not match {self.manifest}: " + "; ".join(self.drift),
                           hint="run `hfcache lock` to update it")


def check_lock(manifest: str | os.PathLike[str] | None = None,
               lock_path: str | os.PathLike[str] | None = None) -> LockCheck:
    """Compare a project's lock with its manifest, without network (arguments and errors as :func:`open_project`)."""
    found, path, existing = open_project(manifest, lock_path)
    problems = drift(found, existing) if existing else (f"{path}: no lock file",)
    return LockCheck(manifest=found.path, lock_path=path, drift=problems)
