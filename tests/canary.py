"""Canaries outside a cache: prove a hostile input made hfcache touch nothing it should not.

A :class:`Canary` is a folder outside the cache holding a root-only secret, a world-readable file and a
sub-folder, plus any paths a test adds. :meth:`Canary.assert_unchanged` fails when any of them changed in content,
mode, owner or link target, or when a new entry appeared in the folder (what an attacker's link made hfcache
write), so a test states "nothing outside the cache moved" in one line.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

SECRET = b"root-only canary: must never be copied, moved, chmod-ed or read into the cache\n"


def _state(path: Path) -> tuple:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        extra = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        extra = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        extra = None
    return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_nlink, extra)


class Canary:
    """A folder of files outside a cache, snapshotted on creation.

    Args:
        base (Path): where to make the folder (not below the cache under test).
    """

    def __init__(self, base: Path) -> None:
        self.dir = base / "canary"
        self.dir.mkdir(mode=0o755)
        self.secret = self.dir / "secret"
        self.secret.write_bytes(SECRET)
        os.chmod(self.secret, 0o600)
        self.public = self.dir / "public.txt"
        self.public.write_bytes(b"public\n")
        os.chmod(self.public, 0o644)
        self.sub = self.dir / "sub"
        self.sub.mkdir(mode=0o700)
        self._extra: list[Path] = []
        self._before = self._snapshot()

    def watch(self, *paths: Path) -> None:
        """Also hold ``paths`` (anywhere outside the cache) to what they are now."""
        self._extra.extend(paths)
        self._before = self._snapshot()

    def _snapshot(self) -> dict[str, tuple | None]:
        seen: dict[str, tuple | None] = {}
        for dirpath, dirnames, filenames in os.walk(self.dir):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                seen[str(path)] = _state(path)
        seen[str(self.dir)] = _state(self.dir)
        for path in self._extra:
            seen[str(path)] = _state(path) if os.path.lexists(path) else None
        return seen

    def assert_unchanged(self) -> None:
        """Fail naming every canary path that changed, appeared or went away."""
        after = self._snapshot()
        changed = sorted(p for p in set(after) | set(self._before) if after.get(p, "gone") != self._before.get(p, "new"))
        assert not changed, f"outside the cache, changed: {changed}"
