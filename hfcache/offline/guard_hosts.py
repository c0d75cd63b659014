"""The network guard's allow-list and readers: one ``HOST[:PORT]`` entry, the list in ``HFCACHE_ALLOW_HOSTS``, what
``/etc/hosts`` answers without a nameserver, and an audit event's arguments and a socket's family and type as C and the
kernel hold them. Part of :mod:`hfcache.offline.guard` (which re-exports it): standard library only, loaded by file path
with it."""

from __future__ import annotations

import _socket
import contextlib
import ipaddress
import os
import re
import socket
from collections.abc import Iterable

#: Environment variable carrying the allowed hosts to a child: ``HOST[:PORT]`` entries separated by commas.
ENV_ALLOW_HOSTS = "HFCACHE_ALLOW_HOSTS"
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_IPV6_TEXT = re.compile(r"[0-9a-f:.]+(?:%[a-z0-9_.-]+)?")
_PORT_TEXT = re.compile(r"[0-9]{1,5}")
_IP_ADDRESS = ipaddress.ip_address


class AllowedHost:
    """One ``HOST[:PORT]`` entry: a host name (matched by name and by the addresses it resolves to), an IPv4 or IPv6
    address, or ``localhost`` (every loopback address); without a port, every port."""

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
    """Parse exactly one ``HOST``, ``HOST:PORT``, ``IPV6``, ``[IPV6]`` or ``[IPV6]:PORT`` into the host in lower case
    without a trailing dot (addresses canonical); ``HOST``: :func:`_is_host_name` (``_`` too, as container names use).
    No separators, ``/``, ``@``, control or non-ASCII characters: an entry never becomes several. Raises ValueError
    (quoting ``spec`` with ``repr``): not one host with an optional port from 1 to 65535."""
    text = spec if type(spec) is str else ""
    if not text.isascii() or not text.isprintable():
        raise ValueError(f"invalid host {spec!r}: use one HOST, HOST:PORT or [IPV6]:PORT")
    text = text.lower()
    port_text = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")) or ":" not in host:
            raise ValueError(f"invalid host {spec!r}: use [IPV6]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host = text  # a bare name, IPv4 address, or IPv6 address without a port
    ip = _ip(host) if ":" in host and _IPV6_TEXT.fullmatch(host) else None
    if ip is None and not _is_host_name(host):
        raise ValueError(f"invalid host {spec!r}: use one HOST, HOST:PORT or [IPV6]:PORT")
    port = None
    if port_text is not None:
        if not _PORT_TEXT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
            raise ValueError(f"invalid port in {spec!r}: use a number from 1 to 65535")
        port = int(port_text)
    ip = ip if ip is not None else _ip(host.rstrip("."))
    return AllowedHost(str(ip) if ip is not None else host.rstrip("."), port)


def _is_host_name(host: str) -> bool:
    """A name of RFC 1123 labels, or a dotted IPv4 address (``inet_aton`` reads ``10.1`` as one too)."""
    if not host or len(host) > 254 or not _HOST_NAME.fullmatch(host) or ":" in host:
        return False
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return not last.isdigit() or (host.count(".") == 3 and _ip(host) is not None)


def hosts_from_environ(environ: dict[str, str] | None = None) -> tuple[AllowedHost, ...]:
    """The allow-list a parent passed in ``HFCACHE_ALLOW_HOSTS`` (unset or empty: nothing). ValueError for an entry
    that does not parse or is empty: the caller must then allow nothing."""
    value = (os.environ if environ is None else environ).get(ENV_ALLOW_HOSTS, "")
    if not value:
        return ()
    return tuple(parse_allow_host(item) for item in value.split(","))


def format_allow_hosts(hosts: Iterable[AllowedHost]) -> str:
    """The ``HFCACHE_ALLOW_HOSTS`` value for ``hosts`` (inverse of :func:`hosts_from_environ`)."""
    return ",".join(str(h) for h in hosts)


def _ip(host: str):
    """:func:`_exact_ip` with an IPv4-mapped IPv6 address unwrapped."""
    ip = _exact_ip(host)
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _target(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def hosts_file_names(path: str = "/etc/hosts", nsswitch: str = "/etc/nsswitch.conf") -> frozenset:
    """The names of :func:`hosts_file_entries`, lower case without a trailing dot (a summary for people)."""
    names, _ = hosts_file_entries(path, nsswitch)
    return frozenset(name.rstrip(".") for name in names)


def hosts_file_entries(path: str = "/etc/hosts", nsswitch: str = "/etc/nsswitch.conf") -> tuple[dict, frozenset]:
    """What glibc's ``files`` backend answers from ``path``: ``({name: frozenset of IP versions 4/6}, frozenset of
    addresses)``, names lower case with a trailing dot kept, addresses as written (glibc strips nothing and does not
    unwrap IPv4-mapped addresses; tests/integration/test_trust3_guard.py). Both empty when ``nsswitch`` puts ``dns``
    before ``files`` or lacks ``files``, or ``path`` cannot be read."""
    if not _files_before_dns(nsswitch):
        return {}, frozenset()
    names: dict[str, set] = {}
    addresses = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                ip = _exact_ip(words[0]) if len(words) >= 2 else None
                if ip is None:
                    continue
                addresses.add(ip)
                for word in words[1:]:
                    names.setdefault(word.lower(), set()).add(ip.version)
    except OSError:
        return {}, frozenset()
    return {name: frozenset(v) for name, v in names.items()}, frozenset(addresses)


def _files_before_dns(nsswitch: str) -> bool:
    try:
        with open(nsswitch, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if words and words[0] == "hosts:":
                    sources = [w for w in words[1:] if not w.startswith("[")]
                    return "files" in sources and not ("dns" in sources and
                                                       sources.index("dns") < sources.index("files"))
    except OSError:
        pass
    return True


def _exact_ip(text: str):
    """``text`` as an ``ipaddress`` address exactly as written (no IPv4-mapped unwrapping), without ``%scope``."""
    try:
        return _IP_ADDRESS(text.split("%", 1)[0])
    except ValueError:
        return None


# ---------------------- reading the guard's audit-event arguments: only exact, immutable types (what C uses)

#: The C-level values, past what Python code can override (a subclass's ``family`` claimed AF_UNIX, connected TCP):
#: the C struct's ``sock_family``; ``SO_DOMAIN`` asks the kernel (``socket(AF_UNIX, fileno=<an AF_INET fd>)``).
_C_FAMILY = _socket.socket.__dict__["family"]
_C_GETSOCKOPT = _socket.socket.getsockopt
_SO_DOMAIN = getattr(_socket, "SO_DOMAIN", None)
_SO_TYPE = getattr(_socket, "SO_TYPE", None)
#: Socket types whose packets carry headers the program writes (Linux ``SOCK_RAW`` = 3, ``SOCK_PACKET`` = 10): the
#: kernel ignores the port of ``sendto``'s address (raw UDP reached any port) and, with ``IP_HDRINCL``, the host.
_RAW_TYPES = frozenset({getattr(socket, "SOCK_RAW", 3), getattr(socket, "SOCK_PACKET", 10)})


def _real_families(sock) -> frozenset:
    """The family as C stores it and as the kernel reports it (``SO_DOMAIN``); empty for no real socket."""
    try:
        families = {_C_FAMILY.__get__(sock)}
    except TypeError:
        return frozenset()
    if _SO_DOMAIN is not None:
        with contextlib.suppress(OSError):  # closed (the call fails too) or no SO_DOMAIN here: the C value stands
            families.add(_C_GETSOCKOPT(sock, _socket.SOL_SOCKET, _SO_DOMAIN))
    return frozenset(families)


def _kernel_raw(sock) -> int:
    """The socket type when the kernel says ``sock`` is raw (whatever type Python was told), else 0."""
    if _SO_TYPE is None:
        return 0
    try:
        kind = _C_GETSOCKOPT(sock, _socket.SOL_SOCKET, _SO_TYPE) & 0xF
    except (OSError, TypeError):
        return 0  # closed: the send fails too
    return kind if kind in _RAW_TYPES else 0


def _family_name(family) -> str:
    try:
        return socket.AddressFamily(family).name
    except ValueError:
        return str(family)


def _type_name(kind: int) -> str:
    try:
        return socket.SocketKind(kind).name
    except ValueError:
        return "SOCK_PACKET" if kind == 10 else str(kind)


def _port(value) -> int | None:
    """A port given as a plain int, or a plain str/bytes of ASCII digits (a service name: None, any port)."""
    if type(value) is int:
        return value or None
    if type(value) in (str, bytes) and value.isascii() and value.isdigit():
        return int(value) or None
    return None


class _Refused(Exception):
    """An argument not of a type the guard can read exactly (raised inside :meth:`_Rules.refusal`)."""

    def __init__(self, what: object) -> None:
        super().__init__(what)
        self.what = type.__dict__["__name__"].__get__(type(what))  # not type(what).__name__: a metaclass may lie


def _plain_host(value) -> str:
    """``value`` as text when exactly a str or ASCII bytes, else :class:`_Refused`."""
    # A bytearray or memoryview can change between this check and C's parse (checked 127.0.0.1, reached 127.0.0.2).
    if type(value) is str:
        return value
    if type(value) is bytes and value.isascii():
        return value.decode("ascii")
    raise _Refused(value)


def _plain_address(address) -> tuple[str, int | None]:
    """(host, port) of an IP socket address that is exactly a tuple of a plain host and an int port."""
    if type(address) is not tuple or len(address) < 2:
        raise _Refused(address)
    host, port = address[0], address[1]
    if type(port) is not int:
        raise _Refused(port)
    return _plain_host(host), port or None
