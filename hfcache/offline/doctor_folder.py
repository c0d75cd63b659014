"""``hfcache doctor``'s checks of the cache folder, as the current user: present, reachable, readable, writable (and
why not: owner, read-only filesystem, group sharing, flock), planted links, symlink support, free space, and the
folder transformers copies custom code into (the list, with the sources followed: :mod:`hfcache.offline.doctor`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .findings import Finding, is_true
from ..bounds import MAX_TREE_DEPTH
from ..cache import safefs
from ..cache.access import flock_check, outsider_check, reach_check, share_recipe, sharing_checks, write_checks
from ..cache.fsops import walk_tree
from ..errors import HfcacheError

#: Below this much free space a cache cannot take a model (or a few more tokenizers).
LOW_DISK_BYTES = 1 << 30
_UNREADABLE_SHOWN = 3
_SNAPSHOT_DEPTH = 3  # <repo folder>/snapshots/<commit>: where a repo's own tree starts below the cache root


@dataclass
class _Folder:
    findings: list[Finding] = field(default_factory=list)
    owner_uid: int | None = None
    owner_gid: int | None = None
    writable: bool | None = None
    read_only_fs: bool | None = None
    symlinks: bool | None = None
    free_bytes: int | None = None
    repos: list = field(default_factory=list)  #: the cache's RepoInfo records (cache/scan.py), when it could be listed


def _nearest_existing(path: Path) -> Path:
    while not os.path.exists(path) and path != path.parent:
        path = path.parent
    return path


def examine_folder(cache: Path, env: dict[str, str], offline: bool, uid: int | None, gid: int | None,
                    groups: tuple[int, ...]) -> _Folder:
    """The cache folder as the current user finds it (findings in the order doctor reports them)."""
    out = _Folder()
    _probe_filesystem(cache, out)
    try:
        os.stat(cache)
    except FileNotFoundError:
        out.findings.append(Finding("cache.missing", "error", f"the cache {cache} does not exist",
                                    f"warm it: hfcache warm REPO_ID... --cache-dir {cache}"))
        return out
    except OSError:
        pass  # cannot even be reached: reach_check says by whom
    unreachable = reach_check(cache, uid, groups) if uid is not None else None
    if unreachable is not None:
        out.findings.append(Finding(unreachable.code, unreachable.severity, unreachable.message, unreachable.fix))
        return out
    if not cache.is_dir():
        out.findings.append(Finding("cache.not_dir", "error", f"the cache {cache} is not a folder",
                                    "point HF_HUB_CACHE at a folder"))
        return out
    st = cache.stat()
    out.owner_uid, out.owner_gid = st.st_uid, st.st_gid
    owners = _content_findings(cache, uid, out)
    _access_findings(cache, st, owners, offline, uid, gid, groups, out)
    _symlink_findings(cache, env, out)
    _disk_findings(out)
    return out


def _probe_filesystem(cache: Path, out: _Folder) -> None:
    """Free space and read-only flag of the cache's filesystem (its nearest existing parent's)."""
    base = _nearest_existing(cache)
    try:
        usage = shutil.disk_usage(base)
        out.free_bytes = usage.free
    except OSError:
        usage = None
    try:
        out.read_only_fs = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        out.read_only_fs = None


def _content_findings(cache: Path, uid: int | None, out: _Folder) -> set[int]:
    """No repo, planted links, entries this user cannot read; returns the owners of the cache's entries."""
    repos = [p for p in _listdir(cache) if "--" in p and not p.startswith(".")]
    if not repos:
        out.findings.append(Finding("cache.empty", "warning", f"the cache {cache} holds no repo",
                                    f"warm it: hfcache warm REPO_ID... --cache-dir {cache}"))
    out.findings += _unsafe_findings(cache, out)
    unreadable, owners = _walk_access(cache)
    if unreadable:
        shown = ", ".join(unreadable[:_UNREADABLE_SHOWN]) + (
            f" (and {len(unreadable) - _UNREADABLE_SHOWN} more)" if len(unreadable) > _UNREADABLE_SHOWN else "")
        out.findings.append(Finding(
            "cache.unreadable", "error",
            f"{len(unreadable)} entr{'y' if len(unreadable) == 1 else 'ies'} of the cache cannot be read by uid {uid}: "
            f"{shown}; loads fail with PermissionError",
            f"make the cache world-readable in the image (chmod -R a+rX {cache}) or chown it to the runtime user"))
    return owners


