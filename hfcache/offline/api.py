"""The Python API for applications (``hfcache.enforce_offline``, ``hfcache.load_tokenizer``): this process uses only the
cache under the network guard, or one tokenizer loads from the cache alone. The variables set and the errors raised are
:mod:`hfcache.offline.env`'s."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cache.root import resolve_cache_dir
from ..errors import HfcacheError, HubError, UsageError
from ..integrity.fast_inputs import is_panic, one_line, reraise_unless_failure
from . import guard as network_guard
from .env import OfflineLoadError, OfflineSetupError, locked_cache, offline_environment, parse_allow_hosts

if TYPE_CHECKING:
    from ..warming.lockfile import Lockfile


@dataclass(frozen=True)
class OfflineSettings:
    """What :func:`enforce_offline` did: ``environ``, the variables set in ``os.environ``; ``patched``, the
    ``module.NAME`` constants updated in modules already imported."""

    cache_dir: Path
    environ: dict[str, str]
    patched: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()


def _module_constants(cache: Path, modules: str | None = None) -> list[tuple[str, str, Any]]:
    """``(module, NAME, value)`` of every copy of an offline setting a library computed at import time (huggingface_hub
    2.4.0 ``constants.py`` reads every ``HF_*`` once, at import, and is read at call time, so setting them takes
    effect; ``utils/_cache_manager.py`` copies ``HF_HUB_CACHE``; transformers 4 ``utils/hub.py: _is_offline_mode``;
    ``datasets.config``). ``HF_HOME``-derived paths stay, but a moved modules cache (transformers 5.24 keeps two)."""
    moved = [("transformers.utils.hub", "HF_MODULES_CACHE", modules),
             ("transformers.dynamic_module_utils", "HF_MODULES_CACHE", modules)] if modules else []
    return moved + [
        ("huggingface_hub.constants", "HF_HUB_OFFLINE", True),
        ("huggingface_hub.constants", "HF_HUB_CACHE", str(cache)),
        # the legacy name, computed once at import and not following HF_HUB_CACHE; TGI's Python server imports it
        # by name (text-generation-inference server/text_generation_server/utils/hub.py)
        ("huggingface_hub.constants", "HUGGINGFACE_HUB_CACHE", str(cache)),
        ("huggingface_hub.constants", "HF_HUB_DISABLE_TELEMETRY", True),
        ("huggingface_hub.constants", "HF_HUB_DISABLE_UPDATE_CHECK", True),
        ("huggingface_hub.constants", "HF_HUB_DISABLE_IMPLICIT_TOKEN", True),
        ("huggingface_hub.utils._cache_manager", "HF_HUB_CACHE", str(cache)),
        ("transformers.utils.hub", "_is_offline_mode", True),
        ("datasets.config", "HF_DATASETS_OFFLINE", True),
        ("datasets.config", "HF_HUB_OFFLINE", True),
    ]


def _sync_imported_modules(cache: Path, modules: str | None = None) -> tuple[str, ...]:
    """Set the import-time copies in imported modules; OfflineSetupError if an accessor still disagrees."""
    patched = []
    for module_name, attr, value in _module_constants(cache, modules):
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attr) and getattr(module, attr) != value:
            setattr(module, attr, value)
            patched.append(f"{module_name}.{attr}")
    problems = []
    if (constants := sys.modules.get("huggingface_hub.constants")) is not None:
        if not constants.is_offline_mode():
            problems.append("huggingface_hub.constants.is_offline_mode() is False")
        if str(cache) != constants.HF_HUB_CACHE:
            problems.append(f"huggingface_hub.constants.HF_HUB_CACHE is {constants.HF_HUB_CACHE}")
    hub = sys.modules.get("transformers.utils.hub")
    if hub is not None and hasattr(hub, "is_offline_mode") and not hub.is_offline_mode():
        problems.append("transformers.utils.hub.is_offline_mode() is False")
    if problems:
        raise OfflineSetupError(
            "huggingface_hub/transformers were imported before enforce_offline() and could not be switched to "
            f"offline mode: {'; '.join(problems)}",
            hint="call hfcache.enforce_offline() before importing transformers or huggingface_hub, or start the "
                 "process with `hfcache exec`")
    return tuple(patched)


def enforce_offline(cache_dir: str | os.PathLike[str] | None = None, *,
                    lock: str | os.PathLike[str] | Lockfile | None = None,
                    allow_hosts: Iterable[str] = ()) -> OfflineSettings:
    """Make this process use only the cache: set the offline environment and install the network guard.

    Best called before transformers or huggingface_hub is imported; their import-time copies are updated otherwise
    (``_module_constants``). Subprocesses inherit the environment, not the guard (use ``hfcache exec``).
    ``cache_dir`` defaults as ``resolve_cache_dir``; ``lock`` (a path or a ``Lockfile``) must be satisfied (``stat``
    only); ``allow_hosts``: ``HOST[:PORT]`` entries the guard lets through (a later call adds).

    Raises:
        UsageError: a bad ``allow_hosts`` entry, an invalid lock. LockNotSatisfied: the cache lacks something the
            lock pins (nothing changed). OfflineSetupError: an imported library could not be switched (``os.environ``
            is set by then).
    """
    hosts = parse_allow_hosts(allow_hosts)
    cache = locked_cache(cache_dir, lock)
    offline = offline_environment(cache)
    os.environ.update(offline.variables)
    patched = _sync_imported_modules(cache, offline.as_dict().get("HF_MODULES_CACHE"))
    network_guard.install(hosts, enforce=True)
    return OfflineSettings(cache_dir=cache, environ=offline.as_dict(), patched=patched,
                           allow_hosts=tuple(str(h) for h in hosts))


class FastTokenizerRefused(OfflineLoadError):
    """``load_tokenizer(backend="tokenizers")`` cannot promise ``AutoTokenizer``'s ids (exit 4); ``reason``: why."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, cause=reason)
        self.reason = reason

    @classmethod
    def of(cls, spec: str, reason: str, hint: str) -> FastTokenizerRefused:
        return cls(f"{spec}: the fast tokenizer path refuses it: {reason}", reason=reason, hint=hint)


