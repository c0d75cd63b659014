"""Locks in a cache that cannot hang (docs/shared-caches.md, "Locks never hang"): the files huggingface_hub locks
(``.locks/<folder>/<etag>.lock``) plus hfcache's per-repo lock, with the filelock library (huggingface_hub's too:
``utils/_fixes.py WeakFileLock``). Its gaps, filled here: every wait ends after ``timeout`` (:class:`LockTimeout`);
filelock falls back to its SoftFileLock only on ENOSYS, here on every :data:`NO_FLOCK_ERRNOS` (probed once per
filesystem); SoftFileLock treats an *empty* marker (what every flock-based run leaves) as a live holder forever,
:class:`SoftLock` takes over one older than :data:`EMPTY_MARKER_GRACE`, and any marker not refreshed for
:data:`STALE_AFTER` seconds whose owner is no live process on this host (holders refresh theirs every
:data:`HEARTBEAT` seconds). The marker format stays filelock's legacy one (``pid\\nhost\\nstart\\n``), which
huggingface_hub's fallback SoftFileLock reads: both exclude each other on such a filesystem.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import CacheError
from .fsops import open_read_at

# filelock is imported where a lock is taken or inspected: `warm --lock` on a complete cache takes no lock and must
# not pay for its import (goal P1 of docs/benchmarks.md).

#: Seconds a command waits for a lock unless told otherwise (``--lock-timeout``).
DEFAULT_LOCK_TIMEOUT = 600.0
#: Seconds of waiting after which ``on_wait`` hears which lock it waits for.
NOTICE_AFTER = 3.0
#: An empty marker this old is a flock-based run's leftover, not a soft holder still writing its record
#: (filelock's MALFORMED_LOCK_AGE_THRESHOLD for the same race).
EMPTY_MARKER_GRACE = 2.0
#: A marker not refreshed for this long is taken over unless its owner is a live process on this host.
STALE_AFTER = DEFAULT_LOCK_TIMEOUT
#: Seconds between refreshes of a held soft marker (its mtime), far below STALE_AFTER.
HEARTBEAT = 30.0
#: errnos with which flock says "not on this filesystem".
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})
_POLL = 0.25

_flock_by_device: dict[int, int | None] = {}  # st_dev -> None (flock works) or the errno flock failed with
_probe_lock = threading.Lock()


@dataclass(frozen=True)
class LockWait:
    """A notice that a command waits for the lock file ``path``, held by ``holder`` when known (e.g. ``pid 4242 on
    node-a (hfcache warm gpt2)``), for ``waited`` seconds so far out of ``timeout``."""

    path: str
    holder: str | None
    waited: float
    timeout: float


class LockTimeout(CacheError):
    """A lock was not acquired within its timeout (exit 5). ``path`` is the lock file."""

    def __init__(self, path: Path, timeout: float, holder: str | None) -> None:
        super().__init__(
            f"timed out after {timeout:g}s waiting for the lock {path}" + (f" (held by {holder})" if holder else ""),
            hint="another hfcache or huggingface_hub process holds it: wait and retry, or raise --lock-timeout; "
                 "on a filesystem without flock, a marker left by a process gone from this host is taken over at "
                 f"once, one from another host only after {STALE_AFTER:g}s without a refresh")
        self.path = str(path)
        self.holder = holder


class _KeepFdPath:
    """Mixin for filelock's lock classes: a lock named ``/proc/self/fd/<N>/<name>`` (:func:`via_dir_fd`) is opened by
    that name. Library gap: filelock 4 resolves the lock's folder with ``os.path.realpath`` (``_core/_registry.py``
    ``canonical``): for ``/proc/self/fd/<N>`` the folder's name *now*, which a member can swap for a symlink."""

    def _resolve_lock_path(self) -> str:
        name = str(self.lock_file)  # type: ignore[attr-defined]
        return name if name.startswith("/proc/self/fd/") else super()._resolve_lock_path()  # type: ignore[misc]


@cache
def _fd_file_lock_class() -> type:
    from filelock import FileLock

    return type("FdFileLock", (_KeepFdPath, FileLock), {"__module__": __name__})


@cache
def _soft_lock_class() -> type:
    from filelock import SoftFileLock
    from filelock._soft import parse_lock_holder, read_lock_file

    class SoftLock(_KeepFdPath, SoftFileLock):
        """filelock's SoftFileLock plus the takeover of empty and unrefreshed markers (module docstring), on its
        4.x hooks ``_try_break_stale_lock`` and ``_take_over`` (pyproject pins ``filelock>=4.3,<5``)."""

        def _try_break_stale_lock(self) -> None:
            try:
                content, marker = read_lock_file(self._lock_path)
            except (OSError, ValueError):
                return
            age = time.time() - marker.st_mtime
            if content == "" and age >= EMPTY_MARKER_GRACE:
                self._take_over(marker, None)
                return
            holder = parse_lock_holder(content)
            if holder is not None and age >= STALE_AFTER and not _alive_here(holder.pid, holder.hostname):
                self._take_over(marker, holder.pid)
                return
            super()._try_break_stale_lock()

    SoftLock.__module__ = __name__
    return SoftLock


