"""``hfcache doctor``'s checks of the cache folder as the current user (reachable, readable, writable and why not,
planted links, symlinks, free space), the folder transformers copies custom code into, and huggingface_hub 2.4's shared
Xet blob store (read through :mod:`hfcache.cache.shared_store`: no link is followed)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..bounds import MAX_TREE_DEPTH
from ..cache import safefs
from ..cache.access import flock_check, outsider_check, reach_check, share_recipe, sharing_checks, write_checks
from ..cache.fsops import create_at, open_dir_at, walk_tree
from ..cache.root import describe_cache_dir
from ..cache.shared_store import DISABLING_VARIABLES, MARKER, STORE_DIR, StoreProblem, open_store_dir
from ..errors import HfcacheError
from ..names import is_sha256
from ..units import human_size
from .doctor_settings import Finding, is_true

#: Below this much free space a cache cannot take a model (or a few more tokenizers).
LOW_DISK_BYTES = 1 << 30
_SHOWN = 3
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


def _finding(check) -> Finding:  # a hfcache.cache.access check result
    return Finding(check.code, check.severity, check.message, check.fix)


def _more(items: list, shown: int = _SHOWN) -> str:
    return f" (and {len(items) - shown} more)" if len(items) > shown else ""


def examine_folder(cache: Path, env: dict[str, str], offline: bool, uid: int | None, gid: int | None,
                   groups: tuple[int, ...]) -> _Folder:
    """The cache folder as the current user finds it (findings in the order doctor reports them)."""
    out = _Folder()
    base = cache
    while not os.path.exists(base) and base != base.parent:
        base = base.parent  # free space and read-only flag of the nearest existing parent's filesystem
    with contextlib.suppress(OSError):
        out.free_bytes = shutil.disk_usage(base).free
    with contextlib.suppress(OSError, AttributeError):
        out.read_only_fs = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
    try:
        os.stat(cache)
    except FileNotFoundError:
        out.findings.append(Finding("cache.missing", "error", f"the cache {cache} does not exist",
                                    f"warm it: hfcache warm REPO_ID... --cache-dir {cache}"))
        return out
    except OSError:
        pass  # cannot even be reached: reach_check says by whom
    if (unreachable := reach_check(cache, uid, groups) if uid is not None else None) is not None:
        out.findings.append(_finding(unreachable))
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
    if out.free_bytes is not None:
        free = human_size(out.free_bytes)
        if out.free_bytes < LOW_DISK_BYTES and out.writable:
            out.findings.append(Finding("disk.low", "warning",
                                        f"only {free} free on the cache's filesystem: warming more fails with "
                                        "'no space left'", "free space or move the cache (HF_HUB_CACHE)"))
        else:
            out.findings.append(Finding("disk.free", "info", f"{free} free on the cache's filesystem"))
    return out


def _content_findings(cache: Path, uid: int | None, out: _Folder) -> set[int]:
    """No repo, planted links, entries this user cannot read; returns the owners of the cache's entries."""
    try:
        names = os.listdir(cache)
    except OSError:
        names = []
    try:
        found = describe_cache_dir(cache)
    except HfcacheError:  # cannot be listed: the access findings say so
        found = None
    if found is not None and not found.is_cache:  # an HF_HOME, a repo folder: every command's error, the cache meant
        error = found.error()
        out.findings.append(Finding("cache.not_a_cache", "error", error.message, error.hint))
    elif not [p for p in names if "--" in p and not p.startswith(".")]:
        out.findings.append(Finding("cache.empty", "warning", f"the cache {cache} holds no repo",
                                    f"warm it: hfcache warm REPO_ID... --cache-dir {cache}"))
    out.findings += _unsafe_findings(cache, out)
    unreadable, owners = _walk_access(cache)
    if unreadable:
        out.findings.append(Finding(
            "cache.unreadable", "error",
            f"{len(unreadable)} entr{'y' if len(unreadable) == 1 else 'ies'} of the cache cannot be read by uid {uid}: "
            f"{', '.join(unreadable[:_SHOWN])}{_more(unreadable)}; loads fail with PermissionError",
            f"make the cache world-readable in the image (chmod -R a+rX {cache}) or chown it to the runtime user"))
    return owners


def _access_findings(cache: Path, st: os.stat_result, owners: set[int], offline: bool, uid: int | None,
                     gid: int | None, groups: tuple[int, ...], out: _Folder) -> None:
    """Whether this user can write the cache and if not why; if so, ``.locks/`` and every repo folder too."""
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
        out.findings.append(_finding(outsider))
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
        out.findings += [_finding(c) for c in checks if c is not None]


def _symlink_findings(cache: Path, env: dict[str, str], out: _Folder) -> None:
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


