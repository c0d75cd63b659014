"""link: make the cache at DEST use the cache at SRC (a runtime user's default path, a volume mount).

Three modes:

- ``symlink``: DEST becomes a directory symlink to SRC (no bytes; SRC must stay where it is).
- ``hardlink``: DEST gets the same tree with every regular file hardlinked (same filesystem: no extra bytes;
  across filesystems a clear error, nothing left half-made) and the snapshot symlinks recreated as they are
  (relative, so they resolve inside DEST).
- ``copy``: the same tree with copies.

``.locks`` and ``*.incomplete`` are never carried over. The tree is built next to DEST and renamed into place; DEST
must be new or an empty folder, so nothing it holds is ever replaced. Linking again onto a DEST that already is what
the link would make (the same symlink; the same tree of hardlinks, or of copies with the same bytes) changes nothing
and succeeds, so an init container can run it on every start. A symlink that leaves its repo's ``blobs/``, a
symlinked folder or a device in SRC refuses the whole link (DEST would otherwise point outside itself).
"""

from __future__ import annotations

import errno
import filecmp
import os
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..cache.root import access_error, write_access_error
from ..errors import CacheError, UsageError
from ..cache import safefs
from ..cache.safefs import repo_layout_problems
from ..cache.shared_store import STORE_DIR
from ..cache.scan import parse_folder_name

MODES = ("symlink", "hardlink", "copy")


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
    """Make ``dest`` a cache that uses ``src``.

    Raises:
        UsageError: bad mode, ``src`` is not a directory, ``dest`` exists, is not an empty directory and is not
            already this link, ``src`` holds a link out of its repo's ``blobs/`` or a symlinked folder (hardlink and
            copy modes).
        CacheError: hardlinks across filesystems (``EXDEV``), or ``dest`` cannot be written.
    """
    if mode not in MODES:
        raise UsageError(f"invalid mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    src = _checked_src(src)
    if not dest.is_symlink() and os.path.realpath(dest) == os.path.realpath(src):  # (a symlink DEST: see below)
        raise UsageError(f"{dest} is {src} itself", hint="give a DEST other than SRC")
    try:
        occupied = dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir())))
    except PermissionError:
        raise write_access_error(dest) from None
    if occupied:
        if mode != "symlink":
            _refuse_unsafe(src)  # before reading anything of SRC to compare
        if already_linked(src, dest, mode):
            return LinkReport(src=str(src), dest=str(dest), mode=mode, files=0, bytes_added=0, unchanged=True)
        raise UsageError(f"{dest} exists, is not an empty directory and is not a {mode} of {src}",
                         hint="link into a new or empty path (DEST is left as it is)")
    if mode != "symlink":
        _refuse_unsafe(src)
    files, added = _make_link(src, dest, mode)
    return LinkReport(src=str(src), dest=str(dest), mode=mode, files=files, bytes_added=added)


def _checked_src(src: Path) -> Path:
    """``src`` made absolute, once it is a directory this user can read.

    Raises:
        UsageError: not a directory. CacheError: it cannot be read (the error names the folder that blocks).
    """
    src = src.absolute()
    try:
        is_dir = src.is_dir()
    except PermissionError:  # Python 3.11's is_dir raises: name the folder that blocks, as every command does
        raise access_error(src) from None
    if not is_dir:
        raise UsageError(f"{src} is not a cache directory", hint="give the folder of an existing cache as SRC")
    if not os.access(src, os.R_OK | os.X_OK):
        raise access_error(src)
    return src


def _make_link(src: Path, dest: Path, mode: str) -> tuple[int, int]:
    """Build the link next to ``dest`` and rename it into place (``dest`` is new or an empty folder); returns the
    files linked or copied and the bytes added. Nothing half-made is left behind on failure."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        raise write_access_error(dest) from None
    staging = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    files = added = 0
    try:
        if mode == "symlink":
            os.symlink(src, staging)
        else:
            files, added = _copy_tree(src, staging, mode)
        if dest.exists():
            dest.rmdir()
        os.replace(staging, dest)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise CacheError(f"cannot hardlink {src} into {dest}: they are on different filesystems",
                             hint="use --mode copy, or a DEST on the same filesystem") from None
        raise CacheError(f"link {src} -> {dest}: {exc.strerror or exc}") from exc
    finally:
        if os.path.lexists(staging):
            if os.path.islink(staging):
                os.unlink(staging)
            else:
                shutil.rmtree(staging, ignore_errors=True)
    return files, added


def already_linked(src: Path, dest: Path, mode: str) -> bool:
    """Whether ``dest`` already is what linking ``src`` in ``mode`` makes: a symlink resolving to ``src``; or the
    same tree (``.locks`` and ``*.incomplete`` left out on both sides) whose symlinks have the same targets and whose
    files are hardlinks of ``src``'s (``hardlink``) or hold the same bytes (``copy``: every file is read)."""
    if mode == "symlink":
        return dest.is_symlink() and os.path.realpath(dest) == os.path.realpath(src)
    if dest.is_symlink() or not dest.is_dir():
        return False
    ours, theirs = _tree(src), _tree(dest)
    if ours.keys() != theirs.keys():
        return False
    for rel, st in ours.items():
        other = theirs[rel]
        if stat.S_IFMT(st.st_mode) != stat.S_IFMT(other.st_mode):
            return False
        s, d = os.path.join(src, rel), os.path.join(dest, rel)
        if stat.S_ISLNK(st.st_mode) and os.readlink(s) != os.readlink(d):
            return False
        if stat.S_ISREG(st.st_mode):
            if mode == "hardlink" and (st.st_dev, st.st_ino) != (other.st_dev, other.st_ino):
                return False
            if mode == "copy" and (st.st_size != other.st_size or not filecmp.cmp(s, d, shallow=False)):
                return False
    return True


