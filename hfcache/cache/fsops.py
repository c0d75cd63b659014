"""The filesystem primitives every room uses below a cache root: opens relative to a folder descriptor that never
follow a link and never block on a FIFO, an exclusive create, a removal of a tree of any depth and a bounded walk.

A group member of a shared cache can swap any folder or file for a link between a check and a use, or plant a
folder chain deep enough to exhaust Python's recursion (docs/security.md, "Group members").
"""

from __future__ import annotations

import contextlib
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
#: The errnos of an open that met a link (ELOOP) or a non-folder (ENOTDIR) where it followed none.
LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR)


class UnsafeLayout(CacheError):
    """A part of the cache is a symlink or not a directory where a directory belongs; nothing was done through it."""


def open_dir_at(dir_fd: int | None, name: str) -> int:
    """Open the folder ``name`` of the folder ``dir_fd`` (None: ``name`` is a path) without following a link; its fd.
    Raises OSError: ELOOP/ENOTDIR for a link or a non-folder, FileNotFoundError when missing."""
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def open_read_at(dir_fd: int | None, name: str, extra: int = 0) -> int:
    """Open ``name`` of ``dir_fd`` (None: a path) with :data:`READ_FLAGS` | ``extra``; the caller checks ``S_ISREG``
    (or uses :func:`open_regular`). OSError (ELOOP: a link)."""
    return os.open(name, READ_FLAGS | extra, dir_fd=dir_fd)


def open_noatime(open_: Callable[[int], int], flags: int = os.O_RDONLY) -> int:
    """``open_(flags | O_NOATIME)``, else ``open_(flags)`` where only the owner may ask for it (PermissionError): for
    reads that are not a use (verify's hashing), which would make every blob look just used to ``ls``/``prune``."""
    try:
        return open_(flags | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        return open_(flags)


def create_at(dir_fd: int, name: str, mode: int = 0o666) -> int:
    """Create the new file ``name`` in ``dir_fd`` with :data:`CREATE_FLAGS`; its fd. FileExistsError, OSError."""
    return os.open(name, CREATE_FLAGS, mode, dir_fd=dir_fd)


def temp_name(name: str, suffix: str = ".tmp") -> str:
    """A private name beside ``name`` for a write renamed onto it: ``.<name>.<8 hex><suffix>``."""
    return f".{name}.{uuid.uuid4().hex[:8]}{suffix}"


def unlink_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` from the folder ``dir_fd`` (the entry itself, never a link's target); missing is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def open_regular(dir_fd: int, name: str, shown: str) -> int:
    """:func:`open_read_at`, then ``fstat``: its fd. UnsafeLayout (naming ``shown``): a link, FIFO, device or folder
    now; FileNotFoundError: it is gone."""
    try:
        fd = open_read_at(dir_fd, name)
    except OSError as exc:
        if exc.errno in (*LINK_ERRNOS, errno.ENXIO):
            raise UnsafeLayout(f"{shown} is not a regular file (a link, FIFO or device): left alone",
                               hint="remove it, then rerun") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeLayout(f"{shown} is not a regular file (a FIFO, device or folder): left alone",
                           hint="remove it, then rerun")
    return fd


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove the folder ``name`` of ``parent_fd`` and everything in it without recursing (``shutil.rmtree``
    recurses once per level): each subfolder is renamed up into ``name`` under a private name. No link is followed;
    an entry swapped for a link meanwhile is unlinked, never entered.
    Raises FileNotFoundError: ``name`` is missing. NotADirectoryError / OSError(ELOOP): it is not a real folder.
    OSError: an entry cannot be removed (ENOTEMPTY when entries keep appearing)."""
    top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        pending: list[str | None] = [None]  # None: the top folder itself; else a name inside it
        while pending:
            sub = pending.pop()
            try:
                fd = top if sub is None else os.open(sub, DIR_FLAGS, dir_fd=top)
            except OSError as exc:
                if exc.errno not in LINK_ERRNOS:
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


def list_entries(path: str | os.PathLike[str]) -> list[os.DirEntry]:
    """The entries of the folder ``path``, sorted by name; [] when it cannot be listed (missing, not a folder)."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def scan_tree(top: str, *, max_depth: int = MAX_TREE_DEPTH, too_deep: list[str] | None = None,
              onerror: Callable[[OSError, str], object] | None = None,
              ) -> Iterator[tuple[str, str, list[os.DirEntry], list[os.DirEntry]]]:
    """Every folder of ``top``, top-down, with an explicit stack (Python 3.11's ``os.walk`` recurses once per
    level); links are never followed.

    Args:
        top: the folder (a ``str``: this runs per snapshot of ``ls``). max_depth: deepest level entered (``top``:
            0). too_deep: receives the relative path (``a/b``) of each folder left unentered. onerror: called with
            the OSError of a folder that cannot be listed and its relative prefix.

    Yields (path, relative prefix ``""`` or ``"a/b/"``, folder entries, other entries (``os.DirEntry``; a link is an
    "other")); remove folder entries in place to keep the walk out of them.
    """
    stack = [(top, "", 0)]
    while stack:
        path, rel, depth = stack.pop()
        try:
            with os.scandir(path) as it:
                dirs, others = [], []
                for e in it:
                    (dirs if e.is_dir(follow_symlinks=False) else others).append(e)
        except OSError as exc:
            if onerror is not None:
                onerror(exc, rel)
            continue
        yield path, rel, dirs, others
        if depth >= max_depth:
            if too_deep is not None:
                too_deep += [rel + e.name for e in dirs]
            continue
        stack += [(e.path, rel + e.name + "/", depth + 1) for e in reversed(dirs)]


def walk_tree(top: str | os.PathLike[str], *, max_depth: int = MAX_TREE_DEPTH,
              onerror: Callable[[OSError], object] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` on :func:`scan_tree` (top-down, bounded, links never followed): (folder path, sub-folder
    names, other entry names) per folder; ``dirnames`` may be pruned in place. ``onerror``: as ``os.walk``'s."""
    report = None if onerror is None else (lambda exc, _rel: onerror(exc))
    for path, _, dirs, others in scan_tree(os.fspath(top), max_depth=max_depth, onerror=report):
        names = [e.name for e in dirs]
        yield path, names, [e.name for e in others]
        keep = set(names)
        dirs[:] = [e for e in dirs if e.name in keep]