def _access_findings(cache: Path, st: os.stat_result, owners: set[int], offline: bool, uid: int | None,
                     gid: int | None, groups: tuple[int, ...], out: _Folder) -> None:
    """Whether this user can write the cache, and if not why (read-only filesystem, owner, a shared cache); when it
    can, whether it can create in ``.locks/`` and every repo folder. Sets ``out.writable``."""
    access_w = os.access(cache, os.W_OK | os.X_OK)
    out.writable = access_w and not out.read_only_fs
    owner_note = (f"owned by uid {st.st_uid} gid {st.st_gid}"
                  + (f" (entries owned by uids {', '.join(map(str, sorted(owners)))})" if len(owners) > 1 else "")
                  + f"; you are uid {uid} gid {gid}")
    if out.read_only_fs:
        out.findings.append(Finding(
            "cache.read_only_fs", "info" if offline else "warning",
            f"the cache is on a read-only filesystem ({owner_note}): fine for offline loads"
            + ("" if offline else
               ", but offline mode is off, so huggingface_hub will try to download into it and fail"),
            None if offline else "export HF_HUB_OFFLINE=1 (hfcache env)"))
    elif not access_w and uid is not None and (outsider := outsider_check(cache, uid, groups)) is not None:
        out.findings.append(Finding(outsider.code, outsider.severity, outsider.message, outsider.fix))
    elif not access_w:
        # A cache whose entries have several owners is shared: a chown -R would lock the others out.
        fix = (share_recipe(cache, st.st_gid, None if st.st_gid in groups else uid) if len(owners) > 1 else
               f"in the image: chown -R {uid}:{gid} {cache} (or COPY --chown / warm as that user); on Kubernetes "
               "volumes: securityContext.fsGroup and group-writable files (chmod -R g+w)")
        out.findings.append(Finding(
            "cache.not_writable", "warning",
            f"the cache is not writable by you ({owner_note}): fine for offline loads, but hfcache warm and any "
            "download by huggingface_hub fail with PermissionError (an image built as root, run as another user)",
            fix))
    else:
        out.findings.append(Finding("cache.writable", "info", f"the cache is writable ({owner_note})"))
        # Writable at the root is not enough: as this user, can it create in .locks/ and in every repo folder?
        checks = [*write_checks(cache, uid, groups), *sharing_checks(cache), flock_check(cache)]
        out.findings += [Finding(c.code, c.severity, c.message, c.fix) for c in checks if c is not None]


def _symlink_findings(cache: Path, env: dict[str, str], out: _Folder) -> None:
    """Symlink support on the cache's filesystem (sets ``out.symlinks``) and ``HF_HUB_DISABLE_SYMLINKS``."""
    out.symlinks = _symlink_support(cache, out.writable)
    if is_true(env.get("HF_HUB_DISABLE_SYMLINKS")):
        out.findings.append(Finding("cache.symlinks_disabled", "info",
                                    "HF_HUB_DISABLE_SYMLINKS is set: downloads store full copies in snapshots/ "
                                    "(a blob shared by revisions is stored once per revision)",
                                    "unset HF_HUB_DISABLE_SYMLINKS unless the filesystem has no symlinks"))
    if out.symlinks is False:
        out.findings.append(Finding(
            "cache.no_symlinks", "warning",
            "the cache's filesystem does not support symlinks: huggingface_hub stores full copies in snapshots/ "
            "(each revision duplicates shared files) and warns about it",
            "put the cache on a filesystem with symlinks (ext4, xfs, overlayfs, tmpfs)"))
    elif out.symlinks is True:
        out.findings.append(Finding("cache.symlinks", "info", "symlinks are supported on the cache's filesystem"))


