"""warm with several endpoints: an in-cluster mirror first, then the next, with the same hash checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers import golden_ids, offline_load, refused_endpoint, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"


def partial_hub(tmp_path: Path, *repos: str) -> Path:
    """A hub holding only ``repos`` (a mirror that was warmed with a subset)."""
    root = tmp_path / "mirror-hub"
    for repo in repos:
        shutil.copytree(HUB / repo, root / repo)
    return root


def warm_json(cache: Path, endpoints: list[str], *specs: str) -> tuple[int, dict]:
    args = ["warm", *specs, "--cache-dir", str(cache), "--json"]
    for e in endpoints:
        args += ["--endpoint", e]
    proc = run_hfcache(args)
    return proc.returncode, json.loads(proc.stdout)


def test_mirror_first_then_the_hub_and_the_report_says_which(tmp_path):
    mirror_root = partial_hub(tmp_path, "openai-community/gpt2")
    with HubServer(mirror_root) as mirror, HubServer(HUB) as hub:
        code, report = warm_json(tmp_path / "cache", [mirror.endpoint, hub.endpoint],
                                 "openai-community/gpt2", "FacebookAI/roberta-base")
        hub_bodies = [r for r in hub.requests if "/resolve/" in r.path and r.method == "GET"]
    assert code == 0, report
    served = {r["repo_id"]: r["endpoint"] for r in report["repos"]}
    assert served == {"openai-community/gpt2": mirror.endpoint, "FacebookAI/roberta-base": hub.endpoint}
    assert report["endpoints"] == [mirror.endpoint, hub.endpoint]
    assert not any("gpt2" in r.path for r in hub_bodies)  # gpt2 came from the mirror only


def test_unreachable_mirror_falls_through(tmp_path):
    with HubServer(HUB) as hub:
        code, report = warm_json(tmp_path / "cache", [refused_endpoint(), hub.endpoint], "gpt2")
    assert code == 0 and report["repos"][0]["endpoint"] == hub.endpoint


def test_mirror_serving_bad_bytes_is_refused_and_the_next_endpoint_used(tmp_path):
    merges = (HUB / "openai-community" / "gpt2" / "merges.txt").read_bytes()
    bad = {("openai-community/gpt2", "merges.txt"): merges[::-1]}
    cache = tmp_path / "cache"
    with HubServer(HUB, overrides=bad) as mirror, HubServer(HUB) as hub:
        code, report = warm_json(cache, [mirror.endpoint, hub.endpoint], "openai-community/gpt2")
    assert code == 0, report
    assert report["repos"][0]["endpoint"] == hub.endpoint
    loaded = offline_load(cache, ["openai-community/gpt2"])
    assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")


def test_when_every_endpoint_fails_each_is_named(tmp_path):
    first, second = refused_endpoint(), refused_endpoint()
    code, report = warm_json(tmp_path / "cache", [first, second], "gpt2")
    assert code == 3
    error = report["repos"][0]["error"]
    assert second in error and f"also tried: {first}" in error


def test_manifest_endpoint_list_is_used_by_lock_and_warm_lock(tmp_path):
    mirror_root = partial_hub(tmp_path, "google-t5/t5-small")
    with HubServer(mirror_root) as mirror, HubServer(HUB) as hub:
        (tmp_path / "hfcache.toml").write_text(
            f'endpoint = ["{mirror.endpoint}", "{hub.endpoint}"]\ncache_dir = "cache"\n'
            '[[repos]]\nrepo_id = "google-t5/t5-small"\n[[repos]]\nrepo_id = "gpt2"\n')
        proc = run_hfcache(["lock"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        proc = run_hfcache(["warm", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    served = {r["repo_id"]: r["endpoint"] for r in json.loads(proc.stdout)["repos"]}
    assert served == {"google-t5/t5-small": mirror.endpoint, "gpt2": hub.endpoint}