def __getattr__(name: str) -> Any:
    # ``SoftLock`` is built on first use (PEP 562), so that importing this module does not import filelock.
    if name == "SoftLock":
        return _soft_lock_class()
    raise AttributeError(name)


def _alive_here(pid: int, hostname: str) -> bool:
    from filelock._identity import host_name

    if hostname != host_name():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def flock_error(directory: Path) -> int | None:
    """None if flock works on ``directory``'s filesystem, else its errno; probed once per filesystem and process.
    OSError when ``directory`` cannot be written."""
    import fcntl

    device = os.stat(directory).st_dev
    with _probe_lock:
        if device in _flock_by_device:
            return _flock_by_device[device]
    fd, name = _probe_file(directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = None
    except OSError as exc:
        result = exc.errno if exc.errno in NO_FLOCK_ERRNOS else None
    finally:
        os.close(fd)
        if name is not None:
            with suppress(OSError):
                os.unlink(name)
    with _probe_lock:
        _flock_by_device[device] = result
    return result


def _probe_file(directory: Path) -> tuple[int, str | None]:
    if hasattr(os, "O_TMPFILE"):
        try:
            return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600), None
        except OSError:
            pass  # NFS and others have no O_TMPFILE: a named probe then
    import secrets

    name = str(directory / f".hfcache-flock-probe-{secrets.token_hex(8)}")
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), name


def _new_lock(path: Path, mode: int):
    try:
        no_flock = flock_error(path.parent)
    except OSError:
        no_flock = None  # the lock's own open reports the real error
    if no_flock is not None:
        return _soft_lock_class()(str(path), mode=mode)
    # fallback_to_soft=False: filelock's own fallback is the plain SoftFileLock that waits on empty files forever.
    return _fd_file_lock_class()(str(path), mode=mode, fallback_to_soft=False)


def holder_of(path: Path) -> str | None:
    """Who holds the lock at ``path`` as far as this host can tell (a soft marker's pid and host, a flock holder
    from ``/proc/locks``, with its command line), or None."""
    from filelock._identity import host_name
    from filelock._soft import parse_lock_holder, read_lock_file

    try:
        content, st = read_lock_file(str(path))
    except (OSError, ValueError):
        return None
    if content:
        holder = parse_lock_holder(content)
        if holder is None:
            return None
        if holder.hostname != host_name():
            return f"pid {holder.pid} on {holder.hostname}"
        return _describe_pid(holder.pid, host_name())
    pid = _flock_holder(st)
    return _describe_pid(pid, host_name()) if pid is not None else None


