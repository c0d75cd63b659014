"""huggingface_hub 2.4's shared Xet blob store, read without following any link hfcache did not judge.

Since huggingface_hub 2.4.0 (``huggingface_hub/utils/_shared_blobs.py``; PR #4498, prune sweep PR #4797), a file
downloaded through Xet is kept once per cache::

    <cache>/blobs/.huggingface-shared-blobs      marker: the text "1\\n" (layout version 1), a regular file
    <cache>/blobs/<2 hex>/<xet_hash>             the payload: a regular read-only file named by its 64-hex Xet hash
    <cache>/blobs/<2 hex>/<xet_hash>.refs        manifest: the repo blob links that use it, one cache-relative
                                                 path per line (a hint: validated before use)
    <cache>/blobs/<2 hex>/<xet_hash>.lock        the per-hash lock (publication, new references, sweeps)
    <cache>/<repo folder>/blobs/<etag>           a RELATIVE symlink ../../blobs/<2 hex>/<xet_hash>

The library accepts a repo blob as store-backed only in that exact shape (``_shared_blob_target``) and only in a
marked store (``is_shared_blobs_dir``); hfcache takes the same definition and nothing wider. The store is off with
:data:`DISABLING_VARIABLES` or a cache without symlinks (``shared_blobs_enabled``), so one cache can hold both forms.
"""

from __future__ import annotations

import errno
import os
import stat

from ..names import is_sha256
from .fsops import LINK_ERRNOS, open_dir_at, open_read_at

#: The store folder at the cache root, its marker, the marker's content, a payload's manifest and lock suffixes.
STORE_DIR = "blobs"
MARKER = ".huggingface-shared-blobs"
MARKER_CONTENT = b"1\n"
MANIFEST_SUFFIX = ".refs"
LOCK_SUFFIX = ".lock"
#: The variables that turn the store off for huggingface_hub (``constants.py``, ``shared_blobs_enabled``).
DISABLING_VARIABLES = ("HF_HUB_DISABLE_SHARED_BLOBS", "HF_HUB_DISABLE_XET")


class StoreProblem(OSError):
    """The store, or the part a link names, is not what huggingface_hub writes (unmarked, a link, a FIFO, a folder):
    nothing was read through it. ``str()`` says what was found."""


def xet_hash_of_link(target: str) -> str | None:
    """The 64-hex Xet hash a repo blob link names when ``target`` (its ``os.readlink`` text) has exactly the shape
    huggingface_hub writes, ``../../blobs/<h[:2]>/<h>``; None for any other (absolute, another depth or prefix)."""
    parts = target.split("/")
    if len(parts) != 5 or parts[:3] != ["..", "..", STORE_DIR] or not is_sha256(parts[4]) or parts[3] != parts[4][:2]:
        return None
    return parts[4]


def open_store_dir(root: str | os.PathLike[str]) -> int:
    """An fd of ``<root>/blobs`` (caller closes) when it is a real folder holding a regular marker file of layout
    version 1. FileNotFoundError: no store; StoreProblem: ``blobs`` or its marker is anything else."""
    try:
        fd = open_dir_at(None, os.path.join(os.fspath(root), STORE_DIR))
    except OSError as exc:
        if exc.errno in LINK_ERRNOS:
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
        mfd = open_read_at(store_fd, MARKER)
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
    """Open the payload ``<root>/blobs/<h[:2]>/<h>`` of a marked store (``xet_hash``: 64 hex), following no link on
    the way, with extra ``flags``; its fd (caller closes) once ``fstat`` shows a regular file.
    Raises FileNotFoundError: no store, or no such payload (a dangling repo link). StoreProblem: the store is unmarked,
    or the prefix folder or payload is a link, FIFO, device or folder."""
    if not is_sha256(xet_hash):
        raise StoreProblem(f"invalid Xet hash {xet_hash!r}")
    store_fd = open_store_dir(root)
    try:
        try:
            prefix_fd = open_dir_at(store_fd, xet_hash[:2])
        except OSError as exc:
            if exc.errno in LINK_ERRNOS:
                raise StoreProblem(f"{root}/{STORE_DIR}/{xet_hash[:2]} is a symlink or not a folder") from None
            raise
        try:
            fd = open_read_at(prefix_fd, xet_hash, flags)
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
