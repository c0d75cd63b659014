"""The whole-answer metadata deadline follows ``--timeout`` (hfcache/pace.py ``metadata_deadline``, docs/security.md
"Deadlines"): 12 timeouts, at least 10 s, at most 120 s, unless ``HFCACHE_METADATA_DEADLINE`` is set.

Before, the deadline was 120 s whatever ``--timeout`` said: ``warm --timeout 3`` on an endpoint dripping its repo info
one byte a second ended after 121 s. Each command that takes ``--timeout`` and asks a Hub, an upstream or a registry
is run here against an endpoint that drips every answer at 1 B/s, as a real subprocess (the mirror in-process, as
``hfcache serve`` runs it), and must end at the deadline its ``--timeout`` derives, naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx2

from hfcache.pace import DEADLINE_PER_TIMEOUT, MIN_METADATA_DEADLINE
from hfcache.serve.pullthrough import PullThroughConfig
from tests.helpers import clean_env, run_hfcache
from tests.hostile import CONTENT, PeerServer, git_sha1
from tests.testhub import HubServer

REPO = "org/x"
C = "c" * 40
#: A repo info long enough that a drip of it outlasts every deadline tried here (1 B/s, or 5 B/s for 14 s).
PADDING = " " * 400


class DripHub(PeerServer):
    """``org/x`` at commit ``C`` with ``tokenizer.json``; with ``drip`` set, every answer (repo info, files, a
    registry's ``/v2/`` too) is sent one byte every ``interval`` seconds after its headers: no single wait is as long
    as ``--timeout``, so only the whole-answer deadline ends it. (The test Hub's ``throttle_bps`` paces file bodies
    only; this drips metadata too.)"""

    def __init__(self, interval: float = 1.0) -> None:
        self.drip, self.interval = False, interval
        super().__init__()

    def _answer(self, h, head: bool) -> None:
        path = h.path.split("?")[0]
        if path.startswith(f"/api/models/{REPO}/revision/"):
            info = {"id": REPO, "sha": C, "siblings": [{"rfilename": "tokenizer.json", "size": len(CONTENT),
                                                        "blobId": git_sha1(CONTENT)}]}
            body, headers = json.dumps(info).encode() + PADDING.encode(), {"Content-Type": "application/json"}
        elif path.startswith(f"/{REPO}/resolve/"):
            body, headers = CONTENT, {"X-Repo-Commit": C, "ETag": f'"{git_sha1(CONTENT)}"'}
        elif path.startswith("/v2/"):  # a registry: its ping, then the manifest
            body, headers = b"{}" + PADDING.encode(), {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
        else:
            body, headers = b'{"error": "not found"}' + PADDING.encode(), {"X-Error-Code": "RepoNotFound"}
        h.send_response(404 if "X-Error-Code" in headers else 200)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            h.send_header(key, value)
        h.end_headers()
        if head:
            return
        if not self.drip:
            h.wfile.write(body)
            return
        for i in range(len(body)):
            if self.stop.wait(self.interval):
                return
            h.wfile.write(body[i:i + 1])
            h.wfile.flush()


def _deadline_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "no complete answer within" in line]
    assert lines, stderr
    return lines[0]


def test_warm_timeout_3_ends_at_36_seconds_not_120_on_a_dripping_endpoint(tmp_path):
    """``warm --timeout 3`` on a repo info dripped at 1 B/s ends at 12 x 3 = 36 s, exit 3 naming the
    deadline and the endpoint (measured before the fix: 120.5 s, "within 120 s")."""
    expected = DEADLINE_PER_TIMEOUT * 3
    with DripHub() as hub:
        hub.drip = True
        started = time.monotonic()
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(tmp_path / "cache"), "--endpoint", hub.endpoint,
                            "--timeout", "3"], env=clean_env(), timeout=150)
        elapsed = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    line = _deadline_line(proc.stderr)
    assert f"no complete answer within {expected} s" in line and hub.endpoint in line, line
    assert "raise --timeout / HFCACHE_METADATA_DEADLINE" in proc.stderr.splitlines()[-1], proc.stderr  # the hint
    assert expected - 1 < elapsed < expected + 12, f"took {elapsed:.1f}s; the deadline of --timeout 3 is {expected} s"
    assert not list((tmp_path / "cache").glob("*/snapshots/*"))


def test_an_explicit_deadline_setting_wins_over_timeout(tmp_path):
    """``HFCACHE_METADATA_DEADLINE`` set explicitly wins both ways: 2 s under ``--timeout 3`` (derived 36 s), and
    14 s over ``--timeout 0.5`` (derived 10 s), each ending at its own figure."""
    with DripHub(interval=0.2) as hub:
        hub.drip = True
        runs: dict[str, tuple[float, subprocess.Popen]] = {}
        for seconds, timeout in (("2", "3"), ("14", "0.5")):
            args = [sys.executable, "-m", "hfcache", "warm", REPO, "--cache-dir", str(tmp_path / f"c{seconds}"),
                    "--endpoint", hub.endpoint, "--timeout", timeout]
            runs[seconds] = (time.monotonic(), subprocess.Popen(args, env=clean_env(HFCACHE_METADATA_DEADLINE=seconds),
                                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                               text=True))
        for seconds, (started, proc) in runs.items():
            _, stderr = proc.communicate(timeout=90)
            elapsed = time.monotonic() - started
            assert proc.returncode == 3, stderr
            assert f"no complete answer within {seconds} s" in _deadline_line(stderr)
            assert float(seconds) - 1 < elapsed < float(seconds) + 10, (seconds, elapsed)


def test_lock_repair_pull_and_the_mirror_derive_their_deadline_from_timeout(tmp_path, monkeypatch):
    """Every other command with ``--timeout`` that asks a peer: ``lock``, ``verify --repair``, ``pull`` (a registry)
    and ``serve --upstream`` (the mirror's wait and its upstream requests), each with ``--timeout 0.5``, end at the
    least derived deadline (10 s) on the dripping peer, naming it; run at once so the test takes one deadline."""
    floor = int(MIN_METADATA_DEADLINE)
    with DripHub(interval=0.2) as hub:
        cache = tmp_path / "cache"
        warmed = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint], env=clean_env())
        assert warmed.returncode == 0, warmed.stderr
        blob = next((cache / "models--org--x" / "blobs").iterdir())
        blob.chmod(0o644)
        blob.write_bytes(CONTENT.replace(b"UNK", b"XXX"))  # corrupt: --repair must fetch it again
        project = tmp_path / "project"
        project.mkdir()
        (project / "hfcache.toml").write_text(f'endpoint = "{hub.endpoint}"\n[[repos]]\nrepo_id = "{REPO}"\n')
        hub.drip = True
        host = hub.endpoint.removeprefix("http://")
        commands = {
            "lock": ["lock", "--manifest", str(project / "hfcache.toml")],
            "verify --repair": ["verify", "--repair", "--cache-dir", str(cache), "--endpoint", hub.endpoint],
            "pull": ["pull", f"{host}/org/x:v1", "--plain-http", "--cache-dir", str(tmp_path / "pulled")],
        }
        started = time.monotonic()
        procs = {name: subprocess.Popen([sys.executable, "-m", "hfcache", *args, "--timeout", "0.5"],
                                        env=clean_env(), cwd=project, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
                 for name, args in commands.items()}
        try:
            mirror_root = tmp_path / "mirror"
            mirror_root.mkdir()
            with HubServer(mirror_root, layout="cache", backend="uvicorn", lfs_redirect=False,
                           upstream=PullThroughConfig(upstreams=(hub.endpoint,), timeout=0.5)) as mirror:
                answer = httpx2.get(f"{mirror.endpoint}/api/models/{REPO}/revision/main", timeout=90)
                mirror_elapsed = time.monotonic() - started
            results = {}
            for name, proc in procs.items():
                _, stderr = proc.communicate(timeout=90)
                results[name] = (proc.returncode, _deadline_line(stderr), time.monotonic() - started)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert answer.status_code == 503, (answer.status_code, answer.text)
    assert f"no complete answer within {floor} s" in answer.json()["error"], answer.text
    assert mirror_elapsed < floor + 10, mirror_elapsed
    for name, (_, line, elapsed) in results.items():
        assert f"within {floor} s" in line, (name, line)
        assert elapsed < floor + 15, (name, elapsed)
    assert results["lock"][0] == 3 and hub.endpoint in results["lock"][1] and not (project / "hfcache.lock").exists()
    assert results["pull"][0] == 3 and f"registry {host}: GET /v2/org/x/manifests/v1" in results["pull"][1]
    assert results["verify --repair"][0] != 0 and "not repaired" in results["verify --repair"][1]
