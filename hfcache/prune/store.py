"""prune and huggingface_hub 2.4's shared Xet blob store: which payloads a prune frees, and their sweep.

A repo blob that is a store link (``<folder>/blobs/<etag>`` -> ``../../blobs/<h[:2]>/<h>``,
:mod:`hfcache.cache.shared_store`) holds no bytes itself: the payload ``<cache>/blobs/<h[:2]>/<h>`` does, and it is
freed only when no repo link uses it any more. huggingface_hub's own deletion (``utils/_cache_manager.py``
``DeleteCacheStrategy.execute``) unlinks the repo links, then calls ``utils/_shared_blobs.py sweep_shared_blob`` on
each payload they named; this module does the same, more cautiously:

- under the per-hash lock ``<h>.lock`` (created ``O_NOFOLLOW`` through the prefix folder's fd, mode 0o666, then
  held with filelock through that fd, as ``_shared_blob_lock`` does);
- the manifest ``<h>.refs`` is read as a hint through the same fd (``O_NOFOLLOW``, a regular file) and every line is
  validated: a cache-relative repo blob path (``<repo folder>/blobs/<name>``) that is now a link of exactly the
  library's shape to this payload counts as a reference; a line that is anything else than a repo blob path (an
  absolute path, ``..``, another depth: a hostile or damaged manifest), a link that cannot be read, a missing or
  unreadable manifest, all make the sweep leak the payload rather than guess (the library skips such lines, which
  a planted manifest could use to have a payload deleted);
- the manifest is rewritten with the remaining references only (atomically, fsync'd), and the payload (and its
  manifest) are deleted only when none remains and the plan said so; its bytes count only when the store name was
  its last (``st_nlink == 1``: no hardlink in a repo folder or outside the cache keeps it).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import NamedTuple

from ..cache import safefs
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockTimeout, file_lock, flock_error, via_dir_fd
from ..cache.safefs import UnsafeLayout
from ..cache.scan import parse_folder_name
from ..names import is_sha256
from ..cache.shared_store import (LOCK_SUFFIX, MANIFEST_SUFFIX, STORE_DIR, StoreProblem,
                                  open_store_dir, xet_hash_of_link)

__all__ = ["Sweep", "has_store", "list_payloads", "payload_path", "read_references", "sweep_payload"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: A manifest larger than this (bytes) is not read: the payload is kept.
MANIFEST_LIMIT = 16 * 1024 * 1024


class Sweep(NamedTuple):
    """One payload's sweep.

    Attributes:
        status (str): ``removed`` (the payload and its manifest are deleted), ``skipped`` (kept: ``note`` says why)
            or ``gone`` (no such payload).
        note (str): why it was kept; empty otherwise.
        bytes_freed (int): bytes given back (0 unless removed, and 0 when another hardlink keeps the inode).
    """

    status: str
    note: str = ""
    bytes_freed: int = 0


def payload_path(xet_hash: str) -> str:
    """``blobs/<h[:2]>/<h>``: the payload's path relative to the cache root."""
    return f"{STORE_DIR}/{xet_hash[:2]}/{xet_hash}"


def has_store(root: str | os.PathLike[str]) -> bool:
    """Whether ``<root>/blobs`` is a marked store (:func:`hfcache.cache.shared_store.open_store_dir`)."""
    try:
        os.close(open_store_dir(root))
    except (OSError, StoreProblem):
        return False
    return True


def list_payloads(root: str | os.PathLike[str]) -> dict[str, os.stat_result]:
    """Xet hash -> ``lstat`` of every payload of a marked store: regular files named by a 64-hex hash under their
    2-hex prefix folder, listed through folder fds (a prefix folder that is a link is skipped, never entered; an
    entry that is not a regular file is not a payload). Empty without a marked store or when it cannot be listed."""
    out: dict[str, os.stat_result] = {}
    try:
        store_fd = open_store_dir(root)
    except (OSError, StoreProblem):
        return out
    try:
        with os.scandir(store_fd) as it:
            prefixes = sorted(e.name for e in it if len(e.name) == 2 and all(c in "0123456789abcdef" for c in e.name))
        for prefix in prefixes:
            try:
                prefix_fd = os.open(prefix, _DIR_FLAGS, dir_fd=store_fd)
            except OSError:
                continue
            try:
                with os.scandir(prefix_fd) as it:
                    for e in it:
                        if is_sha256(e.name) and e.name.startswith(prefix):
                            st = e.stat(follow_symlinks=False)
                            if stat.S_ISREG(st.st_mode):
                                out[e.name] = st
            except OSError:
                pass
            finally:
                os.close(prefix_fd)
    except OSError:
        pass
    finally:
        os.close(store_fd)
    return out


