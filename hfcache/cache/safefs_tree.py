"""Walks and copies below a cache root through folder descriptors (the companions of :mod:`.safefs`).

A group member of a shared cache can swap any folder or file for a link between a check and a use, and plant a
folder chain deep enough to exhaust Python's recursion. :func:`iter_tree` walks without recursion and within
:data:`hfcache.bounds.MAX_TREE_DEPTH`; :func:`copy_blob_at` copies a blob between folder descriptors and re-checks
its hash while it copies.
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from collections.abc import Callable, Container, Iterator, Sequence

from ..bounds import MAX_TREE_DEPTH, TooDeep
from .safefs import UnsafeLayout, _parts, check_etag, open_dir


def iter_tree(root: str | os.PathLike[str], rel: str | Sequence[str], *, max_depth: int = MAX_TREE_DEPTH,
              skip: Container[str] = ()) -> Iterator[tuple[tuple[str, ...], str, int]]:
    """Every entry below the folder ``root/rel``, breadth first, without recursion and without following a link:
    each folder is opened from the cache root with ``O_NOFOLLOW | O_DIRECTORY`` (:func:`open_dir`).

    ``skip``: names of folders directly in ``root/rel`` that are listed but not walked into.

    Yields:
        (folder parts below ``rel``, entry name, ``st_mode`` of the entry, not followed).

    Raises:
        TooDeep: a folder chain deeper than ``max_depth`` levels below ``rel`` (a ValueError: callers report it
            as a problem of the one repo). UnsafeLayout: a folder was swapped for a link while walked.
        FileNotFoundError: ``root/rel`` is missing.
    """
    base = tuple(_parts(rel)) if rel else ()
    queue: list[tuple[str, ...]] = [()]
    while queue:
        here = queue.pop(0)
        if len(here) > max_depth:
            raise TooDeep(f"{root}/{'/'.join(base)}: a folder chain deeper than {max_depth} levels")
        try:
            fd = open_dir(root, (*base, *here))
        except FileNotFoundError:
            if not here:
                raise
            continue  # removed since it was listed
        try:
            names = os.listdir(fd)
            for name in names:
                try:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue
                yield here, name, mode
                if stat.S_ISDIR(mode) and (here or name not in skip):
                    queue.append((*here, name))
        finally:
            os.close(fd)


def blob_hasher(etag: str, size: int):
    """The hash a blob named ``etag`` is named by, fed nothing yet: sha256 for 64 hex, git's blob sha1 (header
    ``blob <size>\0`` included) for 40 hex. Returns a ``hashlib`` object."""
    if len(check_etag(etag)) == 64:
        return hashlib.sha256()
    h = hashlib.sha1()  # noqa: S324 - git object id
    h.update(b"blob %d\0" % size)
    return h


def copy_blob_at(src_fd: int, dst_dir_fd: int, etag: str, size: int,
                 on_create: Callable[[int], None] | None = None, *, name: str | None = None) -> None:
    """Copy the open file ``src_fd`` to ``etag`` in the folder open as ``dst_dir_fd``, re-checking it is the blob.

    The source must be a regular file (``fstat``; open it ``O_NOFOLLOW | O_NONBLOCK`` so a FIFO never blocks)
    of ``size`` bytes whose content hashes to ``etag`` while it is copied (:func:`blob_hasher`): a file swapped in
    after it was checked is refused, never published. The copy is written to a private name created
    ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to ``dst_dir_fd`` and renamed onto ``etag`` relative to it.

    Args:
        src_fd (int): the source (not closed here); dst_dir_fd (int): the destination folder.
        etag (str): the blob name; size (int): its size in bytes.
        on_create: called with the new file's fd before it is written (to share it, :mod:`.sharing`).
        name (str | None): the destination's name in ``dst_dir_fd`` (default ``etag``: a snapshot file made as a
            copy of its blob passes its own name).

    Raises:
        UnsafeLayout: the source is not a regular file of ``size`` bytes hashing to ``etag`` (nothing published).
        OSError: reading or writing failed (the private file is removed).
    """
    st = os.fstat(src_fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        raise UnsafeLayout(f"blobs/{etag}: the copy source is not a regular file of {size} bytes: left alone",
                           hint="remove it, then rerun")
    digest = blob_hasher(etag, size)
    tmp = f".{etag}.{uuid.uuid4().hex[:8]}.incomplete"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dst_dir_fd)
    try:
        try:
            if on_create is not None:
                on_create(out)
            done, offset = 0, 0
            while chunk := os.pread(src_fd, min(1 << 20, size + 1 - done), offset):
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
                done += len(chunk)
                offset += len(chunk)
                if done > size:
                    break
            os.fsync(out)
        finally:
            os.close(out)
        if done != size or digest.hexdigest() != etag:
            raise UnsafeLayout(f"blobs/{etag}: the copy source changed while it was copied: left alone",
                               hint="rerun; if it persists, run `hfcache verify`")
        os.replace(tmp, name or etag, src_dir_fd=dst_dir_fd, dst_dir_fd=dst_dir_fd)
    finally:
        try:
            os.unlink(tmp, dir_fd=dst_dir_fd)
        except FileNotFoundError:
            pass
