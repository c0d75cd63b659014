"""Walks of a cache folder for ``link`` and ``export``: through descriptors, iterative, bounded in depth.

A group member of a shared cache can swap any folder below the root for a symlink between two steps of a command,
and plant a folder chain deep enough to exhaust Python's recursion (``os.walk`` recurses once per level on Python
3.11). :func:`walk` opens every folder from the cache root one component at a time with ``O_NOFOLLOW |
O_DIRECTORY`` (:func:`hfcache.cache.safefs.open_dir`) and hands out that folder's descriptor, so the caller reads
and opens entries relative to it (``dir_fd=``): a folder swapped for a link mid-walk is refused
(:class:`~hfcache.cache.safefs.UnsafeLayout`), never followed. A chain deeper than the bound raises
:class:`TooDeep` (an ``UnsafeLayout``, exit 5) naming the folder.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..bounds import MAX_TREE_DEPTH
from ..cache import safefs
from ..cache.safefs import UnsafeLayout

#: Flags for a file read below the cache root: no final link followed, never blocking on a FIFO.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TooDeep(UnsafeLayout):
    """A folder chain below a cache folder deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH`: nothing was done.
    ``parts``: the components (below the walk's root) of the first folder left unentered."""

    parts: tuple[str, ...] = ()


@dataclass
class Folder:
    """One folder of a :func:`walk`.

    Attributes:
        parts (tuple[str, ...]): its components below the walk's root.
        fd (int): its descriptor, valid until the walk moves on (the walk closes it).
        entries (list[tuple[str, os.stat_result]]): (name, ``lstat``) of its entries, sorted by name; remove
            folders from it (in place) to keep the walk out of them.
    """

    parts: tuple[str, ...]
    fd: int
    entries: list[tuple[str, os.stat_result]]


def walk(root: str | os.PathLike[str], top: Sequence[str] = (), *, max_depth: int = MAX_TREE_DEPTH) -> Iterator[Folder]:
    """Every folder of ``root/top`` (``top`` first, then depth-first in name order), each opened through
    :func:`hfcache.cache.safefs.open_dir` (no link below ``root`` followed).

    Args:
        root: the cache root (it may itself be a symlink).
        top: components below ``root`` where the walk starts.
        max_depth: deepest folder level entered below ``top`` (``top`` is level 0).

    Yields:
        Folder: its parts, descriptor and entries (lstat, not followed).

    Raises:
        TooDeep: a folder more than ``max_depth`` levels below ``top``.
        UnsafeLayout: a folder was swapped for a link or a file during the walk.
        FileNotFoundError: ``top`` is missing (a folder gone later is skipped).
    """
    base = tuple(top)
    stack = [base]
    while stack:
        parts = stack.pop()
        try:
            fd = safefs.open_dir(root, parts)
        except FileNotFoundError:
            if parts == base:
                raise
            continue
        try:
            folder = Folder(parts, fd, _entries(fd))
            yield folder
            subdirs = [name for name, st in folder.entries if stat.S_ISDIR(st.st_mode)]
            if subdirs and len(parts) - len(base) >= max_depth:
                shown = "/".join((*parts, subdirs[0]))
                deep = TooDeep(f"{os.fspath(root)}/{shown}: folders nested deeper than {max_depth} levels: left "
                               "alone", hint="remove that folder chain, then rerun")
                deep.parts = (*parts, subdirs[0])
                raise deep
            stack.extend(parts + (name,) for name in reversed(subdirs))
        finally:
            os.close(fd)


def _entries(fd: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of the folder ``fd``'s entries, sorted; an entry gone meanwhile is left out."""
    out = []
    for name in sorted(os.listdir(fd)):
        try:
            out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return out


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
