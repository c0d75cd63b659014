"""A project's manifest and lock together, before any request: the cache a reading command works on, the manifest
and lock of ``hfcache lock``, and whether they agree (``lock --check``). Light like :mod:`hfcache.warming.lockfile`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..cache.root import existing_cache_dir, require_hub_cache
from ..errors import CheckFailed
from .lockfile import Lockfile, default_lock_path, drift, lock_cache_dir, read_lock
from .manifest import Manifest, find_manifest, load_manifest

__all__ = ["LockCheck", "check_lock", "open_project", "reading_cache_dir"]


def reading_cache_dir(cache_dir: str | os.PathLike[str] | None = None,
                      lock_file: str | os.PathLike[str] | None = None) -> Path:
    """The existing hub cache a reading command (``ls``, ``verify``, ``check``, ``export``...) works on: with a lock,
    the one ``warm --lock`` picks (:func:`hfcache.warming.lockfile.lock_cache_dir`); else ``cache_dir`` or the
    environment's. Absolute.

    Raises:
        CacheError: missing, not a directory, or not a hub cache (an ``HF_HOME``, a repo folder: named in one line
            with the cache probably meant, :func:`hfcache.cache.root.require_hub_cache`).
        UsageError: the lock's manifest exists but is invalid.
    """
    root = existing_cache_dir(lock_cache_dir(lock_file, cache_dir) if lock_file else cache_dir)
    require_hub_cache(root)
    return root


def open_project(manifest: str | os.PathLike[str] | None = None,
                 lock_path: str | os.PathLike[str] | None = None) -> tuple[Manifest, Path, Lockfile | None]:
    """(the manifest, the lock's path, the lock if it exists) for ``hfcache lock``: the manifest given, else
    ``./hfcache.toml`` or ``./pyproject.toml`` with ``[tool.hfcache]``; the lock given, else ``hfcache.lock`` beside.

    Raises:
        UsageError: no manifest, or an invalid manifest or lock.
    """
    found = load_manifest(find_manifest(manifest))
    path = Path(lock_path) if lock_path else default_lock_path(found.path)
    return found, path, read_lock(path) if path.exists() else None


@dataclass(frozen=True)
class LockCheck:
    """Whether a lock matches its manifest (``hfcache lock --check``): the ``manifest`` and ``lock_path`` compared,
    and one ``drift`` line per difference (:func:`hfcache.warming.lockfile.drift`; a missing lock is one too)."""

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
    """Compare a project's lock with its manifest, without network (arguments as :func:`open_project`).

    Raises:
        UsageError: no manifest, or an invalid manifest or lock.
    """
    found, path, existing = open_project(manifest, lock_path)
    problems = drift(found, existing) if existing else (f"{path}: no lock file",)
    return LockCheck(manifest=found.path, lock_path=path, drift=problems)
