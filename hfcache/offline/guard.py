"""The network guard: a PEP 578 audit hook that turns network access to a host not allowed into an error.

:class:`NetworkBlocked` is a ``RuntimeError``: clients retry an ``OSError`` (huggingface_hub ``http_backoff``: ~23 s)
or fall back silently. Only C-level values are read (:mod:`.guard_hosts`). What it checks and what it cannot see
(native code, ``python -I``): docs/offline.md. Standard library only and importable on its own (Python >= 3.8): the
exec ``sitecustomize`` loads it by file path.
"""

from __future__ import annotations

import _socket
import contextlib
import contextvars
import os
import socket
import sys
import threading
from collections.abc import Iterable, Iterator


def _load_hosts_module():
    """``guard_hosts.py``, loaded by file path when this file was."""
    if __package__:
        from . import guard_hosts

        return guard_hosts
    import importlib.util

    name = "_hfcache_guard_hosts"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "guard_hosts.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_hosts = _load_hosts_module()
ENV_ALLOW_HOSTS, AllowedHost, parse_allow_host = _hosts.ENV_ALLOW_HOSTS, _hosts.AllowedHost, _hosts.parse_allow_host
hosts_from_environ, format_allow_hosts = _hosts.hosts_from_environ, _hosts.format_allow_hosts
hosts_file_names, hosts_file_entries = _hosts.hosts_file_names, _hosts.hosts_file_entries
_exact_ip, _ip, _target = _hosts._exact_ip, _hosts._ip, _hosts._target
_family_name, _type_name, _port = _hosts._family_name, _hosts._type_name, _hosts._port
_Refused, _plain_host, _plain_address = _hosts._Refused, _hosts._plain_host, _hosts._plain_address
_RAW_TYPES, _real_families, _kernel_raw = _hosts._RAW_TYPES, _hosts._real_families, _hosts._kernel_raw
#: Set to ``1`` by ``exec --no-network``: every socket but ``AF_UNIX`` is refused at creation with the guard's message
#: (the kernel filter's ``EACCES`` is a ``PermissionError`` HTTP clients retry for ~20-50 s).
ENV_NO_NETWORK = "HFCACHE_NO_NETWORK"
#: Where the process-wide guard lives (one per process, whichever copy of this file installed it).
_STATE_ATTR = "_hfcache_network_guard"
#: Audit events (docs.python.org/3/library/audit_events.html) that can put a byte on the network or query a resolver:
#: ``socket.connect`` covers ``connect_ex``, ``sendto``/``sendmsg`` carry an address (UDP, TCP ``MSG_FASTOPEN``),
#: ``gethostbyname`` covers ``_ex``, reverse look-ups; ``socket.__new__`` refuses families that reach other machines
#: without an IP (``AF_PACKET``, ``AF_VSOCK``: their sends have no event). Local only, not guarded: ``bind``,
#: ``gethostname``, ``getservbyname``/``getservbyport``, ``sethostname``.
_SEND_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_REVERSE_EVENTS = frozenset({"socket.gethostbyaddr", "socket.getnameinfo"})
_LOOKUP_EVENTS = frozenset({"socket.getaddrinfo", "socket.gethostbyname"})
_GUARDED_EVENTS = _SEND_EVENTS | _REVERSE_EVENTS | _LOOKUP_EVENTS | {"socket.__new__"}
_INET_FAMILIES = frozenset({socket.AF_INET, getattr(socket, "AF_INET6", socket.AF_INET)})
#: Families that stay on this machine: Unix sockets, the kernel's netlink and crypto (AF_ALG) interfaces.
_LOCAL_FAMILIES = frozenset(getattr(socket, name) for name in ("AF_UNIX", "AF_NETLINK", "AF_ALG")
                            if hasattr(socket, name))
#: Captured at import: a child that rebinds ``socket.getaddrinfo`` must not get its function called by the guard.
_C_GETADDRINFO = _socket.getaddrinfo
_C_GETNAMEINFO = _socket.getnameinfo
#: The sockaddr tuple :func:`_check_before_c_resolves`'s ``getnameinfo`` is passing to C with ``NI_NUMERICHOST``
#: (no look-up at all), per thread; the audit event then carries that very object.
_NUMERIC_LOOKUP = threading.local()


_INSTALLED = getattr(sys, _STATE_ATTR, None)
if _INSTALLED is not None:
    # The exec sitecustomize installed the guard from its own copy of this file: `NetworkBlocked` here must be the
    # class that guard raises, so that `except NetworkBlocked` works in the child.
    NetworkBlocked = _INSTALLED.error_class
