"""Offline at runtime: the environment that makes a process use only the cache, ``exec`` with a network guard, and
the errors of offline use (also those of :mod:`hfcache.offline.api`).

The variables (checked against huggingface_hub 2.4.0 and transformers 5.24.0; why the libraries need them:
docs/cache-layout.md, 'Traps the libraries leave'):

- ``HF_HUB_CACHE=<cache>``: where huggingface_hub (``constants.py``) and transformers (``utils/hub.py``) look; it
  wins over ``HF_HOME``. ``HF_HOME=<parent>`` only when the cache is a folder named ``hub`` (then ``$HF_HOME/hub`` is
  the same cache, and tools that derive it from ``HF_HOME`` agree).
- ``HF_HUB_OFFLINE=1``: huggingface_hub refuses every HTTP request (``utils/_http.py`` raises
  ``OfflineModeIsEnabled``) and transformers loads with ``local_files_only`` (``is_offline_mode()``): no ~3 requests
  per cached load, no hang on an endpoint that never answers.
- ``HF_HUB_DISABLE_TELEMETRY=1``: no telemetry (``utils/_telemetry.py``), a plain user agent (``_headers.py``);
  ``HF_HUB_DISABLE_UPDATE_CHECK=1``: no version checks by the ``hf`` CLI (``cli/_cli_utils.py``).
- ``HF_HUB_DISABLE_IMPLICIT_TOKEN=1``: ``hf_hub_download`` builds auth headers even for a cached offline load
  (``file_download.py``), reading the token file and perhaps refreshing an OAuth login (a network call and a file
  write, ``utils/_auth.py``); with it, ``get_token_to_send`` (``utils/_headers.py``) skips all of it.
- ``HF_MODULES_CACHE=<private tmp>`` only when the folder transformers copies ``trust_remote_code`` code into
  (default ``$HF_HOME/modules``) cannot be written here, e.g. a read-only HOME; an explicit one is never replaced
  (:mod:`hfcache.warming.modules_cache`).

Each variable is followed by the other names runtimes read for it, with the same value (:mod:`.aliases`):
``HUGGINGFACE_HUB_CACHE`` and ``SENTENCE_TRANSFORMERS_HOME`` after ``HF_HUB_CACHE``; ``TRANSFORMERS_OFFLINE``
(huggingface_hub's fallback; transformers 5 no longer reads it), ``HF_DATASETS_OFFLINE`` and ``LLAMA_OFFLINE``
after ``HF_HUB_OFFLINE``. Left out on purpose: ``HF_HUB_DISABLE_XET`` (Xet only downloads, after a metadata request
offline mode never makes), ``HF_HUB_ETAG_TIMEOUT``/``HF_HUB_DOWNLOAD_TIMEOUT`` (no request), ``HF_ENDPOINT``.
"""

from __future__ import annotations

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

from . import guard as network_guard
from .aliases import alias_map, with_aliases
from ..cache.root import cache_dir_warning, resolve_cache_dir
from ..errors import HfcacheError, OfflineViolation, UsageError

if TYPE_CHECKING:
    from ..warming.lockfile import CacheStatus, Lockfile

#: The flags every offline process gets, in output order (after the cache variables), each followed by its aliases.
OFFLINE_FLAGS: tuple[tuple[str, str], ...] = with_aliases((name, "1") for name in (
    "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_IMPLICIT_TOKEN"))
FORMATS = ("sh", "dotenv", "dockerfile", "k8s", "json")


class LockNotSatisfied(OfflineViolation):
    """The cache does not hold what the lock pins, so an offline run would fail (exit 4)."""


class OfflineLoadError(OfflineViolation):
    """A tokenizer could not be loaded from the cache alone (exit 4). ``cause`` (str | None): what is missing, when
    hfcache can tell (``hfcache.integrity.diagnosis.diagnose``)."""

    def __init__(self, message: str, *, hint: str | None = None, cause: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.cause = cause


class OfflineSetupError(OfflineViolation):
    """huggingface_hub or transformers was imported before :func:`hfcache.offline.api.enforce_offline` and could not
    be switched."""


class CommandNotFound(HfcacheError):
    """``hfcache exec``: the command is not on ``PATH`` (exit 127, as in shells and ``env``)."""

    exit_code = 127


class CommandNotExecutable(HfcacheError):
    """``hfcache exec``: the command exists but cannot be run (exit 126, as in shells and ``env``)."""

    exit_code = 126


@dataclass(frozen=True)
class OfflineEnv:
    """The variables that make a process use only the cache: ``cache_dir`` (Path, the absolute cache root),
    ``variables`` (``(name, value)`` pairs in output order)."""

    cache_dir: Path
    variables: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, str]:
        """``{NAME: value}`` of every variable, aliases included, in output order."""
        return dict(self.variables)

    @property
    def aliases(self) -> dict[str, str]:
        """``{alias: canonical}`` for the aliases among the variables (:mod:`hfcache.offline.aliases`), e.g.
        ``{"HUGGINGFACE_HUB_CACHE": "HF_HUB_CACHE", ...}``; each alias has its canonical variable's value."""
        return alias_map(self.variables)


