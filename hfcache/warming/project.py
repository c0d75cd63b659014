"""A project's manifest and lock together: which manifest goes with a lock, where the lock lives, whether they agree.

What ``hfcache warm --lock`` and ``hfcache lock`` decide before any download or request, for the CLI and the Python
API alike. Light like :mod:`hfcache.warming.lockfile` (no huggingface_hub, no HTTP client): ``warm --lock`` on a warm cache
runs this module, the lock reader and the stat-only cache check, and nothing heavier.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cache.root import existing_cache_dir, require_hub_cache
from ..errors import CheckFailed
from .lockfile import Lockfile, default_lock_path, drift, lock_cache_dir, lock_manifest, read_lock
from .manifest import Manifest, find_manifest, load_manifest, trusts_manifest_endpoint, withheld_endpoints

__all__ = ["LockCheck", "LockInstall", "check_lock", "open_project", "reading_cache_dir", "resolve_install"]


@dataclass(frozen=True)
class LockInstall:
    """What ``warm --lock`` installs, and where from.

    Attributes:
        lock (Lockfile): the lock read.
        manifest (Manifest | None): the manifest found beside the lock (or given); None when there is none.
        cache_dir (Path): absolute: the cache given, else the manifest's ``cache_dir``, else the environment's
            (:func:`hfcache.warming.lockfile.lock_cache_dir`; README "Which cache a --lock command uses").
        endpoint (list[str] | None): the endpoints given, else the manifest's, else None (``HF_ENDPOINT``/the Hub).
        withheld (tuple[str, ...]): the manifest's endpoints that get no Hub token (no opt-in; docs/warm.md).
        drift (tuple[str, ...]): without ``locked``, how the lock differs from its manifest (one line each,
            :func:`hfcache.warming.lockfile.drift`): the lock is installed as written, and the CLI warns.
    """

    lock: Lockfile
    manifest: Manifest | None
    cache_dir: Path
    endpoint: list[str] | None
    withheld: tuple[str, ...] = ()
    drift: tuple[str, ...] = ()

    def drift_warning(self, lock_file: str | os.PathLike[str]) -> str | None:
        """One line naming what drifted (the first difference, and how many more), or None when nothing did."""
        if not self.drift or self.manifest is None:
            return None
        more = f" (and {len(self.drift) - 1} more)" if len(self.drift) > 1 else ""
        return (f"{lock_file} is out of date with {self.manifest.path}: {self.drift[0]}{more}; installed the lock "
                "as written (run `hfcache lock` to update it, or --locked to refuse a lock that drifted)")


def resolve_install(
    lock_file: str | os.PathLike[str],
    *,
    manifest: str | os.PathLike[str] | None = None,
    locked: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint: Sequence[str] = (),
    trust_manifest_endpoint: bool = False,
) -> LockInstall:
    """Read a lock and the manifest beside it (``hfcache.toml`` or ``pyproject.toml`` with ``[tool.hfcache]`` in the
    lock's folder, or ``manifest``); with ``locked``, refuse a lock out of date with its manifest.

    A lock alone (copied into an image without its manifest) is enough unless ``manifest`` or ``locked`` asks for
    one; a manifest that exists but is broken is always an error.

    Args:
        lock_file: the lock's path.
        manifest: the manifest's path (default: found beside the lock).
        locked: fail when the manifest and the lock disagree (``warm --locked``).
        cache_dir: the cache root; overrides the manifest's.
        endpoint: endpoints in order of preference; override the manifest's.
        trust_manifest_endpoint: send the Hub token to the manifest's endpoints (``--trust-manifest-endpoint``;
            ``HFCACHE_TRUST_MANIFEST_ENDPOINT=1`` counts too). Without it they are warmed from anonymously.

    Returns:
        LockInstall.

    Raises:
        UsageError: an unreadable or invalid lock or manifest; no manifest while ``manifest`` or ``locked`` needs one.
        CheckFailed: ``locked`` and the lock is out of date with the manifest (exit 1).
    """
    lock = read_lock(lock_file)
    # A lock alone (e.g. copied into an image) is enough; a broken manifest, or none while one is needed, is an error.
    found = lock_manifest(lock_file, manifest, required=bool(locked))
    problems = tuple(drift(found, lock)) if found is not None else ()
    if locked:
        if problems:
            raise CheckFailed(f"{lock_file} is out of date with {found.path}: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                              hint="run `hfcache lock` and commit the new lock")
    chosen = list(endpoint) or (list(found.endpoints) if found and found.endpoints else None)
    from_manifest = bool(chosen) and not endpoint
    return LockInstall(
        lock=lock,
        manifest=found,
        cache_dir=lock_cache_dir(lock_file, cache_dir, manifest=found),
        endpoint=chosen,
        withheld=withheld_endpoints(chosen, trusts_manifest_endpoint(trust_manifest_endpoint)) if from_manifest
        else (),
        drift=problems,
    )


def reading_cache_dir(cache_dir: str | os.PathLike[str] | None = None,
                      lock_file: str | os.PathLike[str] | None = None) -> Path:
    """The existing cache a reading command (``ls``, ``verify``, ``check``, ``export``) works on: with a lock, as
    ``warm --lock`` picks it (:func:`hfcache.warming.lockfile.lock_cache_dir`: ``cache_dir``, else the lock's manifest's,
    else the environment's); without, ``cache_dir`` or the environment's.

    Returns:
        Path: absolute, an existing directory.

    Raises:
        CacheError: the cache does not exist or is not a directory (see :func:`hfcache.cache.root.existing_cache_dir`),
            or it is a folder but no hub cache (an ``HF_HOME``, whose cache is ``DIR/hub``; a repo folder; anything
            else), named in one line with the cache probably meant (:func:`hfcache.cache.root.require_hub_cache`):
            ``export``/``push``/``sign`` of such a folder used to report 0 repos and exit 0.
        UsageError: the lock's manifest exists but is invalid.
    """
    root = existing_cache_dir(lock_cache_dir(lock_file, cache_dir) if lock_file else cache_dir)
    require_hub_cache(root)
    return root


def open_project(manifest: str | os.PathLike[str] | None = None,
                 lock_path: str | os.PathLike[str] | None = None) -> tuple[Manifest, Path, Lockfile | None]:
    """(the manifest, the lock's path, the lock if it exists) for ``hfcache lock``.

    Args:
        manifest: the manifest's path (default: ``./hfcache.toml``, or ``./pyproject.toml`` with ``[tool.hfcache]``).
        lock_path: the lock's path (default: ``hfcache.lock`` beside the manifest).

    Raises:
        UsageError: no manifest, or an invalid manifest or lock.
    """
    found = load_manifest(find_manifest(manifest))
    path = Path(lock_path) if lock_path else default_lock_path(found.path)
    return found, path, read_lock(path) if path.exists() else None


@dataclass(frozen=True)
class LockCheck:
    """Whether a lock matches its manifest (``hfcache lock --check``; no network).

    Attributes:
        manifest (Path): the manifest compared.
        lock_path (Path): the lock compared (it may not exist).
        drift (tuple[str, ...]): one line per difference (see :func:`hfcache.warming.lockfile.drift`); a missing lock is
            one line too. Empty when they match.
    """

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
