"""Where ``export`` and ``link`` may write: never inside the cache they read.

A DEST inside the source cache (or the cache itself) would make ``export`` write a second cache into the first one
(``verify`` then fails, or a bogus repo folder appears) and ``link --mode copy`` copy a tree into itself. The check
compares resolved paths and, for every existing ancestor of DEST, its resolved folders' ``(st_dev, st_ino)`` with
the cache root's, so a DEST reached through a symlink (or a bind mount of the root) is caught too.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _resolved_chain(dest: Path, follow: bool) -> list[str]:
    """The resolved folders DEST lies in: its deepest existing ancestor (DEST itself when it exists and is no
    symlink, or ``follow``), resolved, and every folder above that."""
    probe = Path.cwd() / dest  # not abspath: '..' after a symlink is resolved by the kernel, not lexically
    if not follow and probe.is_symlink():
        probe = probe.parent
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    real = Path(os.path.realpath(probe))
    return [str(p) for p in (real, *real.parents)]


def refuse_dest_inside(cache_dir: str | os.PathLike[str], dest: str | os.PathLike[str], command: str, *,
                       follow: bool = True) -> None:
    """Raise UsageError (exit 2) when ``dest`` is the cache ``cache_dir`` itself or anywhere inside it.

    Args:
        cache_dir: the source cache root. dest: the path the command would write (need not exist).
        command: ``export`` or ``link``, for the message.
        follow: judge where a DEST that is a symlink points (export); False judges where the link itself lies
            (``link --mode symlink`` run again on its own DEST).

    Raises:
        UsageError: ``dest`` resolves to the cache or below it (by path, or by the identity of a folder on the way).
    """
    root = os.path.realpath(cache_dir)
    root_id = _identity(root)
    chain = _resolved_chain(Path(dest), follow)
    inside = any(p == root or p.startswith(root.rstrip(os.sep) + os.sep) for p in chain)
    if not inside and root_id is not None:
        inside = any(_identity(p) == root_id for p in chain)
    if inside:
        raise UsageError(f"{command} DEST {os.fspath(dest)} is inside the source cache {root}: nothing written",
                         hint=f"{command} to a path outside the cache")