def modules_cache_findings(cache: Path, env: Mapping[str, str]) -> list[Finding]:
    """Custom code in the cache versus ``HF_MODULES_CACHE`` (:mod:`hfcache.warming.modules_cache`):
    ``modules.unwritable`` (error), ``modules.readonly`` (warning: it holds every copy already), ``modules.writable``
    (info); ``config.unparsable`` (warning) per config no parser reads; nothing without custom code."""
    from ..warming.modules_cache import can_create, custom_code_repos, holds_code, modules_cache

    found = custom_code_repos(cache) if os.path.isdir(cache) else []  # no PermissionError (Path.is_dir raises)
    findings = [Finding("config.unparsable", "warning", f"{r.repo_id}@{r.commit_hash[:12]}: {r.error}: its loads fail",
                        "fix or re-warm the repo (hfcache verify --repair), or remove it (hfcache prune)")
                for r in found if r.error]
    if not (repos := [r for r in found if not r.error]):
        return findings
    path, explicit = modules_cache(env)
    names = sorted({r.repo_id for r in repos})
    shown = ", ".join(names[:3]) + _more(names, 3)
    where = f"{path} ({'HF_MODULES_CACHE' if explicit else 'default: $HF_HOME/modules'})"
    if can_create(path):
        return findings + [Finding(
            "modules.writable", "info", f"{len(names)} cached repo(s) run custom code ({shown}); transformers copies "
            f"it into {where}, which is writable")]
    fix = ("HF_MODULES_CACHE is set explicitly (hfcache exec keeps it): point it at a writable folder, e.g. an "
           "emptyDir, or unset it so hfcache exec can choose one") if explicit else (
           "run the application with `hfcache exec` (it points HF_MODULES_CACHE at a private temporary "
           "folder), or export HF_MODULES_CACHE=<a writable folder, e.g. an emptyDir>")
    if all(holds_code(path, r) for r in repos):
        return findings + [Finding(
            "modules.readonly", "warning", f"{len(names)} cached repo(s) run custom code ({shown}); transformers "
            f"cannot write its modules cache {where}, but it already holds their code: loads work until a repo or "
            "revision is added", fix)]
    return findings + [Finding(
        "modules.unwritable", "error", f"{len(names)} cached repo(s) run custom code (auto_map: {shown}), and "
        f"transformers cannot write its modules cache {where}: every trust_remote_code load fails with "
        "PermissionError", fix)]


def _unsafe_findings(cache: Path, out: _Folder) -> list[Finding]:
    """Errors for a symlinked ``.locks`` and repos scanned unsafe or too deep (the scan kept in ``out.repos``)."""
    from ..cache.access import unsafe_locks_check
    from ..cache.scan import TOO_DEEP, scan_cache

    locks = unsafe_locks_check(cache)
    found = [] if locks is None else [_finding(locks)]
    try:
        out.repos = list(scan_cache(cache).repos)
    except HfcacheError:
        return found  # cannot be listed: reach_check and the access walk report it
    unsafe = [(r, r.unsafe or tuple(p for p in r.problems if p.endswith(TOO_DEEP))) for r in out.repos]
    if unsafe := [(r, parts) for r, parts in unsafe if parts]:
        shown = "; ".join(f"{r.folder}: {', '.join(parts)}" for r, parts in unsafe[:_SHOWN])
        found.append(Finding("cache.unsafe_layout", "error",
                             f"{len(unsafe)} repo folder(s) hold planted links, files where folders belong or folder "
                             f"chains deeper than {MAX_TREE_DEPTH} levels: "
                             f"{shown}{_more(unsafe)}; hfcache leaves them alone (check fails them, export refuses "
                             "them)", "remove the symlink or file (or the repo folder) and re-warm the repo"))
    return found


def _walk_access(cache: Path) -> tuple[list[str], set[int]]:
    """Entries the current user cannot read, and their owners; no link followed, bounded."""
    unreadable: list[str] = []
    owners: set[int] = set()
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
            if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
                unreadable.append(os.path.relpath(path, cache))
    return sorted(set(unreadable)), owners


def _symlink_support(cache: Path, writable: bool | None) -> bool | None:
    """Probe like huggingface_hub's ``are_symlinks_supported`` when writable, else look for a snapshot symlink."""
    if not writable:
        for snapshots in cache.glob("*--*/snapshots"):
            for root, _dirs, names in walk_tree(snapshots):  # bounded: no rglob recursion through a planted chain
                if any(os.path.islink(os.path.join(root, name)) for name in names):
                    return True
        return None
    # Made and removed relative to folder descriptors: a group member can swap the probe for a link meanwhile.
    name = f".hfcache-doctor-{uuid.uuid4().hex}"
    try:
        with safefs.dir_fd(cache) as root_fd:
            os.mkdir(name, 0o700, dir_fd=root_fd)
            try:
                probe = open_dir_at(root_fd, name)  # a link swapped in is refused (ELOOP)
                try:
                    os.close(create_at(probe, "src", 0o600))
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
    except OSError:
        return None