def offline_environment(cache_dir: str | os.PathLike[str] | None = None,
                        environ: Mapping[str, str] | None = None) -> OfflineEnv:
    """The offline variables for ``cache_dir`` (the module docstring has each one and its source).

    Args:
        cache_dir: the cache root (default: ``hfcache.cache.root.default_cache_dir``), made absolute.
        environ: the environment the variables will be added to (default ``os.environ``): it decides whether the
            modules cache moves (``modules_cache_override``, which creates the private folder).

    Returns:
        OfflineEnv: ``HF_HOME`` (a cache folder named ``hub`` only), ``HF_HUB_CACHE`` and its aliases,
        ``HF_MODULES_CACHE`` (when its default cannot be written), then :data:`OFFLINE_FLAGS`.

    Raises:
        UsageError: the path holds a newline or NUL, or a ``$NAME``/``${NAME}`` huggingface_hub expands (exit 2).
    """
    cache = resolve_cache_dir(cache_dir)
    if any(c in str(cache) for c in "\n\r\x00"):
        raise UsageError(f"cache path {str(cache)!r} contains a line break or NUL", hint="choose another --cache-dir")
    _refuse_expansion(str(cache))
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


def _refuse_expansion(path: str) -> None:
    """Raise UsageError (exit 2) for a cache path holding ``$NAME`` or ``${...}``: huggingface_hub passes
    ``HF_HUB_CACHE``/``HF_HOME`` through ``os.path.expandvars`` (``constants.py``: ``/x/$HOME/hub`` is
    ``/x/root/hub``), while the runtimes reading the value raw (TGI, TEI, llama.cpp, sentence-transformers) and
    hfcache use ``/x/$HOME/hub``. No quoting helps: the reader expands it, after the shell."""
    found = _EXPANDED.search(path)
    if found:
        raise UsageError(f"cache path {_comment_text(path)} contains {_comment_text(found.group(0))}, which "
                         "huggingface_hub expands (os.path.expandvars) and other runtimes do not: they would use "
                         "different folders", hint="choose a --cache-dir without $NAME or ${NAME}")


_PLAIN = re.compile(r"[A-Za-z0-9_./:@%+,=-]*")


def format_env(env: OfflineEnv, fmt: str) -> str:
    """Render ``env`` as text that each consumer parses back to exactly these values.

    Formats:
        ``sh``: ``export NAME=value`` lines, quoted with ``shlex.quote`` (``eval "$(hfcache env)"``).
        ``dotenv``: ``NAME=value``; a value that needs quoting is single-quoted (literal for shells, docker compose
        and python-dotenv). ``docker run --env-file`` reads values literally, so it needs a path without spaces.
        ``dockerfile``: one ``ENV`` instruction, values double-quoted with ``\\``, ``"`` and ``$`` escaped.
        ``k8s``: a container ``env:`` list in YAML, every value a quoted string (Kubernetes rejects numbers).
        ``json``: one flat ASCII object ``{NAME: value}``, aliases as keys of their own.

    Every format refuses a value that is no inert text (:func:`check_inert`): dotenv and Dockerfile have no
    portable escape, and one rule means one output is never safe where another is not. The comment headers carry
    the path only escaped (:func:`_comment_text`), then name each canonical variable's aliases. A cache folder that
    does not exist (or is no cache) gets one warning on stderr (:func:`warn_cache_dir`), never in the text.

    Raises:
        UsageError: unknown format; a value that is not inert text (exit 2, naming the variable).
    """
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
        lines = [f'{name}="{_dockerfile_escape(value)}"' for name, value in items]
        body = "ENV " + " \\\n    ".join(lines) + "\n"
    else:
        body = "env:\n" + "".join(f"  - name: {name}\n    value: {_yaml_quote(value)}\n" for name, value in items)
    return header + body


def warn_cache_dir(cache: Path) -> None:
    """One line on stderr when ``cache`` does not exist or is not a hub cache (:func:`cache_dir_warning`): env and
    exec still succeed. Written here because ``format_env`` and ``exec_command`` are the CLI's last step."""
    warning = cache_dir_warning(cache)
    if warning:
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in warning)
        sys.stderr.write(f"hfcache: warning: {text}\n")
        sys.stderr.flush()


