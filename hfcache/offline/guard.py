"""The network guard: a PEP 578 audit hook that turns network access to a host that is not allowed into an error.

Used by ``hfcache exec`` (through the ``sitecustomize`` in ``hfcache/offline/_guard_site/``), by
:func:`hfcache.enforce_offline`, :func:`hfcache.load_tokenizer` and by ``hfcache check``'s child (``offline/probe.py``).

Why an audit hook: ``sys.addaudithook`` sees every Python-level ``socket.connect``/``connect_ex``, ``sendto``,
``sendmsg``, ``getaddrinfo``, ``gethostbyname``, ``gethostbyaddr`` and ``getnameinfo`` before it happens (see
``_GUARDED_EVENTS``), whatever HTTP client made it (httpx, urllib3, urllib, asyncio),
so a load that would reach for the network fails at once with a message instead of hanging on an endpoint that
never answers, waiting on DNS in an air-gapped pod, or retrying (docs/cache-layout.md, 'Traps the libraries leave').

Why :class:`NetworkBlocked` is a ``RuntimeError`` and not an ``OSError``: clients treat an ``OSError`` as a network
failure and retry it with backoff - huggingface_hub's ``http_backoff`` (``utils/_http.py``) retries
``httpx.ConnectError`` 5 times over about 23 s - or fall back silently; a ``RuntimeError`` passes through them at once
and names the host.

Limits: it sees what Python code does. Native code that opens sockets itself (a Rust or C extension, ``ctypes``
calling libc's ``connect``) is not seen; nor is a program that is not Python (``os.system("curl ...")``, a
``subprocess`` of another program); a Python child started with ``-S``/``-I`` skips ``sitecustomize`` and one
started with ``-E`` ignores the ``PYTHONPATH`` that brings it; a proxy (``HTTPS_PROXY``) is the host connected to,
so allow the proxy. It is a fail-fast guard against accidents, not a sandbox.

This module is standard library only and importable on its own (Python >= 3.8): the ``sitecustomize`` loads it by
file path, so a Python child needs neither hfcache nor its dependencies installed.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os
import socket
import sys
import threading
from typing import Iterable, Iterator

#: Environment variable carrying the allowed hosts to a child: ``HOST[:PORT]`` entries separated by commas.
ENV_ALLOW_HOSTS = "HFCACHE_ALLOW_HOSTS"
#: Where the process-wide guard lives (one per process, whichever copy of this file installed it).
_STATE_ATTR = "_hfcache_network_guard"
#: Audit events (CPython "Audit events table", docs.python.org/3/library/audit_events.html) that can put a byte on
#: the network or make a resolver query. ``socket.connect`` also covers ``connect_ex``; ``socket.sendto`` and
#: ``socket.sendmsg`` carry an address when they send without ``connect`` (UDP, and TCP with ``MSG_FASTOPEN``, which
#: connects and delivers data in one call); ``socket.gethostbyname`` covers ``gethostbyname_ex``;
#: ``socket.gethostbyaddr`` (also what ``getfqdn`` calls) and ``socket.getnameinfo`` are reverse look-ups;
#: ``socket.__new__`` refuses address families that reach other machines without an IP address (``AF_PACKET``,
#: ``AF_VSOCK``, ``AF_TIPC``, ``AF_BLUETOOTH``, ...), whose later ``send`` has no audit event. Not guarded, because
#: they never leave the machine: ``socket.bind``, ``socket.gethostname``, ``socket.getservbyname``/``getservbyport``
#: (``/etc/services``), ``socket.sethostname``.
_SEND_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_REVERSE_EVENTS = frozenset({"socket.gethostbyaddr", "socket.getnameinfo"})
_LOOKUP_EVENTS = frozenset({"socket.getaddrinfo", "socket.gethostbyname"})
_GUARDED_EVENTS = _SEND_EVENTS | _REVERSE_EVENTS | _LOOKUP_EVENTS | {"socket.__new__"}
_INET_FAMILIES = frozenset({socket.AF_INET, getattr(socket, "AF_INET6", socket.AF_INET)})
#: Families that stay on this machine: Unix sockets, the kernel's netlink and crypto (AF_ALG) interfaces.
_LOCAL_FAMILIES = frozenset(getattr(socket, name) for name in ("AF_UNIX", "AF_NETLINK", "AF_ALG")
                            if hasattr(socket, name))


class NetworkBlocked(RuntimeError):
    """A connection or DNS lookup the guard refused.

    Attributes:
        target (str): ``HOST:PORT`` (``[V6]:PORT``) for connections, ``HOST`` for DNS lookups.
        action (str): ``"connection to"``, ``"DNS lookup of"``, ``"reverse DNS lookup of"`` or
            ``"socket of address family"``.
    """

    def __init__(self, action: str, target: str) -> None:
        self.action = action
        self.target = target
        remedy = (
            "Such sockets cannot be allowed; run this without hfcache's guard if it must"
            if action.startswith("socket") else
            f"If it must reach this host, allow it: `hfcache exec --allow-host {target} -- ...`, or "
            f"hfcache.enforce_offline(allow_hosts=[{target!r}])"
        )
        super().__init__(f"hfcache blocked a {action} {target}: this process runs offline under hfcache's network "
                         f"guard. {remedy}")


class AllowedHost:
    """One ``HOST[:PORT]`` entry of the allow-list.

    ``HOST`` is a host name (matched by name, and by the addresses it resolves to), an IPv4 or IPv6 address
    (``[::1]:8080`` with a port), or ``localhost``, which stands for every loopback address. Without a port, every
    port of the host is allowed.
    """

    __slots__ = ("host", "port", "ip")

    def __init__(self, host: str, port: int | None = None) -> None:
        self.host = host
        self.port = port
        self.ip = _ip(host)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AllowedHost) and (self.host, self.port) == (other.host, other.port)

    def __hash__(self) -> int:
        return hash((self.host, self.port))

    def __repr__(self) -> str:
        return f"AllowedHost({str(self)!r})"

    def __str__(self) -> str:
        return _target(self.host, self.port)


def parse_allow_host(spec: str) -> AllowedHost:
    """Parse ``HOST``, ``HOST:PORT``, ``IPV6``, ``[IPV6]`` or ``[IPV6]:PORT``.

    Raises:
        ValueError: empty host, a port that is not 1-65535, or an unbalanced bracket.
    """
    text = spec.strip()
    port_text = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid host {spec!r}: use [IPV6]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host = text  # a bare name, IPv4 address, or IPv6 address without a port
    host = host.strip().lower().rstrip(".")
    if not host or any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"invalid host {spec!r}: use HOST or HOST:PORT")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"invalid port in {spec!r}: use a number from 1 to 65535")
        port = int(port_text)
    ip = _ip(host)
    return AllowedHost(str(ip) if ip is not None else host, port)


def hosts_from_environ(environ: dict[str, str] | None = None) -> tuple[AllowedHost, ...]:
    """The allow-list a parent passed in ``HFCACHE_ALLOW_HOSTS`` (comma-separated ``HOST[:PORT]``).

    Raises:
        ValueError: an entry does not parse.
    """
    value = (os.environ if environ is None else environ).get(ENV_ALLOW_HOSTS, "")
    return tuple(parse_allow_host(item) for item in value.split(",") if item.strip())


def format_allow_hosts(hosts: Iterable[AllowedHost]) -> str:
    """The ``HFCACHE_ALLOW_HOSTS`` value for ``hosts`` (inverse of :func:`hosts_from_environ`)."""
    return ",".join(str(h) for h in hosts)


def _ip(host: str):
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _target(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def _family_name(family) -> str:
    try:
        return socket.AddressFamily(family).name
    except ValueError:
        return str(family)


def _port(value) -> int | None:
    if isinstance(value, int):
        return value or None
    if isinstance(value, (str, bytes)) and value.isdigit():
        return int(value) or None
    return None


def hosts_file_names(path: str = "/etc/hosts", nsswitch: str = "/etc/nsswitch.conf") -> frozenset:
    """The names the C library answers from ``path`` without asking a DNS server: every name (lower case, no
    trailing dot) of ``/etc/hosts``, when ``nsswitch``'s ``hosts:`` line consults ``files`` before ``dns`` (or has
    no such line: glibc's default is ``files dns``). Empty when ``dns`` comes first or the file cannot be read.

    glibc sends any other name to the nameservers of ``/etc/resolv.conf`` - ``*.localhost`` and the machine's own
    name included (RFC 6761 asks resolvers to answer ``.localhost`` themselves; glibc does not) - so only these and
    ``localhost`` are resolved without an allow-list entry.
    """
    try:
        with open(nsswitch, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if words and words[0] == "hosts:":
                    sources = [w for w in words[1:] if not w.startswith("[")]
                    if "files" not in sources or ("dns" in sources and sources.index("dns") < sources.index("files")):
                        return frozenset()
                    break
    except OSError:
        pass
    names = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if len(words) >= 2 and _ip(words[0]) is not None:
                    names.update(w.lower().rstrip(".") for w in words[1:])
    except OSError:
        return frozenset()
    return frozenset(names)


class _Rules:
    """Which hosts may be reached or resolved: the allow-list and the names ``/etc/hosts`` answers."""

    def __init__(self) -> None:
        self.allowed: list[AllowedHost] = []
        self.local_names = hosts_file_names() | {"localhost"}
        self.resolved: dict[str, frozenset] = {}
        self.busy = threading.local()

    def allow(self, hosts: Iterable[AllowedHost | str]) -> None:
        for host in hosts:
            entry = parse_allow_host(host) if isinstance(host, str) else host
            if entry not in self.allowed:
                self.allowed.append(entry)

    def allows_lookup(self, host: str, port: int | None) -> bool:
        """A name may be resolved when it is an address literal (nothing to look up), ``localhost``, a name
        ``/etc/hosts`` answers (:func:`hosts_file_names`), or an allowed host (for that port, when the entry has
        one). ``*.localhost`` and this machine's own name are not special: glibc asks the nameserver for them."""
        name = host.lower().rstrip(".")
        if _ip(name) is not None or name in self.local_names:
            return True
        return any(a.host == name and (a.port is None or port is None or a.port == port) for a in self.allowed)

    def allows_reverse_lookup(self, host: str, port: int | None) -> bool:
        """A reverse look-up (``gethostbyaddr``, ``getnameinfo``) may run for a loopback address, a name
        ``/etc/hosts`` answers (``socket.getfqdn()`` and ``http.server`` ask for them), or an address or name a
        connection would be allowed to. Any other address is a query to a DNS server."""
        name = host.lower().rstrip(".")
        ip = _ip(name)
        if (ip is not None and ip.is_loopback) or name in self.local_names:
            return True
        if ip is None:
            return self.allows_lookup(name, port)
        return self.allows_connection(name, port) or any(a.ip == ip for a in self.allowed)

    def allows_connection(self, host: str, port: int | None) -> bool:
        """Whether a connection to ``host``:``port`` is allowed: by address, by name, ``localhost`` for loopback
        addresses, or an allowed name that resolves to this address."""
        name = host.lower().rstrip(".")
        ip = _ip(name)
        for entry in self.allowed:
            if entry.port is not None and entry.port != port:
                continue
            if entry.host == "localhost":
                if name == "localhost" or (ip is not None and ip.is_loopback):
                    return True
            elif entry.ip is not None:
                if ip is not None and ip == entry.ip:
                    return True
            elif name == entry.host or (ip is not None and ip in self._resolves_to(entry.host)):
                return True
        return False

    def _resolves_to(self, name: str) -> frozenset:
        """The addresses an allowed name resolves to (cached once found; a failed look-up is retried next time)."""
        if name not in self.resolved:
            self.busy.on = True
            try:
                infos = socket.getaddrinfo(name, None)
            except OSError:
                return frozenset()
            finally:
                self.busy.on = False
            found = frozenset(ip for ip in (_ip(str(info[4][0])) for info in infos) if ip is not None)
            if not found:
                return found
            self.resolved[name] = found
        return self.resolved[name]

    def refusal(self, event: str, args: tuple) -> tuple[str, str] | None:
        """(action, target) when the audit event ``event`` reaches a host not allowed, else None."""
        if event == "socket.__new__":
            family = args[1]  # -1: socket(fileno=...) wraps an existing descriptor; its connect or sendto is checked
            if family != -1 and family not in _INET_FAMILIES and family not in _LOCAL_FAMILIES:
                return "socket of address family", _family_name(family)
        elif event in _SEND_EVENTS:
            sock, address = args[0], args[1]
            if getattr(sock, "family", None) not in _INET_FAMILIES or not isinstance(address, tuple):
                return None  # AF_UNIX and other local families; sendto/sendmsg on a connected socket (connect seen)
            host, port = str(address[0]), _port(address[1])
            if not self.allows_connection(host, port):
                return "connection to", _target(host.split("%", 1)[0], port)
        elif event in _REVERSE_EVENTS:
            address = args[0]
            host, port = (address[0], _port(address[1]) if len(address) > 1 else None) \
                if isinstance(address, tuple) and address else (address, None)
            if isinstance(host, bytes):
                host = host.decode("ascii", "replace")
            if not self.allows_reverse_lookup(str(host), port):
                return "reverse DNS lookup of", str(host)
        else:
            host = args[0]
            if isinstance(host, bytes):
                host = host.decode("ascii", "replace")
            port = _port(args[1]) if event == "socket.getaddrinfo" else None
            if host and not self.allows_lookup(str(host), port):
                return "DNS lookup of", str(host)
        return None


