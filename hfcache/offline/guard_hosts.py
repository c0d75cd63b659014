"""The network guard's allow-list: what one ``HOST[:PORT]`` entry is, how the list travels to a child in
``HFCACHE_ALLOW_HOSTS``, which names and addresses ``/etc/hosts`` answers without a nameserver, and how the guard
reads an audit event's arguments (exactly a tuple, str, bytes or int: immutable, so what is checked is what C uses).

Part of the guard (:mod:`hfcache.offline.guard`, which re-exports every public name here) and, like it, standard
library only and importable on its own: the exec ``sitecustomize`` loads ``guard.py`` by file path, which loads
this file next to it the same way.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from typing import Iterable

#: Environment variable carrying the allowed hosts to a child: ``HOST[:PORT]`` entries separated by commas.
ENV_ALLOW_HOSTS = "HFCACHE_ALLOW_HOSTS"
#: One allow-list entry: a host name (RFC 1123 labels; ``_`` allowed, as in container names), an IPv4 address,
#: an IPv6 address (bare, or in brackets, optionally with a ``%scope``), each optionally with ``:PORT``.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_IPV6_TEXT = re.compile(r"[0-9a-f:.]+(?:%[a-z0-9_.-]+)?")
_PORT_TEXT = re.compile(r"[0-9]{1,5}")
_IP_ADDRESS = ipaddress.ip_address


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
    """Parse exactly one ``HOST``, ``HOST:PORT``, ``IPV6``, ``[IPV6]`` or ``[IPV6]:PORT``.

    ``HOST`` is a host name of RFC 1123 labels (letters, digits, ``-``, and ``_`` as container names use; at most
    253 characters; a last label of digits only must be a whole IPv4 address) or an IPv4 address. Nothing else is
    accepted: no separators (``,`` ``;`` whitespace), no ``/``, ``@``, control or non-ASCII characters, so an entry
    never becomes several entries (``HFCACHE_ALLOW_HOSTS`` is comma-separated) or means more than it says.

    Args:
        spec (str): the entry as typed (``--allow-host``, ``allow_hosts=``, one ``HFCACHE_ALLOW_HOSTS`` item).

    Returns:
        AllowedHost: the host in lower case without a trailing dot (addresses in their canonical form).

    Raises:
        ValueError: anything that is not one host with an optional port from 1 to 65535 (the message quotes
            ``spec`` with ``repr``, so a control character is shown escaped).
    """
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
    """A name of RFC 1123 labels, or a dotted IPv4 address (C's ``inet_aton`` reads ``10.1`` or ``1234`` as an
    address too, so a last label of digits only is accepted only as a whole IPv4 address)."""
    if not host or len(host) > 254 or not _HOST_NAME.fullmatch(host) or ":" in host:
        return False
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return not last.isdigit() or (host.count(".") == 3 and _ip(host) is not None)


def hosts_from_environ(environ: dict[str, str] | None = None) -> tuple[AllowedHost, ...]:
    """The allow-list a parent passed in ``HFCACHE_ALLOW_HOSTS``: ``HOST[:PORT]`` entries (:func:`parse_allow_host`)
    joined by single commas, as :func:`format_allow_hosts` writes it. Unset or empty: nothing allowed.

    Raises:
        ValueError: an entry does not parse, or is empty (``a,,b``, a leading or trailing comma, spaces around an
            entry): the caller must then allow nothing (the exec ``sitecustomize`` does), never guess.
    """
    value = (os.environ if environ is None else environ).get(ENV_ALLOW_HOSTS, "")
    if not value:
        return ()
    return tuple(parse_allow_host(item) for item in value.split(","))


def format_allow_hosts(hosts: Iterable[AllowedHost]) -> str:
    """The ``HFCACHE_ALLOW_HOSTS`` value for ``hosts`` (inverse of :func:`hosts_from_environ`)."""
    return ",".join(str(h) for h in hosts)


def _ip(host: str):
    try:
        ip = _IP_ADDRESS(host.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _target(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def hosts_file_names(path: str = "/etc/hosts", nsswitch: str = "/etc/nsswitch.conf") -> frozenset:
    """Every name (lower case, no trailing dot) of ``path`` when ``nsswitch``'s ``hosts:`` line consults ``files``
    before ``dns`` (or has no such line: glibc's default is ``files dns``); empty when ``dns`` comes first or the
    file cannot be read. A summary for people; the guard matches with :func:`hosts_file_entries`, which is exact."""
    names, _ = hosts_file_entries(path, nsswitch)
    return frozenset(name.rstrip(".") for name in names)


def hosts_file_entries(path: str = "/etc/hosts", nsswitch: str = "/etc/nsswitch.conf") -> tuple[dict, frozenset]:
    """What the C library answers from ``path`` without asking a DNS server (glibc's ``files`` backend, read from
    the files themselves): ``({name: frozenset of IP versions 4/6}, frozenset of addresses)``. Names are lower case
    and keep a trailing dot: glibc compares them case-insensitively and strips nothing (``vm.`` and a lookup of an
    IPv4-only name for ``AF_INET6`` go to the nameserver; checked with a UDP nameserver in
    tests/integration/test_trust3_guard.py). Addresses are ``ipaddress`` objects as written (an IPv4-mapped IPv6
    address is not its IPv4 address: glibc asks the nameserver for it). Both empty when ``nsswitch``'s ``hosts:``
    line consults ``dns`` before ``files`` or not ``files`` at all, or ``path`` cannot be read.

    glibc sends any other name to the nameservers of ``/etc/resolv.conf`` - ``localhost``, ``*.localhost`` and the
    machine's own name included when the file lacks them (RFC 6761 asks resolvers to answer ``.localhost``
    themselves; glibc does not).
    """
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
    """``text`` as an ``ipaddress`` address exactly as written (no IPv4-mapped unwrapping), without a ``%scope``."""
    try:
        return _IP_ADDRESS(text.split("%", 1)[0])
    except ValueError:
        return None


# ------------------------------------------------------------------ reading the guard's audit-event arguments
# (used by guard.py: only exact, immutable types are read, so what is checked is what C uses)


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
    """Raised inside :meth:`_Rules.refusal` when an argument is not of a type the guard can read exactly."""

    def __init__(self, what: object) -> None:
        super().__init__(what)
        self.what = type.__dict__["__name__"].__get__(type(what))  # not type(what).__name__: a metaclass may lie


def _plain_host(value) -> str:
    """``value`` as text when it is exactly a str or bytes (ASCII); else :class:`_Refused`.

    A ``bytearray`` (or ``memoryview``) is refused: another thread can change it between this check and C's
    parse (a connect checked as 127.0.0.1 reached 127.0.0.2, and names were resolved); only an immutable value is
    exactly what C uses."""
    if type(value) is str:
        return value
    if type(value) is bytes and value.isascii():
        return value.decode("ascii")
    raise _Refused(value)


def _plain_address(address) -> tuple[str, int | None]:
    """(host, port) of an IP socket address that is exactly a tuple of a plain host and a plain int port."""
    if type(address) is not tuple or len(address) < 2:
        raise _Refused(address)
    host, port = address[0], address[1]
    if type(port) is not int:
        raise _Refused(port)
    return _plain_host(host), port or None
