"""Removing a folder tree of any depth through folder descriptors, without recursion (used by :mod:`.safefs`).

Standard library only, so that :mod:`hfcache.cache.safefs` can stand on it.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    top = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        pending: list[str | None] = [None]  # None: the top folder itself; else a name inside it
        while pending:
            sub = pending.pop()
            try:
                fd = top if sub is None else os.open(sub, _DIR_FLAGS, dir_fd=top)
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
