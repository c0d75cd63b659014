"""The reliability and security gauntlet: kills, concurrency, hostile servers and caches, disk full, read-only."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache, visible_entries
from tests.hostile import FAULTS, HostileServer
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
REPOS = ["openai-community/gpt2", "FacebookAI/roberta-base", "google-bert/bert-base-chinese",
         "mistralai/Mistral-7B-v0.1"]


def verify_ok(cache: Path, *, allow_empty: bool = False) -> dict:
    """``verify --json`` passes. ``allow_empty``: a run killed before it published any repo leaves an empty cache,
    which is consistent too (verify alone calls it "nothing was verified", exit 1)."""
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json", *(["--allow-empty"] if allow_empty else [])])
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report.get("problems", report)
    return report


def assert_no_partial_visible(cache: Path) -> None:
    """Every snapshot entry resolves to a complete blob, no ref points to a missing snapshot."""
    for entry in cache.glob("*/snapshots/*/**/*"):
        if entry.is_symlink():
            assert entry.exists(), f"dangling {entry}"
    assert scan_cache_dir(cache).warnings == []


# ------------------------------------------------------------------------------------------------ crash safety


@pytest.mark.slow
def test_sigkill_warm_twenty_times_then_it_completes(tmp_path):
    cache = tmp_path / "cache"
    rng = random.Random(1234)
    recovered = mid_file = 0
    # 50 kB/s per connection: downloads resume across kills (progress accumulates), so the link must be slow
    # enough that twenty short runs cannot finish the ~5.6 MB and every kill still lands mid-file.
    with HubServer(HUB, throttle_bps=50_000) as server:
        args = [sys.executable, "-m", "hfcache", "warm", *REPOS, "--cache-dir", str(cache), "--endpoint",
                server.endpoint, "-q"]
        for _ in range(20):
            seen = len(server.requests)
            proc = subprocess.Popen(args, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Kill at a random moment after this run's downloads began (start-up alone takes ~2 s on a loaded CI
            # machine; a fixed delay would kill it before any request).
            deadline = time.monotonic() + 60
            while not any("/resolve/" in r.path and r.method == "GET" for r in server.requests[seen:]) \
                    and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 1.0))
            partial = {p.name for p in cache.glob("*/blobs/*.incomplete")} if cache.exists() else set()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            mid_file += bool(partial)
            if cache.exists():
                verify_ok(cache, allow_empty=True)
                assert_no_partial_visible(cache)
            recovered += 1
        final = subprocess.run(args, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    assert recovered == 20
    print(f"kills: {recovered}/20 recovered, {mid_file} landed mid-file")
    assert mid_file >= 15
    verify_ok(cache)
    loaded = offline_load(cache, ["openai-community/gpt2", "mistralai/Mistral-7B-v0.1"])
    assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")
    assert loaded["mistralai/Mistral-7B-v0.1"]["input_ids"] == golden_ids("mistralai/Mistral-7B-v0.1")


@pytest.mark.slow
def test_sigkill_import_leaves_a_consistent_cache(tmp_path):
    source = tmp_path / "source"
    with HubServer(HUB) as server:
        assert run_hfcache(["warm", *REPOS, "--cache-dir", str(source), "--endpoint", server.endpoint]).returncode == 0
    assert run_hfcache(["export", str(tmp_path / "all.tar"), "--cache-dir", str(source)]).returncode == 0
    target = tmp_path / "target"
    rng = random.Random(99)
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-m", "hfcache", "import", str(tmp_path / "all.tar"), "--cache-dir",
                                 str(target)], env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.15, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if target.exists():  # killed before its first repo was published: an empty cache, consistent too
            verify_ok(target, allow_empty=True)
            assert_no_partial_visible(target)
    proc = run_hfcache(["import", str(tmp_path / "all.tar"), "--cache-dir", str(target)])
    assert proc.returncode == 0, proc.stderr
    verify_ok(target)
    assert {p.name for p in target.glob("models--*")} == {p.name for p in source.glob("models--*")}


# ------------------------------------------------------------------------------------------------ concurrency


@pytest.mark.slow
def test_eight_concurrent_warms_of_overlapping_repos(tmp_path):
    cache = tmp_path / "cache"
    sets = [REPOS[i % 4:] + REPOS[: i % 4] for i in range(8)]  # every process wants every repo, in another order
    with HubServer(HUB, throttle_bps=5_000_000) as server:
        procs = [subprocess.Popen([sys.executable, "-m", "hfcache", "warm", *repos, "--cache-dir", str(cache),
                                   "--endpoint", server.endpoint, "-q"], env=clean_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for repos in sets]
        outs = [p.communicate(timeout=180) for p in procs]
        bodies = [r.path for r in server.requests if r.method == "GET" and r.status == 200
                  and (r.origin == "cdn" or "/resolve/" in r.path)]
    assert [p.returncode for p in procs] == [0] * 8, [o[1] for o in outs]
    verify_ok(cache)
    # The repo lock serialises warms of one repo: every file body crossed the network exactly once.
    assert len(bodies) == len(set(bodies)), sorted(bodies)


# ------------------------------------------------------------------------------------------------ hostile server


EXPECTED = {
    "dotdot_path": (3, "unsafe repo file path"),
    "absolute_path": (3, "unsafe repo file path"),
    "backslash_path": (3, "unsafe repo file path"),
    "bad_hash": (3, "does not match its expected hash"),
    "size_larger": (3, "evil/repo"),
    "size_smaller": (3, "evil/repo"),
    "redirect_loop": (3, "too many redirects"),
    "endless_body": (3, "larger than the"),
    "stall_mid_body": (3, "no answer from"),
    "invalid_json": (3, "malformed answer"),
    "error_500": (3, "HTTP 500"),
    "bad_commit": (3, "not 40 hex characters"),
    "gzip_bomb": (3, "larger than 67108864 bytes (decoded)"),
    "gzip_bomb_404": (3, "larger than 67108864 bytes (decoded)"),
    "deep_json": (3, "nested too deep"),
    "file_and_folder": (3, "'tokenizer.json' as a file and as a folder"),
    "bad_tree_oid": (3, "blob id 'ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ' for tokenizer.json"),
    "bad_head_etag": (3, "blob id 'd41d8cd98f00b204e9800998ecf8427e' for tokenizer.json"),
    "head_without_size": (3, "gave no size"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_hostile_server(tmp_path, fault):
    cache = tmp_path / "cache"
    outside = tmp_path / "outside.json"
    with HostileServer(fault) as server:
        started = time.monotonic()
        proc = run_hfcache(["warm", "evil/repo", "--cache-dir", str(cache), "--endpoint", server.endpoint,
                            "--timeout", "2", "--json"], timeout=60)
        elapsed = time.monotonic() - started
    code, message = EXPECTED[fault]
    assert proc.returncode == code, proc.stderr
    report = json.loads(proc.stdout)
    assert message in report["repos"][0]["error"], report["repos"][0]["error"]
    assert "Traceback" not in proc.stderr
    assert elapsed < 20, f"{fault}: took {elapsed:.1f}s with --timeout 2"
    assert visible_entries(cache) == set()  # nothing unverified visible
    assert not outside.exists() and not (tmp_path / "evil.json").exists()
    written = {p for p in tmp_path.rglob("*")} - {p for p in cache.rglob("*")} - {cache}
    assert written == set(), written  # nothing written outside the cache


# ------------------------------------------------------------------------------------------------ hostile cache


@pytest.fixture
def warmed(tmp_path) -> Path:
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        assert run_hfcache(["warm", "openai-community/gpt2", "FacebookAI/roberta-base", "--cache-dir", str(cache),
                            "--endpoint", server.endpoint]).returncode == 0
    return cache


def make_hostile(cache: Path, tmp_path: Path) -> Path:
    """Every hostile shape at once; returns a secret file outside the cache that must never be read or touched."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    gpt2 = cache / "models--openai-community--gpt2"
    snapshot = next((gpt2 / "snapshots").iterdir())
    (snapshot / "leak.txt").symlink_to(secret)  # symlink pointing outside the cache
    (snapshot / "loop_a").symlink_to("loop_b")  # a symlink loop
    (snapshot / "loop_b").symlink_to("loop_a")
    (gpt2 / "blobs" / ("d" * 40)).mkdir()  # a blob that is a directory
    (gpt2 / "refs" / "heads").mkdir()
    (gpt2 / "refs" / "heads" / "x").write_text(snapshot.name)  # a ref with a path separator
    (cache / "models--..--..").mkdir()  # a folder name that decodes to ..
    (cache / "models--..--..").joinpath("blobs").mkdir()
    return secret


