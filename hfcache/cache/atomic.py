"""Atomic writes into a cache (a temporary name in the same folder, then ``os.replace``, as huggingface_hub's
``file_download.py`` publishes blobs) and file locks with bounded waits.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from .locking import DEFAULT_LOCK_TIMEOUT, LockWait
from .locking import file_lock as _file_lock
from .sharing import SharePolicy, cache_policy, make_dirs, share_fd


def _tmp_name(path: Path, suffix: str = ".tmp") -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{suffix}")


def atomic_write(path: Path, data: bytes, policy: SharePolicy | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, ``os.replace``); ``policy``: the
    shared cache's (:mod:`hfcache.cache.sharing`) when ``path`` is in one."""
    with atomic_output(path, policy) as f:
        f.write(data)


@contextmanager
def atomic_output(path: Path, policy: SharePolicy | None = None):
    """Open a binary file that appears at ``path`` only when the block succeeds (temp file + ``os.replace``)."""
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            share_fd(f.fileno(), policy)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def file_lock(path: Path, stop: threading.Event | None = None, *, timeout: float = DEFAULT_LOCK_TIMEOUT,
              on_wait: Callable[[LockWait], None] | None = None, cache_dir: Path | None = None,
              dir_fd: int | None = None):
    """Hold an exclusive lock at ``path`` (:func:`hfcache.cache.locking.file_lock`: bounded wait, works without flock),
    creating its folder first. In a shared cache (``cache_dir`` given and group-writable, :mod:`hfcache.cache.sharing`)
    the folders are shared and the lock file is writable by the group (``0o664``, as huggingface_hub's WeakFileLock
    creates it, or ``0o666`` in a world-writable cache) whatever the umask, and so is the soft marker that replaces
    it on a filesystem without flock.

    Raises:
        LockTimeout: not acquired within ``timeout`` seconds (exit 5, names the file).
        InterruptedError: ``stop`` was set while waiting.
        OSError: the folder or the lock file cannot be created or opened.
    """
    policy = cache_policy(cache_dir) if cache_dir is not None else None
    if dir_fd is not None:
        pass  # the caller opened the folder (safefs): nothing is created by path
    elif cache_dir is not None:
        make_dirs(path.parent, cache_dir, policy)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o664 | (policy.file_bits if policy else 0)
    return _file_lock(path, timeout=timeout, stop=stop, on_wait=on_wait, mode=mode, dir_fd=dir_fd,
                      marker_mode=mode if policy is not None else None)


def atomic_write_at(dfd: int, name: str, data: bytes, policy: SharePolicy | None = None) -> None:
    """:func:`atomic_write` of ``name`` in the folder open as ``dfd`` (temp file, fsync, ``os.replace``, all relative
    to the fd: nothing is written through a link planted on the way)."""
    tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            share_fd(f.fileno(), policy)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        unlink_at(dfd, tmp)


def unlink_at(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
