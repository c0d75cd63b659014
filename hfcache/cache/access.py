"""What the current user can do in a cache: the checks ``hfcache doctor`` runs for shared caches (what they cover:
docs/shared-caches.md), each problem a :class:`Check` with the command that fixes it. ``.locks/`` is probed by
creating and removing a file (``os.access`` cannot see NFS export rules or ACL masks); repo folders, being many, by
``os.access``.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from ..bounds import MAX_TREE_DEPTH
from . import safefs
from .fsops import create_at, list_entries, walk_tree
from .locking import flock_error

_SHOWN = 4


@dataclass(frozen=True)
class Check:
    """One finding: ``code``, ``severity`` (``error``/``warning``/``info``), ``message`` and ``fix`` (a command)."""

    code: str
    severity: str
    message: str
    fix: str | None = None


def _who(path: Path) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f" (owner uid {st.st_uid}, group gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o})"


def _listed(paths: list[str]) -> str:
    shown = ", ".join(paths[:_SHOWN])
    return shown + (f" (and {len(paths) - _SHOWN} more)" if len(paths) > _SHOWN else "")


def share_recipe(cache: Path, gid: int, uid: int | None = None) -> str:
    """The fix that makes ``cache`` a group-shared cache for group ``gid``: the commands (run as its owner or root),
    and, when ``uid`` is given, that this user must join the group."""
    commands = f"chgrp -R {gid} {cache} && chmod -R g+rwX {cache} && find {cache} -type d -exec chmod g+s {{}} +"
    join = f"; and add uid {uid} to group {gid} (usermod -aG)" if uid is not None else \
        f" (and add every user to group {gid})"
    return f"as the owner or root: {commands}{join}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)  # usermod -aG takes a numeric gid too


def _login(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"<login of uid {uid}>"


def join_fix(uid: int, gid: int) -> str:
    """The fix for a user outside a group-shared cache's group: join it (never a chown of the shared cache)."""
    name = _group_name(gid)
    return f"add uid {uid} to group {name} (usermod -aG {name} {_login(uid)}), then log in again"


def reach_fix(folder: Path, is_cache: bool, uid: int, groups: tuple[int, ...]) -> str:
    """The fix for a folder on the way to a cache (or the cache itself, ``is_cache``) this user cannot enter or list:
    open it to its group when this user is in it, else give it a group of this user or point the cache elsewhere."""
    try:
        st = os.stat(folder)
        owner, mine = str(st.st_uid), st.st_gid in groups
    except OSError:
        owner, mine = "?", False
    bits = "g+rx" if is_cache else "g+x"
    if mine:
        return f"as uid {owner} or root: chmod {bits} {folder}"
    return (f"as its owner or root: chgrp <a group of uid {uid}> {folder} && chmod {bits} {folder}; or point "
            "HF_HUB_CACHE at a cache you can read")


def outsider_check(cache: Path, uid: int, groups: tuple[int, ...]) -> Check | None:
    """An error when the cache is group-shared (group-writable root) and this user is not in its group: it cannot
    create in the root nor in ``.locks/``, so every warm and download fails; the fix is to join the group."""
    st = os.stat(cache)
    if uid == 0 or st.st_gid in groups or not st.st_mode & stat.S_IWGRP or os.access(cache, os.W_OK):
        return None
    return Check("cache.not_in_group", "error",
                 f"uid {uid} is not in the group gid {st.st_gid} ({_group_name(st.st_gid)}) of the shared cache "
                 f"{cache}{_who(cache)}: it cannot create files in {cache} nor in {cache / '.locks'}/, so every "
                 "warm and every download by huggingface_hub fails with 'Permission denied' (offline loads work)",
                 join_fix(uid, st.st_gid))


def blocking_dir(path: Path) -> Path:
    """The first folder on the way to ``path`` (itself included) that this user cannot enter or list; ``path``
    when there is none."""
    path = path.absolute()
    for folder in [*reversed(path.parents), path]:
        if not os.access(folder, os.X_OK) or (folder == path and not os.access(folder, os.R_OK)):
            return folder
    return path


def reach_check(cache: Path, uid: int, groups: tuple[int, ...]) -> Check | None:
    """An error when this user cannot enter a folder on the way to ``cache`` or list ``cache`` itself."""
    cache = cache.absolute()
    folder = blocking_dir(cache)
    if os.access(folder, os.X_OK | (os.R_OK if folder == cache else 0)):
        return None
    what = "list" if folder == cache else "enter"
    return Check("cache.unreachable", "error",
                 f"uid {uid} cannot {what} {folder}{_who(folder)}: every load from the cache {cache} and every "
                 "hfcache command on it fail with 'Permission denied'", reach_fix(folder, folder == cache, uid, groups))


def _probe_create(cache: Path, rel: str) -> OSError | None:
    """Create and remove a probe file in ``cache/rel``, through an fd of that folder (safefs: a planted ``.locks``
    link is never written through; UnsafeLayout is raised instead)."""
    name = f".hfcache-doctor-{os.urandom(6).hex()}"  # as secrets.token_hex(6), unimported
    with safefs.dir_fd(cache, rel) as dfd:
        try:
            os.close(create_at(dfd, name, 0o600))
        except OSError as exc:
            return exc
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
    return None


def locks_state(cache: Path) -> str:
    """``"dir"`` when ``cache/.locks`` is a real folder, ``"missing"``, or ``"unsafe"`` (a symlink or not a folder:
    nothing is created through it)."""
    mode = safefs.list_modes(str(cache), frozenset({".locks"})).get(".locks")
    if mode is None:
        return "missing"
    return "dir" if stat.S_ISDIR(mode) else "unsafe"


