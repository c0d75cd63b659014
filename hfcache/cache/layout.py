"""The Hugging Face hub cache layout of one repo folder (:class:`RepoFolder`), and blobs being downloaded into it.
The layout is huggingface_hub's (``file_download.py``), drawn in docs/cache-layout.md; ``<folder>`` is
``models--ORG--NAME`` (``datasets--``, ``kernels--``) from the repo id as the caller typed it.
"""

from __future__ import annotations

import os
import stat
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path

from ..names import UnsafeName, check_commit, check_etag, check_folder_name, check_ref_name, repo_folder_name
from . import safefs
from .atomic import atomic_write_at, file_lock
from .fsops import create_at, open_read_at, temp_name, unlink_at
from .incomplete import IncompleteBlob
from .locking import DEFAULT_LOCK_TIMEOUT, LockWait
from .safefs_tree import copy_blob_at
from .shared_store import STORE_DIR, StoreProblem, open_store_dir, payload_stat
from .sharing import SharePolicy, cache_policy, open_dirs, share_fd, share_file_at

#: Name of hfcache's per-repo lock inside ``.locks/<folder>/`` (``scan_cache_dir`` never reads ``.locks``).
REPO_LOCK_NAME = "hfcache-repo.lock"


class RepoFolder:
    """Paths and atomic writes (a temporary name, then ``os.replace``) for one repo folder of a cache, none of which
    follows a link planted in it (:mod:`.safefs`); every name that builds a path is checked first.

    Args:
        cache_dir: the cache root. repo_id: the id exactly as callers will load it (a legacy id gets its own folder).
        repo_type: ``model``, ``dataset``, ``space`` or ``kernel``.

    Raises (from every method that builds a path or writes):
        UnsafeName: a blob, commit, ref or path name that would leave its folder.
        UnsafeLayout: a part of the repo folder (or ``.locks/<folder>``) is a symlink or not a directory.
    """

    def __init__(self, cache_dir: Path, repo_id: str, repo_type: str = "model", *,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_lock_wait: Callable[[LockWait], None] | None = None,
                 ) -> None:
        self.cache_dir = cache_dir
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.name = repo_folder_name(repo_id, repo_type)
        check_folder_name(self.name)
        self.root = cache_dir / self.name
        self.locks = cache_dir / ".locks" / self.name
        self.lock_timeout = lock_timeout
        self.on_lock_wait = on_lock_wait
        self.policy = cache_policy(cache_dir)

    def make_dir(self, path: Path) -> None:
        """``mkdir -p`` a folder of this repo (:meth:`open_dir`)."""
        os.close(self.open_dir(path))

    def open_dir(self, path: Path) -> int:
        """Open a folder of this repo, created shared like the root (:func:`.sharing.open_dirs`); its fd (caller
        closes), which every write below acts through. UnsafeLayout: a component is a symlink or not a directory."""
        return open_dirs(path, self.cache_dir, self.policy)

    @contextmanager
    def _blobs_fd(self, for_download: bool = False):
        """An fd of ``blobs/`` (:meth:`open_dir`) for the block; ``for_download``: :meth:`_download_dir`'s."""
        fd = self._download_dir() if for_download else self.open_dir(self.root / "blobs")
        try:
            yield fd
        finally:
            os.close(fd)

    def _download_dir(self) -> int:
        """An fd of ``blobs/``, ``snapshots/`` made first as huggingface_hub does before a download
        (``scan_cache_dir`` reports a repo folder with blobs but no ``snapshots/`` as corrupted)."""
        self.make_dir(self.root / "snapshots")
        return self.open_dir(self.root / "blobs")

    def _existing_blobs(self) -> int | None:
        try:
            return safefs.open_dir(self.cache_dir, (self.name, "blobs"))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def layout_problems(self) -> list[str]:
        """Each part of this repo folder that is a symlink or not a directory (safefs.repo_layout_problems)."""
        return safefs.repo_layout_problems(str(self.cache_dir), self.name)

    def ensure_safe(self) -> None:
        """Raise UnsafeLayout when a part of the repo folder (or its ``.locks`` folder) is a symlink or a file."""
        problems = self.layout_problems()
        if problems:
            raise safefs.UnsafeLayout(f"{self.name}: unsafe cache layout: {'; '.join(problems)}",
                                      hint="remove the symlink or file (or the repo folder), then rerun")

    def blob_path(self, etag: str) -> Path:
        return self.root / "blobs" / check_etag(etag)

    def read_blob(self, etag: str, limit: int) -> bytes:
        """At most ``limit`` bytes of the blob ``etag`` (:func:`.safefs.open_blob`). UnsafeLayout: not a regular file
        (a FIFO, a link to ``/dev/zero``); FileNotFoundError."""
        fd = safefs.open_blob(self.cache_dir, self.name, check_etag(etag))
        return safefs.read_regular_fd(fd, f"{self.name}/blobs/{etag}", limit)

    def pointer_path(self, commit_hash: str, path: str) -> Path:
        return self.root / "snapshots" / check_commit(commit_hash) / Path(*_repo_parts(path))

    def marker_path(self, commit_hash: str, path: str) -> Path:
        return self.root / ".no_exist" / check_commit(commit_hash) / Path(*_repo_parts(path))

    def ref_path(self, revision: str) -> Path:
        return self.root / "refs" / Path(*check_ref_name(revision).split("/"))

    @contextmanager
    def _lock(self, name: str, stop: threading.Event | None):
        """Hold ``.locks/<folder>/<name>``, opened through a descriptor of ``.locks/<folder>`` (no link followed)."""
        fd = self.open_dir(self.locks)
        try:
            try:
                linked = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
            except FileNotFoundError:
                linked = False
            if linked:  # filelock opens with O_NOFOLLOW: say why, not ELOOP
                raise safefs.UnsafeLayout(f"{self.locks / name} is a symlink: left alone", hint="remove it, then rerun")
            with file_lock(self.locks / name, stop, timeout=self.lock_timeout, on_wait=self.on_lock_wait,
                           cache_dir=self.cache_dir, dir_fd=fd):
                yield
        finally:
            os.close(fd)

    def blob_lock(self, etag: str, stop: threading.Event | None = None):
        """The lock huggingface_hub takes while downloading this blob (``.locks/<folder>/<etag>.lock``)."""
        return self._lock(f"{check_etag(etag)}.lock", stop)

    def repo_lock(self, stop: threading.Event | None = None):
        """hfcache's lock on the whole repo folder, held while warm or prune change it; the layout is checked first
        (UnsafeLayout), so no command writes into a repo folder with a planted link."""
        self.ensure_safe()
        return self._lock(REPO_LOCK_NAME, stop)

    def blob_ok(self, etag: str, size: int) -> bool:
        """True when ``blobs/<etag>`` is a regular file of the expected size, or a link of huggingface_hub's exact
        shape into the marked shared Xet store to a payload of that size (no hashing; no other link followed)."""
        try:
            with safefs.dir_fd(self.cache_dir, (self.name, "blobs")) as fd:
                st = os.stat(check_etag(etag), dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                # huggingface_hub 2.4's link into the shared Xet store (cache/shared_store.py): the payload counts
                xet_hash = safefs.store_link_of(self.cache_dir, self.name, etag)
                if xet_hash is None:
                    return False
                st = payload_stat(self.cache_dir, xet_hash)
        except OSError:  # StoreProblem included: an unmarked store, a planted link or FIFO is not a blob
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == size

    def _new_incomplete(self, dfd: int, etag: str) -> tuple[str, int]:
        name = f"{etag}.{uuid.uuid4().hex[:8]}.incomplete"
        fd = create_at(dfd, name)
        share_fd(fd, self.policy)
        return name, fd

    def open_incomplete(self, etag: str) -> tuple[IncompleteBlob, object]:
        """Create ``blobs/<etag>.<random>.incomplete`` (huggingface_hub's download name; mode 0o666 minus the umask)
        relative to an fd of ``blobs/`` the returned :class:`IncompleteBlob` keeps for :meth:`publish_blob`. Returns
        (IncompleteBlob, binary file object); the caller calls ``incomplete.unlink(missing_ok=True)`` when done."""
        check_etag(etag)
        dfd = self._download_dir()
        try:
            name, fd = self._new_incomplete(dfd, etag)
        except BaseException:
            os.close(dfd)
            raise
        return IncompleteBlob(dfd, name, self.root / "blobs" / name), os.fdopen(fd, "wb")

    def resume_incomplete(self, etag: str) -> IncompleteBlob:
        """The partial download of ``blobs/<etag>`` to continue (reopen it with :meth:`IncompleteBlob.open_fd`): the
        largest leftover, the others deleted, or a new empty one. Call it only while holding :meth:`blob_lock`."""
        check_etag(etag)
        dfd = self._download_dir()
        try:
            leftovers = sorted(((size, name) for name, size in _leftovers(dfd, etag)), reverse=True)
            if not leftovers:
                name, fd = self._new_incomplete(dfd, etag)
                os.close(fd)
            else:
                for _, other in leftovers[1:]:
                    unlink_at(dfd, other)
                name = leftovers[0][1]
        except BaseException:
            os.close(dfd)
            raise
        return IncompleteBlob(dfd, name, self.root / "blobs" / name)

    def leftover_sizes(self) -> dict[str, int]:
        """etag -> bytes of each blob's largest leftover partial download, for the progress bar of a resumed repo (an
        estimate: the download keeps what :func:`hfcache.hub.transfer.trusted_prefix` trusts)."""
        dfd = self._existing_blobs()
        if dfd is None:
            return {}
        sizes: dict[str, int] = {}
        try:
            for name, size in _leftovers(dfd, None):
                etag = name.split(".", 1)[0]
                sizes[etag] = max(sizes.get(etag, 0), size)
        finally:
            os.close(dfd)
        return sizes

    def discard_incomplete(self, etag: str) -> int:
        """Delete the leftover partial downloads of ``blobs/<etag>`` once the blob is in place by other means, so a
        rerun leaves none behind; how many. Call it only while holding :meth:`blob_lock`."""
        check_etag(etag)
        dfd = self._existing_blobs()
        if dfd is None:
            return 0
        deleted = 0
        try:
            for name, _ in _leftovers(dfd, etag):
                try:
                    os.unlink(name, dir_fd=dfd)
                    deleted += 1
                except FileNotFoundError:
                    continue
        finally:
            os.close(dfd)
        from . import extents  # here, not at the top: a warm --lock on a complete cache never resumes (~3 ms)

        extents.remove(self, etag)  # the extents of a leftover no longer there
        return deleted

    def publish_blob(self, incomplete: IncompleteBlob, etag: str) -> None:
        """Rename a verified download to ``blobs/<etag>`` (atomic, relative to the dir fd it was created in;
        replaces a broken blob or a planted link of that name, never writes through it); closes that fd."""
        os.replace(incomplete.name, check_etag(etag), src_dir_fd=incomplete.dir_fd,
                   dst_dir_fd=incomplete.dir_fd)
        incomplete.published = True
        incomplete.close()

    def adopt_blob(self, source: Path, etag: str) -> bool:
        """Hardlink an identical blob (``<folder>/blobs/<etag>`` of this cache or a payload of its marked shared
        store) as ``blobs/<etag>``; False, nothing changed, for any other ``source`` or where hardlinks fail."""
        check_etag(etag)
        try:
            src_rel = Path(source).relative_to(self.cache_dir).parts
            check_etag(src_rel[-1])
        except (ValueError, IndexError, UnsafeName):
            return False
        if len(src_rel) != 3 or (src_rel[1] != "blobs" and not _store_payload_rel(self.cache_dir, src_rel)):
            return False
        tmp = temp_name(etag, ".incomplete")
        try:
            sfd = safefs.open_dir(self.cache_dir, src_rel[:2])
        except (OSError, safefs.UnsafeLayout):
            return False
        try:
            with self._blobs_fd(for_download=True) as dfd:
                try:
                    os.link(src_rel[2], tmp, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    return False
                try:
                    if not stat.S_ISREG(os.stat(tmp, dir_fd=dfd, follow_symlinks=False).st_mode):
                        return False
                    os.replace(tmp, etag, src_dir_fd=dfd, dst_dir_fd=dfd)
                finally:
                    unlink_at(dfd, tmp)
        finally:
            os.close(sfd)
        return True

    def move_blob_in(self, src_dir_fd: int, name: str, etag: str) -> None:
        """Rename the verified file ``name`` of the folder ``src_dir_fd`` (import's staging) to ``blobs/<etag>``,
        shared first, relative to both folder fds. UnsafeLayout: a symlink on the way; OSError."""
        check_etag(etag)
        share_file_at(src_dir_fd, name, self.policy)
        with self._blobs_fd() as dfd:
            os.replace(name, etag, src_dir_fd=src_dir_fd, dst_dir_fd=dfd)

    def copy_blob(self, source_folder: str, etag: str, size: int) -> None:
        """Copy ``<source_folder>/blobs/<etag>`` of this cache as this repo's ``blobs/<etag>`` (where a hardlink is
        not possible), hash-checked while copied (:func:`.safefs_tree.copy_blob_at`).
        Raises UnsafeLayout: the source is a link, a FIFO, not ``size`` bytes, or does not hash to ``etag``. OSError: it
        is missing, or the copy cannot be written."""
        check_etag(etag)
        src = safefs.open_unfollowed(self.cache_dir, (check_folder_name(source_folder), "blobs", etag),
                                     f"{self.cache_dir}/{source_folder}/blobs/{etag}", " (nothing copied)")
        try:
            with self._blobs_fd() as dfd:
                copy_blob_at(src, dfd, etag, size, on_create=lambda fd: share_fd(fd, self.policy))
        finally:
            os.close(src)

    def link(self, commit_hash: str, path: str, etag: str, symlinks: bool = True) -> None:
        """Make ``snapshots/<commit>/<path>`` point to ``blobs/<etag>``: a relative link (``../../blobs/<etag>``, one
        more ``../`` per subfolder, as huggingface_hub's ``_create_symlink``), or without ``symlinks`` a hardlink (or
        copy) of the blob, the library's real-file form (:meth:`_link_at`)."""
        pointer = self.pointer_path(commit_hash, path)
        blob = self.blob_path(etag)
        pfd = self.open_dir(pointer.parent)
        try:
            with self._blobs_fd() as bfd:
                self._link_at(pfd, pointer.name, bfd, etag, os.path.relpath(blob, pointer.parent) if symlinks else None)
        finally:
            os.close(pfd)

    def _link_at(self, pfd: int, name: str, bfd: int, etag: str, target: str | None) -> None:
        """Make the entry ``name`` of the folder ``pfd``: a symlink to ``target``, or (None) a hardlink or copy of
        ``blobs/<etag>`` (open as ``bfd``); a wrong existing entry is replaced through a temporary name."""
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if target is not None and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=pfd) == target:
                return
            if target is None and stat.S_ISREG(st.st_mode):
                bst = os.stat(etag, dir_fd=bfd, follow_symlinks=False)
                if (bst.st_dev, bst.st_ino) == (st.st_dev, st.st_ino):
                    return
        if target is not None:
            make = lambda dest: os.symlink(target, dest, dir_fd=pfd)  # noqa: E731
        else:
            make = lambda dest: _hardlink_or_copy_at(bfd, etag, pfd, dest, self.policy)  # noqa: E731
        if st is None:
            with suppress(FileExistsError):
                make(name)
                return
        tmp = temp_name(name)
        try:
            make(tmp)
            os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        finally:
            unlink_at(pfd, tmp)

    def mark_absent(self, commit_hash: str, path: str) -> None:
        """Write the empty ``.no_exist/<commit>/<path>`` marker huggingface_hub reads as "not in the repo"."""
        marker = self.marker_path(commit_hash, path)
        dfd = self.open_dir(marker.parent)
        try:
            fd = create_at(dfd, marker.name)  # empty: atomic
        except FileExistsError:
            return
        finally:
            os.close(dfd)
        share_fd(fd, self.policy)
        os.close(fd)

    def touch_snapshot(self, commit_hash: str) -> None:
        """Set the revision's snapshot folder's mtime to now, through its fd (part of "last use", :mod:`.scan`).
        Best effort: a read-only cache keeps its old time."""
        try:
            fd = safefs.open_dir(self.cache_dir, (self.name, "snapshots", check_commit(commit_hash)))
        except (OSError, safefs.UnsafeLayout):
            return
        try:
            with suppress(OSError):
                os.utime(fd)
        finally:
            os.close(fd)

    def read_ref(self, revision: str) -> bytes | None:
        """``refs/<revision>``'s bytes (at most 256), None when missing; UnsafeLayout: a link (safefs.read_small)."""
        try:
            return safefs.read_small(self.cache_dir, (self.name, "refs", *check_ref_name(revision).split("/")), 256)
        except FileNotFoundError:
            return None

    def write_ref(self, revision: str, commit_hash: str) -> None:
        """Write ``refs/<revision>`` = commit, without a trailing newline (huggingface_hub reads the file whole as
        the commit: one breaks offline resolution)."""
        check_commit(commit_hash)
        if revision == commit_hash:
            return
        ref = self.ref_path(revision)
        dfd = self.open_dir(ref.parent)
        try:
            if self.read_ref(revision) == commit_hash.encode():
                return
            atomic_write_at(dfd, ref.name, commit_hash.encode(), self.policy)
        finally:
            os.close(dfd)


def _hardlink_or_copy_at(bfd: int, etag: str, pfd: int, dest: str, policy: SharePolicy | None) -> None:
    """Hardlink ``blobs/<etag>`` (folder fd ``bfd``) as ``dest`` in the folder ``pfd``; where hardlinks fail, copy to
    a temporary name and rename. Raises FileExistsError when ``dest`` exists. No link is followed."""
    try:
        os.link(etag, dest, src_dir_fd=bfd, dst_dir_fd=pfd, follow_symlinks=False)
        return
    except FileExistsError:
        raise
    except OSError:
        pass
    with suppress(FileNotFoundError):
        os.stat(dest, dir_fd=pfd, follow_symlinks=False)
        raise FileExistsError(dest)
    src = open_read_at(bfd, etag)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise safefs.UnsafeLayout(f"blobs/{etag} is not a regular file: left alone")
        copy_blob_at(src, pfd, etag, st.st_size, on_create=lambda fd: share_fd(fd, policy), name=dest)
    finally:
        os.close(src)


def _leftovers(dfd: int, etag: str | None) -> list[tuple[str, int]]:
    """(name, size) of the regular partial downloads in the ``blobs/`` folder ``dfd``: ``<etag>[.<random>].incomplete``
    (hfcache's names and huggingface_hub's), of ``etag`` only when given."""
    found = []
    for name in os.listdir(dfd):
        if name.endswith(".incomplete") and (etag is None or name.startswith(f"{etag}.")):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((name, st.st_size))
    return found


def _repo_parts(path: str) -> list[str]:
    """The components of a repo path; UnsafeName for an absolute path, ``..``, ``.`` or an empty component."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path:
        raise UnsafeName(f"refusing repo path {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise UnsafeName(f"refusing repo path {path!r}")
    return parts


def _store_payload_rel(cache_dir: Path, rel: tuple[str, ...]) -> bool:
    """Whether ``rel`` names a payload of the cache's marked shared store: ``("blobs", h[:2], h)``."""
    if rel[0] != STORE_DIR or rel[1] != rel[2][:2] or len(rel[2]) != 64:
        return False
    try:
        os.close(open_store_dir(cache_dir))
    except (OSError, StoreProblem):
        return False
    return True