@dataclass(frozen=True)
class StoreState:
    """The shared store of a cache, as doctor found it (``doctor --json``'s ``shared_store``): ``path``
    (``<cache>/blobs``), ``present`` (something is there), ``marked`` (a real folder with the library's marker: it is
    used), ``payloads``/``payload_bytes`` (regular files named by a 64-hex Xet hash in their 2-hex prefix folder),
    ``problems`` (a few things not as the library writes them), ``disabling_variables`` (those of
    :data:`~hfcache.cache.shared_store.DISABLING_VARIABLES` set), ``enabled`` (neither reads as true)."""

    path: str
    present: bool
    marked: bool
    payloads: int
    payload_bytes: int
    problems: tuple[str, ...]
    disabling_variables: dict[str, str]
    enabled: bool


def examine_store(cache: Path, env: Mapping[str, str]) -> tuple[StoreState, list[Finding]]:
    """The store of ``cache`` and doctor's findings on it (``store.present``/``disabled``/``unusable``/``hostile``)."""
    set_vars = {name: env[name] for name in DISABLING_VARIABLES if name in env}
    disabled = [name for name, value in set_vars.items() if is_true(value)]
    path = cache / STORE_DIR
    count, size, problems = 0, 0, []
    try:
        store_fd = open_store_dir(cache)
    except FileNotFoundError:
        store_fd = None
    except (OSError, StoreProblem) as exc:
        store_fd = None
        problems.append(str(exc))
    if store_fd is not None:
        try:
            count, size = _payloads(store_fd, path, problems)
        finally:
            os.close(store_fd)
    state = StoreState(path=str(path), present=os.path.lexists(path), marked=store_fd is not None, payloads=count,
                       payload_bytes=size, problems=tuple(problems[:_SHOWN]), disabling_variables=set_vars,
                       enabled=not disabled)
    return state, _store_findings(state, disabled)


def _payloads(store_fd: int, path: Path, problems: list[str]) -> tuple[int, int]:
    """(count, bytes) of the payloads below the store's fd; entries of the wrong kind go to ``problems``."""
    count = size = 0
    try:
        with os.scandir(store_fd) as it:
            prefixes = [e.name for e in it if len(e.name) == 2 and all(c in "0123456789abcdef" for c in e.name)]
    except OSError as exc:
        problems.append(f"{path} cannot be listed ({exc.strerror})")
        return 0, 0
    for prefix in sorted(prefixes):
        try:
            prefix_fd = open_dir_at(store_fd, prefix)
        except OSError:
            problems.append(f"{path}/{prefix} is a symlink or not a folder")
            continue
        try:
            with os.scandir(prefix_fd) as it:
                for e in it:
                    if not is_sha256(e.name) or not e.name.startswith(prefix):
                        continue
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        count += 1
                        size += st.st_size
                    else:
                        problems.append(f"{path}/{prefix}/{e.name} is not a regular file (a link, FIFO or folder)")
        except OSError as exc:
            problems.append(f"{path}/{prefix} cannot be listed ({exc.strerror})")
        finally:
            os.close(prefix_fd)
    return count, size


def _store_findings(state: StoreState, disabled: list[str]) -> list[Finding]:
    findings = []
    if state.marked:
        findings.append(Finding("store.present", "info",
                                f"shared Xet blob store {state.path}: {state.payloads} payload(s), "
                                f"{state.payload_bytes} bytes (huggingface_hub 2.4 keeps each Xet file once per "
                                "cache; repo blobs link to it)"))
    elif state.present:
        findings.append(Finding("store.unusable", "warning",
                                f"{state.path} is not a shared blob store huggingface_hub uses: "
                                f"{'; '.join(state.problems) or 'no ' + MARKER}",
                                f"remove {state.path} if nothing there is yours (huggingface_hub never adopts an "
                                "unmarked folder)"))
    if state.marked and state.problems:
        findings.append(Finding("store.hostile", "warning",
                                f"entries of the shared store that are not what huggingface_hub writes: "
                                f"{'; '.join(state.problems)}", "remove them; hfcache never follows them"))
    if disabled:
        shown = ", ".join(f"{name}={state.disabling_variables[name]}" for name in disabled)
        findings.append(Finding("store.disabled", "info",
                                f"{shown}: huggingface_hub does not use the shared Xet blob store in this environment "
                                "(new downloads are plain repo blobs; links already in the cache still load)"))
    return findings
