"""link: make the cache at DEST use the cache at SRC (a runtime user's default path, a volume mount).

Three modes:

- ``symlink``: DEST becomes a directory symlink to SRC (no bytes; SRC must stay where it is).
- ``hardlink``: DEST gets the same tree with every regular file hardlinked (same filesystem: no extra bytes;
  across filesystems a clear error, nothing left half-made) and the snapshot symlinks recreated as they are
  (relative, so they resolve inside DEST).
- ``copy``: the same tree with copies.

``.locks`` and ``*.incomplete`` are never carried over. The tree is built next to DEST and renamed into place.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import CacheError, UsageError
from .safefs import repo_layout_problems
from .scan import parse_folder_name

MODES = ("symlink", "hardlink", "copy")


@dataclass(frozen=True)
class LinkReport:
    """What :func:`link_cache` made: ``files`` linked or copied, ``bytes_added`` on DEST's filesystem."""

    src: str
    dest: str
    mode: str
    files: int
    bytes_added: int


def link_cache(src: Path, dest: Path, mode: str = "symlink") -> LinkReport:
    """Make ``dest`` a cache that uses ``src``.

    Raises:
        UsageError: bad mode, ``src`` is not a directory, ``dest`` exists and is not an empty directory.
        CacheError: hardlinks across filesystems (``EXDEV``), or ``dest`` cannot be written.
    """
    if mode not in MODES:
        raise UsageError(f"invalid mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    src = src.absolute()
    if not src.is_dir():
        raise UsageError(f"{src} is not a cache directory")
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise UsageError(f"{dest} exists and is not an empty directory", hint="link into a new or empty path")
    if mode != "symlink":
        _refuse_unsafe(src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    files = added = 0
    try:
        if mode == "symlink":
            os.symlink(src, staging)
        else:
            for dirpath, dirs, names in os.walk(src):
                rel = os.path.relpath(dirpath, src)
                dirs[:] = sorted(d for d in dirs if not (rel == "." and d == ".locks"))
                target_dir = staging / rel if rel != "." else staging
                target_dir.mkdir(parents=True, exist_ok=True)
                for name in sorted(names):
                    if name.endswith(".incomplete"):
                        continue
                    s, d = os.path.join(dirpath, name), target_dir / name
                    if os.path.islink(s):
                        os.symlink(os.readlink(s), d)
                    elif mode == "hardlink":
                        os.link(s, d)
                        files += 1
                    else:
                        shutil.copyfile(s, d)
                        added += os.path.getsize(d)
                        files += 1
        if dest.exists():
            dest.rmdir()
        os.replace(staging, dest)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise CacheError(f"cannot hardlink {src} into {dest}: they are on different filesystems",
                             hint="use --mode copy, or a DEST on the same filesystem") from None
        raise CacheError(f"link {src} -> {dest}: {exc.strerror or exc}") from exc
    finally:
        if os.path.lexists(staging):
            if os.path.islink(staging):
                os.unlink(staging)
            else:
                shutil.rmtree(staging, ignore_errors=True)
    return LinkReport(src=str(src), dest=str(dest), mode=mode, files=files, bytes_added=added)


def _refuse_unsafe(src: Path) -> None:
    """CacheError when a repo folder of ``src`` has a planted link (safefs.repo_layout_problems): a copy would
    silently drop it, and nothing outside the cache is read."""
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if parse_folder_name(entry.name) is None:
            continue
        problems = repo_layout_problems(str(src), entry.name)
        if problems:
            raise CacheError(f"unsafe cache layout in {src}: {entry.name}: {'; '.join(problems)}",
                             hint="remove the symlink or file, then rerun")