class Guard:
    """The per-process guard behind the audit hook (create it with :func:`install`).

    The hook registered with ``sys.addaudithook`` keeps its state in a closure, not in attributes of this object:
    whether blocking is on for the whole process is a latch that only turns on (``guard.enforced = False`` raises
    AttributeError, and rebinding any attribute here changes nothing the hook reads). It is a seatbelt against
    accidents, not a sandbox: code in the process can still widen its own allow-list through :meth:`allow` (the
    public API of :func:`hfcache.enforce_offline`) or dig into the closure; see the README's blind spots.

    Attributes:
        allowed (tuple[AllowedHost, ...]): the allow-list (only grows; a copy).
        enforced (bool): blocking is on for the whole process (``exec``, :func:`enforce_offline`); otherwise only
            inside :meth:`blocking` blocks. Read-only.
        attempts (list[str]): every blocked target, in order (libraries may swallow the exception; callers such as
            ``hfcache check`` look here to notice).
        error_class (type): the exception raised (:class:`NetworkBlocked` of the copy of this file that installed it).
    """

    __slots__ = ("attempts", "hook", "allows_lookup", "allows_reverse_lookup", "allows_connection", "_allow",
                 "_allowed", "_enforce", "_is_enforced", "_scoped")

    def __init__(self) -> None:
        rules = _Rules()
        latch = [False]
        scoped: contextvars.ContextVar[bool] = contextvars.ContextVar("hfcache_guard_scoped", default=False)
        attempts: list[str] = []
        error_class = NetworkBlocked

        def hook(event: str, args: tuple) -> None:
            if event not in _GUARDED_EVENTS or not (latch[0] or scoped.get()):
                return
            if getattr(rules.busy, "on", False):  # our own look-up of an allowed name (see _Rules._resolves_to)
                return
            refused = rules.refusal(event, args)
            if refused is not None:
                attempts.append(refused[1])
                raise error_class(*refused)

        def enforce() -> None:
            latch[0] = True

        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "hook", hook)
        object.__setattr__(self, "allows_lookup", rules.allows_lookup)
        object.__setattr__(self, "allows_reverse_lookup", rules.allows_reverse_lookup)
        object.__setattr__(self, "allows_connection", rules.allows_connection)
        object.__setattr__(self, "_allow", rules.allow)
        object.__setattr__(self, "_allowed", lambda: tuple(rules.allowed))
        object.__setattr__(self, "_enforce", enforce)
        object.__setattr__(self, "_is_enforced", lambda: latch[0])
        object.__setattr__(self, "_scoped", scoped)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"the network guard's {name!r} cannot be changed (blocking only turns on)")

    @property
    def allowed(self) -> tuple[AllowedHost, ...]:
        return self._allowed()

    @property
    def enforced(self) -> bool:
        return self._is_enforced()

    @property
    def error_class(self) -> type:
        return NetworkBlocked

    def allow(self, hosts: Iterable[AllowedHost | str]) -> None:
        """Add ``hosts`` (parsed with :func:`parse_allow_host` when strings) to the allow-list."""
        self._allow(hosts)

    def enforce(self) -> None:
        """Turn blocking on for the whole process, for good."""
        self._enforce()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[Guard]:
        """Block network access not allowed, in this thread (context) only, for the duration of the block."""
        token = self._scoped.set(True)
        try:
            yield self
        finally:
            self._scoped.reset(token)

    @property
    def active(self) -> bool:
        """Whether the calling context is blocked right now."""
        return self.enforced or self._scoped.get()


