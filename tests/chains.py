"""Deep folder chains for the tests that plant them, and removing any tree whatever its depth.

A group member can plant a 1,000-level chain in a shared cache (docs/security.md, "Member-controlled state").
The path of such a chain is longer than PATH_MAX, so it is made relative to descriptors; and Python 3.11's
``shutil.rmtree`` (pytest's own temp cleanup included) recurses once per level, so every test removes what it
planted with :func:`remove_tree` (``rm -rf``, which does not recurse on the stack).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def plant_chain(top: Path, levels: int, *, leaf: str = "leaf", content: bytes = b"") -> None:
    """``top/d/d/.../d/<leaf>``: ``levels`` folders below ``top`` (made if missing), a file at the bottom."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        out = os.open(leaf, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, content)
        os.close(out)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it, whatever its depth (``rm -rf``: iterative, follows no link)."""
    subprocess.run(["rm", "-rf", "--", str(path)], check=True)