def _header_notes(env: OfflineEnv) -> str:
    """Comment lines after the header: which variables are aliases of which (names only, never a value), and
    whether runtimes that find the cache through ``HF_HOME`` alone can find it."""
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
    """``value`` as a YAML 1.1/1.2 double-quoted ASCII scalar: ``\\`` and ``"`` escaped, other non-ASCII as
    ``\\uXXXX``, beyond U+FFFF as one ``\\UXXXXXXXX`` (YAML 1.2 section 5.7: a surrogate pair reads back as two lone
    surrogates in PyYAML, go-yaml refuses it)."""
    out = []
    for char in value:
        code = ord(char)
        out.append("\\" + char if char in '\\"' else char if code < 0x80 else
                   f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


#: Unicode categories that are no inert text in generated output: controls (C0, DEL, C1 with U+0085), format
#: characters (bidi overrides, zero-width), lone surrogates (``surrogateescape`` of a non-UTF-8 path), and the line
#: and paragraph separators U+2028/U+2029 (YAML, JavaScript and ``str.splitlines`` break lines there).
_NOT_INERT = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _offending(value: str) -> str | None:
    """The first character of ``value`` that is not inert text (``_NOT_INERT``), else None."""
    return next((c for c in value if unicodedata.category(c) in _NOT_INERT), None)


def check_inert(name: str, value: str) -> None:
    """Raise UsageError (exit 2) when ``value`` of variable ``name`` holds a character no output format may carry
    raw (``_NOT_INERT``), naming ``name``, the character (``U+XXXX``) and the value escaped, never raw."""
    char = _offending(value)
    if char is None:
        return
    what = ("a line break" if char in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029" else
            "a byte that is not UTF-8" if unicodedata.category(char) == "Cs" else "a control or invisible character")
    source = " (from TMPDIR)" if name == "HF_MODULES_CACHE" else ""
    raise UsageError(f"{name}{source} would be {_comment_text(value)}, which holds {what} (U+{ord(char):04X}): no "
                     "output format can carry it safely",
                     hint="choose a --cache-dir (and TMPDIR) made of printable characters")


def _comment_text(text: str) -> str:
    """``text`` with every character that is not inert text written as ``\\uXXXX`` (``\\xXX``, ``\\UXXXXXXXX``),
    so a comment header or an error message stays one line, whatever the value."""
    return "".join(char.encode("unicode_escape", "backslashreplace").decode("ascii")
                   if unicodedata.category(char) in _NOT_INERT else char for char in text)


def _dotenv_value(value: str) -> str:
    if _PLAIN.fullmatch(value):
        return value
    if "'" not in value:
        return f"'{value}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", value) + '"'


def _dockerfile_escape(value: str) -> str:
    return re.sub(r'([\\"$])', r"\\\1", value)


@dataclass(frozen=True)
class ExecPlan:
    """What ``hfcache exec`` will run.

    Attributes:
        argv (tuple[str, ...]): the command and its arguments. environ (dict[str, str]): the child's environment.
        offline (OfflineEnv): the offline variables set in it.
        allow_hosts (tuple[str, ...]): ``HOST[:PORT]`` entries the guard lets through.
        lock_statuses (tuple[CacheStatus, ...]): the lock check, when ``--lock`` was given (all satisfied).
        no_network (bool): install the process-tree network filter (:mod:`.sandbox`) before the exec.
        paths (tuple[tuple[str, str], ...]): ``(NAME, absolute path)`` of each ``--path``, in order (also in
            ``environ``, and substituted for ``{NAME}`` in ``argv[1:]``).
    """

    argv: tuple[str, ...]
    environ: dict[str, str] = field(repr=False)
    offline: OfflineEnv
    allow_hosts: tuple[str, ...] = ()
    lock_statuses: tuple[CacheStatus, ...] = ()
    no_network: bool = False
    paths: tuple[tuple[str, str], ...] = ()


def parse_allow_hosts(specs: Iterable[str]) -> tuple[network_guard.AllowedHost, ...]:
    """Parse ``HOST[:PORT]`` entries (``--allow-host``, ``allow_hosts=``), without repeats; UsageError for a bad
    one."""
    hosts = []
    for spec in specs:
        try:
            hosts.append(network_guard.parse_allow_host(spec))
        except ValueError as exc:
            raise UsageError(str(exc), hint="use HOST, HOST:PORT or [IPV6]:PORT") from None
    return tuple(dict.fromkeys(hosts))


def guarded_environment(base: Mapping[str, str], offline: OfflineEnv,
                        allow_hosts: Sequence[network_guard.AllowedHost] = ()) -> dict[str, str]:
    """``base`` plus the offline variables and the network guard for Python children: the guard's folder first on
    ``PYTHONPATH`` (the rest kept after it; its ``sitecustomize`` runs the one it shadows), the allow-list in
    ``HFCACHE_ALLOW_HOSTS``."""
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


