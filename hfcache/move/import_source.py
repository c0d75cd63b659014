"""import's source: the entries of an exported cache, read from a tar stream or a directory, never trusted.

:func:`tar_members` reads a tar as a stream (compressed or not) with :class:`BoundedTarInfo`, which refuses a tar
header past :data:`MAX_HEADER_BYTES` and any sparse member before tarfile reads it whole into memory;
:func:`_members_of_dir` walks an exported directory without following a link swapped in while it reads. Both yield
:class:`Member` entries with a stream of the file's bytes; what the entries may be is checked by the reader
(:mod:`hfcache.move.import_plan`).
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import UsageError

#: One PAX extended header or GNU long name (tarfile reads it whole into memory).
MAX_HEADER_BYTES = 1024 * 1024
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)


@dataclass
class Member:
    name: str
    kind: str  # file | dir | symlink | hardlink | special | sparse
    size: int = 0
    linkname: str = ""


class BoundedTarInfo(tarfile.TarInfo):
    """Library gap: tarfile reads a PAX extended header or a GNU long name whole into memory, whatever size it
    declares (``TarInfo._proc_pax``/``_proc_gnulong``, Python 3.8-3.13), so a small compressed tar could make it
    allocate gigabytes. Such a header is refused before it is read."""

    def _proc_member(self, tar):
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise UsageError(f"refused a tar header of {self.size} bytes (more than {MAX_HEADER_BYTES})")
        return super()._proc_member(tar)

    # Library gap: a PAX header with GNU.sparse.* keys makes tarfile parse a sparse map inside ``_proc_pax``, before
    # the member is returned (so before ``issparse()`` can refuse it): format 1.0 (``_proc_gnusparse_10``) reads its
    # map from the member's data, line by line and whole, whatever its length (a 12 MB map: 72 s and 348 MB), and
    # malformed maps raise ValueError. A cache has no sparse file: each format is refused before its map is parsed.
    # The three hooks keep their names in Python 3.8-3.13; their other arguments changed (3.12: raw headers), so
    # they are taken as they come.
    def _refuse_sparse(self, next, args: tuple) -> None:
        headers = args[0] if args and isinstance(args[0], dict) else {}
        name = headers.get("GNU.sparse.name") or headers.get("path") or next.name
        raise UsageError(f"refused entry {_shown(str(name))!r}: a sparse file (a cache has none)")

    def _proc_gnusparse_00(self, next, *args):
        self._refuse_sparse(next, args)

    def _proc_gnusparse_01(self, next, *args):
        self._refuse_sparse(next, args)

    def _proc_gnusparse_10(self, next, *args):
        self._refuse_sparse(next, args)


def _next(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
    """``tar.next()``, with tarfile's ValueError/OverflowError on malformed numbers (a sparse map, a base-256 field)
    turned into the ReadError that callers already answer as "not a readable tar" (library gap: tarfile lets them
    escape as they are)."""
    try:
        return tar.next()
    except (ValueError, OverflowError) as exc:
        raise tarfile.ReadError(f"malformed header: {exc}") from None


def tar_members(stream: BinaryIO, mode: str = "r|*") -> Iterator[tuple[Member, BinaryIO | None]]:
    """The entries of a tar read as a stream (``mode`` ``r|*``: compressed or not; ``r|``: plain), with the file
    content as a stream of the tar (valid until the next entry).

    Raises:
        tarfile.TarError: not a tar, truncated, or a malformed header (ValueError/OverflowError included).
        UsageError: a header past :data:`MAX_HEADER_BYTES`, or a sparse member (refused before its map is read).
    """
    try:  # opening reads the first header
        tar = tarfile.open(fileobj=stream, mode=mode, tarinfo=BoundedTarInfo)
    except (ValueError, OverflowError) as exc:
        raise tarfile.ReadError(f"malformed header: {exc}") from None
    with tar:
        while (info := _next(tar)) is not None:
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


#: Deepest folder chain read from a source directory (the tar names' bound, import_plan.MAX_DEPTH).
MAX_DIR_DEPTH = 256

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _members_of_dir(root: Path) -> Iterator[tuple[Member, BinaryIO | None]]:
    """The entries of an exported directory, depth first in name order, read without recursion: each folder is
    opened ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's fd (a folder swapped for a link while it is read
    is refused, never followed), each file ``O_NOFOLLOW | O_NONBLOCK`` relative to its folder's fd.

    Raises:
        UsageError: a chain deeper than :data:`MAX_DIR_DEPTH`, or an entry that changed while it was read.
    """
    stack: list[tuple[int, str, Iterator[str]]] = []
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack.append((top, "", iter(sorted(os.listdir(top)))))
    try:
        while stack:
            fd, base, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            rel = f"{base}/{name}" if base else name
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                yield Member(rel, "dir"), None
                if len(stack) >= MAX_DIR_DEPTH:
                    raise UsageError(f"refused entry {_shown(rel)!r}: more than {MAX_DIR_DEPTH} levels; nothing "
                                     "was imported")
                sub = _open_sub(fd, name, rel)
                stack.append((sub, rel, iter(())))  # closed by the finally below even if listing fails
                stack[-1] = (sub, rel, iter(sorted(os.listdir(sub))))
            elif stat.S_ISLNK(st.st_mode):
                yield Member(rel, "symlink", linkname=os.readlink(name, dir_fd=fd)), None
            elif stat.S_ISREG(st.st_mode):
                member, f = _open_member(fd, name, rel)
                with f:
                    yield member, f
            else:
                yield Member(rel, "special"), None
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_sub(fd: int, name: str, rel: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UsageError(f"refused entry {_shown(rel)!r}: changed while it was read") from None
        raise


def _open_member(fd: int, name: str, rel: str) -> tuple[Member, BinaryIO]:
    # O_NOFOLLOW: a file swapped for a symlink (to /dev/zero, to a secret) after the stat is not read;
    # O_NONBLOCK: nor does one swapped for a fifo block the open
    try:
        ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"refused entry {_shown(rel)!r}: changed while it was read") from None
        raise
    st = os.fstat(ffd)
    if not stat.S_ISREG(st.st_mode):
        os.close(ffd)
        raise UsageError(f"refused entry {_shown(rel)!r}: changed while it was read")
    return Member(rel, "file", size=st.st_size), os.fdopen(ffd, "rb")


def _shown(name: str) -> str:
    """A name shortened for a one-line message."""
    return name if len(name) <= 100 else f"{name[:60]}...{name[-30:]}"

