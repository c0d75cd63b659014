"""Atomic writes into a cache (a temporary name in the same folder, then ``os.replace``, as huggingface_hub's
``file_download.py`` publishes blobs) and file locks with bounded waits.
"""

from __future__ import annotations

import os
import stat
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError
from .locking import DEFAULT_LOCK_TIMEOUT, LockWait
from .locking import file_lock as _file_lock
from .sharing import SharePolicy, cache_policy, open_dirs, share_fd


def atomic_write(path: Path, data: bytes, policy: SharePolicy | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, ``os.replace``).

    For paths OUTSIDE a cache only (a lockfile in a project, an export DEST): the folders on the way are resolved
    by path. Below a cache root, where a group member can swap a folder for a link between a check and the write,
    use :func:`atomic_write_at` with the folder's descriptor (safefs). ``policy``: sharing bits for the new file.
    """
    with atomic_output(path, policy) as f:
        f.write(data)


@contextmanager
def atomic_output(path: Path, policy: SharePolicy | None = None):
    """Open a binary file that appears at ``path`` only when the block succeeds (temp file + ``os.replace``).

    For paths OUTSIDE a cache only, as :func:`atomic_write` (the folder is opened by path once, then the temp file
    is created ``O_EXCL | O_NOFOLLOW`` and renamed relative to that folder's fd); below a cache root use
    :func:`atomic_output_at`.
    """
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _refuse_non_regular(dfd, path)
        with atomic_output_at(dfd, path.name, policy) as f:
            yield f
            _refuse_non_regular(dfd, path)  # again right before the rename: the user's own folder, best effort
    finally:
        os.close(dfd)


def _refuse_non_regular(dfd: int, path: Path) -> None:
    """A user's output path that exists as anything but a regular file is never replaced: ``hfcache export T
    /dev/null`` as root (or ``sign -o /dev/null``) renamed a regular file over the device node, and a symlinked
    lock file became a copy.

    Raises:
        UsageError: (exit 2) ``path`` is a link, device, FIFO, socket or folder.
    """
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
    """Open a binary file that appears as ``name`` in the folder open as ``dfd`` only when the block succeeds.

    The temp file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to ``dfd``, fsynced, then renamed with
    ``os.replace(..., src_dir_fd=dfd, dst_dir_fd=dfd)``: nothing goes through a path rebuilt afterwards, so a folder
    swapped for a link meanwhile is never written through. On an exception the temp file is removed.

    Args:
        dfd (int): a folder fd (safefs.open_dir); name (str): one component; policy: the shared cache's, or None.

    Yields:
        a binary file object.

    Raises:
        OSError: the file cannot be created or written (ENOSPC, EACCES).
    """
    tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
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
    mode = 0o664 | (policy.file_bits if policy else 0)
    if dir_fd is None and cache_dir is not None:
        # Below a cache root: the folders are created and opened from the root without following a link, and the
        # lock file is opened through the last one's descriptor (locking.via_dir_fd), never by a rebuilt path.
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
    """Write ``data`` (bytes) as ``name`` in the folder open as ``dfd``, atomically (:func:`atomic_output_at`: temp
    file, fsync, ``os.replace``, all relative to the fd: nothing is written through a link planted on the way).

    Raises:
        OSError: the file cannot be created or written.
    """
    with atomic_output_at(dfd, name, policy) as f:
        f.write(data)


def unlink_at(dfd: int, name: str) -> None:
    """Remove ``name`` from the folder open as ``dfd`` (the entry itself, never a link's target); missing is fine."""
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
