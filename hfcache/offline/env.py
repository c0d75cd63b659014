"""Offline at runtime: the environment that makes a process use only the cache, ``exec`` with a network guard, and the
errors of offline use (also :mod:`hfcache.offline.api`'s).

The variables (checked in huggingface_hub 2.4.0 and transformers 5.24.0; docs/cache-layout.md, 'Traps the libraries
leave'): ``HF_HUB_CACHE`` (``constants.py``, transformers ``utils/hub.py``; wins over ``HF_HOME``, set only for a folder
named ``hub``); ``HF_HUB_OFFLINE=1`` (``utils/_http.py`` raises ``OfflineModeIsEnabled``; transformers'
``is_offline_mode()`` loads ``local_files_only``); ``HF_HUB_DISABLE_TELEMETRY=1`` (``utils/_telemetry.py``,
``_headers.py``); ``HF_HUB_DISABLE_UPDATE_CHECK=1`` (``cli/_cli_utils.py``); ``HF_HUB_DISABLE_IMPLICIT_TOKEN=1``
(``file_download.py`` builds auth headers even offline, reading the token and maybe refreshing an OAuth login:
``utils/_auth.py``, ``_headers.py`` ``get_token_to_send``); ``HF_MODULES_CACHE`` only when its default cannot be written
(:mod:`hfcache.warming.modules_cache`). Each is followed by its aliases (:mod:`.aliases`). Not set:
``HF_HUB_DISABLE_XET``, the timeouts, ``HF_ENDPOINT`` (offline mode makes no request).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ..cache.root import cache_dir_warning, refuse_misplaced_cache, resolve_cache_dir
from ..errors import HfcacheError, OfflineViolation, UsageError
from ..names import NOT_INERT, not_inert
from . import guard as network_guard
from .aliases import alias_map, with_aliases

if TYPE_CHECKING:
    from ..warming.lockfile import CacheStatus, Lockfile

#: The flags every offline process gets, in output order (after the cache variables), each followed by its aliases.
OFFLINE_FLAGS: tuple[tuple[str, str], ...] = with_aliases((name, "1") for name in (
    "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_IMPLICIT_TOKEN"))
FORMATS = ("sh", "dotenv", "dockerfile", "k8s", "json")


class LockNotSatisfied(OfflineViolation):
    """The cache does not hold what the lock pins, so an offline run would fail (exit 4)."""


class OfflineLoadError(OfflineViolation):
    """A tokenizer could not be loaded from the cache alone (exit 4); ``cause``: what is missing, when known."""

    def __init__(self, message: str, *, hint: str | None = None, cause: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.cause = cause


class OfflineSetupError(OfflineViolation):
    """huggingface_hub or transformers was imported before :func:`hfcache.enforce_offline` and could not be switched."""


class CommandNotFound(HfcacheError):
    """``hfcache exec``: the command is not on ``PATH`` (exit 127, as in shells and ``env``)."""

    exit_code = 127


class CommandNotExecutable(HfcacheError):
    """``hfcache exec``: the command exists but cannot be run (exit 126, as in shells and ``env``)."""

    exit_code = 126


@dataclass(frozen=True)
class OfflineEnv:
    """The variables that make a process use only the cache (``(name, value)`` pairs in output order)."""

    cache_dir: Path
    variables: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, str]:
        return dict(self.variables)

    @property
    def aliases(self) -> dict[str, str]:
        """``{alias: canonical}`` for the aliases among the variables (each with its canonical's value)."""
        return alias_map(self.variables)


def offline_environment(cache_dir: str | os.PathLike[str] | None = None,
                        environ: Mapping[str, str] | None = None) -> OfflineEnv:
    """The offline variables (the module docstring's) for the cache root ``cache_dir`` (default:
    ``default_cache_dir``), going into ``environ`` (default ``os.environ``: whether the modules cache moves). Raises
    UsageError (exit 2): the path holds a newline or NUL, or a ``$NAME``/``${NAME}`` huggingface_hub expands;
    CacheError (exit 5): a folder that is no hub cache, such as an ``HF_HOME`` (:func:`refuse_misplaced_cache`)."""
    cache = resolve_cache_dir(cache_dir)
    refuse_misplaced_cache(cache, empty_ok=False)
    if any(c in str(cache) for c in "\n\r\x00"):
        raise UsageError(f"cache path {str(cache)!r} contains a line break or NUL", hint="choose another --cache-dir")
    if found := _EXPANDED.search(str(cache)):
        raise UsageError(f"cache path {_comment_text(str(cache))} contains {_comment_text(found.group(0))}, which "
                         "huggingface_hub expands (os.path.expandvars) and other runtimes do not: they would use "
                         "different folders", hint="choose a --cache-dir without $NAME or ${NAME}")
    variables: list[tuple[str, str]] = []
    if cache.name == "hub":
        variables.append(("HF_HOME", str(cache.parent)))
    variables.extend(with_aliases([("HF_HUB_CACHE", str(cache))]))
    from ..warming.modules_cache import ENV_NAME, modules_cache_override

    try:
        modules = modules_cache_override({**(os.environ if environ is None else environ), **dict(variables)})
    except OSError:
        modules = None  # no writable temporary folder either: leave it to transformers (doctor reports it)
    if modules is not None:
        variables.append((ENV_NAME, str(modules)))
    variables.extend(OFFLINE_FLAGS)
    return OfflineEnv(cache_dir=cache, variables=tuple(variables))


#: What ``os.path.expandvars`` replaces (``posixpath._varprog``): ``$NAME`` and ``${...}``.
_EXPANDED = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)


