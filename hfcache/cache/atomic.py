"""Atomic writes (a temporary name in the same folder, then ``os.replace``) and file locks with bounded waits."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError
from .fsops import create_at, temp_name, unlink_at
from .locking import DEFAULT_LOCK_TIMEOUT, LockWait
from .locking import file_lock as _file_lock
from .sharing import SharePolicy, cache_policy, open_dirs, share_fd


def atomic_write(path: Path, data: bytes, policy: SharePolicy | None = None) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_output`). ``policy``: sharing bits for the new file."""
    with atomic_output(path, policy) as f:
        f.write(data)


@contextmanager
def atomic_output(path: Path, policy: SharePolicy | None = None):
    """:func:`atomic_output_at` in the folder of ``path`` opened by path: for paths OUTSIDE a cache only (a project's
    lockfile, an export DEST); below a cache root, use :func:`atomic_output_at` with a safefs fd."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _refuse_non_regular(dfd, path)
        with atomic_output_at(dfd, path.name, policy) as f:
            yield f
            _refuse_non_regular(dfd, path)  # again right before the rename: the user's own folder, best effort
    finally:
        os.close(dfd)


def _refuse_non_regular(dfd: int, path: Path) -> None:
    """UsageError (exit 2) when a user's output ``path`` exists as anything but a regular file (``hfcache export T
    /dev/null`` as root renamed a regular file over the device node; a symlinked lock file became a copy)."""
    try:
        st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket")
        raise UsageError(f"{path} is {kind}, not a regular file: it is not replaced",
                         hint="write to a regular file's path (or to stdout where the command takes -)")


@contextmanager
def atomic_output_at(dfd: int, name: str, policy: SharePolicy | None = None):
    """Open a binary file that appears as ``name`` in the folder ``dfd`` only when the block succeeds (a temp file
    shared by ``policy``, fsynced, renamed; removed on an exception). Raises OSError (ENOSPC, EACCES)."""
    tmp = temp_name(name)
    fd = create_at(dfd, tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            share_fd(f.fileno(), policy)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        unlink_at(dfd, tmp)


def file_lock(path: Path, stop: threading.Event | None = None, *, timeout: float = DEFAULT_LOCK_TIMEOUT,
              on_wait: Callable[[LockWait], None] | None = None, cache_dir: Path | None = None,
              dir_fd: int | None = None):
    """Hold an exclusive lock at ``path`` (:func:`.locking.file_lock`), creating its folder first (below
    ``cache_dir``: through folder fds). In a shared cache the folders are shared and the lock file (and a soft
    marker) is group-writable (``0o664`` as huggingface_hub's WeakFileLock, ``0o666`` in a world-writable cache).
    Raises LockTimeout: not acquired within ``timeout`` seconds (exit 5). InterruptedError: ``stop`` was set. OSError:
    the folder or the lock file cannot be created or opened."""
    policy = cache_policy(cache_dir) if cache_dir is not None else None
    mode = 0o664 | (policy.file_bits if policy else 0)
    if dir_fd is None and cache_dir is not None:
        return _lock_in_cache(path, cache_dir, policy, stop, timeout, on_wait, mode)
    if dir_fd is None:
        path.parent.mkdir(parents=True, exist_ok=True)  # outside a cache: the caller's own folder
    return _file_lock(path, timeout=timeout, stop=stop, on_wait=on_wait, mode=mode, dir_fd=dir_fd,
                      marker_mode=mode if policy is not None else None)


@contextmanager
def _lock_in_cache(path: Path, cache_dir: Path, policy: SharePolicy | None, stop: threading.Event | None,
                   timeout: float, on_wait: Callable[[LockWait], None] | None, mode: int):
    fd = open_dirs(path.parent, cache_dir, policy)
    try:
        with _file_lock(path, timeout=timeout, stop=stop, on_wait=on_wait, mode=mode, dir_fd=fd,
                        marker_mode=mode if policy is not None else None):
            yield
    finally:
        os.close(fd)


def atomic_write_at(dfd: int, name: str, data: bytes, policy: SharePolicy | None = None) -> None:
    """Write ``data`` as ``name`` in the folder open as ``dfd`` atomically (:func:`atomic_output_at`)."""
    with atomic_output_at(dfd, name, policy) as f:
        f.write(data)
