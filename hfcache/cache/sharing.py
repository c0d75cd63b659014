"""Group-shared caches, like git's ``core.sharedRepository``: what hfcache creates stays writable by the group.

A cache root that is group-writable (typically ``chgrp hf ROOT && chmod 2775 ROOT``) is shared: every folder and
file hfcache creates below it (repo folders, ``blobs/``, ``snapshots/``, ``refs/``, ``.no_exist/``, ``.locks/`` and
lock files) gets the root's group and the root's group and other permission bits (group write included; for a
world-writable root, other write too), whatever the creating user's umask, and folders get the setgid bit so that
the group is inherited. Any member can then warm,
re-warm, prune and repair any repo. Without this, user A with umask 022 leaves ``0755`` folders that user B cannot
write: B fails with "Permission denied" on ``.locks/<folder>``.

Library gap: huggingface_hub creates lock files ``0o664`` (``utils/_fixes.py WeakFileLock``) but its folders and
blobs with the umask (``file_download.py _chmod_and_move`` copies a probe file's mode: the umask again), and git's
approach (``adjust_shared_perm``: add the shared bits after each creation, set setgid on folders) is what is missing.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class SharePolicy:
    """How entries created in a shared cache are made shareable.

    Attributes:
        gid (int): the cache root's group; new entries get it.
        dir_bits (int): permission bits added to new folders (e.g. ``0o2070``: setgid + group rwx).
        file_bits (int): permission bits added to new files (e.g. ``0o060``: group rw).
    """

    gid: int
    dir_bits: int
    file_bits: int


def policy_of(mode: int, gid: int) -> SharePolicy | None:
    """The policy a cache root with ``mode`` and group ``gid`` asks for: None unless it is group- or world-writable.

    A world-writable root (``0777``, ``1777``) shares with everyone: others get the same rights as the group. The
    sticky bit is not passed on (it would stop members from removing each other's entries: prune).
    """
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


def share_dir(path: Path | str, policy: SharePolicy | None) -> None:
    """Give a folder just created by this process the shared group and bits (best effort: a folder another user
    created is theirs to fix, and doctor reports it).

    The folder is opened ``O_NOFOLLOW | O_DIRECTORY`` and changed through that fd (:func:`share_dir_fd`), never by
    path: a name exchanged with a symlink after the ``mkdir`` is not followed. The folders *above* ``path`` are
    still resolved by path, so inside a cache use :func:`make_dirs` or ``safefs.open_dir(..., on_create=)``.
    """
    if policy is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        share_dir_fd(fd, policy)
    finally:
        os.close(fd)


def share_dir_fd(fd: int, policy: SharePolicy | None) -> None:
    """:func:`share_dir` for a folder this process just created, open as ``fd`` (no path, so no link followed)."""
    if policy is None:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return
        if st.st_gid != policy.gid:
            os.fchown(fd, -1, policy.gid)
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | policy.dir_bits)
    except OSError:
        pass


def share_fd(fd: int, policy: SharePolicy | None) -> None:
    """Give a file this process just created (open as ``fd``) the shared group and bits.

    Only a regular file this user owns with a single link is changed: a hardlink a member planted in its place
    would carry the mode change to another file of the system.
    """
    if policy is None:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            return
        if st.st_gid != policy.gid:
            os.fchown(fd, -1, policy.gid)
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | policy.file_bits)
    except OSError:
        pass


def share_file_at(dir_fd: int, name: str, policy: SharePolicy | None) -> None:
    """:func:`share_fd` for the entry ``name`` of the folder open as ``dir_fd`` (opened ``O_NOFOLLOW |
    O_NONBLOCK`` relative to it: no link is followed, a FIFO never blocks)."""
    if policy is None:
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        share_fd(fd, policy)
    finally:
        os.close(fd)


def share_file(path: Path | str, policy: SharePolicy | None) -> None:
    """:func:`share_fd` by path, without following a symlink at ``path`` itself. The folders above it are resolved
    by path: below a cache root use :func:`share_file_at` with the folder's descriptor."""
    if policy is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        share_fd(fd, policy)
    finally:
        os.close(fd)


def make_dirs(path: Path, root: Path, policy: SharePolicy | None) -> None:
    """``mkdir -p path`` below ``root``, sharing every folder created on the way (``root`` must exist). Pass the
    cache root as ``root``: only what is below it is walked without following links (``root`` itself may be one).

    Walks from ``root`` one component at a time with ``O_NOFOLLOW | O_DIRECTORY`` and creates each missing folder
    relative to its parent's fd, then shares it through its own fd (:func:`hfcache.cache.safefs.open_dir`): a
    component swapped for a symlink is never followed, created through, or chmod-ed.

    Raises:
        UnsafeLayout: a component is a symlink or not a directory (nothing created through it).
        ValueError: ``path`` is not below ``root``.
        OSError: a folder cannot be created (permissions, read-only filesystem).
    """
    from . import safefs  # safefs does not import this module: no cycle

    rel = Path(path).relative_to(root).parts
    os.close(safefs.open_dir(root, rel, create=True, on_create=lambda fd: share_dir_fd(fd, policy)))


def open_dirs(path: Path, root: Path, policy: SharePolicy | None) -> int:
    """:func:`make_dirs`, returning an fd of ``path`` (caller closes) to act through."""
    from . import safefs

    rel = Path(path).relative_to(root).parts
    return safefs.open_dir(root, rel, create=True, on_create=lambda fd: share_dir_fd(fd, policy))
