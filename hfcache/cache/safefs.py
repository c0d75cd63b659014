"""Filesystem primitives that never leave the cache root, whatever links someone planted in it.

A cache is shared (baked into images, mounted into pods, written by several tools), so the folders and links found
in it are untrusted input (docs/security.md). Every operation here walks from the cache root one
component at a time with ``O_NOFOLLOW | O_DIRECTORY`` and acts relative to the last directory's file descriptor
(``dir_fd``), as ``serve`` already reads the cache: a symlinked or non-directory component anywhere below the root
raises :class:`UnsafeLayout` instead of being followed. The cache root itself may be a symlink (``~/.cache`` on
another disk is common); only what is below it is judged.

Names that build paths are checked where they are used, too: a blob name is 40 or 64 lowercase hex characters
(:func:`check_etag`), a commit 40 (:func:`check_commit`), a ref name a relative path without ``.``/``..``
(:func:`check_ref_name`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import CacheError
from ..names import UnsafeName, check_commit, check_etag, check_folder_name, check_ref_name  # noqa: F401 - the layer's checks
from .fsops import DIR_FLAGS as _DIR_FLAGS, UnsafeLayout, remove_tree_at
from .shared_store import StoreProblem, open_payload, xet_hash_of_link

#: The parts of a repo folder huggingface_hub writes; each must be a real directory when present.
REPO_PARTS = ("blobs", "refs", "snapshots", ".no_exist", "trees")
_PART_SET = frozenset(REPO_PARTS)

def _parts(rel: str | Sequence[str]) -> list[str]:
    parts = rel.split("/") if isinstance(rel, str) else list(rel)
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise UnsafeName(f"refusing path component {part!r} in {'/'.join(parts)!r}")
    return parts


def _unsafe(root: Path, parts: Sequence[str], upto: int, exc: OSError) -> UnsafeLayout:
    rel = "/".join(parts[: upto + 1])
    what = "a symlink" if os.path.islink(os.path.join(root, rel)) else "not a directory"
    return UnsafeLayout(f"{root}/{rel} is {what}: left alone (nothing outside the cache is read or written)",
                        hint="remove it or replace it with a real directory, then rerun")


def open_dir(root: str | os.PathLike[str], rel: str | Sequence[str] = (), *, create: bool = False,
             on_create: Callable[[int], None] | None = None) -> int:
    """Open the directory ``root/rel`` without following a symlink below ``root``; return its fd (caller closes).

    Args:
        root: the cache root (may itself be a symlink).
        rel: ``/``-separated path or components below it; ``()`` opens the root.
        create: make missing directories (mode 0o777 minus the umask, as ``os.makedirs``).
        on_create: called with the fd of each directory this call created (to share it, :mod:`hfcache.cache.sharing`).

    Raises:
        UnsafeLayout: a component is a symlink or not a directory.
        UnsafeName: a component is empty, ``.`` or ``..``.
        FileNotFoundError: a component is missing and ``create`` is False.
    """
    parts = _parts(rel) if rel else []
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                made = True
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    made = False
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except (NotADirectoryError, OSError) as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _unsafe(Path(root), parts, i, exc) from None
                    raise
                if made and on_create is not None:
                    on_create(nfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _unsafe(Path(root), parts, i, exc) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def dir_fd(root: str | os.PathLike[str], rel: str | Sequence[str] = (), *, create: bool = False) -> Iterator[int]:
    """:func:`open_dir` as a context manager that closes the fd."""
    fd = open_dir(root, rel, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def check_existing(root: str | os.PathLike[str], rel: str | Sequence[str]) -> None:
    """Check that each component of ``root/rel`` that exists is a real directory (walking without following links);
    stop at the first missing one. Raises UnsafeLayout otherwise."""
    parts = _parts(rel) if rel else []
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _unsafe(Path(root), parts, i, exc) from None
                raise
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)


def ensure_dirs(root: str | os.PathLike[str], rel: str | Sequence[str]) -> None:
    """Create ``root/rel`` as real directories (like ``mkdir -p``); raise UnsafeLayout on a planted link."""
    os.close(open_dir(root, rel, create=True))


def _split(rel: str | Sequence[str]) -> tuple[list[str], str]:
    parts = _parts(rel)
    return parts[:-1], parts[-1]


def unlink(root: str | os.PathLike[str], rel: str | Sequence[str], *, missing_ok: bool = False) -> bool:
    """Remove the non-directory ``root/rel`` (a link itself, never its target). Returns False when it was missing
    (with ``missing_ok``). Raises UnsafeLayout for a symlinked parent."""
    parent, name = _split(rel)
    try:
        with dir_fd(root, parent) as fd:
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def rmtree(root: str | os.PathLike[str], rel: str | Sequence[str], *, missing_ok: bool = True) -> bool:
    """Remove the directory ``root/rel`` and its contents without following any link and without recursion
    (:func:`remove_tree_at`: a folder chain of any depth is removed); a non-directory there is unlinked.

    Returns:
        bool: False when it was missing (with ``missing_ok``), else True.

    Raises:
        UnsafeLayout: a folder above ``rel`` is a symlink. OSError: an entry cannot be removed (ENOTEMPTY when
        someone keeps adding entries).
    """
    parent, name = _split(rel)
    try:
        with dir_fd(root, parent) as fd:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                remove_tree_at(fd, name)
            else:
                os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def rmdir(root: str | os.PathLike[str], rel: str | Sequence[str]) -> None:
    """Remove the empty directory ``root/rel`` (OSError ENOTEMPTY when it is not empty)."""
    parent, name = _split(rel)
    with dir_fd(root, parent) as fd:
        os.rmdir(name, dir_fd=fd)


def rename(root: str | os.PathLike[str], src: str | Sequence[str], dst: str | Sequence[str]) -> None:
    """``os.replace`` of ``root/src`` to ``root/dst``, both parents opened without following links."""
    sparent, sname = _split(src)
    dparent, dname = _split(dst)
    with dir_fd(root, sparent) as sfd, dir_fd(root, dparent) as dfd:
        os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)


def open_file(root: str | os.PathLike[str], rel: str | Sequence[str], flags: int = os.O_RDONLY,
              mode: int = 0o666) -> int:
    """``os.open`` of ``root/rel`` with ``O_NOFOLLOW`` on the file and every directory above it; returns the fd."""
    parent, name = _split(rel)
    with dir_fd(root, parent) as fd:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)


def read_small(root: str | os.PathLike[str], rel: str | Sequence[str], limit: int) -> bytes:
    """Read at most ``limit`` bytes of the regular file ``root/rel`` (no link followed; a FIFO or device there is
    refused without blocking: opened with ``O_NONBLOCK``, judged by ``fstat``).

    Raises:
        UnsafeLayout: ``root/rel`` or a folder above it is a symlink, or it is not a regular file.
        FileNotFoundError: it is missing.
    """
    try:
        fd = open_file(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeLayout(f"{root}/{'/'.join(_parts(rel))} is a symlink or sits under one: left alone",
                               hint="remove it, then rerun") from None
        raise
    return read_regular_fd(fd, f"{root}/{'/'.join(_parts(rel))}", limit)


def read_regular_fd(fd: int, what: str, limit: int) -> bytes:
    """Read at most ``limit`` bytes from ``fd`` (closed here) when it is a regular file, else raise UnsafeLayout
    naming ``what``. The fd may have been opened ``O_NONBLOCK`` (so a FIFO never blocks the open)."""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UnsafeLayout(f"{what} is not a regular file (a FIFO, device or folder): left alone",
                               hint="remove it, then rerun")
        return f.read(limit)


def open_repo_file(root: str | os.PathLike[str], folder: str, snapshot_rel: Sequence[str],
                   flags: int = os.O_RDONLY) -> int:
    """Open the file a snapshot entry stands for without leaving ``root/folder``: a real file in
    ``snapshots/<commit>/...`` itself, or, for a symlink there, its target resolved inside the repo folder (the
    ``../../blobs/<etag>`` form huggingface_hub writes), opened relative to the repo folder's fd with
    ``O_NOFOLLOW | O_NONBLOCK`` on every component. The caller checks ``S_ISREG`` with ``fstat``.

    Args:
        root: the cache root; folder: the repo folder name; snapshot_rel: ``(commit, *path_parts)``.

    Returns:
        An fd (caller closes).

    Raises:
        UnsafeLayout: a component is a symlink where a folder belongs, or the link points outside the repo folder
            or to another link.
        FileNotFoundError: the entry or its target is missing.
    """
    rel = ["snapshots", *snapshot_rel]
    with dir_fd(root, (folder, *rel[:-1])) as pfd:
        try:
            st = os.stat(rel[-1], dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            raise
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(rel[-1], dir_fd=pfd)
        else:
            target = None
    if target is None:
        parts = rel
    else:
        joined = os.path.normpath(os.path.join(*rel[:-1], target))
        if os.path.isabs(target) or joined.startswith("..") or joined == ".":
            raise UnsafeLayout(f"{root}/{folder}/{'/'.join(rel)} links outside its repo folder: left alone",
                               hint="remove it, then rerun")
        parts = joined.split("/")
    if len(parts) == 2 and parts[0] == "blobs":
        return open_blob(root, folder, parts[1], flags, shown="/".join(rel))
    try:
        return open_file(root, (folder, *parts), flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeLayout(f"{root}/{folder}/{'/'.join(rel)}: a symlink where a file or folder belongs: left "
                               "alone", hint="remove it, then rerun") from None
        raise



def open_blob(root: str | os.PathLike[str], folder: str, etag: str, flags: int = os.O_RDONLY, *,
              shown: str | None = None) -> int:
    """Open ``<root>/<folder>/blobs/<etag>``: a regular file there, or, where huggingface_hub 2.4 made it a link
    into the shared Xet blob store, the store's payload (:mod:`hfcache.cache.shared_store`: exactly the link shape
    and the marked store the library writes). Nothing else is followed. The fd is opened ``O_NONBLOCK``; callers
    check ``S_ISREG``.

    Args:
        root: the cache root; folder: the repo folder name; etag: the blob name.
        flags: ``os.open`` flags; shown: the path named in errors (default ``blobs/<etag>``).

    Raises:
        UnsafeLayout: a link of another shape, a store that is not what the library writes, a link where a folder
            belongs.
        FileNotFoundError: the blob, or the payload a store link names, is missing.
    """
    shown = shown or f"blobs/{etag}"
    try:
        return open_file(root, (folder, "blobs", etag), flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        if exc.errno == errno.ELOOP:
            xet_hash = store_link_of(root, folder, etag)
            if xet_hash is not None:
                try:
                    return open_payload(root, xet_hash, flags)
                except StoreProblem as problem:
                    raise UnsafeLayout(f"{root}/{folder}/{shown}: {problem}: left alone",
                                       hint="remove it, then rerun") from None
        raise UnsafeLayout(f"{root}/{folder}/{shown}: a symlink where a file or folder belongs: left "
                           "alone", hint="remove it, then rerun") from None


def store_link_of(root: str | os.PathLike[str], folder: str, etag: str) -> str | None:
    """The Xet hash ``<folder>/blobs/<etag>`` links to when it is a symlink of the shared store's exact shape
    (``../../blobs/<h[:2]>/<h>``), else None (a regular file, another link, missing). Read through the repo's
    ``blobs`` folder fd; nothing is followed."""
    try:
        with dir_fd(root, (folder, "blobs")) as fd:
            st = os.stat(etag, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                return None
            return xet_hash_of_link(os.readlink(etag, dir_fd=fd))
    except (OSError, UnsafeLayout):
        return None

def read_snapshot_file(snapshot: str | os.PathLike[str], rel: str, limit: int) -> bytes | None:
    """The bytes of ``rel`` in the snapshot folder ``<cache>/<folder>/snapshots/<commit>`` read with
    :func:`open_repo_file` (never through a link leaving the repo folder, never blocking on a FIFO), or None when
    its size exceeds ``limit`` bytes (the caller's parse cap).

    Raises:
        UnsafeLayout: a planted link on the way, or not a regular file. FileNotFoundError: missing.
    """
    snapshot = Path(snapshot)
    root, folder = snapshot.parent.parent.parent, snapshot.parent.parent.name
    parts = (snapshot.name, *_parts(rel))
    fd = open_repo_file(root, folder, parts)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeLayout(f"{snapshot}/{rel} is not a regular file (a FIFO, device or folder): left alone",
                               hint="remove it, then rerun")
        if st.st_size > limit:
            return None
        return f.read(limit)


def read_repo_file(root: str | os.PathLike[str], folder: str, snapshot_rel: Sequence[str], limit: int) -> bytes:
    """At most ``limit`` bytes of a snapshot entry's regular file (:func:`open_repo_file`); UnsafeLayout for a
    FIFO, device or anything but a regular file, FileNotFoundError when missing."""
    fd = open_repo_file(root, folder, snapshot_rel)
    return read_regular_fd(fd, f"{root}/{folder}/snapshots/{'/'.join(snapshot_rel)}", limit)


def repo_layout_problems(root: str, folder: str, locks_entries: dict[str, int] | None = None,
                         entries: dict[str, int] | None = None) -> list[str]:
    """What is unsafe about one repo folder's layout: each part that is a symlink or not a directory.

    Checks the repo folder itself, its :data:`REPO_PARTS`, ``.locks`` and ``.locks/<folder>``. Metadata only.

    Args:
        root: the cache root.
        folder: the repo folder name (``models--ORG--NAME``).
        locks_entries: name -> ``st_mode`` of ``.locks``' entries when the caller listed it already (a scan of the
            whole cache lists it once, having checked that ``.locks`` and the folder are real directories), else
            None to look everything up.
        entries: name -> ``st_mode`` of the repo folder's entries when already listed, else None.

    Returns:
        Sorted messages such as ``"blobs: a symlink (left alone)"``; empty when the layout is sound.
    """
    found = []
    if locks_entries is not None:  # a whole-cache scan: .locks is a real directory, the folder a real one
        lmode = locks_entries.get(folder)
        if lmode is not None and not stat.S_ISDIR(lmode):
            found.append(f".locks/{folder}: {_kind(lmode)} (left alone)")
    else:
        mode = _lstat_mode(os.path.join(root, folder))
        if mode is not None and not stat.S_ISDIR(mode):
            return [f"{folder}: {_kind(mode)} (left alone)"]
        locks_mode = _lstat_mode(os.path.join(root, ".locks"))
        if locks_mode is not None and not stat.S_ISDIR(locks_mode):
            found.append(f".locks: {_kind(locks_mode)} (left alone)")
        elif locks_mode is not None:
            lmode = _lstat_mode(os.path.join(root, ".locks", folder))
            if lmode is not None and not stat.S_ISDIR(lmode):
                found.append(f".locks/{folder}: {_kind(lmode)} (left alone)")
        if mode is None:
            return found
    if entries is None:
        entries = list_modes(os.path.join(root, folder), _PART_SET)
    for part in REPO_PARTS:
        pmode = entries.get(part)
        if pmode is not None and not stat.S_ISDIR(pmode):
            found.append(f"{part}: {_kind(pmode)} (left alone)")
    return sorted(found)


def list_modes(path: str, only: frozenset[str] | None = None) -> dict[str, int]:
    """name -> file type bits of the entries of the directory ``path`` (from ``d_type``: no stat per entry);
    with ``only``, of those names only. Empty when ``path`` is missing or this user cannot list it (nothing can be
    read through it either; the scan reports it as unreadable, docs/shared-caches.md)."""
    out: dict[str, int] = {}
    try:
        with os.scandir(path) as it:
            for e in it:
                if only is not None and e.name not in only:
                    continue
                if e.is_symlink():
                    out[e.name] = stat.S_IFLNK
                elif e.is_dir(follow_symlinks=False):
                    out[e.name] = stat.S_IFDIR
                elif e.is_file(follow_symlinks=False):
                    out[e.name] = stat.S_IFREG
                else:
                    out[e.name] = stat.S_IFIFO  # a device, socket or fifo: not a directory either way
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        pass
    return out


def _lstat_mode(path: str) -> int | None:
    """The mode of ``path`` (not followed), or None when it is missing or this user cannot look (a folder on the way
    cannot be entered: nothing can be read through it either, and the scan reports it as unreadable, docs/shared-caches.md)."""
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a directory"
