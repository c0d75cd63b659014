"""A bounded, iterative ``os.walk`` for folders a cache (or a cache member) supplies.

Python 3.11's ``os.walk`` and ``pathlib.Path.rglob`` recurse once per level: a folder chain a group member of a
shared cache planted (1,000 levels) raised RecursionError (exit 70) in every command that walked it. Readers below a
cache root walk with :func:`walk_tree`, which keeps an explicit stack and stops at :data:`hfcache.bounds.MAX_TREE_DEPTH`
levels; what it leaves unentered, :mod:`hfcache.cache.scan` reports as a layout problem of its repo.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from ..bounds import MAX_TREE_DEPTH


def walk_tree(top: str | os.PathLike[str], *, max_depth: int = MAX_TREE_DEPTH,
              too_deep: list[str] | None = None,
              onerror: Callable[[OSError], object] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` (top-down, links never followed, ``dirnames`` may be pruned in place), iterative and bounded.

    Python 3.11's ``os.walk`` and ``Path.rglob`` recurse once per level, so a folder chain a cache member planted
    (1,000 levels) raised RecursionError; this walk keeps an explicit stack and does not enter a folder more than
    ``max_depth`` levels below ``top``.

    Args:
        top: the folder to walk.
        max_depth: deepest level entered (:data:`hfcache.bounds.MAX_TREE_DEPTH`; ``top`` is level 0).
        too_deep: receives the path (relative to ``top``) of each folder left unentered for its depth.
        onerror: called with the OSError of a folder that cannot be listed (as ``os.walk``'s).

    Yields:
        tuple[str, list[str], list[str]]: (folder path, sub-folder names, other entry names) per folder.
    """
    base = os.fspath(top)
    stack = [(base, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        files = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        yield path, dirs, files
        for name in reversed(dirs):
            sub = os.path.join(path, name)
            if depth >= max_depth:
                if too_deep is not None:
                    too_deep.append(os.path.relpath(sub, base))
                continue
            stack.append((sub, depth + 1))