def _flock_holder(st: os.stat_result) -> int | None:
    """The pid holding a flock on the inode ``st`` according to /proc/locks (its ``FLOCK ... WRITE`` line)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with suppress(OSError, ValueError), open("/proc/locks", encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want:
                return int(fields[4])
    return None


def _describe_pid(pid: int, host: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read(4096).split(b"\0") if a]
    except OSError:
        argv = []
    shown = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv[:6]))
    return f"pid {pid} on {host}" + (f" ({shown})" if shown else "")


def via_dir_fd(path: Path, dir_fd: int | None) -> Path:
    """``/proc/self/fd/<dir_fd>/<name>`` when ``path``'s folder was opened as ``dir_fd`` and ``/proc`` shows fds, else
    ``path`` (library gap: filelock opens a lock and makes its folder by path, through a folder swapped for a link)."""
    if dir_fd is None or not os.path.isdir("/proc/self/fd"):
        return path
    return Path(f"/proc/self/fd/{dir_fd}") / path.name


@contextmanager
def file_lock(path: Path, *, timeout: float = DEFAULT_LOCK_TIMEOUT, stop: threading.Event | None = None,
              on_wait: Callable[[LockWait], None] | None = None, mode: int = 0o664,
              dir_fd: int | None = None, marker_mode: int | None = None) -> Iterator[None]:
    """Hold an exclusive lock at ``path`` for the block: flock (filelock's FileLock) where the filesystem has it, else
    :class:`SoftLock` with a heartbeat.

    Args:
        path: the lock file; its folder must exist. timeout: seconds to wait at most (0: one attempt).
        stop: checked while waiting (InterruptedError when set). on_wait: called once after :data:`NOTICE_AFTER`
            seconds, with a :class:`LockWait`. mode: permission bits of a new lock file, whatever the umask.
        dir_fd: a descriptor of ``path``'s folder the file is opened through (:func:`via_dir_fd`).
        marker_mode: bits a held soft marker gets (a shared cache's); None keeps filelock's (no group write).

    Raises LockTimeout (exit 5), InterruptedError (``stop``), OSError (the lock file cannot be created or opened).
    """
    opened = via_dir_fd(path, dir_fd)
    lock = _acquire(opened, timeout, stop, on_wait, mode, shown=path)
    soft_lock = _soft_lock_class()
    if isinstance(lock, soft_lock) and marker_mode is not None:
        _settle_marker_mode(opened, marker_mode)
    beat = _Heartbeat(opened) if isinstance(lock, soft_lock) else None
    try:
        yield
    finally:
        if beat is not None:
            beat.stop()
        lock.release()


def _acquire(path: Path, timeout: float, stop: threading.Event | None,
             on_wait: Callable[[LockWait], None] | None, mode: int, shown: Path | None = None):
    from filelock import Timeout

    soft_lock = _soft_lock_class()
    shown = shown or path
    started = time.monotonic()
    deadline = started + max(timeout, 0.0)
    lock = _new_lock(path, mode)
    told = False
    while True:
        try:
            lock.acquire(timeout=max(0.0, min(_POLL, deadline - time.monotonic())))
            return lock
        except Timeout:
            pass
        except OSError as exc:
            if exc.errno not in NO_FLOCK_ERRNOS or isinstance(lock, soft_lock):
                if exc.filename == str(path) and path != shown:  # a /proc/self/fd/<N> name: say the cache's path
                    raise type(exc)(exc.errno, exc.strerror, str(shown)) from None
                raise
            # The probe said flock works but this file's filesystem disagrees (e.g. ENOLCK from an NFS lock manager
            # that went away): use the soft lock from now on.
            with suppress(OSError), _probe_lock:
                _flock_by_device[os.stat(path.parent).st_dev] = exc.errno
            lock = soft_lock(str(path), mode=mode)
            continue
        if stop is not None and stop.is_set():
            raise InterruptedError(f"interrupted while waiting for the lock {shown}")
        now = time.monotonic()
        if now >= deadline:
            raise LockTimeout(shown, timeout, holder_of(path))
        if on_wait is not None and not told and now - started >= NOTICE_AFTER:
            told = True
            on_wait(LockWait(str(shown), holder_of(path), now - started, timeout))


@contextmanager
def try_lock(path: Path, dir_fd: int | None = None) -> Iterator[str]:
    """Take the lock at ``path`` without waiting, for the block: ``as`` gives "" when held by us (or when there is no
    lock file), else why not ("a download holds its lock", "its lock file cannot be opened (...)"). ``dir_fd``: an
    fd of its folder the file is looked up and opened through (:func:`via_dir_fd`)."""
    if dir_fd is None:
        regular = os.path.isfile(path)
    else:
        try:
            regular = stat.S_ISREG(os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            regular = False
    if not regular:
        yield ""
        return
    try:
        lock = _acquire(via_dir_fd(path, dir_fd), 0.0, None, None, 0o664, shown=path)
    except LockTimeout:
        yield "a download holds its lock"
        return
    except OSError as exc:
        yield f"its lock file cannot be opened ({exc.strerror or exc})"
        return
    try:
        yield ""
    finally:
        lock.release()


def _settle_marker_mode(path: Path, mode: int) -> None:
    """Give the soft marker this process holds ``mode`` (a shared cache's group write; library gap: SoftFileLock
    strips group and other write whatever ``mode`` asks). Best effort, only on a regular file this user owns."""
    try:
        fd = open_read_at(None, str(path))
    except OSError:
        return
    try:
        with suppress(OSError):
            st = os.fstat(fd)
            # st_nlink: a hardlink planted in its place would carry the mode change to another file
            if (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1
                    and stat.S_IMODE(st.st_mode) != mode):
                os.fchmod(fd, mode)
    finally:
        os.close(fd)


class _Heartbeat:
    """Refresh a held soft marker's mtime every HEARTBEAT seconds, so that peers never find it stale."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.inode = os.lstat(path).st_ino
        except OSError:
            self.inode = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hfcache-lock-heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(HEARTBEAT):
            with suppress(OSError):
                if os.lstat(self.path).st_ino == self.inode:
                    os.utime(self.path)

    def stop(self) -> None:
        self.done.set()
