"""Hostile tokenizer repos on the test Hub, warmed by hfcache, for the tests of what one repo's files can make
``hfcache check`` and ``load_tokenizer(backend="tokenizers")`` do: the fixtures' healthy repos beside
``hostile/<name>`` repos derived from them, and a load in a process of its own under an address-space limit (so a
regression that hangs or aborts fails a test, never the test run)."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import GOLDEN, REPO, clean_env
from tests.testhub import HubServer

HUB = Path(__file__).parent / "data" / "hub"
HEALTHY = ["google-bert/bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2"]  # sorted before/after hostile/
T5 = HUB / "google-t5" / "t5-small" / "tokenizer.json"
GPT2 = HUB / "openai-community" / "gpt2"


def t5_backend(**parts) -> dict[str, str]:
    """t5-small's ``tokenizer.json`` as a TokenizersBackend repo (transformers loads the file as it is), with
    ``parts`` replacing its top-level parts."""
    doc = json.loads(T5.read_text(encoding="utf-8"))
    doc.update(parts)
    return {"tokenizer.json": json.dumps(doc),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})}


def warmed(base: Path, repos: dict[str, dict[str, str]]) -> Path:
    """A cache below ``base`` holding :data:`HEALTHY` and ``hostile/<name>`` for each of ``repos`` (name -> files),
    warmed by hfcache from a test Hub serving them."""
    hub = base / "hub"
    for repo_id in HEALTHY:
        shutil.copytree(HUB / repo_id, hub / repo_id)
    shutil.copy(HUB / "legacy_ids.json", hub / "legacy_ids.json")
    for name, files in repos.items():
        (hub / "hostile" / name).mkdir(parents=True)
        for path, text in files.items():
            (hub / "hostile" / name / path).write_text(text, encoding="utf-8")
    cache = base / "cache"
    with HubServer(hub) as server:
        report = hfcache.warm([WarmRequest.parse(s) for s in (*HEALTHY, *(f"hostile/{n}" for n in repos))],
                              cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos]
    return cache


def assert_healthy_rows(report: dict) -> None:
    """``hfcache check --json --text <golden>``: every healthy repo loaded, with its golden ids, fast path equal."""
    rows = {r["repo_id"]: r for r in report["tokenizers"]}
    for repo_id in HEALTHY:
        assert rows[repo_id]["ok"] is True, rows[repo_id]
        assert rows[repo_id]["input_ids"] == GOLDEN["repos"][repo_id]["input_ids"], repo_id
        assert rows[repo_id]["fast_path"] == "equal", rows[repo_id]


LOAD = r"""
import json, sys
import hfcache
from hfcache.offline.api import FastTokenizerRefused
out = {}
for repo_id in sys.argv[2:]:
    try:
        tok = hfcache.load_tokenizer(repo_id, cache_dir=sys.argv[1], backend="tokenizers")
        out[repo_id] = {"loaded": len(tok.encode("Hello world").ids)}
    except FastTokenizerRefused as exc:
        out[repo_id] = {"refused": exc.reason, "message": str(exc)}
print(json.dumps(out))
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 * 1024**3, 4 * 1024**3))


def load_in_a_process(cache: Path, *repo_ids: str) -> dict[str, dict]:
    """repo id -> ``{"loaded": ids of "Hello world"}`` or ``{"refused": reason, "message": ...}`` of
    ``load_tokenizer(backend="tokenizers")`` in a fresh process (4 GiB of address space, 120 s), which must exit 0."""
    proc = subprocess.run([sys.executable, "-c", LOAD, str(cache), *repo_ids], capture_output=True, text=True,
                          timeout=120, cwd=REPO, check=False, env=clean_env(HF_HOME=str(cache.parent / "home")),
                          preexec_fn=_limited)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