def check_lock(lock: Lockfile, cache: Path, lock_name: str) -> tuple[CacheStatus, ...]:
    """Check with ``stat`` only (``lockfile.cache_statuses``: sizes, refs, markers; no hashing) that ``cache``
    holds ``lock``; LockNotSatisfied names the first missing pieces and how many there are."""
    from ..warming.lockfile import cache_statuses

    statuses = tuple(cache_statuses(lock, cache))
    missing = [f"{s.repo.request.spec}: {m}" for s in statuses for m in s.missing]
    if missing:
        shown = "; ".join(missing[:3]) + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else "")
        raise LockNotSatisfied(f"the cache {cache} does not hold everything {lock_name} pins: {shown}",
                               hint=f"run `hfcache warm --lock {lock_name} --cache-dir {cache}` first "
                                    "(it needs the endpoint)")
    return statuses


def prepare_exec(command: Sequence[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 lock: str | os.PathLike[str] | None = None, allow_hosts: Iterable[str] = (),
                 environ: Mapping[str, str] | None = None, no_network: bool = False,
                 paths: Iterable[str] = ()) -> ExecPlan:
    """Everything ``hfcache exec`` does before it replaces itself with the command.

    Args:
        command: the command and its arguments. environ: the base environment (default: ``os.environ``).
        cache_dir: the cache root (default: the lock's manifest, else the environment's).
        lock: a lock file the cache must satisfy (``stat`` only: milliseconds, no network).
        allow_hosts: ``HOST[:PORT]`` entries the guard lets through.
        no_network: deny the process tree every non-``AF_UNIX`` socket (:mod:`.sandbox`), besides the Python guard.
        paths: ``NAME=REPO_ID[@REVISION][:PATTERN]`` entries (``--path``, :mod:`.exec_paths`), resolved offline.

    Raises:
        UsageError: no command, a bad ``--allow-host``, ``--allow-host`` with ``no_network``, a bad ``--path``, an
            unreadable or invalid lock (exit 2).
        LockNotSatisfied: the cache lacks something the lock pins (exit 4).
        PathNotCached, AmbiguousPath: a ``--path`` is not cached, or its pattern matches several files (exit 1).
    """
    if not command or not command[0]:
        raise UsageError("no command given" if not command else "the command name is empty",
                         hint="hfcache exec [OPTIONS] -- COMMAND [ARGS]...")
    hosts = parse_allow_hosts(allow_hosts)
    if no_network and hosts:
        raise UsageError("--allow-host cannot be combined with --no-network: the process-tree filter refuses every "
                         "network socket and cannot let one host through",
                         hint="drop --no-network to use the Python guard's allow-list, or reach the service over a "
                              "Unix socket")
    statuses: tuple[CacheStatus, ...] = ()
    if lock is not None:
        from ..warming.lockfile import lock_cache_dir, read_lock

        lock_path = Path(lock)
        cache = lock_cache_dir(lock_path, cache_dir)
        statuses = check_lock(read_lock(lock_path), cache, str(lock))
    else:
        cache = resolve_cache_dir(cache_dir)
    base = os.environ if environ is None else environ
    offline = offline_environment(cache, base)
    child_env = guarded_environment(base, offline, hosts)
    if no_network:  # the Python guard names the mode at socket creation (the kernel's EACCES is retried by clients)
        child_env[network_guard.ENV_NO_NETWORK] = "1"
    else:
        child_env.pop(network_guard.ENV_NO_NETWORK, None)
    resolved: tuple[tuple[str, str], ...] = ()
    if paths:
        from .exec_paths import resolve_exec_paths, substitute_paths

        resolved = resolve_exec_paths(offline.cache_dir, paths, reserved=offline.as_dict())
        child_env.update(resolved)
        command = substitute_paths(command, dict(resolved))
    return ExecPlan(argv=tuple(command), environ=child_env, offline=offline,
                    allow_hosts=tuple(str(h) for h in hosts), lock_statuses=statuses, no_network=no_network,
                    paths=resolved)


def exec_command(plan: ExecPlan) -> NoReturn:
    """Replace this process with the command (``os.execvpe``); never returns.

    Exec, not a child: the command keeps hfcache's PID, so SIGTERM/SIGINT/SIGHUP from a terminal, ``docker stop`` or
    the kubelet reach it directly and its exit status is the process's own (all of hfcache's work is done before).
    With ``plan.no_network``, inherited network descriptors are marked close-on-exec and the filter is loaded
    (:func:`.sandbox.install_network_filter`, checked in force) right before the exec, or the command never starts.

    Raises:
        NetworkFilterUnavailable: ``no_network`` and the filter cannot be installed or is not in force (exit 4).
        CommandNotFound: not on ``PATH`` (exit 127).
        CommandNotExecutable: not executable, or not a valid program (exit 126).
    """
    warn_cache_dir(plan.offline.cache_dir)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
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
