"""hfcache warm end to end: a real Hub-compatible server on loopback, real subprocesses, real transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from tests.helpers import (
    clean_env,
    golden_ids,
    offline_load,
    refused_endpoint,
    run_hfcache,
    silent_server,
    visible_entries,
)
from tests.testhub import HubServer

REPOS = [
    "bert-base-uncased",  # legacy id -> google-bert/bert-base-uncased
    "openai-community/gpt2",
    "google-bert/bert-base-chinese",
    "FacebookAI/roberta-base",  # no config.json
    "mistralai/Mistral-7B-v0.1",  # SentencePiece only, an LFS file behind a CDN redirect
    "sentence-transformers/all-MiniLM-L6-v2",  # a subdirectory
]
CANONICAL = {"bert-base-uncased": "google-bert/bert-base-uncased"}


def warm_json(server: HubServer, cache: Path, *specs: str, extra: tuple[str, ...] = ()) -> tuple[int, dict]:
    proc = run_hfcache(["warm", *specs, "--cache-dir", str(cache), "--endpoint", server.endpoint, "--json", *extra])
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr}


@pytest.mark.slow
def test_warm_then_transformers_loads_every_fixture_offline(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, report = warm_json(server, cache, *REPOS)
        assert code == 0, report
        commits = {r: server.commit_of(CANONICAL.get(r, r)) for r in REPOS}
    # The server is stopped: from here on nothing can be fetched.

    by_id = {r["repo_id"]: r for r in report["repos"]}
    assert list(by_id) == REPOS
    for repo_id in REPOS:
        entry = by_id[repo_id]
        assert entry["ok"] and entry["commit_hash"] == commits[repo_id]
        assert entry["canonical_id"] == CANONICAL.get(repo_id, repo_id)
        assert all(f["source"] == "downloaded" or f["source"] == "linked" for f in entry["files"])
        for f in entry["files"]:
            assert f["hash"].startswith(("sha256:", "git-sha1:")) and f["size"] > 0
    assert "config.json" in by_id["FacebookAI/roberta-base"]["absent"]
    assert by_id["mistralai/Mistral-7B-v0.1"]["files"][0]["hash"].startswith("sha256:")
    assert "1_Pooling/config.json" not in {f["path"] for f in by_id["sentence-transformers/all-MiniLM-L6-v2"]["files"]}

    ids = [*REPOS, "google-bert/bert-base-uncased"]
    loaded = offline_load(cache, ids)
    for repo_id in ids:
        assert "error" not in loaded[repo_id], loaded[repo_id]
        assert loaded[repo_id]["input_ids"] == golden_ids(repo_id, CANONICAL.get(repo_id)), repo_id

    # scan_cache_dir reads it without warnings and sees the expected commits.
    info = scan_cache_dir(cache)
    assert info.warnings == []
    seen = {repo.repo_id: {rev.commit_hash for rev in repo.revisions} for repo in info.repos}
    for repo_id in ids:
        assert seen[repo_id] == {commits.get(repo_id) or commits["bert-base-uncased"]}

    # The legacy id shares the canonical repo's bytes: same inodes, stored once.
    legacy = cache / "models--bert-base-uncased" / "blobs"
    canonical = cache / "models--google-bert--bert-base-uncased" / "blobs"
    assert sorted(p.name for p in legacy.iterdir()) == sorted(p.name for p in canonical.iterdir())
    for blob in legacy.iterdir():
        assert blob.stat().st_ino == (canonical / blob.name).stat().st_ino


def test_snapshot_links_are_relative_and_refs_have_no_newline(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, report = warm_json(server, cache, "sentence-transformers/all-MiniLM-L6-v2", extra=("--kind", "model"))
        assert code == 0, report
        commit = server.commit_of("sentence-transformers/all-MiniLM-L6-v2")
    repo = cache / "models--sentence-transformers--all-MiniLM-L6-v2"
    assert (repo / "refs" / "main").read_bytes() == commit.encode()
    pooling = repo / "snapshots" / commit / "1_Pooling" / "config.json"
    assert os.readlink(pooling).startswith("../../../blobs/")
    top = repo / "snapshots" / commit / "tokenizer.json"
    assert os.readlink(top).startswith("../../blobs/")
    assert (repo / ".no_exist" / commit / "added_tokens.json").exists()
    assert not list(repo.rglob("*.incomplete"))
    assert scan_cache_dir(cache).warnings == []


def test_second_warm_downloads_nothing_and_legacy_alias_reuses_blobs(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, first = warm_json(server, cache, "google-bert/bert-base-uncased")
        assert code == 0 and first["bytes_downloaded"] > 0
        server.clear_log()
        code, again = warm_json(server, cache, "google-bert/bert-base-uncased", "bert-base-uncased")
        assert code == 0
        assert again["bytes_downloaded"] == 0
        assert {f["source"] for r in again["repos"] for f in r["files"]} == {"cached"}
        # Only the two metadata requests: no file body was fetched again.
        assert [r.path.split("?")[0] for r in server.requests] == [
            "/api/models/google-bert/bert-base-uncased/revision/main",
            "/api/models/bert-base-uncased/revision/main",
        ] or sorted(r.path.split("?")[0] for r in server.requests) == sorted([
            "/api/models/google-bert/bert-base-uncased/revision/main",
            "/api/models/bert-base-uncased/revision/main",
        ])


def test_identical_files_across_repos_are_hardlinked_not_downloaded(hub_root, tmp_path):
    # bert-base-uncased, distilbert and all-MiniLM-L6-v2 ship the same vocab.txt blob.
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, _ = warm_json(server, cache, "google-bert/bert-base-uncased")
        assert code == 0
        server.clear_log()
        code, report = warm_json(server, cache, "distilbert/distilbert-base-uncased")
        assert code == 0
        files = {f["path"]: f["source"] for f in report["repos"][0]["files"]}
        assert files["vocab.txt"] == "linked"
        assert not any(r.path.endswith("/vocab.txt") for r in server.requests)
    a = next((cache / "models--google-bert--bert-base-uncased" / "blobs").glob("fb14*"))
    b = cache / "models--distilbert--distilbert-base-uncased" / "blobs" / a.name
    assert a.stat().st_ino == b.stat().st_ino


def test_model_kind_and_include_exclude(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, report = warm_json(server, cache, "sentence-transformers/all-MiniLM-L6-v2",
                                 extra=("--kind", "all", "--exclude", "README.md"))
        assert code == 0, report
        paths = {f["path"] for f in report["repos"][0]["files"]}
        assert "modules.json" in paths and "README.md" not in paths and "1_Pooling/config.json" in paths
        assert "added_tokens.json" in report["repos"][0]["absent"]  # markers for every kind
    commit = report["repos"][0]["commit_hash"]
    assert (cache / "models--sentence-transformers--all-MiniLM-L6-v2" / ".no_exist" / commit / "added_tokens.json").exists()


def test_two_concurrent_warms_of_one_cache_both_succeed(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root, throttle_bps=4_000_000) as server:
        args = ["warm", "gpt2", "google-bert/bert-base-chinese", "--cache-dir", str(cache), "--endpoint",
                server.endpoint, "--json"]
        procs = [subprocess.Popen([sys.executable, "-m", "hfcache", *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=clean_env()) for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        bodies = [r for r in server.requests if "/resolve/" in r.path and r.method == "GET"]
        # The repo lock serialises the two processes: every file body crossed the network once.
        assert len(bodies) == len({r.path for r in bodies})
    assert scan_cache_dir(cache).warnings == []
    loaded = offline_load(cache, ["gpt2", "google-bert/bert-base-chinese"])
    assert loaded["gpt2"]["input_ids"] == golden_ids("gpt2", "openai-community/gpt2")
    assert loaded["google-bert/bert-base-chinese"]["input_ids"] == golden_ids("google-bert/bert-base-chinese")


# ---------------------------------------------------------------- bad input and faults


def assert_nothing_visible(cache: Path, partial_files_kept: bool = False) -> None:
    """No snapshot entry or ref; partial downloads only where an interrupted warm keeps them to resume."""
    assert visible_entries(cache) == set(), visible_entries(cache)
    if not partial_files_kept:
        assert not list(cache.rglob("*.incomplete"))


def test_malformed_repo_id_is_a_usage_error(tmp_path):
    proc = run_hfcache(["warm", "not//valid", "--cache-dir", str(tmp_path / "c")])
    assert proc.returncode == 2
    assert "invalid repo id 'not//valid'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "c").exists()


def test_unknown_repo_and_revision_fail_while_others_complete(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        proc = run_hfcache(["warm", "nobody/nothing", "gpt2@v9", "gpt2", "--cache-dir", str(cache),
                            "--endpoint", server.endpoint])
    assert proc.returncode == 3
    assert "nobody/nothing: repo not found" in proc.stderr
    assert "gpt2: revision 'v9' not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (cache / "models--gpt2" / "refs" / "main").exists()
    assert not (cache / "models--nobody--nothing").exists()


def test_unknown_repo_json_lists_the_failure(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, report = warm_json(server, cache, "nobody/nothing", "t5-small")
    assert code == 3 and report["ok"] is False and report["exit_code"] == 3
    failed, good = report["repos"]
    assert failed["ok"] is False and "repo not found" in failed["error"] and failed["exit_code"] == 3
    assert good["ok"] is True and good["canonical_id"] == "google-t5/t5-small"


def test_gated_and_unauthorized_repos(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root, gated={"openai-community/gpt2"}) as server:
        proc = run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint", server.endpoint])
    assert proc.returncode == 3 and "gated or forbidden" in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_visible(cache)

    with HubServer(hub_root, token="hf_secret_test_token") as server:
        proc = run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint", server.endpoint])
        assert proc.returncode == 3 and "openai-community/gpt2" in proc.stderr
        assert_nothing_visible(cache)
        token_file = tmp_path / "token"
        token_file.write_text("hf_secret_test_token\n")
        proc = run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint", server.endpoint,
                            "--token-file", str(token_file), "--json"])
        assert proc.returncode == 0, proc.stderr
        assert "hf_secret_test_token" not in proc.stdout + proc.stderr
        lfs_hits = [r for r in server.requests if r.origin == "cdn"]
        assert all(not r.authorized for r in lfs_hits)


def test_refused_connection(tmp_path):
    cache = tmp_path / "cache"
    proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(cache), "--endpoint", refused_endpoint()])
    assert proc.returncode == 3
    assert "gpt2@main: cannot connect to" in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_visible(cache)


def test_endpoint_that_never_answers_times_out(tmp_path):
    cache = tmp_path / "cache"
    with silent_server() as endpoint:
        started = time.monotonic()
        proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(cache), "--endpoint", endpoint, "--timeout", "1"],
                           timeout=60)
        elapsed = time.monotonic() - started
    assert proc.returncode == 3
    assert "no answer from" in proc.stderr and "within the timeout" in proc.stderr
    assert elapsed < 20  # 1 s of waiting plus interpreter start-up; a hang would hit the 60 s guard
    assert_nothing_visible(cache)


def test_hash_mismatch_is_refused_and_nothing_becomes_visible(hub_root, tmp_path):
    cache = tmp_path / "cache"
    vocab = (hub_root / "google-bert" / "bert-base-uncased" / "vocab.txt").read_bytes()
    tampered = vocab.replace(b"[UNK]", b"[XXX]", 1)
    assert len(tampered) == len(vocab)
    with HubServer(hub_root, overrides={("google-bert/bert-base-uncased", "vocab.txt"): tampered}) as server:
        code, report = warm_json(server, cache, "google-bert/bert-base-uncased")
        gets = [r for r in server.requests if r.path.endswith("/vocab.txt") and r.method == "GET"]
    assert code == 3
    entry = report["repos"][0]
    assert "vocab.txt does not match its expected hash" in entry["error"]
    assert len(gets) == 2  # retried once, then refused
    assert_nothing_visible(cache)
    blobs = cache / "models--google-bert--bert-base-uncased" / "blobs"
    assert not (blobs / "fb140275c155a9c7c5a3b3e0e77a9e839594a938").exists()


def _mounted(tmp_path: Path, options: str) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {result.stderr.decode().strip()}")
    return mnt


@pytest.fixture
def small_disk(tmp_path):
    mnt = _mounted(tmp_path, "size=300k")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def read_only_disk(tmp_path):
    mnt = _mounted(tmp_path, "ro,size=1m")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full(hub_root, small_disk):
    cache = small_disk / "cache"
    with HubServer(hub_root) as server:
        proc = run_hfcache(["warm", "google-bert/bert-base-uncased", "--cache-dir", str(cache), "--endpoint",
                            server.endpoint])
    assert proc.returncode == 5
    assert "no space left on the device" in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_visible(cache)
    assert "gave back the" in proc.stderr or not list(cache.glob("*--*/blobs/*")), proc.stderr  # the space back
    if cache.exists():  # what is there is still a sound cache (a root this warm made and left empty is removed)
        verified = run_hfcache(["verify", "--cache-dir", str(cache), "--allow-empty"])
        assert verified.returncode == 0, verified.stderr


def test_unwritable_cache_dir(read_only_disk):
    proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(read_only_disk / "cache"), "--endpoint",
                        refused_endpoint()])
    assert proc.returncode == 5
    assert "cannot write" in proc.stderr and "Traceback" not in proc.stderr
    assert list(read_only_disk.iterdir()) == []


def test_ctrl_c_stops_promptly_and_publishes_nothing(hub_root, tmp_path):
    import signal

    cache = tmp_path / "cache"
    with HubServer(hub_root, throttle_bps=50_000) as server:
        proc = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", "openai-community/gpt2", "FacebookAI/roberta-base",
                                 "--cache-dir", str(cache), "--endpoint", server.endpoint],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        deadline = time.monotonic() + 30
        while not list(cache.rglob("*.incomplete")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(cache.rglob("*.incomplete")), "no download started"
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - started
    assert proc.returncode == 130
    # One "interrupted" line and its hint on stderr; no repo is called failed, no summary table, no empty bars.
    # (click writes one newline first: on a terminal it ends the "^C" line.)
    lines = err.strip().splitlines()
    assert lines[0] == "hfcache: error: interrupted" and lines[1].startswith("hint: ") and len(lines) == 2, err
    assert "failed" not in out + err and out == ""
    assert elapsed < 15  # the 2.6 MiB at 50 kB/s would take ~55 s more
    assert_nothing_visible(cache, partial_files_kept=True)  # kept for the next run to resume (test_transport.py)
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]
    assert scan_cache_dir(cache).warnings == []


#: hfcache's CLI in the main thread; a helper thread sends a signal to ITSELF once a download began: what the kernel
#: does now and then with a Ctrl-C or a `kill`, deterministically (CPython runs the handler in the main thread, at its
#: next bytecode). ARGV: the cache, a file receiving the signal's CLOCK_MONOTONIC time, the signal, hfcache's args.
SIGNAL_ON_ANOTHER_THREAD = r"""
import signal, sys, threading, time
from pathlib import Path
cache, stamp, signum, args = Path(sys.argv[1]), Path(sys.argv[2]), getattr(signal, sys.argv[3]), sys.argv[4:]
def interrupt_from_this_thread():
    while not list(cache.rglob("*.incomplete")):
        time.sleep(0.05)
    stamp.write_text(repr(time.monotonic()))
    signal.pthread_kill(threading.get_ident(), signum)
