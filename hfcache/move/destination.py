"""Where ``export`` and ``link`` write: never inside the cache they read (:func:`refuse_dest_inside`), and never
half-made (:func:`replace_beside`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..cache.fsops import open_dir_at
from ..errors import UsageError

_T = TypeVar("_T")


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _resolved_chain(dest: Path, follow: bool) -> list[str]:
    """DEST's deepest existing ancestor (DEST itself unless a symlink not followed), resolved, and its parents."""
    probe = Path.cwd() / dest  # not abspath: '..' after a symlink is resolved by the kernel, not lexically
    if not follow and probe.is_symlink():
        probe = probe.parent
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    real = Path(os.path.realpath(probe))
    return [str(p) for p in (real, *real.parents)]


def refuse_dest_inside(cache_dir: str | os.PathLike[str], dest: str | os.PathLike[str], command: str, *,
                       follow: bool = True) -> None:
    """Raise UsageError (exit 2) when ``dest`` (need not exist) is ``cache_dir`` or inside it, by resolved path or by
    the identity of a folder on the way (a symlink or bind mount of the root). ``command``: for the message.
    ``follow``: judge where a symlink DEST points (export); False: where the link lies (``link`` run again on it)."""
    root = os.path.realpath(cache_dir)
    root_id = _identity(root)
    chain = _resolved_chain(Path(dest), follow)
    inside = any(p == root or p.startswith(root.rstrip(os.sep) + os.sep) for p in chain)
    if not inside and root_id is not None:
        inside = any(_identity(p) == root_id for p in chain)
    if inside:
        raise UsageError(f"{command} DEST {os.fspath(dest)} is inside the source cache {root}: nothing written",
                         hint=f"{command} to a path outside the cache")


def open_parent(dest: Path) -> int:
    """An fd of DEST's parent folder, made if missing (the user's path, outside the cache; it may be a link)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def replace_beside(pfd: int, dest: Path, make: Callable[[str], _T]) -> _T:
    """``make(name)`` builds DEST's content as ``name`` in DEST's parent ``pfd``, then renamed onto ``dest`` (new, or
    an empty folder); on any error the half-made entry is removed, following nothing. Returns what ``make`` does."""
    staging = f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        made = make(staging)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(dest.name, dir_fd=pfd)  # an empty DEST folder (checked by the caller)
        os.replace(staging, dest.name, src_dir_fd=pfd, dst_dir_fd=pfd)
        return made
    except BaseException:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.stat(staging, dir_fd=pfd, follow_symlinks=False).st_mode):
                shutil.rmtree(staging, dir_fd=pfd, ignore_errors=True)
            else:
                os.unlink(staging, dir_fd=pfd)
        raise


def private_dir(pfd: int, name: str, fill: Callable[[int], _T]) -> _T:
    """Make the folder ``name`` in ``pfd``, private (0700) while ``fill(fd)`` fills it through its descriptor."""
    os.mkdir(name, 0o700, dir_fd=pfd)
    fd = open_dir_at(pfd, name)
    try:
        return fill(fd)
    finally:
        os.close(fd)
