"""export to a directory: the plan written as a new cache folder beside DEST (private until complete), then renamed
into place; every entry made, chmod-ed and chown-ed relative to its folder's descriptor, following no link.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..cache.fsops import create_at, open_dir_at
from ..errors import CacheError, UsageError
from .destination import open_parent, private_dir, replace_beside
from .export import _CHUNK, ExportPlan, modes
from .export_store import entry_reader


def write_dir(plan: ExportPlan, dest: Path, chown: tuple[int, int] | None = None, group_writable: bool = False) -> None:
    """Write the plan as a new cache directory at ``dest``. Raises UsageError (``dest`` is not an empty directory),
    CacheError (a blob does not match its name, a source file changed, ``dest`` cannot be written: nothing left)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not empty", hint="export into a new directory")
    pfd = None
    try:
        pfd = open_parent(dest)
        replace_beside(pfd, dest, lambda name: private_dir(
            pfd, name, lambda sfd: _write_entries(plan, sfd, chown, group_writable)))
    except OSError as exc:
        raise CacheError(f"export to {dest}: {exc.strerror or exc}", hint="check the destination") from exc
    finally:
        if pfd is not None:
            os.close(pfd)


def _write_entries(plan: ExportPlan, sfd: int, chown: tuple[int, int] | None, group_writable: bool) -> None:
    """Create the entries in ``sfd``, chown them deepest first, the staging folder's mode and owner last."""
    dir_mode, file_mode = modes(group_writable)
    for e in plan.entries:
        if e.kind == "dir":
            with contextlib.suppress(FileExistsError):
                os.mkdir(e.name, dir_mode, dir_fd=sfd)
            _fchmod_close(open_dir_at(sfd, e.name), dir_mode)
        elif e.kind == "symlink":
            os.symlink(e.target, e.name, dir_fd=sfd)
        elif e.kind == "hardlink":
            os.link(e.target, e.name, src_dir_fd=sfd, dst_dir_fd=sfd, follow_symlinks=False)
        else:
            fd = create_at(sfd, e.name, file_mode)
            with os.fdopen(fd, "wb", closefd=False) as out:
                if e.kind in ("empty", "data"):
                    out.write(e.target.encode())
                else:  # the read that returns b"" checks a blob's hash, a file's size
                    with entry_reader(e, grown=f"{e.source} changed while it was exported ({e.size + 1} bytes, "
                                               f"planned {e.size}): nothing exported") as reader:
                        while chunk := reader.read(_CHUNK):
                            out.write(chunk)
            _fchmod_close(fd, file_mode)
    if chown is not None:
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