else:
    class NetworkBlocked(RuntimeError):
        """A connection or DNS lookup the guard refused: ``target`` (str), ``HOST:PORT`` (``[V6]:PORT``) for
        connections, ``HOST`` for DNS lookups; ``action`` (str): ``"connection to"``, ``"DNS lookup of"``, ``"reverse
        DNS lookup of"``, ``"socket of address family"``, ``"socket of type"`` (``SOCK_RAW``/``SOCK_PACKET`` of an IP
        family) or ``"call with an argument of type"`` (not exactly a tuple, str, bytes or int)."""

        def __init__(self, action: str, target: str) -> None:
            if not (target.isascii() and target.isprintable()):
                target = ascii(target)[1:-1]  # a name from the code that asked: shown escaped, one line
            self.action = action
            self.target = target
            remedy = (
                "`hfcache exec --no-network` allows only AF_UNIX sockets; run without --no-network (and with "
                "--allow-host) if it must reach a host"
                if action.startswith("socket") and "--no-network" in target else
                "Such sockets cannot be allowed; run this without hfcache's guard if it must"
                if action.startswith("socket") else
                "Pass the address as a plain tuple of a str host and an int port"
                if action.startswith("call") else
                f"If it must reach this host, allow it: `hfcache exec --allow-host {target} -- ...`, or "
                f"hfcache.enforce_offline(allow_hosts=[{target!r}])"
            )
            super().__init__(f"hfcache blocked a {action} {target}: this process runs offline under hfcache's "
                             f"network guard. {remedy}")

        def __reduce__(self):
            # Picklable as made: a multiprocessing worker sends the error back to the pool (with RuntimeError's
            # default, unpickling called __init__ with one argument and Pool.map hung for ever).
            return type(self), (self.action, self.target)


