"""hfcache check: every warmed fixture tokenizer loads offline; broken caches fail with the cause named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import GOLDEN, run_hfcache, warm
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
CANONICAL = {"bert-base-uncased": "google-bert/bert-base-uncased", "gpt2": "openai-community/gpt2"}



def check_json(cache: Path, *args: str) -> tuple[int, dict]:
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", *args], timeout=300)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
def test_check_passes_on_every_warmed_fixture(tmp_path):
    cache = tmp_path / "cache"
    repos = ["bert-base-uncased", "gpt2", "google-bert/bert-base-chinese", "FacebookAI/roberta-base",
             "mistralai/Mistral-7B-v0.1", "sentence-transformers/all-MiniLM-L6-v2",
             "distilbert/distilbert-base-uncased", "google-t5/t5-small", "microsoft/Phi-3-mini-4k-instruct"]
    warm(cache, *repos)
    code, report = check_json(cache, "--text", GOLDEN["text"])
    assert code == 0, report
    by_id = {t["repo_id"]: t for t in report["tokenizers"]}
    assert set(by_id) >= set(repos)
    for repo_id in repos:
        golden = GOLDEN["repos"][CANONICAL.get(repo_id, repo_id)]
        assert by_id[repo_id]["input_ids"] == golden["input_ids"], repo_id
        assert by_id[repo_id]["class"] == golden["class"]
        assert by_id[repo_id]["vocab_size"] > 1000


def test_check_names_a_missing_config_and_marker(tmp_path):
    cache = tmp_path / "cache"
    warm(cache, "google-bert/bert-base-uncased", "FacebookAI/roberta-base")
    bert = cache / "models--google-bert--bert-base-uncased"
    next((bert / "snapshots").glob("*/config.json")).unlink()  # tokenizer-only: config.json gone, no marker
    roberta = cache / "models--FacebookAI--roberta-base"
    next((roberta / ".no_exist").glob("*/config.json")).unlink()  # the repo has none, and now no marker says so
    code, report = check_json(cache)
    assert code == 1
    by_id = {t["repo_id"]: t for t in report["tokenizers"]}
    for repo_id in ("google-bert/bert-base-uncased", "FacebookAI/roberta-base"):
        assert by_id[repo_id]["ok"] is False
        assert "no config.json and no .no_exist marker" in by_id[repo_id]["cause"], by_id[repo_id]
    # The load failed fast, by the guard or offline mode, never by reaching a network.
    assert all(t["seconds"] < 30 for t in report["tokenizers"])


def test_check_flags_a_chat_template_the_cache_lost(tmp_path):
    hub = tmp_path / "hub"
    shutil.copytree(HUB, hub)
    phi = hub / "microsoft" / "Phi-3-mini-4k-instruct"
    (phi / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with HubServer(hub) as server:
        (tmp_path / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\ncache_dir = "cache"\n'
                                               '[[repos]]\nrepo_id = "microsoft/Phi-3-mini-4k-instruct"\n')
        assert run_hfcache(["lock"], cwd=tmp_path).returncode == 0
        assert run_hfcache(["warm", "--lock", "hfcache.lock"], cwd=tmp_path).returncode == 0
    code, report = check_json(tmp_path / "cache", "--lock", str(tmp_path / "hfcache.lock"))
    assert code == 0, report
    next((tmp_path / "cache").glob("models--microsoft--Phi-3-mini-4k-instruct/snapshots/*/chat_template.jinja")).unlink()
    code, report = check_json(tmp_path / "cache", "--lock", str(tmp_path / "hfcache.lock"))
    assert code == 1
    assert "chat template(s) in the repo but not in the cache: chat_template.jinja" in report["tokenizers"][0]["cause"]


def test_check_with_nothing_to_check_is_a_usage_error(tmp_path):
    (tmp_path / "cache").mkdir()
    proc = run_hfcache(["check", "--cache-dir", str(tmp_path / "cache")])
    assert proc.returncode == 2 and "no tokenizer to check" in proc.stderr


def test_probe_guard_turns_any_connection_into_an_immediate_error(tmp_path, hub_root):
    import subprocess
    import sys
    import time

    from tests.helpers import clean_env

    with HubServer(hub_root) as server:
        env = clean_env(HF_ENDPOINT=server.endpoint, HF_HUB_CACHE=str(tmp_path / "empty"), HF_HOME=str(tmp_path))
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "hfcache.offline.probe", "hi", "openai-community/gpt2@main"],
                              capture_output=True, text=True, env=env, timeout=120)
        elapsed = time.monotonic() - started
        assert server.requests == []  # the guard stopped the connection before any byte was sent
    result = json.loads(proc.stdout.strip().splitlines()[-1])["openai-community/gpt2@main"]
    assert "network access attempted" in result["error"]
    assert elapsed < 60


def test_check_takes_a_probe_text_that_starts_with_a_dash(tmp_path):
    """The child's options come before ``--`` and its text and specs after: ``--text=-x`` was exit 70 ("the offline
    probe process failed (exit 2): ... unrecognized arguments: -x")."""
    cache = tmp_path / "cache"
    warm(cache, "google-bert/bert-base-uncased")
    code, report = check_json(cache, "--text=-x")
    assert code == 0, report
    (row,) = report["tokenizers"]
    assert report["text"] == "-x" and row["ok"] and row["input_ids"] == [101, 1011, 1060, 102], row
