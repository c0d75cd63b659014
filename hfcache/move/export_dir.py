"""export to a directory: the plan written as a new cache folder beside DEST, then renamed into place.

The staging folder is made private (0700) and every entry is created, chmod-ed and chown-ed relative to its
descriptor (``*at`` calls with ``O_NOFOLLOW``, ``fchmod`` of the descriptor created), so neither the source cache's
members nor the owner ``--chown`` names can redirect a write while the export runs. DEST is the user's path, outside
the source cache (``cli/move.py`` refuses one inside it: :func:`hfcache.move.destination.refuse_dest_inside`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO

from ..errors import CacheError, UsageError
from .export import _CHUNK, Entry, ExportPlan, _modes
from .export_store import HashingReader as _HashingReader, SizedReader as _SizedReader
from .export_store import open_plain_source as _open_source


def write_dir(plan: ExportPlan, dest: Path, chown: tuple[int, int] | None = None, group_writable: bool = False) -> None:
    """Write the plan as a new cache directory at ``dest`` (built beside it, then renamed into place).

    The staging folder is private (0700, root's when root runs) until it is complete: every entry is created,
    chmod-ed and chown-ed relative to its descriptor (``*at`` calls, ``O_NOFOLLOW``, ``fchmod`` of what was
    created), so an owner given with ``--chown`` cannot swap a part for a link while the export still writes. The
    caller refuses a ``dest`` inside the source cache (:func:`hfcache.move.destination.refuse_dest_inside`).

    Raises:
        UsageError: ``dest`` exists and is not an empty directory.
        CacheError: a blob's content does not match its name, or a source file changed or was swapped for a link
            (nothing is left at ``dest``); ``dest`` cannot be written.
    """
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not empty", hint="export into a new directory")
    staging = f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    pfd = made = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)  # DEST is the user's (outside the cache)
        pfd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.mkdir(staging, 0o700, dir_fd=pfd)
        made = staging
        sfd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        try:
            _write_entries(plan, sfd, chown, group_writable)
        finally:
            os.close(sfd)
        try:
            os.rmdir(dest.name, dir_fd=pfd)  # an empty DEST folder (checked above)
        except FileNotFoundError:
            pass
        os.replace(staging, dest.name, src_dir_fd=pfd, dst_dir_fd=pfd)
        made = None
    except OSError as exc:
        raise CacheError(f"export to {dest}: {exc.strerror or exc}", hint="check the destination") from exc
    finally:
        if made is not None:
            shutil.rmtree(made, dir_fd=pfd, ignore_errors=True)  # the descriptor-based form: follows no link
        if pfd is not None:
            os.close(pfd)


def _write_entries(plan: ExportPlan, sfd: int, chown: tuple[int, int] | None, group_writable: bool) -> None:
    """Create the plan's entries in the private staging folder ``sfd`` (names relative to it), then chown them
    deepest first and give the staging folder itself its mode and owner last."""
    dir_mode, file_mode = _modes(group_writable)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for e in plan.entries:
        if e.kind == "dir":
            try:
                os.mkdir(e.name, dir_mode, dir_fd=sfd)
            except FileExistsError:
                pass
            fd = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
            _fchmod_close(fd, dir_mode)
        elif e.kind == "symlink":
            os.symlink(e.target, e.name, dir_fd=sfd)
        elif e.kind == "hardlink":
            os.link(e.target, e.name, src_dir_fd=sfd, dst_dir_fd=sfd, follow_symlinks=False)
        else:
            fd = os.open(e.name, flags, file_mode, dir_fd=sfd)
            with os.fdopen(fd, "wb", closefd=False) as out:
                if e.kind in ("empty", "data"):
                    out.write(e.target.encode())
                else:
                    _copy_source(e, out)
            _fchmod_close(fd, file_mode)
    if chown is not None:  # children before their folders: each folder stays ours until its content is done
        for e in sorted(plan.entries, key=lambda e: e.name.count("/"), reverse=True):
            os.chown(e.name, *chown, dir_fd=sfd, follow_symlinks=False)
    os.fchmod(sfd, dir_mode)
    if chown is not None:
        os.fchown(sfd, *chown)


def _fchmod_close(fd: int, mode: int) -> None:
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _copy_source(e: Entry, out: BinaryIO) -> None:
    """Copy the content of the ``file`` entry ``e`` to ``out``: a blob hashed on the way (export_store), another
    file through :func:`_open_source`, exactly ``e.size`` bytes of it (``SizedReader``).

    Raises:
        CacheError: the content does not match the blob name, or the file's size changed since the plan.
    """
    reader = _HashingReader(e.source, e.etag, e.size) if e.etag else _SizedReader(_open_source(e), e.size, e.source)
    with reader:
        copied = 0
        while chunk := reader.read(min(_CHUNK, e.size + 1 - copied)):
            copied += len(chunk)
            if copied > e.size:
                break
            out.write(chunk)  # the read that returns b"" is where a blob's hash, a file's size is checked
    if copied != e.size:
        raise CacheError(f"{e.source} changed while it was exported ({copied} bytes, planned {e.size}): nothing "
                         "exported", hint="rerun once nothing writes the cache")
