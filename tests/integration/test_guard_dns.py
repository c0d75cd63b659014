"""The exec guard's DNS rule against a real nameserver: a UDP listener on 127.0.0.1:53 that records every query.

Inside a private mount namespace (``unshare -m``, root) ``/etc/resolv.conf`` names that listener and ``/etc/hosts``
is one written here. Under ``hfcache exec`` a look-up of ``exfil-secret.localhost`` (glibc sends ``*.localhost`` to the
nameserver) or of the machine's own name (not in that hosts file) is refused and no query arrives; a name of the
hosts file resolves. The same child without the guard does send the query, so the check can fail.
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

from tests.helpers import clean_env

pytestmark = [pytest.mark.container,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="needs root and unshare for a private /etc/resolv.conf")]

CHILD = textwrap.dedent("""
    import json, socket
    out = {}
    for name in ("exfil-secret.localhost", socket.gethostname(), "mirror.hosts-file.test", "localhost"):
        try:
            out[name] = sorted({info[4][0] for info in socket.getaddrinfo(name, 80)})
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
""")


def _run(tmp_path: Path, guarded: bool) -> tuple[dict, list[bytes]]:
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n127.0.0.1 mirror.hosts-file.test\n")
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
    child = [sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path / "cache"), "--"] if guarded else []
    script = 'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    try:
        proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(tmp_path / "resolv.conf"),
                               str(tmp_path / "hosts"), *child, sys.executable, "-c", CHILD],
                              capture_output=True, text=True, env=clean_env(), timeout=120)
        threading.Event().wait(1.0)
    finally:
        stop.set()
        thread.join()
        dns.close()
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), queries


def test_only_localhost_and_hosts_file_names_resolve_and_no_query_leaves(tmp_path):
    results, queries = _run(tmp_path, guarded=True)
    assert queries == [], queries
    assert results["exfil-secret.localhost"].startswith("NetworkBlocked: hfcache blocked a DNS lookup of "
                                                        "exfil-secret.localhost"), results
    own = socket.gethostname()
    assert results[own].startswith(f"NetworkBlocked: hfcache blocked a DNS lookup of {own}"), results
    assert results["mirror.hosts-file.test"] == ["127.0.0.1"]
    assert "127.0.0.1" in results["localhost"]


def test_without_the_guard_the_query_reaches_the_nameserver(tmp_path):
    """The control: the same look-up without exec sends a query that names the secret."""
    results, queries = _run(tmp_path, guarded=False)
    assert any(b"exfil-secret" in q for q in queries), queries
    assert results["mirror.hosts-file.test"] == ["127.0.0.1"]