def _disk_findings(out: _Folder) -> None:
    """Free space on the cache's filesystem: low when under :data:`LOW_DISK_BYTES` and the cache is writable."""
    if out.free_bytes is not None:
        free = _human(out.free_bytes)
        if out.free_bytes < LOW_DISK_BYTES and out.writable:
            out.findings.append(Finding("disk.low", "warning",
                                        f"only {free} free on the cache's filesystem: warming more fails with "
                                        "'no space left'", "free space or move the cache (HF_HUB_CACHE)"))
        else:
            out.findings.append(Finding("disk.free", "info", f"{free} free on the cache's filesystem"))


def modules_cache_findings(cache: Path, env: Mapping[str, str]) -> list[Finding]:
    """Custom code in the cache versus the folder transformers copies it into (``HF_MODULES_CACHE``, see
    :mod:`hfcache.warming.modules_cache`): an error when a cached repo's ``auto_map`` names code and that folder cannot be
    written (every such load then fails with PermissionError; a warning when it already holds every copy, see
    ``modules_cache.holds_code``); a warning per config no parser can read; nothing when no cached repo has custom
    code."""
    from ..warming.modules_cache import custom_code_repos

    found = custom_code_repos(cache) if os.path.isdir(cache) else []  # no PermissionError (Path.is_dir raises)
    findings = [Finding("config.unparsable", "warning", f"{r.repo_id}@{r.commit_hash[:12]}: {r.error}: its loads fail",
                        "fix or re-warm the repo (hfcache verify --repair), or remove it (hfcache prune)")
                for r in found if r.error]
    repos = [r for r in found if not r.error]
    return findings + (_modules_findings(repos, env) if repos else [])


def _modules_findings(repos: list, env: Mapping[str, str]) -> list[Finding]:
    from ..warming.modules_cache import can_create, holds_code, modules_cache

    path, explicit = modules_cache(env)
    names = sorted({r.repo_id for r in repos})
    shown = ", ".join(names[:3]) + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")
    where = f"{path} ({'HF_MODULES_CACHE' if explicit else 'default: $HF_HOME/modules'})"
    if can_create(path):
        return [Finding("modules.writable", "info",
                        f"{len(names)} cached repo(s) run custom code ({shown}); transformers copies it into {where}, "
                        "which is writable")]
    fix = ("HF_MODULES_CACHE is set explicitly (hfcache exec keeps it): point it at a writable folder, e.g. an "
           "emptyDir, or unset it so hfcache exec can choose one") if explicit else (
           "run the application with `hfcache exec` (it points HF_MODULES_CACHE at a private temporary "
           "folder), or export HF_MODULES_CACHE=<a writable folder, e.g. an emptyDir>")
    if all(holds_code(path, r) for r in repos):
        return [Finding("modules.readonly", "warning",
                        f"{len(names)} cached repo(s) run custom code ({shown}); transformers cannot write its modules "
                        f"cache {where}, but it already holds their code: loads work until a repo or revision is added",
                        fix)]
    return [Finding("modules.unwritable", "error",
                    f"{len(names)} cached repo(s) run custom code (auto_map: {shown}), and transformers cannot write "
                    f"its modules cache {where}: every trust_remote_code load fails with PermissionError", fix)]


