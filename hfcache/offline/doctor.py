"""doctor: what a process started from this environment will do with the Hugging Face cache, and what is wrong.

Each finding has a stable ``code``, a ``severity`` (``error``: loads will fail or use another cache than intended;
``warning``: a trap that bites under some conditions; ``info``: a fact worth seeing) and a ``fix``. Checks:

- the effective cache path and the setting that chose it, resolved exactly as huggingface_hub ``constants.py`` does
  (``HF_HUB_CACHE``, else the legacy ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``; a variable set to an empty string counts
  as set, and yields a path relative to the working directory);
- offline mode as huggingface_hub computes it (``HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE``: a non-empty
  ``HF_HUB_OFFLINE=0`` masks ``TRANSFORMERS_OFFLINE=1``), values it does not understand, telemetry and token flags;
- ``TRANSFORMERS_CACHE`` (and its older names), ignored by transformers 5 (no reference left in its source);
  ``HF_HOME`` and ``HF_HUB_CACHE`` disagreeing;
- the cache folder: present, readable by this user, writable, owner uid/gid versus the current user (the
  image-built-as-root, pod-runs-as-1000 problem), read-only filesystem, symlink support (probed like
  huggingface_hub ``file_download.py: are_symlinks_supported``), free disk space;
- as the current user (:mod:`hfcache.cache.access`): reaching and listing the cache root, creating files in ``.locks/``
  and opening its lock files, writing every repo folder; in a group-shared cache, folders the group cannot write;
  whether flock works on the filesystem;
- installed versions of huggingface_hub, transformers, tokenizers (and optional tokenizer packages).

Reads only, except the probes: a temporary folder (symlinks) and files (``.locks/`` creation, flock) in the cache,
removed at once (as huggingface_hub's symlink probe does).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..cache.access import flock_check, outsider_check, reach_check, share_recipe, sharing_checks, write_checks
from ..cache.layout import resolve_cache_dir
from ..errors import HfcacheError

SEVERITIES = ("error", "warning", "info")
#: Below this much free space a cache cannot take a model (or a few more tokenizers).
LOW_DISK_BYTES = 1 << 30
# huggingface_hub constants.py: ENV_VARS_TRUE_VALUES (compared after .upper()).
_TRUE = {"1", "ON", "YES", "TRUE"}
_FALSE = {"0", "OFF", "NO", "FALSE"}
_PACKAGES = ("huggingface_hub", "transformers", "tokenizers", "hf_xet", "sentencepiece", "protobuf", "tiktoken")
_LEGACY_TRANSFORMERS_CACHES = ("TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE", "PYTORCH_PRETRAINED_BERT_CACHE")
_UNREADABLE_SHOWN = 3


@dataclass(frozen=True)
class Finding:
    """One thing doctor found.

    Attributes:
        code (str): stable identifier, e.g. ``offline.masked``.
        severity (str): ``error``, ``warning`` or ``info``.
        message (str): what is the case, and why it matters.
        fix (str | None): what to do about it.
    """

    code: str
    severity: str
    message: str
    fix: str | None = None


@dataclass(frozen=True)
class DoctorReport:
    """doctor's result.

    Attributes:
        cache_dir (str): the cache examined (``--cache-dir``, else the effective one).
        effective_cache_dir (str): the cache huggingface_hub would use in this environment.
        cache_source (str): the setting that chose the effective cache: ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``,
            ``HF_HOME``, ``XDG_CACHE_HOME`` or ``default``.
        offline (bool): huggingface_hub's offline mode in this environment.
        uid (int | None), gid (int | None), groups (tuple[int, ...]): the current user (None off POSIX).
        owner_uid (int | None), owner_gid (int | None): owner of the cache folder (None when it does not exist).
        writable (bool | None), read_only_fs (bool | None), symlinks (bool | None): None when it cannot be told.
        free_bytes (int | None): free space on the cache's filesystem (its nearest existing parent's).
        versions (dict[str, str | None]): installed distribution versions (None: not installed).
        findings (tuple[Finding, ...]): errors first, then warnings, then infos.
    """

    cache_dir: str
    effective_cache_dir: str
    cache_source: str
    offline: bool
    uid: int | None
    gid: int | None
    groups: tuple[int, ...]
    owner_uid: int | None
    owner_gid: int | None
    writable: bool | None
    read_only_fs: bool | None
    symlinks: bool | None
    free_bytes: int | None
    versions: dict[str, str | None] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def _is_true(value: str | None) -> bool:
    return value is not None and value.upper() in _TRUE


def hub_cache_setting(environ: Mapping[str, str]) -> tuple[Path, str]:
    """The cache huggingface_hub uses in ``environ`` and the variable that chose it.

    Mirrors huggingface_hub 2.4.0 ``constants.py`` (``HF_HOME``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HUB_CACHE``, each
    through ``os.getenv(name, default)``, then ``expandvars(expanduser(...))``) and ``file_download.py``
    (``Path(cache_dir).expanduser().resolve()``): a variable set to the empty string is *set*.

    Returns:
        (absolute path, source) with source ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``,
        ``XDG_CACHE_HOME`` or ``default``.
    """
    def expand(value: str) -> str:
        return os.path.expandvars(os.path.expanduser(value))

    # The same expressions, in the same order, as constants.py (which expands HF_HOME's result a second time too).
    home = expand(environ["HF_HOME"] if "HF_HOME" in environ else
                  os.path.join(environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
                               "huggingface"))
    legacy = environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    hub = expand(environ.get("HF_HUB_CACHE", legacy))
    source = next((name for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
                   if name in environ), "default")
    return Path(hub).expanduser().resolve(), source


def doctor(cache_dir: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> DoctorReport:
    """Examine the environment and the cache.

    Args:
        cache_dir: the cache to examine (default: the effective one); it is also compared with the effective one.
        environ: the environment to judge (default: ``os.environ``).

    Returns:
        DoctorReport; ``exit_code`` is 1 when any finding is an error.
    """
    env = dict(os.environ if environ is None else environ)
    findings: list[Finding] = []
    effective, source = hub_cache_setting(env)
    cache = resolve_cache_dir(cache_dir).resolve() if cache_dir is not None else effective
    findings += _cache_setting_findings(env, effective, source, cache, cache_dir is not None)
    offline, offline_findings = _offline_findings(env)
    findings += offline_findings
    versions = _versions()
    findings += _legacy_cache_findings(env, effective, versions)
    findings += _version_findings(versions)
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    gid = os.getegid() if hasattr(os, "getegid") else None
    groups = tuple(sorted(set(os.getgroups()) | ({gid} if gid is not None else set()))) \
        if hasattr(os, "getgroups") else ()
    folder = _examine_folder(cache, env, offline, uid, gid, groups)
    findings += folder.findings
    findings += modules_cache_findings(cache, env)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return DoctorReport(
        cache_dir=str(cache), effective_cache_dir=str(effective), cache_source=source, offline=offline,
        uid=uid, gid=gid, groups=groups, owner_uid=folder.owner_uid, owner_gid=folder.owner_gid,
        writable=folder.writable, read_only_fs=folder.read_only_fs, symlinks=folder.symlinks,
        free_bytes=folder.free_bytes, versions=versions, findings=tuple(findings))


# ------------------------------------------------------------------------------------------------ environment


def _cache_setting_findings(env: dict[str, str], effective: Path, source: str, cache: Path,
                            explicit: bool) -> list[Finding]:
    found = [Finding("cache.path", "info", f"huggingface_hub uses the cache {effective} (chosen by "
                     f"{'no setting: the default' if source == 'default' else source})")]
    for name in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        if name in env and not env[name].strip():
            found.append(Finding(
                "env.empty", "error",
                f"{name} is set to an empty string: huggingface_hub treats it as set and uses a path relative to the "
                f"working directory ({effective})",
                f"unset {name} or give it an absolute path"))
    if explicit and cache != effective:
        found.append(Finding(
            "cache.not_effective", "warning",
            f"processes started from this environment use {effective} (from "
            f"{'the default' if source == 'default' else source}), not {cache}",
            f"export HF_HUB_CACHE={cache} (all the settings: hfcache env --cache-dir {cache})"))
    if "HF_HOME" in env and "HF_HUB_CACHE" in env and env["HF_HOME"].strip() and env["HF_HUB_CACHE"].strip():
        home_hub = Path(os.path.expandvars(os.path.expanduser(env["HF_HOME"]))).expanduser().resolve() / "hub"
        if home_hub != effective:
            found.append(Finding(
                "env.home_mismatch", "warning",
                f"HF_HOME ({env['HF_HOME']}) and HF_HUB_CACHE ({env['HF_HUB_CACHE']}) disagree: models and tokenizers "
                f"come from HF_HUB_CACHE, while HF_HOME still holds the token, trust_remote_code modules and the Xet "
                f"cache, and tools that assume $HF_HOME/hub look in {home_hub}",
                (f"export HF_HOME={effective.parent}" if effective.name == "hub" else
                 "unset HF_HOME, or set HF_HUB_CACHE=$HF_HOME/hub") + " so that both name one cache"))
    return found


def _offline_findings(env: dict[str, str]) -> tuple[bool, list[Finding]]:
    hub_raw, tf_raw = env.get("HF_HUB_OFFLINE"), env.get("TRANSFORMERS_OFFLINE")
    # huggingface_hub constants.py: _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    offline = _is_true(hub_raw or tf_raw)
    found = []
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                 "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_HUB_DISABLE_SYMLINKS"):
        value = env.get(name)
        if value and value.upper() not in _TRUE | _FALSE:
            found.append(Finding("env.not_boolean", "warning",
                                 f"{name}={value!r} is not one of 1/ON/YES/TRUE: huggingface_hub reads it as false",
                                 f"export {name}=1"))
    if hub_raw and not _is_true(hub_raw) and _is_true(tf_raw):
        found.append(Finding(
            "offline.masked", "error",
            f"HF_HUB_OFFLINE={hub_raw} masks TRANSFORMERS_OFFLINE={tf_raw}: huggingface_hub reads HF_HUB_OFFLINE "
            "first (constants.py), so this process is ONLINE; a cached load still makes requests and hangs on an "
            "endpoint that never answers",
            "export HF_HUB_OFFLINE=1 (or unset it)"))
    elif offline:
        shown = f"HF_HUB_OFFLINE={hub_raw}" if _is_true(hub_raw) else f"TRANSFORMERS_OFFLINE={tf_raw}"
        found.append(Finding("offline.on", "info", f"offline mode is on ({shown}): no request reaches the endpoint"))
    else:
        found.append(Finding(
            "offline.off", "warning",
            "offline mode is off: every cached tokenizer load makes ~3 requests, and hangs forever against an "
            "endpoint that accepts connections and never answers",
            "export HF_HUB_OFFLINE=1 at runtime (all the settings: hfcache env)"))
    telemetry = any(_is_true(env.get(n)) for n in ("HF_HUB_DISABLE_TELEMETRY", "DISABLE_TELEMETRY", "DO_NOT_TRACK"))
    if not telemetry:
        found.append(Finding("env.telemetry", "info",
                             "telemetry is not disabled" + (" (offline mode turns it off anyway)" if offline else ""),
                             "export HF_HUB_DISABLE_TELEMETRY=1"))
    if not _is_true(env.get("HF_HUB_DISABLE_IMPLICIT_TOKEN")):
        found.append(Finding(
            "env.implicit_token", "info",
            "every file lookup reads the stored token and may refresh an OAuth login, even offline "
            "(huggingface_hub file_download.py builds auth headers first)",
            "export HF_HUB_DISABLE_IMPLICIT_TOKEN=1"))
    return offline, found


def _legacy_cache_findings(env: dict[str, str], effective: Path, versions: dict[str, str | None]) -> list[Finding]:
    found = []
    major = _major(versions.get("transformers"))
    for name in _LEGACY_TRANSFORMERS_CACHES:
        if name not in env:
            continue
        value = env[name]
        target = Path(os.path.expandvars(os.path.expanduser(value or "."))).expanduser().resolve()
        if major is not None and major < 5:
            found.append(Finding("env.transformers_cache", "warning",
                                 f"{name}={value} is deprecated (transformers {versions['transformers']})",
                                 f"use HF_HUB_CACHE={target} and unset {name}"))
        elif target != effective:
            found.append(Finding(
                "env.transformers_cache", "error",
                f"{name}={value} is ignored by transformers 5 (silently): tokenizers and models come from {effective}, "
                f"not {target}",
                f"export HF_HUB_CACHE={target} and unset {name}"))
        else:
            found.append(Finding("env.transformers_cache", "warning",
                                 f"{name}={value} is ignored by transformers 5; it happens to name the effective cache",
                                 f"unset {name}; HF_HUB_CACHE is the setting that counts"))
    if "HUGGINGFACE_HUB_CACHE" in env:
        if "HF_HUB_CACHE" in env:
            found.append(Finding("env.legacy_hub_cache", "warning",
                                 "HUGGINGFACE_HUB_CACHE is ignored: HF_HUB_CACHE is set and wins",
                                 "unset HUGGINGFACE_HUB_CACHE"))
        else:
            found.append(Finding("env.legacy_hub_cache", "warning",
                                 "HUGGINGFACE_HUB_CACHE is a deprecated name (huggingface_hub still reads it)",
                                 f"export HF_HUB_CACHE={effective} and unset HUGGINGFACE_HUB_CACHE"))
    return found


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = None
    return found


def _major(version: str | None) -> int | None:
    try:
        return int(version.split(".")[0]) if version else None
    except ValueError:
        return None


def _version_findings(versions: dict[str, str | None]) -> list[Finding]:
    found = [Finding("versions", "info", ", ".join(f"{name} {versions[name] or 'not installed'}"
                                                   for name in ("huggingface_hub", "transformers", "tokenizers")))]
    if versions.get("transformers") is None:
        found.append(Finding("versions.transformers", "warning",
                             "transformers is not installed: AutoTokenizer cannot load anything",
                             "pip install transformers"))
    elif _major(versions["transformers"]) != 5:
        found.append(Finding("versions.transformers", "warning",
                             f"transformers {versions['transformers']}: hfcache's facts were checked against 5.x",
                             "pip install 'transformers>=5.20'"))
    if versions.get("huggingface_hub") is not None and _major(versions["huggingface_hub"]) != 2:
        found.append(Finding("versions.huggingface_hub", "warning",
                             f"huggingface_hub {versions['huggingface_hub']}: hfcache's facts were checked against 2.x",
                             "pip install 'huggingface-hub>=2.4,<3'"))
    if versions.get("tokenizers") is None and versions.get("transformers") is not None:
        found.append(Finding("versions.tokenizers", "warning",
                             "tokenizers is not installed: no fast tokenizers (tokenizer.json cannot be used)",
                             "pip install tokenizers"))
    missing = [n for n in ("sentencepiece", "protobuf") if versions.get(n) is None]
    if missing:
        found.append(Finding("versions.optional", "info",
                             f"not installed: {', '.join(missing)} (SentencePiece-only tokenizers need them)",
                             f"pip install {' '.join(missing)}"))
    return found


# ------------------------------------------------------------------------------------------------ the folder


@dataclass
class _Folder:
    findings: list[Finding] = field(default_factory=list)
    owner_uid: int | None = None
    owner_gid: int | None = None
    writable: bool | None = None
    read_only_fs: bool | None = None
    symlinks: bool | None = None
    free_bytes: int | None = None


def _nearest_existing(path: Path) -> Path:
    while not os.path.exists(path) and path != path.parent:
        path = path.parent
    return path


def _examine_folder(cache: Path, env: dict[str, str], offline: bool, uid: int | None, gid: int | None,
                    groups: tuple[int, ...]) -> _Folder:
    out = _Folder()
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
    repos = [p for p in _listdir(cache) if "--" in p and not p.startswith(".")]
    if not repos:
        out.findings.append(Finding("cache.empty", "warning", f"the cache {cache} holds no repo",
                                    f"warm it: hfcache warm REPO_ID... --cache-dir {cache}"))
    out.findings += _unsafe_findings(cache)
    unreadable, owners = _walk_access(cache)
    if unreadable:
        shown = ", ".join(unreadable[:_UNREADABLE_SHOWN]) + (
            f" (and {len(unreadable) - _UNREADABLE_SHOWN} more)" if len(unreadable) > _UNREADABLE_SHOWN else "")
        out.findings.append(Finding(
            "cache.unreadable", "error",
            f"{len(unreadable)} entr{'y' if len(unreadable) == 1 else 'ies'} of the cache cannot be read by uid {uid}: "
            f"{shown}; loads fail with PermissionError",
            f"make the cache world-readable in the image (chmod -R a+rX {cache}) or chown it to the runtime user"))
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
    out.symlinks = _symlink_support(cache, out.writable)
    if _is_true(env.get("HF_HUB_DISABLE_SYMLINKS")):
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
    if out.free_bytes is not None:
        free = _human(out.free_bytes)
        if out.free_bytes < LOW_DISK_BYTES and out.writable:
            out.findings.append(Finding("disk.low", "warning",
                                        f"only {free} free on the cache's filesystem: warming more fails with "
                                        "'no space left'", "free space or move the cache (HF_HUB_CACHE)"))
        else:
            out.findings.append(Finding("disk.free", "info", f"{free} free on the cache's filesystem"))
    return out


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


def _unsafe_findings(cache: Path) -> list[Finding]:
    """Errors for planted links: a symlinked ``.locks`` (doctor's probes never write through it) and each repo whose
    layout scan flags unsafe (a symlinked ``blobs/``, ``snapshots/<commit>``, ref, ``.no_exist/<commit>``...):
    hfcache leaves those alone and doctor reads no config through them."""
    from ..cache.access import unsafe_locks_check
    from ..cache.scan import scan_cache

    found = []
    locks = unsafe_locks_check(cache)
    if locks is not None:
        found.append(Finding(locks.code, locks.severity, locks.message, locks.fix))
    try:
        unsafe = [r for r in scan_cache(cache).repos if r.unsafe]
    except HfcacheError:
        return found  # cannot be listed: reach_check and the access walk report it
    if unsafe:
        shown = "; ".join(f"{r.folder}: {', '.join(r.unsafe)}" for r in unsafe[:_UNREADABLE_SHOWN])
        more = f" (and {len(unsafe) - _UNREADABLE_SHOWN} more)" if len(unsafe) > _UNREADABLE_SHOWN else ""
        found.append(Finding("cache.unsafe_layout", "error",
                             f"{len(unsafe)} repo folder(s) hold planted links or files where folders belong: "
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
    for root, dirs, files in os.walk(cache, onerror=lambda exc: unreadable.append(
            os.path.relpath(exc.filename, cache) if exc.filename else str(exc))):
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
    the cache holds (a snapshot entry that is a symlink proves support; None when nothing tells)."""
    if writable:
        try:
            with tempfile.TemporaryDirectory(dir=cache, prefix=".hfcache-doctor-") as tmp:
                (Path(tmp) / "src").touch()
                try:
                    os.symlink("src", Path(tmp) / "dst")
                    return True
                except OSError:
                    return False
        except OSError:
            return None
    for snapshots in cache.glob("*--*/snapshots"):
        for entry in snapshots.rglob("*"):
            if entry.is_symlink():
                return True
    return None


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