class _Rules:
    """Which hosts may be reached or resolved: the allow-list and the names ``/etc/hosts`` answers."""

    def __init__(self) -> None:
        self.allowed: list[AllowedHost] = []
        self.hosts_names, self.hosts_addresses = hosts_file_entries()
        self.resolved: dict[str, frozenset] = {}
        self.busy = threading.local()
        self.local_only = False  # exec --no-network: only AF_UNIX sockets (turns on only, see Guard.refuse_ip)

    def allow(self, hosts: Iterable[AllowedHost | str]) -> None:
        for host in hosts:
            # Every entry is parsed again from its text: an AllowedHost of another copy of this file (hfcache's,
            # when the exec sitecustomize installed its own) or any other object becomes one of ours, checked.
            entry = parse_allow_host(host if type(host) is str else str(host))
            if entry not in self.allowed:
                self.allowed.append(entry)

    def allows_lookup(self, host: str, port: int | None, family: int = 0) -> bool:
        """A name may be resolved when it is an address literal, an allowed host (for that port), or a name
        ``/etc/hosts`` answers for ``family`` as glibc matches it (``AF_UNSPEC``: any entry; ``AF_INET``/``AF_INET6``:
        one of that version)."""
        if _ip(host) is not None:
            return True
        name = host.lower()
        versions = self.hosts_names.get(name, frozenset())
        wanted = {socket.AF_INET: 4, getattr(socket, "AF_INET6", -6): 6}.get(family)
        if versions and (family == socket.AF_UNSPEC or wanted in versions):
            return True
        name = name.rstrip(".")
        return any(a.host == name and (a.port is None or port is None or a.port == port) for a in self.allowed)

    def allows_reverse_lookup(self, host: str, port: int | None = None) -> bool:
        """Only when no nameserver is asked: an address ``/etc/hosts`` lists exactly as given or a name it answers (a
        PTR query for loopback or an allowed address carries 3 bytes of a secret too)."""
        if (ip := _exact_ip(host)) is None:
            return bool(self.hosts_names.get(host.lower()))
        return ip in self.hosts_addresses

    def allows_connection(self, host: str, port: int | None) -> bool:
        """By address, by name, ``localhost`` for loopback, or an allowed name resolving to this address."""
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
                infos = _C_GETADDRINFO(name, None)
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
        """(action, target) when ``event`` reaches a host not allowed, else None (C-level values only)."""
        try:
            return self._refusal(event, args)
        except _Refused as exc:
            return "call with an argument of type", f"{exc.what} (only a plain tuple, str, bytes or int is read)"

    def _refusal(self, event: str, args: tuple) -> tuple[str, str] | None:
        if event == "socket.__new__":
            family = args[1]  # -1: socket(fileno=...) wraps an existing descriptor; its connect or sendto is checked
            if self.local_only and family != -1 and family != socket.AF_UNIX:
                return "socket of address family", f"{_family_name(family)} (exec --no-network: AF_UNIX only)"
            if family != -1 and family not in _INET_FAMILIES and family not in _LOCAL_FAMILIES:
                return "socket of address family", _family_name(family)
            # family -1 is also C's default (AF_INET when no fileno is given): a raw type is refused then too
            if (family in _INET_FAMILIES or family == -1) and type(args[2]) is int and args[2] & 0xF in _RAW_TYPES:
                return "socket of type", f"{_type_name(args[2] & 0xF)} ({_family_name(family)})"
        elif event in _SEND_EVENTS:
            return self._send_refusal(args[0], args[1])
        elif event in _REVERSE_EVENTS:
            return self._reverse_refusal(event, args[0])
        else:
            host = None if args[0] is None else _plain_host(args[0])
            port, family = None, socket.AF_INET  # gethostbyname[_ex]: IPv4 look-ups
            if event == "socket.getaddrinfo":
                if args[1] is not None:
                    if type(args[1]) not in (int, str, bytes):
                        raise _Refused(args[1])
                    port = _port(args[1])
                family = args[2] if len(args) > 2 else socket.AF_UNSPEC
                if type(family) is not int:
                    raise _Refused(family)
            if host and not self.allows_lookup(host, port, family):
                return "DNS lookup of", host
        return None

    def _reverse_refusal(self, event: str, address) -> tuple[str, str] | None:
        """gethostbyaddr(host) and getnameinfo(sockaddr): :meth:`allows_reverse_lookup`."""
        if event == "socket.getnameinfo" and address is getattr(_NUMERIC_LOOKUP, "sockaddr", None):
            return None  # our getnameinfo wrapper saw NI_NUMERICHOST for this very (immutable) tuple
        if type(address) is tuple:
            host = _plain_host(address[0]) if address else ""
            if len(address) > 1 and type(address[1]) is not int:
                raise _Refused(address[1])
        else:
            host = _plain_host(address)
        if not self.allows_reverse_lookup(host):
            return "reverse DNS lookup of", host
        return None

    def _send_refusal(self, sock, address) -> tuple[str, str] | None:
        """connect/connect_ex, sendto, sendmsg: checked by the family C and the kernel give the socket."""
        if not (families := _real_families(sock)):
            return None
        family = next(iter(families))
        if len(families) > 1 or (family not in _INET_FAMILIES and family not in _LOCAL_FAMILIES):
            # socket(AF_UNIX, fileno=<an AF_INET or AF_PACKET descriptor>): what C parses is not what the kernel
            # sends; and an AF_PACKET socket's later sends have no audit event of their own
            return "socket of address family", "/".join(sorted(_family_name(f) for f in families))
        if family in _LOCAL_FAMILIES:
            return None  # AF_UNIX and other local families
        raw = _kernel_raw(sock)  # adopted (fileno=, fromfd, inherited): the kernel ignores the port (IP_HDRINCL: host)
        if raw:
            return "socket of type", f"{_type_name(raw)} ({_family_name(family)})"
        if address is None:
            return None  # sendmsg on a connected socket (its connect was seen)
        if not isinstance(address, tuple) or (type(address) is tuple and len(address) < 2):
            return None  # C refuses it itself (TypeError; seen only before C parses it): nothing is sent
        host, port = _plain_address(address)
        if not self.allows_connection(host, port):
            return "connection to", _target(host.split("%", 1)[0], port)
        return None


class Guard:
    """The per-process guard behind the audit hook (create it with :func:`install`).

    Its state lives in the hook's closure, not in attributes: blocking for the whole process only turns on (assigning an
    attribute raises AttributeError). A seatbelt, not a sandbox: code can still widen its allow-list (:meth:`allow`).
    ``allowed``: a copy of the allow-list (only grows); ``enforced``: blocking is on for the whole process, else only
    inside :meth:`blocking`; ``attempts``: every blocked target, in order (libraries may swallow the exception).
    """

    __slots__ = ("attempts", "hook", "allows_lookup", "allows_reverse_lookup", "allows_connection", "_allow",
                 "_allowed", "_enforce", "_is_enforced", "_scoped", "_refuse_ip")

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
            if (refused := rules.refusal(event, args)) is not None:
                error = error_class(*refused)
                attempts.append(error.target)  # escaped when it is not printable ASCII
                raise error

        def enforce() -> None:
            latch[0] = True

        for name, value in (("attempts", attempts), ("hook", hook), ("allows_lookup", rules.allows_lookup),
                            ("allows_reverse_lookup", rules.allows_reverse_lookup),
                            ("allows_connection", rules.allows_connection), ("_allow", rules.allow),
                            ("_allowed", lambda: tuple(rules.allowed)), ("_enforce", enforce),
                            ("_is_enforced", lambda: latch[0]), ("_scoped", scoped),
                            ("_refuse_ip", lambda: setattr(rules, "local_only", True))):
            object.__setattr__(self, name, value)

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
        self._allow(hosts)

    def enforce(self) -> None:
        """Turn blocking on for the whole process, for good."""
        self._enforce()

    def refuse_ip(self) -> None:
        """Refuse every socket but ``AF_UNIX`` at its creation, for good (``exec --no-network``'s children)."""
        self._refuse_ip()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[Guard]:
        """Block network access not allowed, in this thread (context) only, for the duration of the block."""
        token = self._scoped.set(True)
        try:
            yield self
        finally:
            self._scoped.reset(token)


