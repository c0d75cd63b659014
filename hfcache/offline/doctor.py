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
  ``HF_HOME`` and ``HF_HUB_CACHE`` disagreeing; the aliases other runtimes read (``HUGGINGFACE_HUB_CACHE``,
  ``SENTENCE_TRANSFORMERS_HOME``, ``HF_DATASETS_OFFLINE``, ``LLAMA_OFFLINE``: :mod:`.aliases`) disagreeing with
  what huggingface_hub uses;
- the cache folder: present, readable by this user, writable, owner uid/gid versus the current user (the
  image-built-as-root, pod-runs-as-1000 problem), read-only filesystem, symlink support (probed like
  huggingface_hub ``file_download.py: are_symlinks_supported``), free disk space;
- as the current user (:mod:`hfcache.cache.access`): reaching and listing the cache root, creating files in ``.locks/``
  and opening its lock files, writing every repo folder; in a group-shared cache, folders the group cannot write;
  whether flock works on the filesystem;
- runtime traps (:mod:`.doctor_runtime`): a read-only cache used online with revisions that can move upstream
  (``cache.read_only_online``, an error), and a umask that drops group write in a group-shared folder the
  application writes into (``umask.not_shared``, a warning);
- which network enforcement this machine and container allow (:mod:`.doctor_enforce`): the process-tree filter of
  ``hfcache exec --no-network`` (``offline.network_filter``), probed in a forked child;
- huggingface_hub 2.4's shared Xet blob store (:mod:`.doctor_store`): present and marked, its payloads and bytes,
  and ``HF_HUB_DISABLE_SHARED_BLOBS``/``HF_HUB_DISABLE_XET`` when set (they turn it off for the library);
- installed versions of huggingface_hub, transformers, tokenizers (and optional tokenizer packages).

Reads only, except the probes: a temporary folder (symlinks) and files (``.locks/`` creation, flock) in the cache,
removed at once (as huggingface_hub's symlink probe does).

This module holds the report and :func:`doctor`, which runs the checks of :mod:`.doctor_settings` (the environment,
the versions) and :mod:`.doctor_folder` (the cache folder); :mod:`.findings` holds what each check returns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .doctor_folder import examine_folder, modules_cache_findings
from .doctor_runtime import process_umask, read_only_online_findings, umask_findings
from .doctor_store import StoreState, examine_store
from .doctor_settings import (alias_findings, cache_setting_findings, installed_versions, legacy_cache_findings,
                              offline_mode_findings, version_findings)
from .findings import SEVERITIES, Finding
from ..cache.root import resolve_cache_dir


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
        shared_store (StoreState | None): the cache's shared Xet blob store (None when the cache is missing).
        umask (int | None): this process's umask (e.g. ``0o022``; None when it cannot be read).
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
    shared_store: StoreState | None = None
    umask: int | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


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
    findings += cache_setting_findings(env, effective, source, cache, cache_dir is not None)
    offline, offline_findings = offline_mode_findings(env)
    findings += offline_findings
    versions = installed_versions()
    findings += legacy_cache_findings(env, effective, versions)
    findings += alias_findings(env, effective, offline)
    findings += version_findings(versions)
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
    from .doctor_enforce import enforcement_findings  # forks a probe child: only when doctor runs

    findings += enforcement_findings()
    store = None
    if os.path.isdir(cache):  # False, not PermissionError, where this user cannot reach it
        store, store_findings = examine_store(cache, env)
        findings += store_findings
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return DoctorReport(
        cache_dir=str(cache), effective_cache_dir=str(effective), cache_source=source, offline=offline,
        uid=uid, gid=gid, groups=groups, owner_uid=folder.owner_uid, owner_gid=folder.owner_gid,
        writable=folder.writable, read_only_fs=folder.read_only_fs, symlinks=folder.symlinks,
        free_bytes=folder.free_bytes, versions=versions, findings=tuple(findings),
        shared_store=store, umask=umask)
