"""doctor: what a process started from this environment will do with the Hugging Face cache, and what is wrong
(:class:`.doctor_settings.Finding`; docs/offline.md, "doctor"). Reads only, but for probes removed at once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..cache.root import refuse_misplaced_cache, resolve_cache_dir
from ..warming.run import process_umask
from . import doctor_settings as settings
from .doctor_folder import StoreState, examine_folder, examine_store, modules_cache_findings
from .doctor_runtime import read_only_online_findings, umask_findings
from .doctor_settings import SEVERITIES, Finding


@dataclass(frozen=True)
class DoctorReport:
    """doctor's result: ``cache_dir`` examined (``--cache-dir``, else the effective one), ``effective_cache_dir``
    huggingface_hub would use here and the ``cache_source`` setting that chose it; ``uid``/``gid``/``groups`` None
    off POSIX, ``owner_*`` None without a cache folder, the ``bool | None`` fields None when they cannot be told;
    ``free_bytes`` of the nearest existing parent's filesystem; ``versions`` None: not installed; ``findings`` errors
    first, then warnings, then infos; ``shared_store`` None when the cache is missing."""

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
    shared_store: StoreState | None = None
    umask: int | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def hub_cache_setting(environ: Mapping[str, str]) -> tuple[Path, str]:
    """(absolute path, source): the cache huggingface_hub uses in ``environ`` and the variable that chose it
    (``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``, ``XDG_CACHE_HOME`` or ``default``), as huggingface_hub
    2.4.0 ``constants.py`` (``os.getenv``, then ``expandvars(expanduser())``) and ``file_download.py``
    (``.expanduser().resolve()``) compute it: a variable set to the empty string is *set*."""
    from ..warming.modules_cache import hf_home

    # The same expressions, in the same order, as constants.py (which expands HF_HOME's result a second time too).
    legacy = environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home(environ), "hub"))
    hub = os.path.expandvars(os.path.expanduser(environ.get("HF_HUB_CACHE", legacy)))
    source = next((name for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
                   if name in environ), "default")
    return Path(hub).expanduser().resolve(), source


def doctor(cache_dir: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> DoctorReport:
    """Examine ``environ`` (default: ``os.environ``) and ``cache_dir`` (default: the effective cache; else compared
    with it). The report's ``exit_code`` is 1 when any finding is an error."""
    env = dict(os.environ if environ is None else environ)
    findings: list[Finding] = []
    effective, source = hub_cache_setting(env)
    cache = resolve_cache_dir(cache_dir).resolve() if cache_dir is not None else effective
    if cache_dir is not None:  # the one rule of every command (an effective cache that is none is a finding)
        refuse_misplaced_cache(cache, empty_ok=False)
    findings += settings.cache_setting_findings(env, effective, source, cache, cache_dir is not None)
    offline, offline_findings = settings.offline_mode_findings(env)
    findings += offline_findings
    versions = settings.installed_versions()
    findings += settings.legacy_cache_findings(env, effective, versions)
    findings += settings.alias_findings(env, effective, offline)
    findings += settings.version_findings(versions)
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    gid = os.getegid() if hasattr(os, "getegid") else None
    groups = tuple(sorted(set(os.getgroups()) | ({gid} if gid is not None else set()))) \
        if hasattr(os, "getgroups") else ()
    folder = examine_folder(cache, env, offline, uid, gid, groups)
    findings += folder.findings
    findings += modules_cache_findings(cache, env)
    umask = process_umask()
    if folder.owner_uid is not None:  # the cache exists and this user reaches it
        findings += read_only_online_findings(cache, folder.repos, offline=offline, read_only_fs=folder.read_only_fs)
    findings += umask_findings(cache, env, offline, umask)
    findings += enforcement_findings()
    store = None
    if os.path.isdir(cache):  # False, not PermissionError, where this user cannot reach it
        store, store_findings = examine_store(cache, env)
        findings += store_findings
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return DoctorReport(
        cache_dir=str(cache), effective_cache_dir=str(effective), cache_source=source, offline=offline,
        uid=uid, gid=gid, groups=groups, owner_uid=folder.owner_uid, owner_gid=folder.owner_gid,
        writable=folder.writable, read_only_fs=folder.read_only_fs, symlinks=folder.symlinks,
        free_bytes=folder.free_bytes, versions=versions, findings=tuple(findings),
        shared_store=store, umask=umask)


def enforcement_findings() -> list[Finding]:
    """``offline.network_filter`` (info: it loads and is in force in a forked child; else a warning with the reason) and
    ``offline.network_filter_active`` (info) when this process already cannot create IP sockets."""
    from .sandbox import probe_filter  # forks a probe child: only when doctor runs

    probe = probe_filter()
    label = "process-tree network filter (exec --no-network)"
    if probe.available:
        findings = [Finding("offline.network_filter", "info", f"{label}: available ({probe.detail})")]
    else:
        findings = [Finding(
            "offline.network_filter", "warning", f"{label}: unavailable: {probe.detail}",
            fix="exec --no-network refuses to start here; install libseccomp (libseccomp2), and in a container "
                "allow seccomp(2)/prctl(2) (e.g. the runtime's default seccomp profile, not one that blocks them); "
                "else rely on the Python guard and a NetworkPolicy (docs/offline.md)")]
    if probe.already_denied:
        findings.append(Finding("offline.network_filter_active", "info",
                                "this process cannot create IP sockets: a network filter is in force "
                                "(exec --no-network or a sandbox like it)"))
    return findings