def _repo_blob(line: str) -> tuple[str, str] | None:
    """(repo folder, blob name) of a manifest line that is a cache-relative repo blob path, as the library writes
    them (``_relative_blob_path``: three parts, a repo folder, ``blobs``); None for anything else."""
    parts = line.split("/")
    if len(parts) != 3 or parts[1] != "blobs" or parse_folder_name(parts[0]) is None:
        return None
    name = parts[2]
    if name in ("", ".", "..") or "\0" in line or "\\" in line:
        return None
    return parts[0], name


def _links_here(root: str | os.PathLike[str], folder: str, name: str, xet_hash: str) -> bool | None:
    """Whether ``<folder>/blobs/<name>`` is now a link of the library's exact shape to ``xet_hash`` (read through
    the repo's ``blobs`` fd); None when it cannot be told (a link where a folder belongs, an I/O error)."""
    try:
        with safefs.dir_fd(root, (folder, "blobs")) as fd:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                return False
            return xet_hash_of_link(os.readlink(name, dir_fd=fd)) == xet_hash
    except FileNotFoundError:
        return False
    except (OSError, UnsafeLayout):
        return None


def read_references(root: str | os.PathLike[str], prefix_fd: int, xet_hash: str) -> tuple[list[str] | None, str]:
    """The valid references of ``<h>.refs`` (opened through ``prefix_fd``, no link followed): the lines naming a
    repo blob that links to this payload now, sorted, once each.

    Returns:
        (references, "") or (None, why): None when the manifest is missing, not a regular file, unreadable, larger
        than :data:`MANIFEST_LIMIT`, not UTF-8, names anything that is not a repo blob path inside the cache, or a
        reference cannot be checked. The payload is then kept (leaked), never deleted.
    """
    try:
        fd = os.open(xet_hash + MANIFEST_SUFFIX, os.O_RDONLY | _FILE_FLAGS, dir_fd=prefix_fd)
    except FileNotFoundError:
        return None, "its .refs manifest is missing"
    except OSError as exc:
        return None, "its .refs manifest is a symlink" if exc.errno == errno.ELOOP else \
            f"its .refs manifest cannot be opened ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "its .refs manifest is not a regular file"
        if st.st_size > MANIFEST_LIMIT:
            return None, "its .refs manifest is too large"
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        return None, f"its .refs manifest cannot be read ({exc.strerror or exc})"
    finally:
        os.close(fd)
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None, "its .refs manifest is not UTF-8"
    references = set()
    for line in lines:
        parsed = _repo_blob(line)
        if parsed is None:
            return None, f"its .refs manifest names {line[:80]!r}, not a repo blob inside the cache"
        linked = _links_here(root, *parsed, xet_hash)
        if linked is None:
            return None, f"its reference {line[:80]} cannot be checked"
        if linked:
            references.add(line)
    return sorted(references), ""


def sweep_payload(root: str | os.PathLike[str], xet_hash: str, *, delete: bool,
                  lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> Sweep:
    """Sweep one payload after repo links to it were removed (see the module docstring).

    Args:
        root: the cache root.
        xet_hash: 64 lowercase hex characters.
        delete: whether the plan frees this payload; when False the manifest is only rewritten (a payload the plan
            did not count stays, even without references: the next prune plans it).
        lock_timeout: seconds to wait at most for ``<h>.lock``.

    Returns:
        :class:`Sweep`. Errors (an unmarked store, a link or FIFO in place of a folder, the lock, the manifest or the
        payload, an OSError) give ``skipped`` with a note: nothing is deleted then.
    """
    if not is_sha256(xet_hash):
        return Sweep("skipped", f"invalid Xet hash {xet_hash!r}")
    try:
        store_fd = open_store_dir(root)
    except FileNotFoundError:
        return Sweep("gone")
    except (OSError, StoreProblem) as exc:
        return Sweep("skipped", f"the shared store is left alone: {exc}")
    try:
        try:
            prefix_fd = os.open(xet_hash[:2], _DIR_FLAGS, dir_fd=store_fd)
        except FileNotFoundError:
            return Sweep("gone")
        except OSError as exc:
            return Sweep("skipped", f"{STORE_DIR}/{xet_hash[:2]} is a symlink or not a folder ({exc.strerror})")
        try:
            return _sweep_locked(Path(root), prefix_fd, xet_hash, delete, lock_timeout)
        finally:
            os.close(prefix_fd)
    finally:
        os.close(store_fd)


def _open_lock(prefix_fd: int, name: str) -> str:
    """Make sure ``name`` exists through ``prefix_fd`` as huggingface_hub's ``_shared_blob_lock`` leaves it (a
    regular file, mode 0o666 whatever the umask); "" when it is usable, else why it is left alone.

    Only a lock file created here is given mode 0o666. An existing one is never chmod-ed: a group member can plant a
    hardlink to any file as ``<h>.lock`` (``O_NOFOLLOW`` stops symlinks, not hardlinks), and changing its mode would
    change that file's. An existing lock with more than one link is refused for the same reason (filelock's own
    check, ``_native/_unix.py`` ``_finalize_locked_fd``, refuses such a lock as well).
    """
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o666, dir_fd=prefix_fd)
        created = True
    except FileExistsError:
        created = False
        try:
            fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=prefix_fd)
        except OSError as exc:
            return "its lock file is a symlink" if exc.errno == errno.ELOOP else \
                f"its lock file cannot be opened ({exc.strerror})"
    except OSError as exc:
        return f"its lock file cannot be created ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "its lock file is not a regular file"
        if st.st_nlink != 1:
            return "its lock file has other hard links (it may be another file of the system)"
        if created:
            try:
                os.fchmod(fd, 0o666)
            except OSError:
                pass
    finally:
        os.close(fd)
    return ""


