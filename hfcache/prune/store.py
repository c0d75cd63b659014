"""prune and huggingface_hub 2.4's shared Xet blob store (:mod:`hfcache.cache.shared_store`; docs/prune.md): which
payloads a prune frees, and their sweep as ``utils/_shared_blobs.py sweep_shared_blob`` does it, more cautiously:
through the prefix folder's descriptor, under ``<h>.lock``, the ``<h>.refs`` manifest read as a hint whose every
line is checked (a planted manifest must not make it delete), a payload kept on any doubt.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import NamedTuple

from ..cache import safefs
from ..cache.fsops import create_at, open_dir_at, open_read_at
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockTimeout, file_lock, flock_error, via_dir_fd
from ..cache.safefs import UnsafeLayout
from ..cache.scan import parse_folder_name
from ..cache.shared_store import LOCK_SUFFIX, MANIFEST_SUFFIX, STORE_DIR, StoreProblem, open_store_dir, xet_hash_of_link
from ..names import is_sha256

#: A manifest larger than this (bytes) is not read: the payload is kept.
MANIFEST_LIMIT = 16 * 1024 * 1024


class Sweep(NamedTuple):
    """One payload's sweep: ``status`` ``removed`` (payload and manifest deleted), ``skipped`` (kept: ``note`` says
    why) or ``gone`` (no such payload); ``bytes_freed``: 0 unless removed, and 0 when a hardlink keeps the inode."""

    status: str
    note: str = ""
    bytes_freed: int = 0


def payload_path(xet_hash: str) -> str:
    return f"{STORE_DIR}/{xet_hash[:2]}/{xet_hash}"


def has_store(root: str | os.PathLike[str]) -> bool:
    """Whether ``<root>/blobs`` is a marked store (:func:`hfcache.cache.shared_store.open_store_dir`)."""
    try:
        os.close(open_store_dir(root))
    except (OSError, StoreProblem):
        return False
    return True


def list_payloads(root: str | os.PathLike[str]) -> dict[str, os.stat_result]:
    """Xet hash -> ``lstat`` of every payload of a marked store: regular files named by a 64-hex hash in their
    2-hex prefix folder (a prefix folder that is a link is skipped). Empty without a store or when unlistable."""
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
                prefix_fd = open_dir_at(store_fd, prefix)
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
    them (``_relative_blob_path``); None for anything else."""
    parts = line.split("/")
    if len(parts) != 3 or parts[1] != "blobs" or parse_folder_name(parts[0]) is None \
            or parts[2] in ("", ".", "..") or "\0" in line or "\\" in line:
        return None
    return parts[0], parts[2]


def _links_here(root: str | os.PathLike[str], folder: str, name: str, xet_hash: str) -> bool | None:
    """Whether ``<folder>/blobs/<name>`` is now a link of the library's exact shape to ``xet_hash``; None when it
    cannot be told (a link where a folder belongs, an I/O error)."""
    try:
        with safefs.dir_fd(root, (folder, "blobs")) as fd:
            if not stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                return False
            return xet_hash_of_link(os.readlink(name, dir_fd=fd)) == xet_hash
    except FileNotFoundError:
        return False
    except (OSError, UnsafeLayout):
        return None


def read_references(root: str | os.PathLike[str], prefix_fd: int, xet_hash: str) -> tuple[list[str] | None, str]:
    """The valid references of ``<h>.refs`` (read through ``prefix_fd``): the lines naming a repo blob that links
    to this payload now, sorted, once each; or (None, why) when the manifest is missing, not a regular file,
    unreadable, over :data:`MANIFEST_LIMIT`, not UTF-8, names anything but a repo blob, or a reference cannot be
    checked (the payload is then kept, never deleted)."""
    try:
        fd = open_read_at(prefix_fd, xet_hash + MANIFEST_SUFFIX)
    except FileNotFoundError:
        return None, "its .refs manifest is missing"
    except OSError as exc:
        return None, "its .refs manifest is a symlink" if exc.errno == errno.ELOOP else \
            f"its .refs manifest cannot be opened ({exc.strerror})"
    try:
        data = safefs.read_regular_fd(fd, "its .refs manifest", MANIFEST_LIMIT, whole=True)  # closes fd
        if data is None:
            return None, "its .refs manifest is too large"
        lines = data.decode("utf-8").splitlines()
    except UnsafeLayout:
        return None, "its .refs manifest is not a regular file"
    except OSError as exc:
        return None, f"its .refs manifest cannot be read ({exc.strerror or exc})"
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


