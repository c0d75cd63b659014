"""The network guard's allow-list rules and exec's child environment (pure; the hook itself is exercised in
tests/integration/test_offline.py, in child processes, since an audit hook cannot be removed)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

from hfcache.errors import UsageError
from hfcache.offline import guard
from hfcache.offline.env import guarded_environment, offline_environment, parse_allow_hosts


@pytest.mark.parametrize("spec, host, port", [
    ("example.org", "example.org", None),
    ("Example.ORG.:443", "example.org", 443),
    ("127.0.0.1:8080", "127.0.0.1", 8080),
    ("::1", "::1", None),
    ("[::1]:8080", "::1", 8080),
    ("[2001:DB8::1]", "2001:db8::1", None),
    ("localhost", "localhost", None),
])
def test_parse_allow_host(spec, host, port):
    entry = guard.parse_allow_host(spec)
    assert (entry.host, entry.port) == (host, port)
    assert guard.parse_allow_host(str(entry)) == entry  # round trip through HFCACHE_ALLOW_HOSTS


@pytest.mark.parametrize("spec", ["", ":80", "host:0", "host:65536", "host:http", "[::1", "[::1]x", "a b", "h/x"])
def test_parse_allow_host_rejects(spec):
    with pytest.raises(ValueError):
        guard.parse_allow_host(spec)


def test_allow_hosts_env_round_trip():
    hosts = parse_allow_hosts(["a.example:1", "[::1]:2", "10.0.0.1", "a.example:1"])
    value = guard.format_allow_hosts(hosts)
    assert value == "a.example:1,[::1]:2,10.0.0.1"
    assert guard.hosts_from_environ({guard.ENV_ALLOW_HOSTS: value}) == hosts


def test_bad_allow_host_is_a_usage_error():
    with pytest.raises(UsageError, match="port"):
        parse_allow_hosts(["h:99999"])


def make_guard(*allowed: str) -> guard.Guard:
    g = guard.Guard()  # not installed: only its rules are tested
    g.allow(allowed)
    return g


def test_nothing_is_allowed_by_default_not_even_loopback():
    g = make_guard()
    assert not g.allows_connection("127.0.0.1", 80)
    assert not g.allows_connection("::1", 80)
    assert not g.allows_connection("huggingface.co", 443)


def test_address_and_port_rules():
    g = make_guard("127.0.0.1:8080", "10.1.2.3")
    assert g.allows_connection("127.0.0.1", 8080)
    assert not g.allows_connection("127.0.0.1", 8081)
    assert not g.allows_connection("127.0.0.2", 8080)
    assert g.allows_connection("10.1.2.3", 1) and g.allows_connection("10.1.2.3", 65535)
    assert g.allows_connection("::ffff:127.0.0.1", 8080)  # an IPv4-mapped IPv6 address is the IPv4 address


def test_localhost_means_every_loopback_address():
    g = make_guard("localhost:9000")
    assert g.allows_connection("127.0.0.1", 9000) and g.allows_connection("127.8.9.10", 9000)
    assert g.allows_connection("::1", 9000) and g.allows_connection("localhost", 9000)
    assert not g.allows_connection("127.0.0.1", 9001)
    assert not g.allows_connection("10.0.0.1", 9000)


def test_an_allowed_name_allows_the_addresses_it_resolves_to():
    name = socket.gethostname()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        pytest.skip("this machine's own name does not resolve")
    g = make_guard(f"{name}:8443")
    assert all(g.allows_connection(address, 8443) for address in addresses)
    assert not any(g.allows_connection(address, 8444) for address in addresses)
    assert g.allows_connection(name, 8443)


def test_dns_lookups():
    g = make_guard("mirror.internal:443")
    assert g.allows_lookup("mirror.internal", 443) and g.allows_lookup("MIRROR.internal.", None)
    assert not g.allows_lookup("mirror.internal", 80)
    assert not g.allows_lookup("huggingface.co", 443)
    # nothing to look up, or resolved locally: the connection itself is checked afterwards
    assert g.allows_lookup("127.0.0.1", 80) and g.allows_lookup("::1", 80) and g.allows_lookup("localhost", 80)


def test_the_error_names_hfcache_the_host_and_how_to_allow_it():
    message = str(guard.NetworkBlocked("connection to", "[::1]:8080"))
    assert message.startswith("hfcache blocked a connection to [::1]:8080")
    assert "--allow-host [::1]:8080" in message and "allow_hosts=['[::1]:8080']" in message
    assert isinstance(guard.NetworkBlocked("x", "y"), RuntimeError)
    assert not isinstance(guard.NetworkBlocked("x", "y"), OSError)  # clients would retry an OSError


def test_child_environment_keeps_pythonpath_after_the_guard():
    offline = offline_environment("/opt/c")
    base = {"PATH": "/usr/bin", "PYTHONPATH": os.pathsep.join(["/app/lib", "/app/more"]), "HF_HUB_OFFLINE": "0"}
    env = guarded_environment(base, offline, parse_allow_hosts(["127.0.0.1:1"]))
    assert env["PYTHONPATH"].split(os.pathsep) == [guard.site_dir(), "/app/lib", "/app/more"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HUB_CACHE"] == "/opt/c" and env["PATH"] == "/usr/bin"
    assert env[guard.ENV_ALLOW_HOSTS] == "127.0.0.1:1"
    again = guarded_environment(env, offline)  # nested exec: the guard is not listed twice, the allow-list replaced
    assert again["PYTHONPATH"].split(os.pathsep) == [guard.site_dir(), "/app/lib", "/app/more"]
    assert guard.ENV_ALLOW_HOSTS not in again
    assert guarded_environment({}, offline)["PYTHONPATH"] == guard.site_dir()


def test_the_guard_site_folder_ships_in_the_package():
    """setuptools' own discovery, with pyproject.toml's [tool.setuptools.packages.find], finds the sitecustomize."""
    from setuptools import find_namespace_packages

    root = Path(guard.__file__).parents[2]
    assert (Path(guard.site_dir()) / "sitecustomize.py").is_file()
    assert "hfcache.offline._guard_site" in find_namespace_packages(where=str(root), include=["hfcache*"])


def test_reverse_lookups():
    """A reverse look-up runs only where the C library answers it from /etc/hosts: anything else asks a nameserver,
    and the address itself can carry data out (127.x.y.z built from secret bytes), allowed hosts included."""
    names, addresses = guard.hosts_file_entries()
    g = make_guard("10.1.2.3", "mirror.internal:443")
    for address in ("127.0.0.1", "::1", "10.1.2.3", "192.0.2.1", "127.95.102.104"):
        assert g.allows_reverse_lookup(address, 80) == (ipaddress.ip_address(address) in addresses), address
    for name in ("localhost", "mirror.internal", "example.org"):
        assert g.allows_reverse_lookup(name, None) == (name in names), name


def test_every_sending_or_resolving_audit_event_is_guarded():
    """The events of CPython's audit table that can send or resolve; a missing one is a hole (docs/security.md, the guard's limits)."""
    assert {"socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                                     "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
                                     "socket.__new__"} <= guard._GUARDED_EVENTS
    g = make_guard()
    g.enforce()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(guard.NetworkBlocked, match="connection to 127.0.0.1:9"):
            g.hook("socket.sendmsg", (udp, ("127.0.0.1", 9)))
        g.hook("socket.sendmsg", (udp, None))  # a connected socket: its connect was checked
    finally:
        udp.close()
    with pytest.raises(guard.NetworkBlocked, match="reverse DNS lookup of 192.0.2.1"):
        g.hook("socket.getnameinfo", (("192.0.2.1", 443),))
    with pytest.raises(guard.NetworkBlocked, match="socket of address family"):
        g.hook("socket.__new__", (None, getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW, 0))
    g.hook("socket.__new__", (None, socket.AF_UNIX, socket.SOCK_STREAM, 0))


def test_names_resolve_without_an_entry_only_from_the_hosts_file(tmp_path):
    """glibc sends ``*.localhost`` and the machine's own name to the nameserver unless /etc/hosts answers them."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.5 Mirror.Internal. mirror # comment\n# 10.0.0.6 commented\n"
                     "not-an-ip name-of-garbage\n")
    files_first = tmp_path / "nsswitch-files"
    files_first.write_text("passwd: files\nhosts: files [NOTFOUND=return] dns\n")
    dns_first = tmp_path / "nsswitch-dns"
    dns_first.write_text("hosts: dns files\n")
    assert guard.hosts_file_names(str(hosts), str(files_first)) == {"localhost", "mirror.internal", "mirror"}
    assert guard.hosts_file_names(str(hosts), str(dns_first)) == frozenset()
    assert guard.hosts_file_names(str(hosts), str(tmp_path / "none")) == {"localhost", "mirror.internal", "mirror"}
    assert guard.hosts_file_names(str(tmp_path / "none"), str(files_first)) == frozenset()
    g = make_guard()
    assert g.allows_lookup("localhost", 80)
    assert not g.allows_lookup("exfil-secret.localhost", 80) and not g.allows_lookup("a.b.localhost.", None)


def test_enforced_is_a_latch_the_hook_reads_from_its_closure():
    g = make_guard()
    assert not g.enforced
    g.enforce()
    assert g.enforced
    with pytest.raises(AttributeError, match="cannot be changed"):
        g.enforced = False
    with pytest.raises(AttributeError):
        g.hook = lambda *a: None
    with pytest.raises(guard.NetworkBlocked, match="DNS lookup of exfil.localhost"):
        g.hook("socket.getaddrinfo", ("exfil.localhost", 80, 0, 0, 0, 0))
    assert g.attempts == ["exfil.localhost"]
