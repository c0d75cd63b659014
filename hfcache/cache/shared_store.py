"""huggingface_hub 2.4's shared Xet blob store, read without following any link hfcache did not judge.

Since huggingface_hub 2.4.0 (``huggingface_hub/utils/_shared_blobs.py``; PR #4498, prune sweep PR #4797), a file
downloaded through Xet is kept once per cache::

    <cache>/blobs/.huggingface-shared-blobs      marker: the text "1\\n" (layout version 1), a regular file
    <cache>/blobs/<2 hex>/<xet_hash>             the payload: a regular read-only file named by its 64-hex Xet hash
    <cache>/blobs/<2 hex>/<xet_hash>.refs        manifest: the repo blob links that use it, one cache-relative
                                                 path per line (a hint: validated before use)
    <cache>/blobs/<2 hex>/<xet_hash>.lock        the per-hash lock (publication, new references, sweeps)
    <cache>/<repo folder>/blobs/<etag>           a RELATIVE symlink ../../blobs/<2 hex>/<xet_hash>

The library accepts a repo blob as store-backed only in that exact shape (``_shared_blob_target``: two parts under
the store, the prefix equal to the hash's first two characters) and only in a marked store
(``is_shared_blobs_dir``). hfcache takes the same definition and nothing wider: every other link stays refused,
and the store is reached by walking from the cache root with ``O_NOFOLLOW | O_DIRECTORY`` on ``blobs`` and on the
prefix folder, and ``O_NOFOLLOW | O_NONBLOCK`` on the payload, so a planted link, FIFO or folder anywhere on the way
is refused, never followed. The store is off with ``HF_HUB_DISABLE_SHARED_BLOBS``, ``HF_HUB_DISABLE_XET`` or a
cache without symlinks (``shared_blobs_enabled``, ``file_download.py``), so one cache can hold both forms.

Standard library only: :mod:`hfcache.cache.safefs` builds on it.
"""

from __future__ import annotations

import errno
import os
import stat

from ..names import is_sha256

#: The store folder at the cache root, its marker and the marker's content (``_shared_blobs.py``).
STORE_DIR = "blobs"
MARKER = ".huggingface-shared-blobs"
MARKER_CONTENT = b"1\n"
MANIFEST_SUFFIX = ".refs"
LOCK_SUFFIX = ".lock"
#: The variables that turn the store off for huggingface_hub (``constants.py``, ``shared_blobs_enabled``).
DISABLING_VARIABLES = ("HF_HUB_DISABLE_SHARED_BLOBS", "HF_HUB_DISABLE_XET")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StoreProblem(OSError):
    """The store, or the part of it a link names, is not what huggingface_hub writes (unmarked, a link, a FIFO, a
    folder, missing): nothing was read through it. ``str()`` says what was found."""


def xet_hash_of_link(target: str) -> str | None:
    """The Xet hash a repo blob link names, when ``target`` (the link's text, as ``os.readlink`` gives it) has
    exactly the shape huggingface_hub writes, ``../../blobs/<h[:2]>/<h>``; else None.

    Args:
        target: the symlink's content, relative to the repo's ``blobs/`` folder.

    Returns:
        The 64-hex Xet hash, or None for any other shape (absolute, another depth, a prefix that does not match).
    """
    parts = target.split("/")
    if len(parts) != 5 or parts[:3] != ["..", "..", STORE_DIR] or not is_sha256(parts[4]) or parts[3] != parts[4][:2]:
        return None
    return parts[4]


def open_store_dir(root: str | os.PathLike[str]) -> int:
    """An fd of ``<root>/blobs`` when it is a real folder holding a regular marker file with the layout version
    huggingface_hub writes. The caller closes the fd.

    Raises:
        FileNotFoundError: the cache has no store.
        StoreProblem: ``blobs`` is a link or not a folder, or its marker is missing, a link, not a regular file, or
            another version.
    """
    try:
        fd = os.open(os.path.join(os.fspath(root), STORE_DIR), _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StoreProblem(f"{root}/{STORE_DIR} is a symlink or not a folder") from None
        raise
    try:
        _check_marker(fd, root)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_marker(store_fd: int, root: str | os.PathLike[str]) -> None:
    where = f"{root}/{STORE_DIR}/{MARKER}"
    try:
        mfd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=store_fd)
    except FileNotFoundError:
        raise StoreProblem(f"{root}/{STORE_DIR} has no marker {MARKER}: not a shared blob store") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreProblem(f"{where} is a symlink") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(mfd).st_mode):
            raise StoreProblem(f"{where} is not a regular file")
        if os.read(mfd, 16) != MARKER_CONTENT:
            raise StoreProblem(f"{where} names another layout version than 1")
    finally:
        os.close(mfd)


def open_payload(root: str | os.PathLike[str], xet_hash: str, flags: int = os.O_RDONLY) -> int:
    """Open the payload ``<root>/blobs/<h[:2]>/<h>`` of a marked store, following no link on the way, and return
    its fd (the caller closes it) once ``fstat`` shows a regular file.

    Args:
        root: the cache root (itself may be a link, as anywhere in hfcache).
        xet_hash: 64 lowercase hex characters.
        flags: extra ``os.open`` flags (read-only by default; the store is never written through this).

    Raises:
        FileNotFoundError: no store, or no such payload (a dangling repo link).
        StoreProblem: the store is unmarked, or the prefix folder or the payload is a link, a FIFO, a device or a
            folder.
    """
    if not is_sha256(xet_hash):
        raise StoreProblem(f"invalid Xet hash {xet_hash!r}")
    store_fd = open_store_dir(root)
    try:
        try:
            prefix_fd = os.open(xet_hash[:2], _DIR_FLAGS, dir_fd=store_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreProblem(f"{root}/{STORE_DIR}/{xet_hash[:2]} is a symlink or not a folder") from None
            raise
        try:
            fd = os.open(xet_hash, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=prefix_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                raise StoreProblem(f"{root}/{STORE_DIR}/{xet_hash[:2]}/{xet_hash} is a symlink or a folder") from None
            raise
        finally:
            os.close(prefix_fd)
    finally:
        os.close(store_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreProblem(f"{root}/{STORE_DIR}/{xet_hash[:2]}/{xet_hash} is not a regular file")
    return fd


def payload_stat(root: str | os.PathLike[str], xet_hash: str) -> os.stat_result:
    """``fstat`` of a payload opened with :func:`open_payload` (same errors): its size, inode and times."""
    fd = open_payload(root, xet_hash)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
