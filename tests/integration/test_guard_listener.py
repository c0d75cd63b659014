"""The exec network guard against every way Python can put a byte on the network, checked by a real listener.

A TCP and a UDP socket on 127.0.0.1 record every connection and datagram that arrives. The child under
``hfcache exec`` tries each audited way to send or resolve (docs/security.md; e.g. ``sendmsg`` with ``MSG_FASTOPEN``
connected and delivered data past the guard); the same child without the guard reaches the listener, so the check
can fail.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading

import pytest

from tests.helpers import clean_env, listener, run_hfcache

ATTEMPTS = textwrap.dedent("""
    import json, socket, sys
    port, mode = int(sys.argv[1]), sys.argv[2]
    target = ("127.0.0.1", port)
    def tcp_fastopen():
        s = socket.socket(); s.sendmsg([b"fastopen"], [], socket.MSG_FASTOPEN, target); s.close()
    def tcp_sendto_fastopen():
        s = socket.socket(); s.sendto(b"sendto-fastopen", socket.MSG_FASTOPEN, target); s.close()
    def udp_sendmsg():
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"udp-sendmsg"], [], 0, target)
    def udp_sendto():
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"udp-sendto", target)
    def udp6_mapped():
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"udp6", ("::ffff:127.0.0.1", port))
    def connect_ex():
        s = socket.socket(); s.connect_ex(target); s.sendall(b"connect-ex"); s.close()
    def create_connection():
        socket.create_connection(target, timeout=5).sendall(b"create-connection")
    sends = [tcp_fastopen, tcp_sendto_fastopen, udp_sendmsg, udp_sendto, udp6_mapped, connect_ex, create_connection]
    lookups = [
        lambda: socket.gethostbyaddr("192.0.2.1"),
        lambda: socket.getnameinfo(("192.0.2.1", 443), 0),
        lambda: socket.gethostbyname_ex("hub.invalid"),
        lambda: socket.getaddrinfo("hub.invalid", 443),
        lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW),
    ]
    out = {}
    for attempt in sends + (lookups if mode == "all" else []):
        name = getattr(attempt, "__name__", "lambda") + str(len(out))
        try:
            attempt()
            out[name] = "sent"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    # Loopback reverse look-ups are answered from /etc/hosts: http.server and socket.getfqdn() need them.
    if mode == "all":
        socket.gethostbyaddr("127.0.0.1"); socket.getfqdn()
    print(json.dumps(out))
""")



def test_every_send_and_lookup_is_blocked_and_nothing_reaches_the_listener(tmp_path):
    with listener() as (port, arrivals):
        proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--", sys.executable, "-c", ATTEMPTS,
                            str(port), "all"])
        assert proc.returncode == 0, proc.stderr
        results = json.loads(proc.stdout.strip().splitlines()[-1])
        threading.Event().wait(1.0)  # let late datagrams land
        assert arrivals == [], arrivals
    assert len(results) == 12
    for name, result in results.items():
        assert result.startswith("NetworkBlocked: hfcache blocked a "), (name, result)
    assert f"connection to 127.0.0.1:{port}" in results["tcp_fastopen0"]
    assert "reverse DNS lookup of 192.0.2.1" in results["<lambda>7"]
    assert "reverse DNS lookup of 192.0.2.1" in results["<lambda>8"]
    assert "DNS lookup of hub.invalid" in results["<lambda>9"]
    assert "socket of address family AF_PACKET" in results["<lambda>11"]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("models--*"))


def test_the_same_sends_reach_the_listener_without_the_guard():
    """The control: without exec the attempts do arrive, so the test above would see a leak."""
    import subprocess

    with listener() as (port, arrivals):
        proc = subprocess.run([sys.executable, "-c", ATTEMPTS, str(port), "sends"], capture_output=True, text=True,
                              env=clean_env(), timeout=60)
        assert proc.returncode == 0, proc.stderr
        threading.Event().wait(1.0)
    assert "tcp:b'fastopen'" in arrivals and "udp:b'udp-sendmsg'" in arrivals and "udp:b'udp-sendto'" in arrivals, \
        arrivals


@pytest.mark.parametrize("flag", ["-I", "-S", "-E"])
def test_a_child_that_skips_site_is_not_guarded(tmp_path, flag):
    """Documented blind spot (README): -I/-S/-E interpreters never load the guard's sitecustomize."""
    with listener() as (port, arrivals):
        proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--", sys.executable, flag, "-c",
                            ATTEMPTS, str(port), "sends"])
        assert proc.returncode == 0, proc.stderr
        threading.Event().wait(1.0)
    assert "udp:b'udp-sendto'" in arrivals


FLIPS = textwrap.dedent("""
    import json, socket, sys
    port = int(sys.argv[1])
    guard = sys._hfcache_network_guard
    out = {}
    for name, flip in [("enforced", lambda: setattr(guard, "enforced", False)),
                       ("hook", lambda: setattr(guard, "hook", lambda *a: None)),
                       ("state", lambda: setattr(sys, "_hfcache_network_guard", None))]:
        try:
            flip()
            out[name] = "flipped"
        except AttributeError as exc:
            out[name] = f"AttributeError: {exc}"
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"after-flip", ("127.0.0.1", port))
        out["send"] = "sent"
    except Exception as exc:
        out["send"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")


def test_the_guard_cannot_be_switched_off_by_an_attribute(tmp_path):
    """The hook keeps its state in a closure: flipping ``enforced``, rebinding the hook or dropping the guard object
    from ``sys`` changes nothing it reads (docs/security.md)."""
    with listener() as (port, arrivals):
        proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--", sys.executable, "-c", FLIPS,
                            str(port)])
        assert proc.returncode == 0, proc.stderr
        threading.Event().wait(1.0)
        assert arrivals == [], arrivals
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["enforced"].startswith("AttributeError: the network guard's 'enforced' cannot be changed")
    assert results["hook"].startswith("AttributeError")
    assert results["send"].startswith(f"NetworkBlocked: hfcache blocked a connection to 127.0.0.1:{port}"), results


def test_a_grandchild_that_rewrites_its_environment_is_not_guarded(tmp_path):
    """Documented blind spot (README): the guard is a seatbelt, not a sandbox. A process that widens the allow-list
    in its children's environment, or drops PYTHONPATH, starts them unguarded."""
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {ATTEMPTS!r}, sys.argv[1], 'sends'])"
    widen = ("import os, subprocess, sys; os.environ['HFCACHE_ALLOW_HOSTS'] = 'localhost'; "
             f"subprocess.run([sys.executable, '-c', {ATTEMPTS!r}, sys.argv[1], 'sends'])")
    for script in (widen, grandchild.replace("subprocess.run(", "subprocess.run(env={}, args=")):
        with listener() as (port, arrivals):
            proc = run_hfcache(["exec", "--cache-dir", str(tmp_path / "cache"), "--", sys.executable, "-c", script,
                                str(port)])
            assert proc.returncode == 0, proc.stderr
            threading.Event().wait(1.0)
        assert "udp:b'udp-sendto'" in arrivals, (script[:60], arrivals, proc.stderr)