def test_hostile_cache_verify_ls_export_never_leave_the_cache(warmed, tmp_path):
    secret = make_hostile(warmed, tmp_path)
    before = (secret.stat().st_mtime_ns, secret.read_text())
    proc = run_hfcache(["verify", "--cache-dir", str(warmed), "--json"])
    assert proc.returncode == 1
    problems = {(p["path"], p["kind"]) for p in json.loads(proc.stdout)["problems"]}
    assert ("leak.txt", "link_absolute") in problems and ("loop_a", "link_outside") in problems
    assert "TOP SECRET" not in proc.stdout + proc.stderr
    proc = run_hfcache(["ls", "--cache-dir", str(warmed), "--json"])
    assert proc.returncode == 0 and "models--..--.." not in proc.stdout
    proc = run_hfcache(["export", str(tmp_path / "out.tar"), "--cache-dir", str(warmed)])
    assert proc.returncode == 5 and "broken entry" in proc.stderr  # refuses to ship a broken snapshot
    proc = run_hfcache(["export", str(tmp_path / "ok.tar"), "FacebookAI/roberta-base", "--cache-dir", str(warmed)])
    assert proc.returncode == 0
    assert b"TOP SECRET" not in (tmp_path / "ok.tar").read_bytes()
    assert (secret.stat().st_mtime_ns, secret.read_text()) == before
    assert (tmp_path / "secret.txt").exists()


