"""link: make the cache at DEST use the cache at SRC (:data:`MODES`; ``.locks``, the shared Xet store, whose payloads
become repo blobs, and ``*.incomplete`` left out). Built beside DEST and renamed into place (:mod:`.destination`); SRC
is read through folder descriptors (a group member may swap its folders). The rules: docs/transfer.md."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..bounds import MAX_TREE_DEPTH
from ..cache import safefs, safefs_tree
from ..cache.fsops import create_at, open_regular
from ..cache.root import access_error, require_hub_cache, write_access_error
from ..cache.safefs import repo_layout_problems
from ..cache.scan import parse_folder_name
from ..cache.shared_store import STORE_DIR
from ..errors import CacheError, UsageError
from ..warming.run import process_umask
from .destination import open_parent, private_dir, refuse_dest_inside, replace_beside

MODES = ("symlink", "hardlink", "copy")
#: Deepest folder level walked below the root: ``<repo>/snapshots/<commit>/`` and MAX_TREE_DEPTH below it.
_LINK_DEPTH = MAX_TREE_DEPTH + 3
#: What a link never carries over at the top.
_LEFT_OUT = (".locks", STORE_DIR)


@dataclass(frozen=True)
class LinkReport:
    """What :func:`link_cache` made: ``files`` linked or copied, ``bytes_added`` on DEST's filesystem;
    ``unchanged`` when DEST already was that link (nothing was done, ``files`` and ``bytes_added`` are 0)."""

    src: str
    dest: str
    mode: str
    files: int
    bytes_added: int
    unchanged: bool = False


def link_cache(src: Path, dest: Path, mode: str = "symlink") -> LinkReport:
    """Make ``dest`` a cache that uses ``src``. Raises UsageError: bad mode, ``src`` no directory, ``dest`` in
    ``src`` or occupied, a link in ``src`` out of its repo's ``blobs/``; CacheError: ``src`` no readable hub cache,
    hardlinks across filesystems, ``dest`` not writable; UnsafeLayout: a swapped or planted link, folders too deep."""
    if mode not in MODES:
        raise UsageError(f"invalid mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    src = _checked_src(src)
    if not dest.is_symlink() and os.path.realpath(dest) == os.path.realpath(src):  # (a symlink DEST: see below)
        raise UsageError(f"{dest} is {src} itself", hint="give a DEST other than SRC")
    refuse_dest_inside(src, dest, "link", follow=False)  # a copy into itself; a link loop inside the cache
    try:
        occupied = dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir())))
    except PermissionError:
        raise write_access_error(dest) from None
    if mode != "symlink":
        _refuse_unsafe(src)  # before reading anything of SRC to compare
    if occupied:
        if already_linked(src, dest, mode):
            return LinkReport(src=str(src), dest=str(dest), mode=mode, files=0, bytes_added=0, unchanged=True)
        raise UsageError(f"{dest} exists, is not an empty directory and is not a {mode} of {src}",
                         hint="link into a new or empty path (DEST is left as it is)")
    files, added = _make_link(src, dest, mode)
    return LinkReport(src=str(src), dest=str(dest), mode=mode, files=files, bytes_added=added)


def _checked_src(src: Path) -> Path:
    """``src`` made absolute, a hub cache this user can read (UsageError, CacheError naming what blocks)."""
    src = src.absolute()
    try:
        is_dir = src.is_dir()
    except PermissionError:  # Python 3.11's is_dir raises: name the folder that blocks, as every command does
        raise access_error(src) from None
    if not is_dir:
        raise UsageError(f"{src} is not a cache directory", hint="give the folder of an existing cache as SRC")
    if not os.access(src, os.R_OK | os.X_OK):
        raise access_error(src)
    require_hub_cache(src)
    return src


def _make_link(src: Path, dest: Path, mode: str) -> tuple[int, int]:
    """(files, bytes added) of the link built beside ``dest`` and renamed into place."""
    try:
        pfd = open_parent(dest)  # DEST is the user's, outside the cache (refuse_dest_inside)
    except PermissionError:
        raise write_access_error(dest) from None

    def make(staging: str) -> tuple[int, int]:
        if mode == "symlink":
            os.symlink(src, staging, dir_fd=pfd)
            return 0, 0
        return private_dir(pfd, staging, lambda sfd: _copy_tree(src, sfd, mode))

    try:
        return replace_beside(pfd, dest, make)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise CacheError(f"cannot hardlink {src} into {dest}: they are on different filesystems",
                             hint="use --mode copy, or a DEST on the same filesystem") from None
        raise CacheError(f"link {src} -> {dest}: {exc.strerror or exc}") from exc
    finally:
        os.close(pfd)


def already_linked(src: Path, dest: Path, mode: str) -> bool:
    """Whether ``dest`` already is what linking ``src`` in ``mode`` makes (the same tree, link targets, and inodes or
    bytes). Raises UnsafeLayout: a folder of ``src`` swapped for a link, or nested too deep."""
    if mode == "symlink":
        return dest.is_symlink() and os.path.realpath(dest) == os.path.realpath(src)
    if dest.is_symlink() or not dest.is_dir():
        return False
    ours, theirs = _tree(src), _tree(dest)
    if ours.keys() != theirs.keys():
        return False
    for rel, (st, link) in ours.items():
        other, other_link = theirs[rel]
        if stat.S_IFMT(st.st_mode) != stat.S_IFMT(other.st_mode) or link != other_link:
            return False
        if stat.S_ISREG(st.st_mode):
            if mode == "hardlink" and (st.st_dev, st.st_ino) != (other.st_dev, other.st_ino):
                return False
            if mode == "copy" and (st.st_size != other.st_size or not _same_bytes(src, dest, rel)):
                return False
    return True


def _tree(root: Path) -> dict[tuple[str, ...], tuple[os.stat_result, str | None]]:
    """Every entry under ``root`` by relative parts: (lstat or a store payload's fstat, a symlink's target)."""
    entries = {}
    for folder in _walk(root):
        for name, st in folder.entries:
            key = (*folder.parts, name)
            link = os.readlink(name, dir_fd=folder.fd) if stat.S_ISLNK(st.st_mode) else None
            if link is not None and (payload := _store_payload(root, key)) is not None:
                with payload:
                    entries[key] = (os.fstat(payload.fileno()), None)
            else:
                entries[key] = (st, link)
    return entries


def _walk(root: Path):
    """:func:`safefs_tree.walk` of ``root`` without what a link leaves out; its depth error names the repo."""
    try:
        for folder in safefs_tree.walk(root, max_depth=_LINK_DEPTH):
            folder.entries[:] = [(n, st) for n, st in folder.entries
                                 if not (not folder.parts and n in _LEFT_OUT)
                                 and not (n.endswith(".incomplete") and not stat.S_ISDIR(st.st_mode))]
            yield folder
    except safefs_tree.TooDeep as exc:
        repo = exc.parts[0] if exc.parts else "?"
        raise safefs_tree.TooDeep(f"unsafe cache layout in {root}: {repo}: folders nested deeper than "
                                  f"{MAX_TREE_DEPTH} levels ({'/'.join(exc.parts[:3])}/...): nothing was linked",
                                  hint="remove that folder chain (or the repo), then rerun") from None


def _same_bytes(src: Path, dest: Path, rel: tuple[str, ...]) -> bool:
    """Whether the file ``rel`` holds the same bytes in ``src`` (a store payload followed) and in ``dest``."""
    ours = _store_payload(src, rel) or os.fdopen(_open_regular(src, rel), "rb")
    with ours, os.fdopen(_open_regular(dest, rel), "rb") as theirs:
        while True:
            a, b = ours.read(1024 * 1024), theirs.read(1024 * 1024)
            if a != b:
                return False
            if not a:
                return True


def _open_regular(root: Path, rel: Sequence[str]) -> int:
    with safefs.dir_fd(root, rel[:-1]) as fd:
        return open_regular(fd, rel[-1], os.path.join(root, *rel))


def _store_payload(root: Path, rel: Sequence[str]):
    """The open payload when ``rel`` is a blob linked into the shared Xet store, else None (CacheError: not a file)."""
    parts = list(rel)
    if len(parts) != 3 or parts[1] != "blobs" or safefs.store_link_of(root, parts[0], parts[2]) is None:
        return None
    fd = safefs.open_blob(root, parts[0], parts[2])
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheError(f"{root}/{'/'.join(parts)}: the store payload is not a regular file: nothing was linked",
                         hint="remove it, then rerun")
    return os.fdopen(fd, "rb")


def _carry(fd: int, sfd: int, target: str, mode: str) -> int:
    """Write the open file ``fd`` at ``target`` in ``sfd``: a hardlink of its inode (no name looked up) or a copy."""
    if mode == "hardlink":  # a dst_dir_fd makes os.link call linkat with AT_SYMLINK_FOLLOW (link() would not follow)
        os.link(f"/proc/self/fd/{fd}", target, dst_dir_fd=sfd, follow_symlinks=True)
        return 0
    with os.fdopen(create_at(sfd, target), "wb") as fout, os.fdopen(os.dup(fd), "rb") as fin:
        shutil.copyfileobj(fin, fout, 1024 * 1024)
        return fout.tell()


def _refuse_unsafe(src: Path) -> None:
    """Raise CacheError when a repo folder of ``src`` has a planted link (a copy would drop it silently)."""
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if parse_folder_name(entry.name) is None:
            continue
        if problems := repo_layout_problems(str(src), entry.name):
            raise CacheError(f"unsafe cache layout in {src}: {entry.name}: {'; '.join(problems)}",
                             hint="remove the symlink or file, then rerun")


def _copy_tree(src: Path, sfd: int, mode: str) -> tuple[int, int]:
    """Recreate ``src`` in ``sfd`` (hardlinks or copies; only snapshot links into their repo's ``blobs/``), then give
    ``sfd`` ``mkdir``'s mode; (files, bytes added). Raises UsageError (another link, a device), UnsafeLayout."""
    files = added = 0
    for folder in _walk(src):
        for name, st in folder.entries:
            rel = (*folder.parts, name)
            target, shown = "/".join(rel), os.path.join(src, *rel)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o777, dir_fd=sfd)
            elif stat.S_ISLNK(st.st_mode):
                if (payload := _store_payload(src, rel)) is None:
                    os.symlink(_checked_link(src, rel, os.readlink(name, dir_fd=folder.fd)), target, dir_fd=sfd)
                    continue
                with payload:
                    added += _carry(payload.fileno(), sfd, target, mode)
                files += 1
            elif not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{shown} is not a regular file, link or folder")
            else:
                fd = open_regular(folder.fd, name, shown)
                try:
                    added += _carry(fd, sfd, target, mode)
                finally:
                    os.close(fd)
                files += 1
    os.fchmod(sfd, (0o777 & ~(process_umask() or 0)) | (os.fstat(sfd).st_mode & stat.S_ISGID))
    return files, added


def _checked_link(src: Path, rel: Sequence[str], target: str) -> str:
    """``target`` (of the symlink ``src/rel``) if it is a snapshot entry pointing into ``<repo>/blobs/``."""
    resolved = os.path.dirname(os.path.normpath(os.path.join(*rel[:-1], target)))
    if os.path.isabs(target) or len(rel) < 4 or rel[1] != "snapshots" or resolved != f"{rel[0]}/blobs":
        raise UsageError(f"{os.path.join(src, *rel)} links to {target!r}, outside its repo's blobs/; nothing was "
                         "linked", hint="run `hfcache verify` on the source cache")
    return target