def load_tokenizer(repo_id: str, revision: str | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
                   allow_network: bool = False, backend: str = "transformers", require_proof: bool = False,
                   **kwargs: Any):
    """Load a tokenizer from the cache alone, under the network guard (blocking the calling context for the load):
    ``AutoTokenizer.from_pretrained`` with ``cache_dir`` and ``local_files_only=True`` passed explicitly, or a
    ``tokenizers.Tokenizer`` without importing transformers.

    Args:
        repo_id, revision: as the application uses them (a legacy id loads from its own cache folder; None: main).
        cache_dir: the cache root (default as ``resolve_cache_dir``).
        allow_network (bool): load from the endpoint into ``cache_dir`` when the cache cannot serve the load.
        backend (str): ``"transformers"`` [default] or ``"tokenizers"``: built from the cached ``tokenizer.json``,
            its ``encode(text).ids`` equal ``AutoTokenizer``'s ``input_ids`` (as transformers 5.24 sets it up; no
            truncation or padding), in milliseconds.
        require_proof (bool): ``backend="tokenizers"`` only: load only a repo@commit ``hfcache check`` proved equal,
            in a record owned by this uid or root, with this ``tokenizers`` version.
        **kwargs: passed to ``AutoTokenizer.from_pretrained`` (not ``cache_dir``/``local_files_only``).

    Returns a ``transformers.PreTrainedTokenizerBase``, or a ``tokenizers.Tokenizer``.

    Raises:
        OfflineLoadError: the cache cannot serve the load (``cause``: the missing piece, or a tokenizers panic, not
            retried online), a connection was attempted, ``allow_network`` while offline. HubError: ``allow_network``
            and the network load failed too.
        FastTokenizerRefused: what :func:`hfcache.integrity.fast_tokenizer.build` refuses, recorded as differing by
            ``hfcache check``, or no proof. CacheError: ``backend="tokenizers"`` met a planted link or FIFO, or a file
            this user cannot read.
        UsageError: transformers not installed (``hfcache[check]``), an unknown ``backend``, an argument the backend
            does not take. TypeError: ``cache_dir`` or ``local_files_only`` in ``kwargs``.
    """
    for reserved in ("cache_dir", "local_files_only"):
        if reserved in kwargs:
            raise TypeError(f"load_tokenizer() sets {reserved} itself")
    if backend not in ("transformers", "tokenizers"):
        raise UsageError(f"load_tokenizer(backend={backend!r}): not a backend",
                         hint='use backend="transformers" or backend="tokenizers"')
    cache = resolve_cache_dir(cache_dir)
    if backend == "tokenizers":
        if allow_network or kwargs:
            raise UsageError(f"load_tokenizer(backend=\"tokenizers\") takes no "
                             f"{'allow_network' if allow_network else ', '.join(sorted(kwargs))}",
                             hint='use backend="transformers" for those')
        return _load_fast(cache, repo_id, revision, require_proof)
    if require_proof:
        raise UsageError("require_proof applies to backend=\"tokenizers\" only")
    return _load_slow(cache, repo_id, revision, allow_network, kwargs)