def _tree(root: Path) -> dict[str, os.stat_result]:
    """Every entry under ``root`` by relative path (lstat), leaving out what a link never carries over."""
    entries = {}
    for dirpath, dirs, names in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirs[:] = [d for d in dirs if not (rel == "." and d in _LEFT_OUT)]
        for name in dirs + [n for n in names if not n.endswith(".incomplete")]:
            path = os.path.join(dirpath, name)
            key = os.path.relpath(path, root)
            payload = _store_payload(root, key)
            if payload is None:
                entries[key] = os.lstat(path)
            else:
                with payload:
                    entries[key] = os.fstat(payload.fileno())
    return entries


#: What a link never carries over at the top: locks, and the shared Xet store (its payloads become the repo blobs).
_LEFT_OUT = (".locks", STORE_DIR)


def _store_payload(root: Path, rel: str):
    """The open payload (a binary file) when ``rel`` is ``<repo>/blobs/<etag>`` and is a link of huggingface_hub
    2.4's exact shape into its marked shared store (``utils/_shared_blobs.py``; ``safefs.open_blob``, nothing else
    followed); else None.

    Raises:
        UnsafeLayout (CacheError): the store or payload is a link, FIFO or folder.
    """
    parts = rel.split(os.sep)
    if len(parts) != 3 or parts[1] != "blobs" or safefs.store_link_of(root, parts[0], parts[2]) is None:
        return None
    fd = safefs.open_blob(root, parts[0], parts[2])
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheError(f"{root}/{rel}: the store payload is not a regular file: nothing was linked",
                         hint="remove it, then rerun")
    return os.fdopen(fd, "rb")


def _carry_payload(payload, dest: Path, mode: str) -> int:
    """Write the store ``payload`` (an open file) at ``dest`` as a regular blob: a hardlink of that very inode
    (``linkat`` of ``/proc/self/fd``, linkat(2)) or a copy; returns the bytes added."""
    if mode == "hardlink":  # a dst_dir_fd makes os.link call linkat with AT_SYMLINK_FOLLOW (link() would not follow)
        parent = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.link(f"/proc/self/fd/{payload.fileno()}", dest.name, dst_dir_fd=parent, follow_symlinks=True)
        finally:
            os.close(parent)
        return 0
    with open(dest, "xb") as fout:
        shutil.copyfileobj(payload, fout, 1024 * 1024)
    return os.path.getsize(dest)


def _refuse_unsafe(src: Path) -> None:
    """CacheError when a repo folder of ``src`` has a planted link (safefs.repo_layout_problems): a copy would
    silently drop it, and nothing outside the cache is read."""
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if parse_folder_name(entry.name) is None:
            continue
        problems = repo_layout_problems(str(src), entry.name)
        if problems:
            raise CacheError(f"unsafe cache layout in {src}: {entry.name}: {'; '.join(problems)}",
                             hint="remove the symlink or file, then rerun")


def _copy_tree(src: Path, staging: Path, mode: str) -> tuple[int, int]:
    """Recreate ``src`` under ``staging`` with hardlinks or copies; return (files, bytes copied).

    The same rule as import: a symlink is carried over only when it is a snapshot entry pointing into its own repo's
    ``blobs/`` (so DEST never links out of itself); any other symlink, a symlinked folder or a device is refused.

    Raises:
        UsageError: naming the entry.
    """
    files = added = 0
    for dirpath, dirs, names in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        dirs[:] = sorted(d for d in dirs if not (rel == "." and d in _LEFT_OUT))
        target_dir = staging / rel if rel != "." else staging
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in sorted(d for d in dirs if os.path.islink(os.path.join(dirpath, d))):
            raise UsageError(f"{os.path.join(dirpath, name)} is a symlink to a folder; a cache has none",
                             hint="run `hfcache verify` on the source cache")
        for name in sorted(names):
            if name.endswith(".incomplete"):
                continue
            s, d = os.path.join(dirpath, name), target_dir / name
            st = os.lstat(s)
            payload = _store_payload(src, os.path.relpath(s, src)) if stat.S_ISLNK(st.st_mode) else None
            if payload is not None:
                with payload:
                    added += _carry_payload(payload, d, mode)
                files += 1
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(_checked_link(src, s), d)
            elif not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{s} is not a regular file, link or folder")
            elif mode == "hardlink":
                os.link(s, d, follow_symlinks=False)
                files += 1
            else:
                fd = os.open(s, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                with os.fdopen(fd, "rb") as fin, open(d, "xb") as fout:
                    shutil.copyfileobj(fin, fout, 1024 * 1024)
                added += os.path.getsize(d)
                files += 1
    return files, added


def _checked_link(src: Path, path: str) -> str:
    """The target of the symlink ``path`` if it is ``<repo>/snapshots/...`` pointing into ``<repo>/blobs/``."""
    target = os.readlink(path)
    rel = os.path.relpath(path, src).split(os.sep)
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    blobs = os.path.normpath(os.path.join(src, rel[0], "blobs"))
    if os.path.isabs(target) or len(rel) < 4 or rel[1] != "snapshots" or os.path.dirname(resolved) != blobs:
        raise UsageError(f"{path} links to {target!r}, outside its repo's blobs/; nothing was linked",
                         hint="run `hfcache verify` on the source cache")
    return target