def _unsafe_findings(cache: Path, out: _Folder) -> list[Finding]:
    """Errors for planted links: a symlinked ``.locks`` (doctor's probes never write through it) and each repo whose
    layout scan flags unsafe (a symlinked ``blobs/``, ``snapshots/<commit>``, ref, ``.no_exist/<commit>``...):
    hfcache leaves those alone and doctor reads no config through them. The scan's repos are kept in ``out.repos``
    (the runtime checks of :mod:`.doctor_runtime` read their refs: one scan per doctor run)."""
    from ..cache.access import unsafe_locks_check
    from ..cache.scan import TOO_DEEP, scan_cache

    found = []
    locks = unsafe_locks_check(cache)
    if locks is not None:
        found.append(Finding(locks.code, locks.severity, locks.message, locks.fix))
    try:  # planted links, and snapshot folder chains deeper than MAX_TREE_DEPTH (not read below)
        out.repos = list(scan_cache(cache).repos)
        unsafe = [(r, r.unsafe or tuple(p for p in r.problems if p.endswith(TOO_DEEP))) for r in out.repos]
    except HfcacheError:
        return found  # cannot be listed: reach_check and the access walk report it
    unsafe = [(r, parts) for r, parts in unsafe if parts]
    if unsafe:
        shown = "; ".join(f"{r.folder}: {', '.join(parts)}" for r, parts in unsafe[:_UNREADABLE_SHOWN])
        more = f" (and {len(unsafe) - _UNREADABLE_SHOWN} more)" if len(unsafe) > _UNREADABLE_SHOWN else ""
        found.append(Finding("cache.unsafe_layout", "error",
                             f"{len(unsafe)} repo folder(s) hold planted links, files where folders belong or folder "
                             f"chains deeper than {MAX_TREE_DEPTH} levels: "
                             f"{shown}{more}; hfcache leaves them alone (check fails them, export refuses them)",
                             "remove the symlink or file (or the repo folder) and re-warm the repo"))
    return found


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _walk_access(cache: Path) -> tuple[list[str], set[int]]:
    """Entries the current user cannot read (folders: list and enter) and the set of owners, without following
    symlinks out of the cache (a snapshot link is checked through its blob, which the walk visits too)."""
    unreadable: list[str] = []
    owners: set[int] = set()
    # Bounded and iterative (os.walk recurses per level on Python 3.11: a planted 1,000-level chain was exit 70);
    # a snapshot chain deeper than the bound is reported by the layout scan (_unsafe_findings).
    for root, dirs, files in walk_tree(cache, max_depth=MAX_TREE_DEPTH + _SNAPSHOT_DEPTH, onerror=lambda exc:
                                       unreadable.append(os.path.relpath(exc.filename, cache) if exc.filename
                                                         else str(exc))):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            owners.add(st.st_uid)
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)
            if not os.access(path, mode):
                unreadable.append(os.path.relpath(path, cache))
    return sorted(set(unreadable)), owners


def _symlink_support(cache: Path, writable: bool | None) -> bool | None:
    """Probe like huggingface_hub's ``are_symlinks_supported`` when the cache is writable; otherwise judge from what
    the cache holds (a snapshot entry that is a symlink proves support; None when nothing tells).

    The probe folder is made, filled and removed relative to descriptors (the root's, then its own, opened with
    ``O_NOFOLLOW``): in a group-writable root a member can rename it away and put a link in its place, and a path
    rebuilt afterwards would then write wherever that link points."""
    if writable:
        try:
            return _probe_symlinks(cache)
        except OSError:
            return None
    for snapshots in cache.glob("*--*/snapshots"):
        for root, _dirs, names in walk_tree(snapshots):  # bounded: no rglob recursion through a planted chain
            if any(os.path.islink(os.path.join(root, name)) for name in names):
                return True
    return None


def _probe_symlinks(cache: Path) -> bool:
    """Create ``.hfcache-doctor-<random>/{src,dst -> src}`` below the cache root through folder descriptors and
    remove it; True when the symlink could be made.

    Raises:
        OSError: the probe folder could not be made or opened (a link swapped in is refused, ``ELOOP``).
    """
    name = f".hfcache-doctor-{uuid.uuid4().hex}"
    with safefs.dir_fd(cache) as root_fd:
        os.mkdir(name, 0o700, dir_fd=root_fd)
        try:
            probe = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            try:
                os.close(os.open("src", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=probe))
                try:
                    os.symlink("src", "dst", dir_fd=probe)
                    return True
                except OSError:
                    return False
            finally:
                for entry in ("dst", "src"):
                    with contextlib.suppress(OSError):
                        os.unlink(entry, dir_fd=probe)
                os.close(probe)
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=root_fd)


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"