def _sweep_locked(root: Path, prefix_fd: int, xet_hash: str, delete: bool, lock_timeout: float) -> Sweep:
    where = root / STORE_DIR / xet_hash[:2]
    try:
        # Without flock, huggingface_hub locks "<h>.lock.soft" instead: hfcache's soft lock would not exclude it.
        no_flock = flock_error(via_dir_fd(where / xet_hash, prefix_fd).parent)
    except OSError as exc:
        return Sweep("skipped", f"the store cannot be written ({exc.strerror or exc})")
    if no_flock is not None:
        return Sweep("skipped", "no flock on this filesystem: left for huggingface_hub's own sweep")
    why = _open_lock(prefix_fd, xet_hash + LOCK_SUFFIX)
    if why:
        return Sweep("skipped", why + " (left alone)")
    try:
        with file_lock(where / (xet_hash + LOCK_SUFFIX), timeout=lock_timeout, mode=0o666, dir_fd=prefix_fd):
            return _sweep_held(root, prefix_fd, xet_hash, delete)
    except LockTimeout as exc:
        return Sweep("skipped", exc.message)
    except OSError as exc:
        return Sweep("skipped", f"{exc.strerror or exc}: {exc.filename or where}")


def _sweep_held(root: Path, prefix_fd: int, xet_hash: str, delete: bool) -> Sweep:
    """The sweep proper, with ``<h>.lock`` held."""
    try:
        st = os.stat(xet_hash, dir_fd=prefix_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Sweep("gone")
    references, why = read_references(root, prefix_fd, xet_hash)
    if references is None:
        return Sweep("skipped", why + ": the payload is kept (never deleted on a doubt)")
    if references or not delete or not stat.S_ISREG(st.st_mode):
        _rewrite_manifest(prefix_fd, xet_hash, references)
        if references:
            return Sweep("skipped", f"{len(references)} repo link(s) use it now; its manifest is rewritten")
        if not stat.S_ISREG(st.st_mode):
            return Sweep("skipped", "the payload is not a regular file (left alone)")
        return Sweep("skipped", "not planned for deletion; its manifest is rewritten")
    freed = st.st_size if st.st_nlink == 1 else 0
    os.unlink(xet_hash, dir_fd=prefix_fd)
    try:
        os.unlink(xet_hash + MANIFEST_SUFFIX, dir_fd=prefix_fd)
    except FileNotFoundError:
        pass
    note = "" if freed or not st.st_size else "another hardlink keeps its bytes"
    return Sweep("removed", note, freed)


def _rewrite_manifest(prefix_fd: int, xet_hash: str, references: list[str]) -> None:
    """Replace ``<h>.refs`` with ``references`` (one a line), through ``prefix_fd``: a temporary file created
    ``O_EXCL``, mode 0o666 (as ``_rewrite_manifest`` in ``_shared_blobs.py``), fsync'd, then renamed over it."""
    tmp = f"{xet_hash}{MANIFEST_SUFFIX}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o666, dir_fd=prefix_fd)
    try:
        try:
            os.fchmod(fd, 0o666)
            data = "".join(f"{line}\n" for line in references).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, xet_hash + MANIFEST_SUFFIX, src_dir_fd=prefix_fd, dst_dir_fd=prefix_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=prefix_fd)
        except OSError:
            pass
        raise