def current() -> Guard | None:
    """The guard installed in this process, if any."""
    return getattr(sys, _STATE_ATTR, None)


def install(allow_hosts: Iterable[AllowedHost | str] = (), *, enforce: bool = True) -> Guard:
    """Install the process's guard (once: audit hooks cannot be removed) and return it.

    A later call reuses the installed guard: it adds ``allow_hosts`` to the allow-list and, with ``enforce``, turns
    blocking on for the whole process. With ``enforce=False`` the hook only blocks inside :meth:`Guard.blocking`.

    Args:
        allow_hosts: ``HOST[:PORT]`` strings or :class:`AllowedHost` entries that stay reachable.
        enforce: block everywhere in this process from now on.

    Raises:
        ValueError: an allow-list entry does not parse.
        RuntimeError: this Python has no ``sys.addaudithook`` (before 3.8).
    """
    guard = current()
    if guard is None:
        if not hasattr(sys, "addaudithook"):  # pragma: no cover - Python < 3.8
            raise RuntimeError("the network guard needs Python >= 3.8 (sys.addaudithook)")
        guard = Guard()
        guard.allow(allow_hosts)
        sys.addaudithook(guard.hook)
        setattr(sys, _STATE_ATTR, guard)
    else:
        guard.allow(allow_hosts)
    if enforce:
        guard.enforce()
    return guard


def site_dir() -> str:
    """The folder ``hfcache exec`` puts first on a Python child's ``PYTHONPATH`` (it holds the ``sitecustomize``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard_site")


# When the exec sitecustomize installed the guard from its own copy of this file, `hfcache.offline.guard.NetworkBlocked` must
# be the class that guard raises, so that `except NetworkBlocked` works in the child.
if current() is not None:
    NetworkBlocked = current().error_class  # type: ignore[misc]  # noqa: F811