# ------------------------------------------------------------------------------------------------ read-only


def test_read_only_cache_serves_reads_and_refuses_writes_clearly(warmed, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a read-only bind mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(warmed), str(ro)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        assert verify_ok(ro)["blobs_hashed"] > 0
        assert run_hfcache(["ls", "--cache-dir", str(ro)]).returncode == 0
        proc = run_hfcache(["check", "--cache-dir", str(ro)], timeout=300)
        assert proc.returncode == 0, proc.stderr
        loaded = offline_load(ro, ["openai-community/gpt2"])
        assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")
        from tests.served import served

        with served("--cache-dir", str(ro)) as (endpoint, _):  # serve a read-only cache to a real client
            client = tmp_path / "client"
            script = ("import sys; from huggingface_hub import hf_hub_download; print(hf_hub_download("
                      "'openai-community/gpt2', 'vocab.json', cache_dir=sys.argv[1], endpoint=sys.argv[2]))")
            got = subprocess.run([sys.executable, "-c", script, str(client), endpoint], capture_output=True,
                                 text=True, env=clean_env(), timeout=60)
            assert got.returncode == 0, got.stderr
            assert Path(got.stdout.strip()).read_bytes() == (HUB / "openai-community/gpt2/vocab.json").read_bytes()
        with HubServer(HUB) as server:
            proc = run_hfcache(["warm", "google-t5/t5-small", "--cache-dir", str(ro), "--endpoint", server.endpoint])
        assert proc.returncode == 5 and "Read-only file system" in proc.stderr
    finally:
        subprocess.run(["umount", str(ro)])


# ------------------------------------------------------------------------------------------------ secrets


SECRET = "hf_gauntletSECRETtoken0123456789"


def _all_bytes_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.slow
def test_token_never_printed_written_or_sent_to_another_origin(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    outputs: list[str] = []
    ways = {
        "flag": (["--token", SECRET], clean_env()),
        "env": ([], clean_env(HF_TOKEN=SECRET)),
        "file": (["--token-file", str(token_file)], clean_env()),
    }
    with HubServer(HUB, token=SECRET) as server:
        for way, (token_args, env) in ways.items():
            work = tmp_path / way
            work.mkdir()
            cache = work / "cache"
            (work / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\ncache_dir = "cache"\n'
                                               '[[repos]]\nrepo_id = "mistralai/Mistral-7B-v0.1"\n')
            runs = [
                ["warm", "mistralai/Mistral-7B-v0.1", "gpt2", "--cache-dir", str(cache), "--endpoint", server.endpoint,
                 *token_args],
                ["warm", "nobody/missing", "--cache-dir", str(cache), "--endpoint", server.endpoint, "--json",
                 *token_args],
                ["warm", "gpt2", "--cache-dir", str(cache), "--endpoint", "not a url", "--json", *token_args],
                ["lock", *token_args, "--json"],
                ["lock", *token_args],
                ["warm", "--lock", "hfcache.lock", *token_args, "--json"],
                ["verify", "--cache-dir", str(cache), "--repair", "--endpoint", server.endpoint, *token_args, "--json"],
                ["ls", "--cache-dir", str(cache), "--json"],
                ["export", str(work / "cache.tar"), "--cache-dir", str(cache)],
                ["import", str(work / "cache.tar"), "--cache-dir", str(work / "imported"), "--json"],
                ["check", "--cache-dir", str(cache), "--json"],
            ]
            for args in runs:
                proc = run_hfcache(args, env=env, cwd=work, timeout=300)
                outputs.append(proc.stdout + proc.stderr)
            assert (cache / "models--gpt2" / "refs" / "main").exists(), way  # the token did get used
        cdn = [r for r in server.requests if r.origin == "cdn"]
        hub_requests = [r for r in server.requests if r.origin == "hub"]
    assert cdn and not any(r.authorized for r in cdn)  # never sent across the LFS redirect
    assert any(r.authorized for r in hub_requests)
    assert not [o for o in outputs if SECRET in o]
    written = _all_bytes_under(tmp_path)
    assert written.count(SECRET.encode()) == 1  # only the token file itself


@pytest.mark.slow
def test_warm_prune_and_verify_at_once_lose_nothing_pinned(tmp_path):
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        assert run_hfcache(["warm", "openai-community/gpt2", "FacebookAI/roberta-base", "--cache-dir", str(cache),
                            "--endpoint", server.endpoint]).returncode == 0
    with HubServer(HUB, throttle_bps=1_000_000) as server:
        env = clean_env()
        warm = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", "google-bert/bert-base-chinese",
                                 "mistralai/Mistral-7B-v0.1", "--cache-dir", str(cache), "--endpoint",
                                 server.endpoint, "-q"], env=env, stderr=subprocess.PIPE, text=True)
        prunes, verifies = [], []
        deadline = time.monotonic() + 60
        while warm.poll() is None and time.monotonic() < deadline:
            prunes.append(subprocess.run([sys.executable, "-m", "hfcache", "prune", "--cache-dir", str(cache),
                                          "--max-size", "0", "--keep", "openai-community/gpt2", "--yes", "--json"],
                                         env=env, capture_output=True, text=True))
            verifies.append(subprocess.run([sys.executable, "-m", "hfcache", "verify", "--cache-dir", str(cache),
                                            "--json"], env=env, capture_output=True, text=True))
        warm_err = warm.communicate(timeout=120)[1]
    assert warm.returncode == 0, warm_err
    assert prunes and all(p.returncode == 0 for p in prunes), [p.stderr for p in prunes if p.returncode]
    assert all(v.returncode == 0 for v in verifies), [v.stdout[-2000:] for v in verifies if v.returncode]
    print(f"concurrent: 1 warm, {len(prunes)} prunes, {len(verifies)} verifies, 0 errors")
    verify_ok(cache)
    loaded = offline_load(cache, ["openai-community/gpt2"])  # the pinned repo survived every prune
    assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")
