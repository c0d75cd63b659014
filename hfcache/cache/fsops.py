"""The filesystem primitives every room uses below a cache root: opens relative to a folder descriptor that never
follow a link and never block on a FIFO, an exclusive create, a removal of a tree of any depth and a bounded walk.

A group member of a shared cache can swap any folder or file for a link between a check and a use, or plant a
folder chain deep enough to exhaust Python's recursion (docs/security.md, "Group members"). Only this module and
the modules built on it (:mod:`.safefs`, :mod:`.safefs_tree`, :mod:`.shared_store`, :mod:`.atomic`) spell
``O_NOFOLLOW``; ``tests/unit/test_fs_discipline.py`` fails anywhere else. Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterator

from ..bounds import MAX_TREE_DEPTH
from ..errors import CacheError

#: A folder below the root: never a link.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file read below the root: no final link followed, never blocking on a FIFO.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: A file created below the root: a new name only, never through a link.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeLayout(CacheError):
    """A part of the cache is a symlink or not a directory where a directory belongs; nothing was done through it."""


def open_dir_at(dir_fd: int | None, name: str) -> int:
    """Open the folder ``name`` of the folder ``dir_fd`` (None: ``name`` is a path) without following a link; its fd.

    Raises:
        OSError: ELOOP/ENOTDIR when it is a link or not a folder, FileNotFoundError when missing.
    """
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def open_read_at(dir_fd: int | None, name: str, extra: int = 0) -> int:
    """Open ``name`` of the folder ``dir_fd`` for reading (``O_NOFOLLOW | O_NONBLOCK``, plus ``extra`` flags); the
    caller checks ``S_ISREG`` (or uses :func:`open_regular`). Raises OSError (ELOOP for a link)."""
    return os.open(name, READ_FLAGS | extra, dir_fd=dir_fd)


def create_at(dir_fd: int, name: str, mode: int = 0o666) -> int:
    """Create the new file ``name`` in the folder ``dir_fd`` for writing (``O_EXCL | O_NOFOLLOW``: never an existing
    entry, never through a link); its fd. Raises FileExistsError, OSError."""
    return os.open(name, CREATE_FLAGS, mode, dir_fd=dir_fd)


def open_regular(dir_fd: int, name: str, shown: str) -> int:
    """Open the regular file ``name`` of the folder ``dir_fd`` for reading (``O_NOFOLLOW | O_NONBLOCK``, then
    ``fstat``), so a name swapped for a link, FIFO, device or folder after it was listed is refused.

    Args:
        dir_fd: the folder's descriptor (from :func:`walk`). name: one component. shown: the path named in errors.

    Returns:
        int: the descriptor (caller closes).

    Raises:
        UnsafeLayout: not a regular file (a link, FIFO, device or folder) now.
        FileNotFoundError: it is gone.
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            raise UnsafeLayout(f"{shown} is not a regular file (a link, FIFO or device): left alone",
                               hint="remove it, then rerun") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeLayout(f"{shown} is not a regular file (a FIFO, device or folder): left alone",
                           hint="remove it, then rerun")
    return fd


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove the folder ``name`` of the folder open as ``parent_fd`` and everything in it, iteratively.

    Library gap: Python 3.11's ``shutil.rmtree`` (and ``os.walk``) recurse once per level, so a 1,000-level chain
    a group member plants raises RecursionError. Here every subfolder found at any depth is first renamed (relative
    to the folder fds) up into the folder being removed under a private name, so the work stays one level deep,
    with two descriptors open, whatever the depth. Nothing is followed: every folder is opened with
    ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's fd, and an entry swapped for a link meanwhile is unlinked
    (the link itself), never entered.

    Args:
        parent_fd (int): an fd of the folder holding ``name`` (opened by :func:`open_dir`).
        name (str): one component.

    Raises:
        FileNotFoundError: ``name`` is missing. NotADirectoryError / OSError(ELOOP): it is not a real folder.
        OSError: an entry cannot be removed (ENOTEMPTY when entries keep appearing).
    """
    top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        pending: list[str | None] = [None]  # None: the top folder itself; else a name inside it
        while pending:
            sub = pending.pop()
            try:
                fd = top if sub is None else os.open(sub, DIR_FLAGS, dir_fd=top)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                os.unlink(sub, dir_fd=top)  # swapped for a link or a file since it was listed
                continue
            try:
                pending += _empty_level(fd, top, sub is None)
            finally:
                if fd != top:
                    os.close(fd)
            if sub is not None:
                os.rmdir(sub, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent_fd)


def _empty_level(fd: int, top: int, is_top: bool) -> list[str]:
    """Unlink the non-folders of the folder ``fd``; move its subfolders into ``top`` (unless it is ``top``) under
    private names. Returns the names (in ``top``) of the subfolders still to empty."""
    found = []
    for entry in os.listdir(fd):
        try:
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(entry, dir_fd=fd)
        elif is_top:
            found.append(entry)
        else:
            moved = f".hfcache-rm-{uuid.uuid4().hex}"
            os.rename(entry, moved, src_dir_fd=fd, dst_dir_fd=top)
            found.append(moved)
    return found


def walk_tree(top: str | os.PathLike[str], *, max_depth: int = MAX_TREE_DEPTH,
              too_deep: list[str] | None = None,
              onerror: Callable[[OSError], object] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` (top-down, links never followed, ``dirnames`` may be pruned in place), iterative and bounded.

    Python 3.11's ``os.walk`` and ``Path.rglob`` recurse once per level, so a folder chain a cache member planted
    (1,000 levels) raised RecursionError; this walk keeps an explicit stack and does not enter a folder more than
    ``max_depth`` levels below ``top``.

    Args:
        top: the folder to walk.
        max_depth: deepest level entered (:data:`hfcache.bounds.MAX_TREE_DEPTH`; ``top`` is level 0).
        too_deep: receives the path (relative to ``top``) of each folder left unentered for its depth.
        onerror: called with the OSError of a folder that cannot be listed (as ``os.walk``'s).

    Yields:
        tuple[str, list[str], list[str]]: (folder path, sub-folder names, other entry names) per folder.
    """
    base = os.fspath(top)
    stack = [(base, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        files = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        yield path, dirs, files
        for name in reversed(dirs):
            sub = os.path.join(path, name)
            if depth >= max_depth:
                if too_deep is not None:
                    too_deep.append(os.path.relpath(sub, base))
                continue
            stack.append((sub, depth + 1))