_PLAIN = re.compile(r"[A-Za-z0-9_./:@%+,=-]*")


def format_env(env: OfflineEnv, fmt: str) -> str:
    """Render ``env`` as text each consumer parses back to exactly these values: ``sh``, ``dotenv`` (``docker run
    --env-file`` reads values literally), ``dockerfile`` (one ``ENV``), ``k8s`` (a container ``env:`` list), ``json``
    (one flat ASCII object); comment headers carry the path escaped and name the aliases. Raises UsageError: an unknown
    format, a value that is not inert text (:func:`check_inert`)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    items = env.variables
    for name, value in items:
        check_inert(name, value)
    warn_cache_dir(env.cache_dir)
    if fmt == "json":
        return json.dumps(dict(items), indent=2, ensure_ascii=True) + "\n"
    cache_text = _comment_text(str(env.cache_dir))
    header = (f"# Offline settings for the Hugging Face cache at {cache_text}\n"
              f"# Generated by: hfcache env --cache-dir {_comment_text(shlex.quote(str(env.cache_dir)))} "
              f"--format {fmt}\n") + _header_notes(env)
    if fmt == "sh":
        body = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in items)
    elif fmt == "dotenv":
        body = "".join(f"{name}={_dotenv_value(value)}\n" for name, value in items)
    elif fmt == "dockerfile":
        lines = ['{}="{}"'.format(name, re.sub(r'([\\"$])', r"\\\1", value)) for name, value in items]
        body = "ENV " + " \\\n    ".join(lines) + "\n"
    else:
        body = "env:\n" + "".join(f"  - name: {name}\n    value: {_yaml_quote(value)}\n" for name, value in items)
    return header + body


def warn_cache_dir(cache: Path) -> None:
    """One line on stderr when ``cache`` does not exist or is no hub cache."""
    if warning := cache_dir_warning(cache):
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in warning)
        sys.stderr.write(f"hfcache: warning: {text}\n")
        sys.stderr.flush()


def _header_notes(env: OfflineEnv) -> str:
    groups: dict[str, list[str]] = {}
    for alias, canonical in env.aliases.items():
        groups.setdefault(canonical, []).append(alias)
    lines = [f"# {', '.join(names)}: {'aliases' if len(names) > 1 else 'an alias'} of {canonical}, same value\n"
             for canonical, names in groups.items()]
    if "HF_HOME" not in env.as_dict():
        lines.append("# No HF_HOME (the cache folder is not named hub): the Rust hf-hub crate, which looks only in "
                     "$HF_HOME/hub, will not find it\n")
    return "".join(lines)


def _yaml_quote(value: str) -> str:
    """``value`` as a YAML double-quoted ASCII scalar (beyond U+FFFF one ``\\UXXXXXXXX``: YAML 1.2 5.7)."""
    out = []
    for char in value:
        code = ord(char)
        out.append("\\" + char if char in '\\"' else char if code < 0x80 else
                   f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def check_inert(name: str, value: str) -> None:
    """Raise UsageError (exit 2) when ``value`` of variable ``name`` holds a character no output format may carry raw
    (:data:`hfcache.names.NOT_INERT`), naming ``name``, the character (``U+XXXX``) and the value escaped."""
    if (char := not_inert(value)) is None:
        return
    what = ("a line break" if char in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029" else
            "a byte that is not UTF-8" if unicodedata.category(char) == "Cs" else "a control or invisible character")
    source = " (from TMPDIR)" if name == "HF_MODULES_CACHE" else ""
    raise UsageError(f"{name}{source} would be {_comment_text(value)}, which holds {what} (U+{ord(char):04X}): no "
                     "output format can carry it safely",
                     hint="choose a --cache-dir (and TMPDIR) made of printable characters")


def _comment_text(text: str) -> str:
    """``text`` with every character that is not inert escaped (``\\uXXXX``...): one line whatever the value."""
    return "".join(char.encode("unicode_escape", "backslashreplace").decode("ascii")
                   if unicodedata.category(char) in NOT_INERT else char for char in text)


def _dotenv_value(value: str) -> str:
    if _PLAIN.fullmatch(value):
        return value
    if "'" not in value:
        return f"'{value}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", value) + '"'


@dataclass(frozen=True)
class ExecPlan:
    """What ``hfcache exec`` will run; ``no_network``: install the process-tree filter (:mod:`.sandbox`) first."""

    argv: tuple[str, ...]
    environ: dict[str, str] = field(repr=False)
    offline: OfflineEnv
    no_network: bool = False


def parse_allow_hosts(specs: Iterable[str]) -> tuple[network_guard.AllowedHost, ...]:
    hosts = []
    for spec in specs:
        try:
            hosts.append(network_guard.parse_allow_host(spec))
        except ValueError as exc:
            raise UsageError(str(exc), hint="use HOST, HOST:PORT or [IPV6]:PORT") from None
    return tuple(dict.fromkeys(hosts))


def guarded_environment(base: Mapping[str, str], offline: OfflineEnv,
                        allow_hosts: Sequence[network_guard.AllowedHost] = ()) -> dict[str, str]:
    """``base`` plus the offline variables and the guard for Python children: its folder first on ``PYTHONPATH``, the
    allow-list in ``HFCACHE_ALLOW_HOSTS``."""
    environ = dict(base)
    environ.update(offline.variables)
    site = network_guard.site_dir()
    existing = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    environ["PYTHONPATH"] = os.pathsep.join([site, *existing])
    if allow_hosts:
        environ[network_guard.ENV_ALLOW_HOSTS] = network_guard.format_allow_hosts(allow_hosts)
    else:
        environ.pop(network_guard.ENV_ALLOW_HOSTS, None)
    return environ


def locked_cache(cache_dir: str | os.PathLike[str] | None, lock: str | os.PathLike[str] | Lockfile | None) -> Path:
    """The cache root (``cache_dir``, else a lock file's manifest's, else the environment's), checked to hold what
    ``lock`` (a path or a Lockfile; None: nothing) pins (:func:`check_lock`). Raises UsageError: an invalid lock;
    LockNotSatisfied."""
    if lock is None:
        return resolve_cache_dir(cache_dir)
    from ..warming.lockfile import Lockfile, lock_cache_dir, read_lock

    if isinstance(lock, Lockfile):
        cache = resolve_cache_dir(cache_dir)
        check_lock(lock, cache, "the lock")
    else:
        cache = lock_cache_dir(Path(lock), cache_dir)
        check_lock(read_lock(lock), cache, str(lock))
    return cache


def check_lock(lock: Lockfile, cache: Path, lock_name: str) -> tuple[CacheStatus, ...]:
    """Check with ``stat`` only that ``cache`` holds ``lock``; LockNotSatisfied names the first missing pieces."""
    from ..warming.lockfile import cache_statuses

    statuses = tuple(cache_statuses(lock, cache))
    if missing := [f"{s.repo.request.spec}: {m}" for s in statuses for m in s.missing]:
        shown = "; ".join(missing[:3]) + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else "")
        raise LockNotSatisfied(f"the cache {cache} does not hold everything {lock_name} pins: {shown}",
                               hint=f"run `hfcache warm --lock {lock_name} --cache-dir {cache}` first "
                                    "(it needs the endpoint)")
    return statuses


def prepare_exec(command: Sequence[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 lock: str | os.PathLike[str] | None = None, allow_hosts: Iterable[str] = (),
                 environ: Mapping[str, str] | None = None, no_network: bool = False,
                 paths: Iterable[str] = ()) -> ExecPlan:
    """Everything ``hfcache exec`` does before it replaces itself with the command (``cache_dir`` defaults to the
    lock's manifest, else the environment's; ``environ`` to ``os.environ``; ``paths``: ``--path`` entries,
    :mod:`.exec_paths`). Raises UsageError (exit 2): no command, a bad ``--allow-host`` (or one with ``no_network``),
    ``--path`` or lock; LockNotSatisfied (exit 4); PathNotCached, AmbiguousPath: a bad ``--path`` (exit 1)."""
    if not command or not command[0]:
        raise UsageError("no command given" if not command else "the command name is empty",
                         hint="hfcache exec [OPTIONS] -- COMMAND [ARGS]...")
    hosts = parse_allow_hosts(allow_hosts)
    if no_network and hosts:
        raise UsageError("--allow-host cannot be combined with --no-network: the process-tree filter refuses every "
                         "network socket and cannot let one host through",
                         hint="drop --no-network to use the Python guard's allow-list, or reach the service over a "
                              "Unix socket")
    cache = locked_cache(cache_dir, lock)
    base = os.environ if environ is None else environ
    offline = offline_environment(cache, base)
    child_env = guarded_environment(base, offline, hosts)
    if no_network:  # the Python guard names the mode at socket creation (the kernel's EACCES is retried by clients)
        child_env[network_guard.ENV_NO_NETWORK] = "1"
    else:
        child_env.pop(network_guard.ENV_NO_NETWORK, None)
    if paths:
        from .exec_paths import resolve_exec_paths, substitute_paths

        resolved = resolve_exec_paths(offline.cache_dir, paths, reserved=offline.as_dict())
        child_env.update(resolved)
        command = substitute_paths(command, dict(resolved))
    return ExecPlan(argv=tuple(command), environ=child_env, offline=offline, no_network=no_network)


def exec_command(plan: ExecPlan) -> NoReturn:
    """Replace this process with the command (``os.execvpe``: it keeps hfcache's PID, so signals reach it and its exit
    status is the process's); never returns. With ``plan.no_network``, inherited network descriptors are marked
    close-on-exec and the filter loaded (and checked) right before the exec. Raises NetworkFilterUnavailable (exit 4),
    CommandNotFound (exit 127), CommandNotExecutable (exit 126)."""
    warn_cache_dir(plan.offline.cache_dir)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if plan.no_network:
        from .sandbox import close_inherited_sockets, install_network_filter

        close_inherited_sockets()
        install_network_filter()
    name = plan.argv[0]
    try:
        os.execvpe(name, list(plan.argv), plan.environ)
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {name}", hint="check the command name and PATH") from None
    except PermissionError:
        raise CommandNotExecutable(f"cannot run {name}: permission denied", hint="make it executable") from None
    except OSError as exc:
        raise CommandNotExecutable(f"cannot run {name}: {exc.strerror or exc}") from None
    raise AssertionError("os.execvpe returned")  # pragma: no cover
