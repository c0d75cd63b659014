"""The record ``verify --fast`` keeps of blobs that hashed right, so that a later ``--fast`` run skips them.

A blob is skipped only while its (device, inode, size, mtime_ns, ctime_ns) and name are exactly those recorded when it
last hashed to its name. Any write to the file changes its mtime and ctime; ``touch -d`` can set mtime back but not
ctime, which only the kernel sets. What ``--fast`` cannot catch: bytes changed under a live filesystem without going
through the file (a disk or a filesystem fault), and a writer of the cache who rewrites the record too. That is why
the default stays "hash every blob".

The record is ``<cache>/.locks/hfcache-verified.json``: under ``.locks``, which huggingface_hub's cache scan, ``hf
cache`` and ``hfcache ls``/``prune`` ignore as a repo folder. Read and written without following links (a planted
link is ignored on read and refused on write), through a descriptor of ``.locks`` opened from the cache root (so a
``.locks`` swapped for a link mid-run is never written through), at most :data:`MAX_RECORD_BYTES` and
:data:`hfcache.bounds.MAX_JSON_DEPTH` levels deep, atomically (temp file + rename in that folder); a cache that cannot
be written (a read-only image layer) keeps no record, and ``--fast`` then hashes everything.

The record is authority for its writer only: in a group-shared cache any member can write ``.locks``, and a member who
corrupted a blob could rewrite the record to vouch for it. So it is honoured only when it is a regular file with one
link, owned by the current effective uid and not writable by group or others (``fstat`` of the opened file); it is
written ``0644`` whatever the umask or the cache's sharing. A record another member wrote (or one a member
rewrote) is ignored with a note (:func:`load` returns why), every blob is hashed, and this run's record replaces it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import uuid

from ..bounds import MAX_JSON_DEPTH, TooDeep, loads_json
from ..cache import safefs
from ..cache.atomic import unlink_at
from ..cache.sharing import cache_policy, share_dir_fd
from ..errors import CacheError

RECORD = (".locks", "hfcache-verified.json")
MAX_RECORD_BYTES = 64 * 1024 * 1024  # ~600,000 blobs; a larger record is ignored (everything is hashed)
_VERSION = 1

#: (device, inode) -> (size, mtime_ns, ctime_ns, blob name)
Stamps = dict[tuple[int, int], tuple[int, int, int, str]]


def stamp(st: os.stat_result, etag: str) -> tuple[int, int, int, str]:
    """What must be unchanged for a blob to be skipped: (size, mtime_ns, ctime_ns, blob name)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, etag)


_MODE = 0o644  # never group-writable, even in a shared cache: the record is authority for its writer only


def _open_record(cache_dir: str) -> tuple[int | None, str]:
    """(fd of the record opened ``O_NOFOLLOW|O_NONBLOCK`` relative to a checked ``.locks`` fd, "") when it may be
    honoured; else (None, why it is not: "" when there simply is none)."""
    try:
        locks = safefs.open_dir(cache_dir, RECORD[:-1])
    except FileNotFoundError:
        return None, ""
    except (OSError, CacheError):
        return None, ".locks is a symlink, not a folder, or cannot be opened"
    try:
        fd = os.open(RECORD[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=locks)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, "a symlink" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
    finally:
        os.close(locks)
    st = os.fstat(fd)
    euid = os.geteuid()
    why = ("not a regular file" if not stat.S_ISREG(st.st_mode)
           else f"{st.st_nlink} hard links" if st.st_nlink != 1
           else f"owned by uid {st.st_uid}, not by uid {euid} (this run)" if st.st_uid != euid
           else f"writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o})" if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
           else "")
    if why:
        os.close(fd)
        return None, why
    return fd, ""


def load(cache_dir: str) -> tuple[Stamps, str]:
    """The record of ``cache_dir``, and why it was ignored.

    Args:
        cache_dir (str): the cache root.

    Returns:
        tuple[Stamps, str]: the stamps (empty when there is no record or it is not honoured: then every blob is
        hashed), and "" or one line saying why an existing record was ignored (a symlink, not a regular file, owned
        by another uid, writable by group or others, too large, nested too deep, malformed).
    """
    fd, why = _open_record(cache_dir)
    if fd is None:
        return {}, why
    try:
        raw = safefs.read_regular_fd(fd, "/".join(RECORD), MAX_RECORD_BYTES + 1)
    except (OSError, CacheError) as exc:
        return {}, f"cannot be read ({exc})"
    if len(raw) > MAX_RECORD_BYTES:
        return {}, f"larger than {MAX_RECORD_BYTES} bytes"
    try:
        data = loads_json(raw, "/".join(RECORD))
        if data.get("version") != _VERSION:
            return {}, f"format version {data.get('version')!r}, not {_VERSION}"
        return {(int(dev), int(ino)): (int(size), int(mtime), int(ctime), str(etag))
                for dev, ino, size, mtime, ctime, etag in data["blobs"]}, ""
    except TooDeep:
        return {}, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        return {}, f"malformed ({type(exc).__name__})"


def save(cache_dir: str, stamps: Stamps) -> bool:
    """Replace the record of ``cache_dir`` with ``stamps``; False when it cannot be written (then there is none).

    Written relative to a descriptor of ``.locks`` opened from the cache root without following links (created and
    group-shared like every folder when missing): a temp file created ``O_EXCL|O_NOFOLLOW`` with mode 0600, set to
    :data:`_MODE` by ``fchmod``, fsync-ed, then renamed over the record in that same folder. Nothing is written
    through a ``.locks`` a member swapped for a link, and no member can open the file for writing on the way.
    """
    rows = sorted([dev, ino, *rest] for (dev, ino), rest in stamps.items())
    data = json.dumps({"version": _VERSION, "blobs": rows}, separators=(",", ":")).encode()
    policy = cache_policy(cache_dir)
    try:
        locks = safefs.open_dir(cache_dir, RECORD[:-1], create=True, on_create=lambda fd: share_dir_fd(fd, policy))
    except (OSError, CacheError):
        return False
    try:
        _write_at(locks, RECORD[-1], data)
        return True
    except OSError:
        return False
    finally:
        os.close(locks)


def _write_at(dfd: int, name: str, data: bytes) -> None:
    """Atomic write of ``name`` in the folder ``dfd`` with mode :data:`_MODE` from creation on.

    Library gap (of hfcache's own :func:`hfcache.cache.atomic.atomic_write_at`): it creates with the umask and can
    only add a shared cache's bits, so a umask-002 member would see a group-writable temp file before the rename."""
    tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        unlink_at(dfd, tmp)
