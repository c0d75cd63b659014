"""What the faster cold warm (docs/benchmarks.md) must not change: files fetched while configs are read still fail the repo
with their own error, a malformed config still fails it with nothing published or half-written, and hfcache asks
no host but its endpoint (huggingface_hub's agent-registry fetch is kept off)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import clean_env, run_hfcache, visible_entries
from tests.make_model_repos import ORG, _json, _tokenizer_files, _write
from tests.testhub import HubServer

CODE = "from transformers import BertTokenizer\n\n\nclass TokOverlap(BertTokenizer):\n    pass\n"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlap-hub")
    code = root / ORG / "code-tokenizer"
    _tokenizer_files(code, {"tokenizer_class": "TokOverlap", "do_lower_case": True,
                            "auto_map": {"AutoTokenizer": ["tok_overlap.TokOverlap", None]}})
    _write(code / "config.json", _json({"model_type": "bert"}))
    _write(code / "tok_overlap.py", CODE)
    broken = root / ORG / "broken-config"
    _tokenizer_files(broken)
    _write(broken / "config.json", '{"auto_map": ' + "[" * 100_000 + "]" * 100_000 + "}")  # no parser reads it
    return root, {"code": f"{ORG}/code-tokenizer", "broken": f"{ORG}/broken-config"}


def _warm(server: HubServer, cache: Path, repo_id: str, env: dict | None = None) -> tuple[int, dict, str]:
    proc = run_hfcache(["warm", repo_id, "--cache-dir", str(cache), "--endpoint", server.endpoint, "--json"], env=env)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def _assert_nothing_published(cache: Path) -> None:
    assert visible_entries(cache) == set()
    assert not list(cache.rglob("*.incomplete"))


def test_custom_code_repo_warms_every_file_and_its_code(repos, tmp_path):
    root, ids = repos
    with HubServer(root) as server:
        code, report, stderr = _warm(server, tmp_path / "hub", ids["code"])
        gets = sorted(r.path.rsplit("/", 1)[-1] for r in server.requests if r.method == "GET" and "/resolve/" in r.path)
    assert code == 0, stderr
    files = sorted(f["path"] for f in report["repos"][0]["files"])
    assert files == ["config.json", "tok_overlap.py", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert gets == files  # each file fetched exactly once, the early ones included


def test_a_tampered_file_fetched_while_configs_are_read_is_the_repos_error(repos, tmp_path):
    root, ids = repos
    vocab = (root / ids["code"] / "vocab.txt").read_bytes()
    tampered = vocab.replace(b"[UNK]", b"[XXX]", 1)
    assert tampered != vocab and len(tampered) == len(vocab)
    cache = tmp_path / "hub"
    with HubServer(root, overrides={(ids["code"], "vocab.txt"): tampered}) as server:
        code, report, stderr = _warm(server, cache, ids["code"])
    assert code == 3, stderr
    error = report["repos"][0]["error"]
    assert "vocab.txt does not match its expected hash" in error, error
    assert "cancel" not in error
    _assert_nothing_published(cache)


def test_a_malformed_config_fails_the_repo_and_early_downloads_are_settled(repos, tmp_path):
    root, ids = repos
    cache = tmp_path / "hub"
    with HubServer(root) as server:
        code, report, stderr = _warm(server, cache, ids["broken"])
    assert code == 3, stderr
    entry = report["repos"][0]
    assert entry["error"].startswith(f"{ids['broken']}: config.json"), entry["error"]
    assert "malformed" in entry["hint"]
    _assert_nothing_published(cache)
    # The repo lock was released only after every early download ended: a rerun of the fixed repo is not blocked.
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]


def test_warm_with_telemetry_on_asks_no_host_but_its_endpoint(repos, tmp_path):
    """huggingface_hub >= 1.x fetches ``{HF_ENDPOINT}/api/agent-harnesses`` from build_hf_headers when telemetry is
    on, and writes it under HF_HOME: hfcache must not (HF_ENDPOINT here is a second server standing for the Hub)."""
    root, ids = repos
    home = tmp_path / "home"
    env = clean_env(HF_HOME=str(home))
    env.pop("HF_HUB_DISABLE_TELEMETRY")
    with HubServer(root) as server, HubServer(root) as public:
        env["HF_ENDPOINT"] = public.endpoint
        code, _, stderr = _warm(server, tmp_path / "hub", ids["code"], env=env)
        asked = [r.path for r in server.requests] + [r.path for r in public.requests]
        public_requests = list(public.requests)
    assert code == 0, stderr
    assert public_requests == []
    assert not [p for p in asked if "agent-harnesses" in p]
    assert not (home / ".agent_harnesses.json").exists()


def test_a_cached_agent_registry_is_read_not_refreshed(repos, tmp_path):
    root, ids = repos
    home = tmp_path / "home"
    home.mkdir()
    registry = home / ".agent_harnesses.json"
    registry.write_text(json.dumps({"standardEnvVars": ["AI_AGENT"], "harnesses": {}}))
    before = registry.stat().st_mtime_ns
    env = clean_env(HF_HOME=str(home))
    env.pop("HF_HUB_DISABLE_TELEMETRY")
    with HubServer(root) as server:
        env["HF_ENDPOINT"] = server.endpoint
        os.utime(registry, ns=(before - 3 * 86400 * 10**9, before - 3 * 86400 * 10**9))  # stale: would be refetched
        code, _, stderr = _warm(server, tmp_path / "hub", ids["code"], env=env)
        asked = [r.path for r in server.requests]
    assert code == 0, stderr
    assert not [p for p in asked if "agent-harnesses" in p]
    assert registry.stat().st_mtime_ns == before - 3 * 86400 * 10**9  # not rewritten


def test_a_file_shared_by_repos_of_one_warm_is_fetched_once(hub_root, tmp_path):
    # bert-base-uncased, distilbert and all-MiniLM-L6-v2 ship the same vocab.txt blob; warmed together, the first
    # download is linked into the other two folders (no duplicate bodies within one run).
    cache = tmp_path / "hub"
    ids = ["google-bert/bert-base-uncased", "distilbert/distilbert-base-uncased",
           "sentence-transformers/all-MiniLM-L6-v2"]
    with HubServer(hub_root) as server:
        proc = run_hfcache(["warm", *ids, "--cache-dir", str(cache), "--endpoint", server.endpoint, "--json"])
        vocab_gets = [r for r in server.requests if r.method == "GET" and r.path.endswith("/vocab.txt")]
    assert proc.returncode == 0, proc.stderr
    sources = [next(f["source"] for f in repo["files"] if f["path"] == "vocab.txt")
               for repo in json.loads(proc.stdout)["repos"]]
    assert sorted(sources) == ["downloaded", "linked", "linked"]
    assert len(vocab_gets) == 1
    inodes = {next((cache / f"models--{i.replace('/', '--')}" / "blobs").glob("fb14*")).stat().st_ino for i in ids}
    assert len(inodes) == 1


def test_falling_back_to_another_endpoint_leaves_no_partial_file(hub_root, tmp_path):
    """Every body fails on the first endpoint, so each file leaves a partial download there; the second endpoint's
    attempt finds some blobs already in place (cached, or linked from a repo of the same run): those leftovers are
    deleted too (docs/warm.md: a rerun leaves no .incomplete)."""
    from tests.testhub import Faults

    cache = tmp_path / "hub"
    ids = ["google-bert/bert-base-uncased", "distilbert/distilbert-base-uncased",
           "sentence-transformers/all-MiniLM-L6-v2"]
    with HubServer(hub_root, faults=Faults(failing_bodies=1000, body_failure="reset")) as failing, \
            HubServer(hub_root) as good:
        proc = run_hfcache(["warm", *ids, "--cache-dir", str(cache), "--endpoint", failing.endpoint,
                            "--endpoint", good.endpoint, "--retries", "0", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert {r["endpoint"] for r in json.loads(proc.stdout)["repos"]} == {good.endpoint}
    assert sorted(p.name for p in cache.rglob("*.incomplete")) == []
    rerun = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    assert rerun.returncode == 0 and json.loads(rerun.stdout)["problems"] == [], rerun.stdout
