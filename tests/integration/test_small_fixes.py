"""The small things a newcomer tripped on: the quickstart's two servers on one port, ``serve --host 0.0.0.0`` saying
only ``127.0.0.1``, a read-only mount named as ``/proc/self/fd/N/...`` by prune, a cache folder made by a warm of
a mistyped id."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HUB, REPO, clean_env, run_hfcache, user_namespaces
from tests.testhub import HubServer


def test_the_quickstarts_servers_use_two_ports():
    page = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    ports = re.findall(r"hfcache serve [^\n]*--port (\d+)", page)
    assert len(ports) == 2 and len(set(ports)) == 2, ports
    task5 = page[page.index("## 5."):]
    assert f"127.0.0.1:{ports[1]}/healthz" in task5 and f"--endpoint http://127.0.0.1:{ports[1]}" in task5


def test_serve_on_every_interface_says_so_and_keeps_the_endpoint_last():
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "serve", "--repos", str(HUB), "--host", "0.0.0.0",
                             "--port", "0"], env=clean_env(), stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline().strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    match = re.fullmatch(r"hfcache: serving repo folders \S+, listening on 0\.0\.0\.0:(\d+) \(every interface\) "
                         r"at http://127\.0\.0\.1:(\d+)", line)
    assert match and match.group(1) == match.group(2) != "0", line


def test_a_warm_of_a_mistyped_id_leaves_no_cache_folder(tmp_path):
    cache = tmp_path / "new" / "cache"
    with HubServer(HUB) as server:
        proc = run_hfcache(["warm", "openai-community/gtp2", "--cache-dir", str(cache), "--endpoint",
                            server.endpoint])
        assert proc.returncode == 3 and "repo not found" in proc.stderr, proc.stderr
        assert not cache.exists()
        existing = tmp_path / "existing"
        assert run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(existing), "--endpoint",
                            server.endpoint]).returncode == 0
        again = run_hfcache(["warm", "openai-community/gtp2", "--cache-dir", str(existing), "--endpoint",
                             server.endpoint])
    assert again.returncode == 3 and (existing / "CACHEDIR.TAG").is_file()  # a cache that was there stays
    assert not (existing / "models--openai-community--gtp2").exists()


@pytest.mark.skipif(not user_namespaces(), reason="no user namespaces to mount a read-only tmpfs")
def test_prune_on_a_read_only_mount_names_the_cache_path(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    script = ('m="$0"; mount -t tmpfs tmpfs "$m" || exit 99; cp -a "$1/." "$m/" && mount -o remount,ro "$m" '
              '|| exit 98; shift 2; "$@"')
    with HubServer(HUB) as server:
        seed = tmp_path / "seed"
        assert run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(seed), "--endpoint",
                            server.endpoint]).returncode == 0
    (seed / "models--openai-community--gpt2" / "blobs" / ("0" * 40)).write_bytes(b"orphan")  # something to prune
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(mount),
                           str(seed), "-", sys.executable, "-m", "hfcache", "prune", "--yes", "--cache-dir",
                           str(mount)], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 5, (proc.returncode, proc.stdout, proc.stderr)
    assert "/proc/self/fd" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert str(mount / ".locks" / "models--openai-community--gpt2") in proc.stdout + proc.stderr
    assert Path(seed / "models--openai-community--gpt2" / "blobs" / ("0" * 40)).exists()
