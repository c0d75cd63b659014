"""import's source: the entries of an exported cache (:class:`Member` and a stream of a file's bytes), read from a
tar stream (:func:`tar_members`) or a directory (:func:`members_of_dir`), never trusted: checked by :mod:`.import_plan`.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from ..cache.fsops import UnsafeLayout, open_dir_at, open_regular
from ..errors import UsageError

#: One PAX extended header or GNU long name (tarfile reads it whole into memory).
MAX_HEADER_BYTES = 1024 * 1024
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)
#: Deepest folder chain of an entry, in a tar or a source directory.
MAX_DEPTH = 256
_T = TypeVar("_T")


@dataclass
class Member:
    name: str
    kind: str  # file | dir | symlink | hardlink | special | sparse
    size: int = 0
    linkname: str = ""


def shown_name(name: str) -> str:
    """A name shortened for a one-line message."""
    return name if len(name) <= 100 else f"{name[:60]}...{name[-30:]}"


class BoundedTarInfo(tarfile.TarInfo):
    """Library gaps (tarfile, Python 3.8-3.13): a PAX header or GNU long name is read whole whatever size it declares:
    refused past :data:`MAX_HEADER_BYTES`. A GNU.sparse.* map is parsed before ``issparse()`` (a 12 MB map took 72 s
    and 348 MB): a cache has no sparse file, so each format is refused before its map is read."""

    def _proc_member(self, tar):
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise UsageError(f"refused a tar header of {self.size} bytes (more than {MAX_HEADER_BYTES})")
        return super()._proc_member(tar)

    def _refuse_sparse(self, next, *args) -> None:
        headers = args[0] if args and isinstance(args[0], dict) else {}
        name = headers.get("GNU.sparse.name") or headers.get("path") or next.name
        raise UsageError(f"refused entry {shown_name(str(name))!r}: a sparse file (a cache has none)")

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


def _header(read: Callable[[], _T]) -> _T:
    """``read()``, with tarfile's ValueError/OverflowError on a malformed number as ReadError (library gap)."""
    try:
        return read()
    except (ValueError, OverflowError) as exc:
        raise tarfile.ReadError(f"malformed header: {exc}") from None


def tar_members(stream: BinaryIO, mode: str = "r|*") -> Iterator[tuple[Member, BinaryIO | None]]:
    """The entries of a tar read as a stream (``mode`` ``r|*``: compressed or not; ``r|``: plain); a file's stream
    is valid until the next entry. Raises tarfile.TarError (not a tar, truncated, a malformed header), UsageError
    (a header past :data:`MAX_HEADER_BYTES`, a sparse member)."""
    tar = _header(lambda: tarfile.open(fileobj=stream, mode=mode, tarinfo=BoundedTarInfo))  # noqa: SIM115 - closed below
    with tar:
        while (info := _header(tar.next)) is not None:
            if info.isdir():
                yield Member(info.name, "dir"), None
            elif info.issym():
                yield Member(info.name, "symlink", linkname=info.linkname), None
            elif info.islnk():
                yield Member(info.name, "hardlink", linkname=info.linkname), None
            elif info.issparse():  # its declared size is mostly holes: 10 KiB of tar can expand to any size
                yield Member(info.name, "sparse", size=info.size), None
            elif info.isfile():
                yield Member(info.name, "file", size=info.size), tar.extractfile(info)
            else:
                yield Member(info.name, "special"), None


def members_of_dir(root: Path) -> Iterator[tuple[Member, BinaryIO | None]]:
    """The entries of an exported directory, depth first in name order, each opened relative to its folder's fd
    (no link followed, no FIFO blocking). Raises UsageError: deeper than :data:`MAX_DEPTH`, or an entry changed
    (became a link) while it was read."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack: list[tuple[int, str, Iterator[str]]] = [(top, "", iter(()))]
    try:
        stack[-1] = (top, "", iter(sorted(os.listdir(top))))
        while stack:
            fd, base, names = stack[-1]
            if (name := next(names, None)) is None:
                os.close(stack.pop()[0])
                continue
            rel = f"{base}/{name}" if base else name
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                yield Member(rel, "dir"), None
                if len(stack) >= MAX_DEPTH:
                    raise UsageError(f"refused entry {shown_name(rel)!r}: more than {MAX_DEPTH} levels; "
                                     "nothing was imported")
                try:
                    sub = open_dir_at(fd, name)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _changed(rel) from None
                    raise
                stack.append((sub, rel, iter(())))  # closed by the finally below even if listing fails
                stack[-1] = (sub, rel, iter(sorted(os.listdir(sub))))
            elif stat.S_ISLNK(st.st_mode):
                yield Member(rel, "symlink", linkname=os.readlink(name, dir_fd=fd)), None
            elif stat.S_ISREG(st.st_mode):
                try:  # a file swapped for a link (to /dev/zero, to a secret) or a FIFO after the stat is not read
                    f = os.fdopen(open_regular(fd, name, rel), "rb")
                except UnsafeLayout:
                    raise _changed(rel) from None
                with f:
                    yield Member(rel, "file", size=os.fstat(f.fileno()).st_size), f
            else:
                yield Member(rel, "special"), None
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _changed(rel: str) -> UsageError:
    return UsageError(f"refused entry {shown_name(rel)!r}: changed while it was read")
