"""What a Hub endpoint is trusted with: a manifest's endpoint gets no token without the user's opt-in, manifest paths
expand ``~`` only, every metadata answer has a deadline and every body a throughput floor, and a full commit sha
must be answered as itself (warm, lock, warm --lock).

Each test builds the hostile endpoint or manifest itself (a small Hub below, on tests/hostile.py's ``PeerServer``), runs the real
command as a subprocess, and checks the exit code, the one-line message, that the token never leaves for where it
was not sent (the endpoint's request log, every output, every path), that a canary outside the cache is unchanged
and that the cache still verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path

import pytest

from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.hostile import CONTENT, PeerServer, git_sha1

TOKEN = "hf_manifestSecretTokenValue0123456789"
REPO = "org/x"
C = hashlib.sha1(b"asked commit").hexdigest()  # a commit id
D = hashlib.sha1(b"other commit").hexdigest()


class TinyHub(PeerServer):
    """One repo, ``org/x`` with ``tokenizer.json``, served at commit ``C`` (``D`` with mode ``other_sha``).

    Modes: ``honest``; ``gated`` (401 GatedRepo without the token); ``drip_info`` (repo info at 1 B/s);
    ``gzip_drip`` (repo info as an endless run of empty gzip members); ``drip_body`` (the file at 1 B/s);
    ``other_sha`` (any revision answered as ``D``); ``other_commit_header`` (file GETs say ``X-Repo-Commit: D``).
    ``auth`` logs every request's path and Authorization header. The test Hub answers the commit it was asked and
    sends whole bodies (paced at most): drips and another commit than asked are this server's.
    """

    def __init__(self, mode: str = "honest") -> None:
        self.mode = mode
        self.auth: list[tuple[str, str | None]] = []
        super().__init__()

    def _record(self, h) -> None:
        self.auth.append((h.path, h.headers.get("Authorization")))

    def saw_token(self) -> bool:
        return any(value is not None and TOKEN in value for _, value in self.auth)

    def _send(self, h, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _drip(self, h, body: bytes, headers: dict[str, str]) -> None:
        h.send_response(200)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            h.send_header(key, value)
        h.end_headers()
        for i in range(len(body)):
            if self.stop.wait(1.0):
                return
            h.wfile.write(body[i:i + 1])
            h.wfile.flush()

    def _answer(self, h, head: bool) -> None:
        path = h.path.split("?")[0]
        if self.mode == "gated" and h.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(h, 401, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo",
                                                      "X-Error-Message": "Access to this repo is restricted"}, head)
            return
        if path.startswith(f"/api/models/{REPO}/revision/"):
            sha = D if self.mode == "other_sha" else C
            info = {"id": REPO, "sha": sha, "siblings": [
                {"rfilename": "tokenizer.json", "size": len(CONTENT), "blobId": git_sha1(CONTENT)}]}
            body = json.dumps(info).encode()
            if self.mode == "drip_info":
                self._drip(h, body, {"Content-Type": "application/json"})
            elif self.mode == "gzip_drip":
                self._gzip_drip(h)
            else:
                self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        if path.startswith(f"/{REPO}/resolve/"):
            commit = D if self.mode == "other_commit_header" else C
            headers = {"X-Repo-Commit": commit, "ETag": f'"{git_sha1(CONTENT)}"'}
            if self.mode == "drip_body" and not head:
                self._drip(h, CONTENT, headers)
            else:
                self._send(h, 200, CONTENT, headers, head)
            return
        self._send(h, 404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, head)

    def _gzip_drip(self, h) -> None:
        """Repo info as gzip members that each decode to nothing, forever (only compressed bytes arrive)."""
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Encoding", "gzip")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        squeezer = zlib.compressobj(9, zlib.DEFLATED, 31)
        member = squeezer.compress(b"") + squeezer.flush()
        while not self.stop.wait(0.05):
            h.wfile.write(b"%x\r\n%s\r\n" % (len(member), member))
            h.wfile.flush()


def _env(**extra: str) -> dict[str, str]:
    return clean_env(HF_TOKEN=TOKEN, **extra)


def _manifest(folder: Path, endpoint: str, revision: str = "main", cache_dir: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f'endpoint = "{endpoint}"']
    if cache_dir is not None:
        lines.append(f'cache_dir = "{cache_dir}"')
    lines += ["[[repos]]", f'repo_id = "{REPO}"', f'revision = "{revision}"']
    path = folder / "hfcache.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _no_token_anywhere(proc, *roots: Path) -> None:
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr
    for root in roots:
        for path in root.rglob("*"):
            assert TOKEN not in str(path), path
            if path.is_file() and not path.is_symlink():
                assert TOKEN.encode() not in path.read_bytes(), path


def _verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hfcache: error:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------------ the token


def test_lock_sends_no_token_to_a_manifest_endpoint_without_the_opt_in(tmp_path):
    canary = Canary(tmp_path)
    with TinyHub() as hub:
        manifest = _manifest(tmp_path / "project", hub.endpoint)
        proc = run_hfcache(["lock", "--manifest", str(manifest)], env=_env())
    assert proc.returncode == 0, proc.stderr
    assert hub.auth and not hub.saw_token(), hub.auth
    notes = [line for line in proc.stderr.splitlines() if "is not sent to the manifest's endpoint" in line]
    assert len(notes) == 1 and hub.endpoint in notes[0], proc.stderr
    assert (manifest.parent / "hfcache.lock").is_file()
    _no_token_anywhere(proc, tmp_path)
    canary.assert_unchanged()


def test_gated_repo_at_a_manifest_endpoint_fails_with_a_hint_naming_the_opt_in(tmp_path):
    canary = Canary(tmp_path)
    with TinyHub("gated") as hub:
        manifest = _manifest(tmp_path / "project", hub.endpoint)
        proc = run_hfcache(["lock", "--manifest", str(manifest)], env=_env())
    assert proc.returncode == 3, proc.stderr
    assert not hub.saw_token()
    assert "gated or forbidden" in proc.stderr and hub.endpoint in proc.stderr, proc.stderr
    hints = [line for line in proc.stderr.splitlines() if line.startswith("hint:")]
    assert len(hints) == 1 and "--trust-manifest-endpoint" in hints[0], proc.stderr
    assert proc.stderr.count("is not sent to the manifest's endpoint") == 1, proc.stderr
    assert not (manifest.parent / "hfcache.lock").exists()
    _no_token_anywhere(proc, tmp_path)
    canary.assert_unchanged()


@pytest.mark.parametrize("opt_in", ["flag", "env"])
def test_the_opt_in_sends_the_token_to_the_manifest_endpoint(tmp_path, opt_in):
    canary = Canary(tmp_path)
    with TinyHub("gated") as hub:
        manifest = _manifest(tmp_path / "project", hub.endpoint)
        args = ["lock", "--manifest", str(manifest)] + (["--trust-manifest-endpoint"] if opt_in == "flag" else [])
        env = _env(HFCACHE_TRUST_MANIFEST_ENDPOINT="1") if opt_in == "env" else _env()
        proc = run_hfcache(args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert hub.saw_token()
    assert "is not sent" not in proc.stderr
    _no_token_anywhere(proc, tmp_path)
    canary.assert_unchanged()


def _lock_for(tmp_path: Path, endpoint: str) -> Path:
    """A lock resolved from an honest hub with the user's own --endpoint (the token is the user's to send)."""
    manifest = _manifest(tmp_path / "project", endpoint)
    proc = run_hfcache(["lock", "--manifest", str(manifest), "--endpoint", endpoint], env=_env())
    assert proc.returncode == 0, proc.stderr
    return manifest.parent / "hfcache.lock"


@pytest.mark.parametrize("how", ["manifest", "flag", "cli_endpoint", "hf_endpoint"])
def test_warm_lock_sends_the_token_only_where_the_user_said(tmp_path, how):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with TinyHub("gated") as hub:
        lock = _lock_for(tmp_path, hub.endpoint)
        hub.auth.clear()
        args = ["warm", "--lock", str(lock), "--cache-dir", str(cache), "--json"]
        env = _env()
        if how == "flag":
            args.append("--trust-manifest-endpoint")
        elif how == "cli_endpoint":
            args += ["--endpoint", hub.endpoint]
        elif how == "hf_endpoint":
            env = _env(HF_ENDPOINT=hub.endpoint)  # the same origin as the manifest's: the user named it
        proc = run_hfcache(args, env=env)
    report = json.loads(proc.stdout)
    if how == "manifest":
        assert proc.returncode == 3, proc.stderr
        assert not hub.saw_token(), hub.auth
        assert "--trust-manifest-endpoint" in report["repos"][0]["hint"]
        assert proc.stderr.count("is not sent to the manifest's endpoint") == 1, proc.stderr
        assert not list(cache.glob("*/snapshots/*"))
    else:
        assert proc.returncode == 0, proc.stderr
        assert hub.saw_token()
        _verify_ok(cache)
    _no_token_anywhere(proc, tmp_path)
    canary.assert_unchanged()


def test_manifest_cache_dir_expands_no_environment_variable(tmp_path):
    canary = Canary(tmp_path)
    literal = f"{tmp_path}/x/cache-${{HF_TOKEN}}"
    with TinyHub() as hub:
        manifest = _manifest(tmp_path / "project", hub.endpoint, cache_dir=literal)
        locked = run_hfcache(["lock", "--manifest", str(manifest)], env=_env())
        assert locked.returncode == 0, locked.stderr
        proc = run_hfcache(["warm", "--lock", str(manifest.parent / "hfcache.lock"), "--json"], env=_env())
        table = run_hfcache(["warm", "--lock", str(manifest.parent / "hfcache.lock")], env=_env())
    assert proc.returncode == 0, proc.stderr
    assert table.returncode == 0, table.stderr
    assert json.loads(proc.stdout)["cache_dir"] == literal
    assert Path(literal).is_dir()
    assert not hub.saw_token()
    for run in (locked, proc, table):
        _no_token_anywhere(run, tmp_path)
    _verify_ok(Path(literal))
    canary.assert_unchanged()


# ------------------------------------------------------------------------------------------------ deadlines


@pytest.mark.parametrize("mode", ["drip_info", "gzip_drip"])
def test_a_dripping_repo_info_fails_at_the_metadata_deadline(tmp_path, mode):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with TinyHub(mode) as hub:
        started = time.monotonic()
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint],
                           env=_env(HFCACHE_METADATA_DEADLINE="3"), timeout=60)
        elapsed = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    line = _error_line(proc)
    assert "no complete answer within 3 s" in line and hub.endpoint in line, line
    assert elapsed < 12, f"took {elapsed:.1f}s with HFCACHE_METADATA_DEADLINE=3"
    assert not list(cache.glob("*/snapshots/*")) and not list(cache.glob("*/refs/*"))
    _no_token_anywhere(proc, tmp_path)
    canary.assert_unchanged()


def test_a_dripping_file_body_fails_below_the_throughput_floor(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with TinyHub("drip_body") as hub:
        started = time.monotonic()
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint, "--retries", "1",
                            "--json"], env=_env(HFCACHE_MIN_RATE="1KB", HFCACHE_RATE_WINDOW="2"), timeout=60)
        elapsed = time.monotonic() - started
        gets = [p for p, _ in hub.auth if "/resolve/" in p]
    assert proc.returncode == 3, proc.stderr
    result = json.loads(proc.stdout)["repos"][0]
    assert "below the floor" in result["error"] and hub.endpoint in result["error"], result
    assert result["retries"] == 1 and len(gets) == 2, (result, gets)  # retried once, within --retries
    assert elapsed < 15, f"took {elapsed:.1f}s with HFCACHE_RATE_WINDOW=2"
    assert not list(cache.glob("*/snapshots/*")) and not list(cache.glob("*/refs/*"))
    canary.assert_unchanged()
    _verify_ok(cache)


def test_a_malformed_deadline_setting_is_a_usage_error(tmp_path):
    proc = run_hfcache(["warm", REPO, "--cache-dir", str(tmp_path / "cache"), "--endpoint", "http://127.0.0.1:9"],
                       env=_env(HFCACHE_METADATA_DEADLINE="soon"))
    assert proc.returncode == 2, proc.stderr
    assert "HFCACHE_METADATA_DEADLINE" in _error_line(proc)


# ------------------------------------------------------------------------------------------------ a commit is itself


def _nothing_published(cache: Path) -> None:
    assert not list(cache.glob("*/refs/*")) and not list(cache.glob("*/snapshots/*"))


def test_warm_of_a_full_commit_answered_with_another_sha_fails(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with TinyHub("other_sha") as hub:
        proc = run_hfcache(["warm", f"{REPO}@{C}", "--cache-dir", str(cache), "--endpoint", hub.endpoint],
                           env=_env())
        assert not [p for p, _ in hub.auth if "/resolve/" in p]  # refused before any file was fetched
    assert proc.returncode == 3, proc.stderr
    line = _error_line(proc)
    assert C in line and D in line and hub.endpoint in line, line
    _nothing_published(cache)
    assert not list(cache.glob("*/blobs/*"))
    canary.assert_unchanged()


def test_lock_of_a_full_commit_answered_with_another_sha_fails(tmp_path):
    canary = Canary(tmp_path)
    with TinyHub("other_sha") as hub:
        manifest = _manifest(tmp_path / "project", hub.endpoint, revision=C)
        proc = run_hfcache(["lock", "--manifest", str(manifest), "--endpoint", hub.endpoint], env=_env())
    assert proc.returncode == 3, proc.stderr
    assert C in proc.stderr and D in proc.stderr and hub.endpoint in proc.stderr, proc.stderr
    assert not (manifest.parent / "hfcache.lock").exists()
    canary.assert_unchanged()


def test_a_lock_pinning_a_full_commit_to_another_sha_is_refused(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with TinyHub() as hub:
        manifest = _manifest(tmp_path / "project", hub.endpoint, revision=C)
        proc = run_hfcache(["lock", "--manifest", str(manifest), "--endpoint", hub.endpoint], env=_env())
        assert proc.returncode == 0, proc.stderr
        lock = manifest.parent / "hfcache.lock"
        lock.write_text(lock.read_text(encoding="utf-8").replace(f'commit_hash = "{C}"', f'commit_hash = "{D}"'),
                        encoding="utf-8")
        hub.auth.clear()
        proc = run_hfcache(["warm", "--lock", str(lock), "--cache-dir", str(cache), "--endpoint", hub.endpoint],
                           env=_env())
        assert not hub.auth  # refused before any request
    assert proc.returncode == 2, proc.stderr
    line = _error_line(proc)
    assert C in line and D in line, line
    _nothing_published(cache)
    canary.assert_unchanged()


def test_warm_lock_refuses_file_answers_naming_another_commit(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with TinyHub() as hub:
        lock = _lock_for(tmp_path, hub.endpoint)
        hub.mode = "other_commit_header"
        proc = run_hfcache(["warm", "--lock", str(lock), "--cache-dir", str(cache), "--endpoint", hub.endpoint,
                            "--json"], env=_env())
    assert proc.returncode == 3, proc.stderr
    error = json.loads(proc.stdout)["repos"][0]["error"]
    assert C in error and D in error and hub.endpoint in error, error
    _nothing_published(cache)
    canary.assert_unchanged()
    if cache.exists():
        _verify_ok(cache)
    assert os.path.isdir(tmp_path / "canary")