def payload_references(root: str | os.PathLike[str], xet_hash: str) -> tuple[list[str] | None, str]:
    """:func:`read_references` of the payload ``xet_hash``; (None, why) when the store or its prefix folder cannot be
    opened (a link, missing)."""
    try:
        store_fd = open_store_dir(root)
    except (OSError, StoreProblem) as exc:
        return None, f"the store is left alone ({exc})"
    try:
        prefix_fd = open_dir_at(store_fd, xet_hash[:2])
    except OSError as exc:
        return None, f"its prefix folder is a symlink or missing ({exc.strerror})"
    finally:
        os.close(store_fd)
    try:
        return read_references(root, prefix_fd, xet_hash)
    finally:
        os.close(prefix_fd)


def sweep_payload(root: str | os.PathLike[str], xet_hash: str, *, delete: bool,
                  lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> Sweep:
    """Sweep the payload ``xet_hash`` (64 hex) of the cache ``root`` after repo links to it were removed, waiting at
    most ``lock_timeout`` seconds for ``<h>.lock``. ``delete``: whether the plan frees it (False only rewrites the
    manifest). An unmarked store, a link or FIFO where a folder, the lock, the manifest or the payload belongs, an
    OSError: ``skipped`` with a note."""
    if not is_sha256(xet_hash):
        return Sweep("skipped", f"invalid Xet hash {xet_hash!r}")
    try:
        store_fd = open_store_dir(root)
    except FileNotFoundError:
        return Sweep("gone")
    except (OSError, StoreProblem) as exc:
        return Sweep("skipped", f"the shared store is left alone: {exc}")
    try:
        prefix_fd = open_dir_at(store_fd, xet_hash[:2])
    except FileNotFoundError:
        return Sweep("gone")
    except OSError as exc:
        return Sweep("skipped", f"{STORE_DIR}/{xet_hash[:2]} is a symlink or not a folder ({exc.strerror})")
    finally:
        os.close(store_fd)
    try:
        return _sweep_locked(Path(root), prefix_fd, xet_hash, delete, lock_timeout)
    finally:
        os.close(prefix_fd)


def _open_lock(prefix_fd: int, name: str) -> str:
    """Make sure ``name`` exists through ``prefix_fd`` as ``_shared_blob_lock`` leaves it (a regular file, mode
    0o666); "" when it is usable, else why not. Only a lock created here is chmod-ed: an existing one may be a
    planted hardlink to any file, and one with more links is refused (as filelock's ``_finalize_locked_fd``)."""
    try:
        fd, created = create_at(prefix_fd, name, 0o666), True
    except FileExistsError:
        created = False
        try:
            fd = open_read_at(prefix_fd, name)
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
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)
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
    with contextlib.suppress(FileNotFoundError):
        os.unlink(xet_hash + MANIFEST_SUFFIX, dir_fd=prefix_fd)
    return Sweep("removed", "" if freed or not st.st_size else "another hardlink keeps its bytes", freed)


def _rewrite_manifest(prefix_fd: int, xet_hash: str, references: list[str]) -> None:
    """Replace ``<h>.refs`` with ``references`` (one a line) through ``prefix_fd``: a new temporary file, mode
    0o666 (as ``_rewrite_manifest`` in ``_shared_blobs.py``), fsync'd, then renamed over it."""
    tmp = f"{xet_hash}{MANIFEST_SUFFIX}.{secrets.token_hex(4)}.tmp"
    fd = create_at(prefix_fd, tmp, 0o666)
    try:
        try:
            os.fchmod(fd, 0o666)
            view = memoryview("".join(f"{line}\n" for line in references).encode())
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, xet_hash + MANIFEST_SUFFIX, src_dir_fd=prefix_fd, dst_dir_fd=prefix_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=prefix_fd)
        raise
