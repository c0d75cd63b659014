"""owned_record: the JSON records hfcache keeps under ``<cache>/.locks/`` and the one rule for trusting them.

Four records live there: ``verify --fast``'s (:mod:`hfcache.integrity.verify_record`), ``check``'s fast-tokenizer
proofs (:mod:`hfcache.integrity.fast_record`), ``pull``'s imported layers (:mod:`hfcache.oci.pull_record`) and, per
repo folder, the extents of a partial download (:mod:`hfcache.cache.extents`). Reading (:func:`load`): through a
checked descriptor of ``.locks``, no link followed, at most ``max_bytes`` and ``MAX_JSON_DEPTH`` deep.

Trust: a record is authority for its writer only (in a group-shared cache any member can write ``.locks``, and one
who corrupted a blob could rewrite a record to vouch for it). It is *trusted* only as a regular file with one
link, owned by the effective uid (or by root where the caller allows it: an image built as root, run as another
uid) and not writable by group or others (``fstat`` of the opened file). Each caller decides what an untrusted
record may still do (usually nothing).

Writing (:func:`save`): atomically (:func:`write_at`) through a descriptor of ``.locks`` (created and group-shared
when missing). A cache that cannot be written (a read-only image layer) keeps no record.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..bounds import MAX_JSON_DEPTH, TooDeep, loads_json
from ..errors import CacheError
from . import safefs
from .fsops import create_at, open_read_at, temp_name, unlink_at
from .sharing import cache_policy, open_dirs

LOCKS = ".locks"
MODE = 0o644  # never group-writable, even in a shared cache: a record is authority for its writer only


@dataclass(frozen=True)
class Loaded:
    """A record as read by :func:`load`: ``data``, the parsed JSON (None: no record, or unreadable); ``distrust``, ""
    when trusted, else why not ("2 hard links", "writable by group (mode 0664)"); ``problem``, "" or why an existing
    record could not be read ("a symlink", "larger than N bytes", "malformed (ValueError)")."""

    data: object | None
    distrust: str = ""
    problem: str = ""

    @property
    def trusted(self) -> bool:
        return self.data is not None and not self.distrust


def _distrust(st: os.stat_result, root_ok: bool) -> str:
    euid = os.geteuid()
    owners = (euid, 0) if root_ok else (euid,)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink != 1:
        return f"{st.st_nlink} hard links"
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not by uid {euid} (this run)"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o})")
    return ""


def load(cache_dir: str, name: str, max_bytes: int, *, root_ok: bool = False,
         read_untrusted: bool = False, folder: tuple[str, ...] = ()) -> Loaded:
    """Read the record ``<cache_dir>/.locks/[<folder>/]<name>`` (module docstring); never raises for what a cache
    holds. ``max_bytes``: a larger record is not read. ``root_ok``: a record owned by root is trusted too.
    ``read_untrusted``: parse an untrusted record as well (``data`` set, ``distrust`` non-empty)."""
    try:
        locks = safefs.open_dir(cache_dir, (LOCKS, *folder))
    except FileNotFoundError:
        return Loaded(None)
    except (OSError, CacheError):
        return Loaded(None, problem=f"{LOCKS} is a symlink, not a folder, or cannot be opened")
    try:
        fd = open_read_at(locks, name)
    except FileNotFoundError:
        return Loaded(None)
    except OSError as exc:
        return Loaded(None, problem="a symlink" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})")
    finally:
        os.close(locks)
    label = "/".join((LOCKS, *folder, name))
    st = os.fstat(fd)
    distrust = _distrust(st, root_ok)
    if distrust and not (read_untrusted and stat.S_ISREG(st.st_mode)):
        os.close(fd)
        return Loaded(None, distrust=distrust)
    try:
        raw = safefs.read_regular_fd(fd, label, max_bytes + 1)  # closes fd
    except (OSError, CacheError) as exc:
        return Loaded(None, distrust, f"cannot be read ({exc})")
    if len(raw) > max_bytes:
        return Loaded(None, distrust, f"larger than {max_bytes} bytes")
    try:
        return Loaded(loads_json(raw, label), distrust)
    except TooDeep:
        return Loaded(None, distrust, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    except ValueError as exc:
        return Loaded(None, distrust, f"malformed ({type(exc).__name__})")


def save(cache_dir: str, name: str, data: bytes, *, folder: tuple[str, ...] = (), durable: bool = True) -> bool:
    """Replace the record ``<cache_dir>/.locks/[<folder>/]<name>`` with ``data`` (``durable`` False: no fsync);
    False, the record left as it was, when it cannot be written (a read-only or full cache, a ``.locks`` link)."""
    try:
        locks = open_dirs(Path(cache_dir, LOCKS, *folder), Path(cache_dir), cache_policy(cache_dir))
    except (OSError, CacheError):
        return False
    try:
        write_at(locks, name, data, durable)
        return True
    except OSError:
        return False
    finally:
        os.close(locks)


def remove(cache_dir: str, name: str, *, folder: tuple[str, ...] = ()) -> None:
    """Delete the record ``<cache_dir>/.locks/[<folder>/]<name>`` (never a link's target), if it can be opened."""
    try:
        locks = safefs.open_dir(cache_dir, (LOCKS, *folder))
    except (OSError, CacheError):
        return
    try:
        with contextlib.suppress(OSError):
            unlink_at(locks, name)
    finally:
        os.close(locks)


def write_at(dfd: int, name: str, data: bytes, durable: bool = True) -> None:
    """Atomic write of ``name`` in the folder ``dfd`` with mode :data:`MODE` from creation on (not
    :func:`.atomic.atomic_write_at`: a umask-002 member's temp file would be group-writable before the rename)."""
    tmp = temp_name(name)
    fd = create_at(dfd, tmp, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), MODE)
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        unlink_at(dfd, tmp)
