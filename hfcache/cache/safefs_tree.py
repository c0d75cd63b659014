"""Walks and copies below a cache root through folder descriptors (the companions of :mod:`.safefs`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass

from .. import bounds
from ..bounds import MAX_TREE_DEPTH
from ..names import check_etag
from .content import BlobHash
from .fsops import create_at, open_regular, temp_name, unlink_at  # noqa: F401 - open_regular: re-exported for walkers
from .safefs import UnsafeLayout, _parts, open_dir


class TooDeep(UnsafeLayout, bounds.TooDeep):
    """A folder chain deeper than :data:`hfcache.bounds.MAX_TREE_DEPTH`: nothing was done (exit 5; also a
    ``ValueError``: a problem of one repo). ``parts``: the first folder left unentered, below the walk's root."""

    parts: tuple[str, ...] = ()


@dataclass
class Folder:
    """One folder of a :func:`walk`: its ``parts`` below the walk's root, its ``fd`` (valid until the walk moves on),
    its ``entries`` (name, ``lstat``) sorted by name (remove folders in place to keep the walk out of them)."""

    parts: tuple[str, ...]
    fd: int
    entries: list[tuple[str, os.stat_result]]


def walk(root: str | os.PathLike[str], top: Sequence[str] = (), *, max_depth: int = MAX_TREE_DEPTH) -> Iterator[Folder]:
    """Every folder of ``root/top`` (``top`` first, then depth-first in name order) as a :class:`Folder`, each opened
    from the cache root by :func:`.safefs.open_dir`, at most ``max_depth`` levels below ``top`` (level 0).
    Raises TooDeep: a folder more than ``max_depth`` levels below ``top``. UnsafeLayout: a folder was swapped for a link
    or a file during the walk. FileNotFoundError: ``top`` is missing (a folder gone later is skipped)."""
    base = tuple(top)
    stack = [base]
    while stack:
        parts = stack.pop()
        try:
            fd = open_dir(root, parts)
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


def iter_tree(root: str | os.PathLike[str], rel: str | Sequence[str], *, max_depth: int = MAX_TREE_DEPTH,
              skip: Container[str] = ()) -> Iterator[tuple[tuple[str, ...], str, int]]:
    """(folder parts below ``rel``, name, ``st_mode`` not followed) of every entry below ``root/rel`` (:func:`walk`,
    and its errors), parents first; ``skip``: names of folders directly in ``root/rel`` listed but not walked into."""
    base = tuple(_parts(rel)) if rel else ()
    for folder in walk(root, base, max_depth=max_depth):
        here = folder.parts[len(base):]
        for name, st in folder.entries:
            yield here, name, st.st_mode
        if not here and skip:
            folder.entries[:] = [(n, st) for n, st in folder.entries if n not in skip]


def copy_blob_at(src_fd: int, dst_dir_fd: int, etag: str, size: int,
                 on_create: Callable[[int], None] | None = None, *, name: str | None = None) -> None:
    """Copy the open file ``src_fd`` (not closed here) to ``name`` (default ``etag``) in the folder ``dst_dir_fd``,
    hashed while copied: a file swapped in after it was checked is never published. The copy is written to a private
    name (``on_create`` gets its fd first, to share it), then renamed.
    Raises UnsafeLayout: the source is not a regular file of ``size`` bytes hashing to ``etag`` (nothing published).
    OSError: reading or writing failed (the private file is removed)."""
    st = os.fstat(src_fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        raise UnsafeLayout(f"blobs/{etag}: the copy source is not a regular file of {size} bytes: left alone",
                           hint="remove it, then rerun")
    digest = BlobHash.for_etag(check_etag(etag), size)
    tmp = temp_name(etag, ".incomplete")
    out = create_at(dst_dir_fd, tmp)
    try:
        try:
            if on_create is not None:
                on_create(out)
            done = 0
            while chunk := os.pread(src_fd, min(1 << 20, size + 1 - done), done):
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
                done += len(chunk)
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
        unlink_at(dst_dir_fd, tmp)