def unsafe_locks_check(cache: Path) -> Check | None:
    """An error when ``.locks`` is a symlink or a file: hfcache refuses to warm through it, and huggingface_hub
    would create its lock files wherever it points."""
    if locks_state(cache) != "unsafe":
        return None
    return Check("cache.unsafe_layout", "error",
                 f"{cache / '.locks'} is a symlink or not a folder: hfcache leaves it alone (doctor's probes too) and "
                 "refuses to warm; huggingface_hub would create lock files wherever it points",
                 f"remove it (it holds only lock files): rm {cache / '.locks'}")


def write_checks(cache: Path, uid: int, groups: tuple[int, ...]) -> list[Check]:
    """Errors for what this user cannot create in ``.locks/`` and in the repo folders (the cache root is writable)."""
    found: list[Check] = []
    st = os.stat(cache)
    recipe = share_recipe(cache, st.st_gid, None if st.st_gid in groups or uid == 0 else uid)
    locks = cache / ".locks"
    if locks_state(cache) == "dir":
        try:
            failed = _probe_create(cache, ".locks")
        except (OSError, safefs.UnsafeLayout):  # swapped for a link meanwhile: nothing written through it
            failed = None
        if failed is not None and failed.errno in (errno.EACCES, errno.EPERM):
            found.append(Check("cache.locks_not_writable", "error",
                               f"uid {uid} cannot create files in {locks}{_who(locks)}: every warm and every "
                               "download by huggingface_hub fails with 'Permission denied'", recipe))
    denied: list[str] = []
    for folder, lock_files in _lock_folders(locks):
        if not os.access(folder, os.W_OK | os.X_OK):
            denied.append(str(folder.relative_to(cache)) + "/")
        denied += [str(f.relative_to(cache)) for f in lock_files if not os.access(f, os.W_OK)]
    for folder in _repo_folders(cache):
        denied += [str(p.relative_to(cache)) + "/" for p in folder if not os.access(p, os.W_OK | os.X_OK)]
    if denied:
        found.append(Check("cache.repo_not_writable", "error",
                           f"uid {uid} cannot write {len(denied)} folder(s) or lock file(s) of the cache: "
                           f"{_listed(denied)}; warming, re-warming or pruning those repos fails with "
                           "'Permission denied' (created by another user whose umask left them private)", recipe))
    return found


def _lock_folders(locks: Path) -> list[tuple[Path, list[Path]]]:
    out = []
    for entry in list_entries(locks):
        if entry.is_dir(follow_symlinks=False):
            out.append((Path(entry.path), [Path(e.path) for e in list_entries(entry.path)
                                           if e.name.endswith(".lock") and e.is_file(follow_symlinks=False)]))
    return out


def _repo_folders(cache: Path) -> list[list[Path]]:
    """Per repo folder: it and every folder below it that hfcache creates entries in (not ``trees/``), walked to
    :data:`hfcache.bounds.MAX_TREE_DEPTH` levels below a snapshot (the layout scan reports a deeper chain)."""
    out = []
    for entry in list_entries(cache):
        if "--" not in entry.name or entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        dirs = [folder]
        for root, subdirs, _ in walk_tree(folder, max_depth=MAX_TREE_DEPTH + 2):
            if root == str(folder) and "trees" in subdirs:
                subdirs.remove("trees")
            dirs += [Path(root) / d for d in subdirs]  # folders only: walk_tree never lists a link among them
        out.append(dirs)
    return out


def sharing_checks(cache: Path) -> list[Check]:
    """In a group-shared cache (group-writable root): folders other members cannot write (wrong group, no g+w)."""
    st = os.stat(cache)
    if not st.st_mode & stat.S_IWGRP:
        return []
    odd = []
    for dirs in [[cache / ".locks"], *_repo_folders(cache)]:
        for path in dirs:
            try:
                sub = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(sub.st_mode) and (sub.st_gid != st.st_gid or not sub.st_mode & stat.S_IWGRP):
                odd.append(str(path.relative_to(cache)) + "/")
    found = [Check("cache.shared", "info",
                   f"the cache is group-shared (group gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}): what "
                   "hfcache creates in it stays writable by that group whatever the umask")]
    if odd:
        found.append(Check("cache.not_shared", "warning",
                           f"{len(odd)} folder(s) are not writable by the cache's group gid {st.st_gid}: "
                           f"{_listed(odd)}; other members cannot warm or prune those repos",
                           share_recipe(cache, st.st_gid)))
    return found


def flock_check(cache: Path) -> Check | None:
    """Whether flock works where the locks live (None when it cannot be probed: nothing writable)."""
    locks = cache / ".locks"
    state = locks_state(cache)
    if state == "unsafe":
        return None  # never probed through a planted link (unsafe_locks_check reports it)
    try:
        code = flock_error(locks if state == "dir" else cache)
    except OSError:
        return None
    if code is None:
        return Check("cache.flock", "info", "flock works on the cache's filesystem")
    return Check(
        "cache.no_flock", "warning",
        f"the cache's filesystem has no working flock ({errno.errorcode.get(code, code)}: {os.strerror(code)}): "
        "hfcache then locks with files naming host, pid and start time, taken over when their holder is gone or "
        "has not refreshed them for 10 minutes; huggingface_hub falls back to such files only on ENOSYS, and waits "
        "forever on an empty lock file left by an earlier flock-based run",
        f"while nothing downloads: find {locks} -type f -empty -delete; or mount with working locks (NFS: run the "
        "lock manager, or mount with local_lock=flock when only one node writes)")
