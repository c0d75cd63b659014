"""Group-shared caches (docs/shared-caches.md), like git's ``core.sharedRepository``: below a group- or world-writable
root, what hfcache creates gets the root's group and its group and other bits whatever the umask, folders the setgid
bit. Library gap: huggingface_hub creates lock files ``0o664`` (``utils/_fixes.py WeakFileLock``) but folders and
blobs with the umask (``file_download.py _chmod_and_move``). Everything here acts through descriptors.
"""

from __future__ import annotations

import os
import stat
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import safefs
from .fsops import open_read_at


@dataclass(frozen=True)
class SharePolicy:
    """How entries created in a shared cache are made shareable: they get the root's group ``gid``, folders get
    ``dir_bits`` added (e.g. ``0o2070``: setgid + group rwx), files ``file_bits`` (e.g. ``0o060``: group rw)."""

    gid: int
    dir_bits: int
    file_bits: int


def policy_of(mode: int, gid: int) -> SharePolicy | None:
    """The policy a cache root with ``mode`` and group ``gid`` asks for: None unless it is group- or world-writable.
    A world-writable root shares with everyone; its sticky bit is not passed on (members could not prune)."""
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    dir_bits = stat.S_ISGID | (mode & (stat.S_IRWXG | stat.S_IRWXO))
    dir_bits |= stat.S_IRGRP | stat.S_IXGRP  # a member who can write must also list and enter
    file_bits = (dir_bits & (stat.S_IRWXG | stat.S_IRWXO)) & 0o666
    return SharePolicy(gid=gid, dir_bits=dir_bits, file_bits=file_bits)


@lru_cache(maxsize=64)
def _policy_for(root: str) -> SharePolicy | None:
    try:
        st = os.stat(root)
    except OSError:
        return None
    return policy_of(st.st_mode, st.st_gid)


def cache_policy(cache_dir: Path) -> SharePolicy | None:
    """The sharing policy of the cache root ``cache_dir`` (read once per process and root), or None."""
    return _policy_for(str(cache_dir))


def share_fd(fd: int, policy: SharePolicy | None) -> None:
    """Give a folder or file this process just created, open as ``fd``, the shared group and bits; best effort, and
    only to a folder, or a regular file with one link (a planted hardlink would carry the mode), this user owns."""
    if policy is None:
        return
    with suppress(OSError):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            bits = policy.dir_bits
        elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            bits = policy.file_bits
        else:
            return
        if st.st_uid != os.geteuid():
            return
        if st.st_gid != policy.gid:
            os.fchown(fd, -1, policy.gid)
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | bits)


def share_file_at(dir_fd: int, name: str, policy: SharePolicy | None) -> None:
    """:func:`share_fd` for the entry ``name`` of the folder ``dir_fd`` (:func:`.fsops.open_read_at`)."""
    if policy is None:
        return
    try:
        fd = open_read_at(dir_fd, name)
    except OSError:
        return
    try:
        share_fd(fd, policy)
    finally:
        os.close(fd)


def open_dirs(path: Path, root: Path, policy: SharePolicy | None) -> int:
    """``mkdir -p path`` below the existing cache root ``root`` (:func:`.safefs.open_dir`), sharing every folder
    created on the way; an fd of ``path`` (caller closes).
    Raises UnsafeLayout: a component is a symlink or not a directory (nothing created through it). ValueError: ``path``
    is not below ``root``. OSError: a folder cannot be created."""
    rel = Path(path).relative_to(root).parts
    return safefs.open_dir(root, rel, create=True, on_create=lambda fd: share_fd(fd, policy))


def make_dirs(path: Path, root: Path, policy: SharePolicy | None) -> None:
    """:func:`open_dirs` without keeping the fd."""
    os.close(open_dirs(path, root, policy))
