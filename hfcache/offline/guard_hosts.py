"""The network guard's allow-list: what one ``HOST[:PORT]`` entry is, how the list travels to a child in
``HFCACHE_ALLOW_HOSTS``, and which names ``/etc/hosts`` answers without a nameserver.

Part of the guard (:mod:`hfcache.offline.guard`, which re-exports every public name here) and, like it, standard
library only and importable on its own: the exec ``sitecustomize`` loads ``guard.py`` by file path, which loads
this file next to it the same way.
"""

from __future__ import annotations

import ipaddress
import os
import re
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