threading.Thread(target=interrupt_from_this_thread, daemon=True).start()
from hfcache.cli.main import main
sys.argv = ["hfcache", *args]
main()
"""


@pytest.mark.parametrize("signame, exit_code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_received_by_another_thread_still_stops_at_once(hub_root, tmp_path, signame, exit_code):
    """The main thread never sits in a wait a signal cannot cut short (hfcache/pools.py): before, a Ctrl-C that
    the kernel handed to a download thread waited for the whole first repo (27 s here)."""
    cache, stamp = tmp_path / "cache", tmp_path / "signalled"
    with HubServer(hub_root, throttle_bps=50_000) as server:
        args = ["warm", "openai-community/gpt2", "FacebookAI/roberta-base", "--cache-dir", str(cache),
                "--endpoint", server.endpoint, "-q"]
        proc = subprocess.run([sys.executable, "-c", SIGNAL_ON_ANOTHER_THREAD, str(cache), str(stamp), signame, *args],
                              capture_output=True, text=True, env=clean_env(), timeout=120)
        ended = time.monotonic()
    assert stamp.exists(), proc.stderr  # the signal was sent mid-download
    assert proc.returncode == exit_code, proc.stderr
    assert ended - float(stamp.read_text()) < 5, proc.stderr  # ~0.1 s; the whole download takes ~50 s
    assert ("interrupted" if signame == "SIGINT" else "terminated") in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_visible(cache, partial_files_kept=True)


def test_failed_repo_leaves_a_cache_huggingface_hub_still_reads(hub_root, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()  # the user's (empty) cache: a failed warm keeps it, only a folder it made itself goes
    original = (hub_root / "openai-community" / "gpt2" / "merges.txt").read_bytes()
    with HubServer(hub_root, overrides={("openai-community/gpt2", "merges.txt"): original[::-1]}) as server:
        code, report = warm_json(server, cache, "openai-community/gpt2")
    assert code == 3 and "merges.txt" in report["repos"][0]["error"]
    assert_nothing_visible(cache)
    assert scan_cache_dir(cache).warnings == []


@pytest.mark.slow
def test_kind_all_still_writes_markers_so_tokenizer_only_repos_load_offline(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        code, report = warm_json(server, cache, "FacebookAI/roberta-base", extra=("--kind", "all"))
        assert code == 0, report
    loaded = offline_load(cache, ["FacebookAI/roberta-base"])
    assert loaded["FacebookAI/roberta-base"].get("input_ids") == golden_ids("FacebookAI/roberta-base")


def test_empty_selection_is_an_error_not_a_silent_success(hub_root, tmp_path):
    cache = tmp_path / "cache"
    with HubServer(hub_root) as server:
        proc = run_hfcache(["warm", "gpt2", "--exclude", "*", "--cache-dir", str(cache), "--endpoint", server.endpoint])
    assert proc.returncode == 2 and "no file matches the selection" in proc.stderr
    assert_nothing_visible(cache)


def test_offline_mode_in_the_environment_is_exit_4(hub_root, tmp_path):
    with HubServer(hub_root) as server:
        proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(tmp_path / "c"), "--endpoint", server.endpoint],
                           env=clean_env(HF_HUB_OFFLINE="1"))
        assert server.requests == []
    assert proc.returncode == 4 and "HF_HUB_OFFLINE is set" in proc.stderr


@pytest.mark.parametrize("endpoint", ["foo", "127.0.0.1:8080", "ftp://host", "http://[::1", "https://u:p@host"])
def test_invalid_endpoint_is_a_usage_error(tmp_path, endpoint):
    proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(tmp_path / "c"), "--endpoint", endpoint, "--json"])
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 2  # --json: one document, even for a command-level error
    assert "Traceback" not in proc.stderr and "u:p" not in proc.stderr + proc.stdout


def test_endpoint_is_read_from_the_environment_at_call_time(hub_root, tmp_path):
    with HubServer(hub_root) as server:
        proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(tmp_path / "c"), "--json"],
                           env=clean_env(HF_ENDPOINT=server.endpoint))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["repos"][0]["endpoint"] == server.endpoint