def current() -> Guard | None:
    return getattr(sys, _STATE_ATTR, None)


def install(allow_hosts: Iterable[AllowedHost | str] = (), *, enforce: bool = True, local_only: bool = False) -> Guard:
    """Install the process's guard (once: audit hooks cannot be removed; a later call reuses it) and return it:
    ``allow_hosts`` added to its allow-list; ``enforce``: block everywhere from now on (else only inside
    :meth:`Guard.blocking`); ``local_only``: :meth:`Guard.refuse_ip`. Raises ValueError: an allow-list entry does
    not parse; RuntimeError: no ``sys.addaudithook`` (Python < 3.8)."""
    if (guard := current()) is None:
        if not hasattr(sys, "addaudithook"):  # pragma: no cover - Python < 3.8
            raise RuntimeError("the network guard needs Python >= 3.8 (sys.addaudithook)")
        guard = Guard()
        guard.allow(allow_hosts)
        sys.addaudithook(guard.hook)
        _check_before_c_resolves(guard.hook)
        setattr(sys, _STATE_ATTR, guard)
    else:
        guard.allow(allow_hosts)
    if enforce:
        guard.enforce()
    if local_only:
        guard.refuse_ip()
    return guard


def _check_before_c_resolves(hook) -> None:
    """Run ``hook``'s send check before C parses the address; mark ``NI_NUMERICHOST`` ``getnameinfo`` calls."""
    # CPython gap: socket.socket's connect/sendto/sendmsg parse the address before their audit event, and parsing a
    # host name resolves it (libc getaddrinfo, no event): connect(("exfil-secret.example", 80)) sent a DNS query.
    import functools

    base = _socket.socket

    @functools.wraps(base.connect)
    def connect(self, address):
        hook("socket.connect", (self, address))
        return base.connect(self, address)

    @functools.wraps(base.connect_ex)
    def connect_ex(self, address):
        hook("socket.connect", (self, address))
        return base.connect_ex(self, address)

    @functools.wraps(base.sendto)
    def sendto(self, data, *args):
        if args:  # sendto(data, address) or sendto(data, flags, address); C reports a wrong count itself
            hook("socket.sendto", (self, args[-1]))
        return base.sendto(self, data, *args)

    @functools.wraps(base.sendmsg)
    def sendmsg(self, *args):
        if len(args) > 3:  # sendmsg(buffers, ancdata, flags, address): positional only in C too
            hook("socket.sendmsg", (self, args[3]))
        return base.sendmsg(self, *args)

    @functools.wraps(_C_GETNAMEINFO)
    def getnameinfo(sockaddr, flags):
        if type(sockaddr) is not tuple or type(flags) is not int or not flags & _socket.NI_NUMERICHOST:
            return _C_GETNAMEINFO(sockaddr, flags)  # the event checks it: a PTR query unless /etc/hosts answers
        previous = getattr(_NUMERIC_LOOKUP, "sockaddr", None)
        _NUMERIC_LOOKUP.sockaddr = sockaddr  # a tuple cannot change; C parses it numerically only
        try:
            return _C_GETNAMEINFO(sockaddr, flags)
        finally:
            _NUMERIC_LOOKUP.sockaddr = previous

    socket.getnameinfo = getnameinfo
    cls = socket.socket
    if not (isinstance(cls, type) and issubclass(cls, base) and cls.__module__ == "socket"):
        return  # replaced already (gevent's monkey patching): its class is not ours to change; the events stay
    for method in (connect, connect_ex, sendto, sendmsg):
        setattr(cls, method.__name__, method)


def site_dir() -> str:
    """The folder ``hfcache exec`` puts first on a Python child's ``PYTHONPATH`` (it holds the ``sitecustomize``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard_site")

