"""The aliases of `hfcache env`, proved with a real consumer that reads them: huggingface_hub and transformers in
a fresh process that gets *only* the aliases (``HUGGINGFACE_HUB_CACHE``, ``TRANSFORMERS_OFFLINE``), not the
canonical variables, find the warmed cache and stay offline (the Hub server's request log is the proof); and
`hfcache exec` hands every alias to its child with its canonical value.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hfcache
from hfcache.offline.aliases import ALIASES
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import GOLDEN, clean_env, golden_ids, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "google-bert/bert-base-uncased"

#: Where huggingface_hub looks, whether it is offline, and what transformers loads from there.
PROBE = r"""
import json, sys
from huggingface_hub import constants
from transformers import AutoTokenizer
try:
    ids = AutoTokenizer.from_pretrained(sys.argv[1])(sys.argv[2])["input_ids"]
except Exception as exc:
    ids = f"{type(exc).__name__}: {exc}"
print(json.dumps({"cache": constants.HF_HUB_CACHE, "offline": constants.HF_HUB_OFFLINE, "ids": ids}))
"""


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("aliases") / "team cache"  # not named hub: HF_HOME cannot stand in
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(REPO)], cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos if not r.ok]
    return cache


def _printed(cache: Path, home: Path) -> dict[str, str]:
    proc = run_hfcache(["env", "--cache-dir", str(cache), "--json"], env=clean_env(HOME=str(home)))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _probe(env: dict[str, str], server: HubServer) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, REPO, GOLDEN["text"]], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_huggingface_hub_and_transformers_use_the_cache_offline_from_the_aliases_alone(warmed, tmp_path):
    canary = Canary(tmp_path)
    printed = _printed(warmed, tmp_path / "home")
    only_aliases = {name: value for name, value in printed.items()
                    if name in ("HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE")}
    assert only_aliases == {"HUGGINGFACE_HUB_CACHE": printed["HF_HUB_CACHE"], "TRANSFORMERS_OFFLINE": "1"}
    with HubServer(HUB) as server:  # reachable: only offline mode keeps the load from asking it anything
        base = clean_env(HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "elsewhere"),
                         HF_ENDPOINT=server.endpoint, HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
        result = _probe({**base, **only_aliases}, server)
        assert result == {"cache": str(warmed), "offline": True, "ids": golden_ids(REPO)}
        assert server.requests == []
        # The control: the same process without the aliases looks in $HF_HOME/hub and asks the endpoint.
        control = _probe(base, server)
        assert control["cache"] == str(tmp_path / "elsewhere" / "hub") and control["offline"] is False
        assert server.requests
    verified = run_hfcache(["verify", "--cache-dir", str(warmed)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    canary.assert_unchanged()


def test_exec_gives_its_child_every_alias_with_the_canonical_value(warmed, tmp_path):
    canary = Canary(tmp_path)
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    # A base environment that already names other caches under the aliases (a TGI or sentence-transformers base
    # image does): exec replaces them, so every reader agrees on one cache.
    env = clean_env(HOME=str(tmp_path / "home"), HUGGINGFACE_HUB_CACHE="/data", SENTENCE_TRANSFORMERS_HOME="/st",
                    LLAMA_OFFLINE="0")
    proc = run_hfcache(["exec", "--cache-dir", str(warmed), "--", sys.executable, "-c", script], env=env)
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    for alias in ALIASES:
        assert child[alias.name] == child[alias.canonical], alias.name
    assert child["HUGGINGFACE_HUB_CACHE"] == child["SENTENCE_TRANSFORMERS_HOME"] == str(warmed)
    assert child["LLAMA_OFFLINE"] == "1"
    canary.assert_unchanged()