def _load_slow(cache: Path, repo_id: str, revision: str | None, allow_network: bool, kwargs: dict[str, Any]):
    """``backend="transformers"``: ``AutoTokenizer`` under the guard, diagnosed (or loaded over the network)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # a core install has no transformers (the extra `check`): exit 2
        raise UsageError(f"transformers is not installed ({exc}): load_tokenizer()'s default backend needs it",
                         hint="pip install 'hfcache[check]', or use backend=\"tokenizers\"") from None
    guard, seen, spec = _scoped_guard(repo_id, revision)
    try:
        with guard.blocking():
            tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision, cache_dir=str(cache),
                                                      local_files_only=True, **kwargs)
        attempts = guard.attempts[seen:]
        if attempts:  # it loaded, but only because a library swallowed the refused connection
            raise OfflineLoadError(f"{spec}: network access attempted ({attempts[0]}) during an offline load",
                                   hint="run `hfcache check` on the cache to see what the load is missing")
        return tokenizer
    except HfcacheError:
        raise
    except BaseException as exc:  # any load failure (a panic of the tokenizers library too) is diagnosed below
        reraise_unless_failure(exc)
        failure = exc
    error = one_line(failure, 500) if is_panic(failure) else f"{type(failure).__name__}: {failure}"
    if guard.attempts[seen:] and "network access attempted" not in error:
        error = f"network access attempted ({guard.attempts[seen]}) during an offline load; then {error}"
    if allow_network and not is_panic(failure):  # the endpoint would serve the same commit's files
        return _load_from_network(AutoTokenizer, repo_id, revision, cache, spec, kwargs, error=error, failure=failure)
    raise _offline_load_error(cache, repo_id, revision, spec, error) from failure


def _load_fast(cache: Path, repo_id: str, revision: str | None, require_proof: bool):
    """``backend="tokenizers"``: ``integrity.fast_tokenizer.build`` under the guard, then check's records."""
    from ..integrity import fast_record
    from ..integrity.fast_tokenizer import HINT, FastPathRefused, NotCached, build

    try:
        import tokenizers  # imported here so a missing package is one clear error
    except ImportError as exc:
        raise HfcacheError(f"tokenizers is not installed: {exc}", hint="pip install tokenizers") from None
    guard, seen, spec = _scoped_guard(repo_id, revision)
    try:
        with guard.blocking():
            built = build(cache, repo_id, revision)
    except FastPathRefused as exc:
        raise FastTokenizerRefused.of(spec, exc.reason, HINT) from None
    except NotCached as exc:
        raise OfflineLoadError(f"{spec} cannot be loaded from the cache {cache}: {exc}", cause=str(exc),
                               hint=f"warm it: hfcache warm {spec} --cache-dir {cache}") from None
    if guard.attempts[seen:]:
        raise OfflineLoadError(f"{spec}: network access attempted ({guard.attempts[seen]}) during an offline load")
    # fast_record: a "differs" entry counts from any record read safely, an "equal" one only from a trusted record.
    record_key = fast_record.key("model", repo_id, built.commit)
    if differs := fast_record.recorded_difference(str(cache), record_key):
        raise FastTokenizerRefused.of(
            spec, f"hfcache check recorded that its ids differ from AutoTokenizer's ({differs[:300]})", HINT)
    if require_proof and not fast_record.proven_equal(str(cache), record_key, tokenizers.__version__):
        raise FastTokenizerRefused.of(spec, f"no proof recorded for commit {built.commit[:12]} with tokenizers "
                                      f"{tokenizers.__version__} (require_proof=True)",
                                      f"run hfcache check {repo_id} --cache-dir {cache} as this user or root, or "
                                      + HINT)
    return built.tokenizer


def _scoped_guard(repo_id: str, revision: str | None) -> tuple[network_guard.Guard, int, str]:
    """The process's guard (not enforced), how many attempts it has seen, and ``REPO_ID@REVISION``."""
    guard = network_guard.install(enforce=False)
    return guard, len(guard.attempts), f"{repo_id}@{revision or 'main'}"


def _load_from_network(auto_tokenizer: Any, repo_id: str, revision: str | None, cache: Path, spec: str,
                       kwargs: dict[str, Any], *, error: str, failure: Exception):
    """``allow_network=True``: the load from the endpoint (OfflineLoadError when offline, HubError naming both)."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and constants.is_offline_mode():
        raise OfflineLoadError(
            f"{spec} is not fully in the cache {cache}, and allow_network=True cannot help: offline mode is on "
            "in this process (HF_HUB_OFFLINE or enforce_offline)",
            hint=f"warm it first: hfcache warm {spec} --cache-dir {cache}") from failure
    try:
        return auto_tokenizer.from_pretrained(repo_id, revision=revision, cache_dir=str(cache), **kwargs)
    except BaseException as exc:  # one clear error naming both attempts (a panic of tokenizers too)
        reraise_unless_failure(exc)
        raise HubError(f"{spec}: not loadable from the cache {cache} ({error.splitlines()[0]}), and the network "
                       f"load failed: {one_line(exc, 500)}",
                       hint="check HF_ENDPOINT and the network, or warm the cache with hfcache warm") from exc


def _offline_load_error(cache: Path, repo_id: str, revision: str | None, spec: str, error: str) -> OfflineLoadError:
    """The error of a load the cache cannot serve, hfcache's diagnosis of the missing piece as its ``cause``."""
    from ..integrity.check_targets import CheckTarget
    from ..integrity.diagnosis import diagnose

    cause = diagnose(cache, CheckTarget(repo_id, revision or "main"), error)
    hint = (cause.split("(", 1)[1].rstrip(")") if cause and cause.startswith("missing Python package") else
            f"warm it: hfcache warm {spec} --cache-dir {cache} (or pass allow_network=True)")
    return OfflineLoadError(f"{spec} cannot be loaded from the cache {cache}: {cause or error.splitlines()[0]}",
                            hint=hint, cause=cause)
