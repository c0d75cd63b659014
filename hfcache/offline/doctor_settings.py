"""What ``hfcache doctor`` reports (:class:`Finding`), and its checks of the environment: the cache the settings choose,
offline mode, booleans as huggingface_hub reads them (``constants.py``: ``ENV_VARS_TRUE_VALUES``, after ``.upper()``),
telemetry and token flags, legacy cache variables and aliases, installed versions."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SEVERITIES = ("error", "warning", "info")
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
FALSE_VALUES = {"0", "OFF", "NO", "FALSE"}
_PACKAGES = ("huggingface_hub", "transformers", "tokenizers", "hf_xet", "sentencepiece", "protobuf", "tiktoken")
_LEGACY_TRANSFORMERS_CACHES = ("TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE", "PYTORCH_PRETRAINED_BERT_CACHE")


@dataclass(frozen=True)
class Finding:
    """One thing doctor found: ``code`` (stable, e.g. ``offline.masked``), ``severity`` (``error``: loads fail or use
    another cache; ``warning``: a trap; ``info``), ``message`` (what is the case, and why it matters), ``fix`` (what to
    do, or None)."""

    code: str
    severity: str
    message: str
    fix: str | None = None


def is_true(value: str | None) -> bool:
    """Whether huggingface_hub reads ``value`` (a variable's value, None when unset) as true."""
    return value is not None and value.upper() in TRUE_VALUES


def _resolved(value: str, expand_vars: bool = True) -> Path:
    """A cache variable's value as huggingface_hub makes it a folder; empty is the working directory."""
    value = os.path.expanduser(value or ".")
    return Path(os.path.expandvars(value) if expand_vars else value).expanduser().resolve()


def cache_setting_findings(env: dict[str, str], effective: Path, source: str, cache: Path,
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
        home_hub = _resolved(env["HF_HOME"]) / "hub"
        if home_hub != effective:
            found.append(Finding(
                "env.home_mismatch", "warning",
                f"HF_HOME ({env['HF_HOME']}) and HF_HUB_CACHE ({env['HF_HUB_CACHE']}) disagree: models and tokenizers "
                f"come from HF_HUB_CACHE, while HF_HOME still holds the token, trust_remote_code modules and the Xet "
                f"cache, and tools that assume $HF_HOME/hub look in {home_hub}",
                (f"export HF_HOME={effective.parent}" if effective.name == "hub" else
                 "unset HF_HOME, or set HF_HUB_CACHE=$HF_HOME/hub") + " so that both name one cache"))
    return found


def offline_mode_findings(env: dict[str, str]) -> tuple[bool, list[Finding]]:
    hub_raw, tf_raw = env.get("HF_HUB_OFFLINE"), env.get("TRANSFORMERS_OFFLINE")
    # huggingface_hub constants.py: is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    offline = is_true(hub_raw or tf_raw)
    found = []
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                 "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_HUB_DISABLE_SYMLINKS"):
        value = env.get(name)
        if value and value.upper() not in TRUE_VALUES | FALSE_VALUES:
            found.append(Finding("env.not_boolean", "warning",
                                 f"{name}={value!r} is not one of 1/ON/YES/TRUE: huggingface_hub reads it as false",
                                 f"export {name}=1"))
    if hub_raw and not is_true(hub_raw) and is_true(tf_raw):
        found.append(Finding(
            "offline.masked", "error",
            f"HF_HUB_OFFLINE={hub_raw} masks TRANSFORMERS_OFFLINE={tf_raw}: huggingface_hub reads HF_HUB_OFFLINE "
            "first (constants.py), so this process is ONLINE; a cached load still makes requests and hangs on an "
            "endpoint that never answers",
            "export HF_HUB_OFFLINE=1 (or unset it)"))
    elif offline:
        shown = f"HF_HUB_OFFLINE={hub_raw}" if is_true(hub_raw) else f"TRANSFORMERS_OFFLINE={tf_raw}"
        found.append(Finding("offline.on", "info", f"offline mode is on ({shown}): no request reaches the endpoint"))
    else:
        found.append(Finding(
            "offline.off", "warning",
            "offline mode is off: every cached tokenizer load makes ~3 requests, and hangs forever against an "
            "endpoint that accepts connections and never answers",
            "export HF_HUB_OFFLINE=1 at runtime (all the settings: hfcache env)"))
    telemetry = any(is_true(env.get(n)) for n in ("HF_HUB_DISABLE_TELEMETRY", "DISABLE_TELEMETRY", "DO_NOT_TRACK"))
    if not telemetry:
        found.append(Finding("env.telemetry", "info",
                             "telemetry is not disabled" + (" (offline mode turns it off anyway)" if offline else ""),
                             "export HF_HUB_DISABLE_TELEMETRY=1"))
    if not is_true(env.get("HF_HUB_DISABLE_IMPLICIT_TOKEN")):
        found.append(Finding(
            "env.implicit_token", "info",
            "every file lookup reads the stored token and may refresh an OAuth login, even offline "
            "(huggingface_hub file_download.py builds auth headers first)",
            "export HF_HUB_DISABLE_IMPLICIT_TOKEN=1"))
    return offline, found


def legacy_cache_findings(env: dict[str, str], effective: Path, versions: dict[str, str | None]) -> list[Finding]:
    found = []
    major = _major(versions.get("transformers"))
    for name in _LEGACY_TRANSFORMERS_CACHES:
        if name not in env:
            continue
        value = env[name]
        target = _resolved(value)
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
    # HUGGINGFACE_HUB_CACHE beside HF_HUB_CACHE is the alias `hfcache env` prints (TGI, TEI, llama.cpp read it):
    # fine when both name one cache; alias_findings reports them disagreeing.
    if "HUGGINGFACE_HUB_CACHE" in env and "HF_HUB_CACHE" not in env:
        found.append(Finding("env.legacy_hub_cache", "warning",
                             "HUGGINGFACE_HUB_CACHE is a deprecated name (huggingface_hub still reads it, when "
                             "HF_HUB_CACHE is unset)",
                             f"export HF_HUB_CACHE={effective} as well (keep HUGGINGFACE_HUB_CACHE: TGI and TEI read "
                             "only it; hfcache env prints both)"))
    return found


def alias_findings(env: dict[str, str], effective: Path, offline: bool) -> list[Finding]:
    """``env.alias_mismatch`` (warning) for each alias set in ``env`` that disagrees with huggingface_hub: a cache alias
    naming another folder than ``effective``, an offline alias not true while ``offline``. Unset: no finding."""
    from .aliases import ALIASES

    found = []
    for alias in ALIASES:
        if alias.name not in env or alias.name == "TRANSFORMERS_OFFLINE":
            continue
        value, readers = env[alias.name], "; ".join(alias.readers)
        if alias.canonical == "HF_HUB_CACHE" and _resolved(value, expand_vars=False) != effective:
            found.append(Finding(
                "env.alias_mismatch", "warning",
                f"{alias.name}={value} names another cache than the one huggingface_hub uses ({effective}): "
                f"{readers} read {alias.name}, so they look for (and download into) another folder",
                f"export {alias.name}={effective} (hfcache env prints every alias with the same value)"))
        elif alias.canonical == "HF_HUB_OFFLINE" and offline and not is_true(value):
            found.append(Finding(
                "env.alias_mismatch", "warning",
                f"{alias.name}={value} is not true while offline mode is on: {readers} read {alias.name} and go "
                "online", f"export {alias.name}=1 (hfcache env prints every alias with the same value)"))
    return found


def installed_versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in _PACKAGES:
        for dist in dict.fromkeys((name.replace("_", "-"), name)):
            try:
                found[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                found[name] = None
    return found


def _major(version: str | None) -> int | None:
    try:
        return int(version.split(".")[0]) if version else None
    except ValueError:
        return None


def version_findings(versions: dict[str, str | None]) -> list[Finding]:
    found = [Finding("versions", "info", ", ".join(f"{name} {versions[name] or 'not installed'}"
                                                   for name in ("huggingface_hub", "transformers", "tokenizers")))]
    if versions.get("transformers") is None:
        found.append(Finding("versions.transformers", "warning",
                             "transformers is not installed: AutoTokenizer cannot load anything (a core hfcache "
                             "install warms, verifies and moves caches without it; "
                             "load_tokenizer(backend=\"tokenizers\") loads fast tokenizers)",
                             "pip install 'hfcache[check]' where the application loads tokenizers"))
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
    if missing := [n for n in ("sentencepiece", "protobuf") if versions.get(n) is None]:
        found.append(Finding("versions.optional", "info",
                             f"not installed: {', '.join(missing)} (SentencePiece-only tokenizers need them)",
                             f"pip install {' '.join(missing)}"))
    return found
