"""Tokenizer files built to break the tokenizers library, served by the real test Hub and warmed by hfcache: each
fails its own repo, never the others' results nor the whole command.

tokenizers (Rust, via pyo3) panics on some malformed files (``pyo3_runtime.PanicException``, a ``BaseException``),
and aborts the process when an allocation fails (hfcache/integrity/fast_inputs.py says where). Before: a panicking
``tokenizer.json`` made ``hfcache check`` exit 70 with no result for any repo, and ``load_tokenizer(backend=
"tokenizers")`` raised the panic, or a ``TypeError`` for a setting of the wrong type, instead of its refusal.

The hostile repos are derived from the fixtures as a red team would make them: t5-small's ``tokenizer.json`` with a
``Precompiled`` normalizer whose charsmap is cut short (panics at load), or with a ``TemplateProcessing`` naming
``</s>`` that its ``special_tokens`` no longer define (panics at every encode); bert-base-uncased with settings of
the wrong type; and a repo whose custom code (opted in) makes tokenizers abort the process.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hfcache
from hfcache.integrity.check_child import CRASHED
from hfcache.offline.api import FastTokenizerRefused
from tests.helpers import GOLDEN, HUB, REPO, clean_env, run_hfcache, warm

HEALTHY = ["google-bert/bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2"]  # sorted before/after hostile/
T5 = HUB / "google-t5" / "t5-small" / "tokenizer.json"
BERT = HUB / "google-bert" / "bert-base-uncased"


def _t5(change) -> str:
    doc = json.loads(T5.read_text(encoding="utf-8"))
    change(doc)
    return json.dumps(doc)


def _short_charsmap(doc: dict) -> None:
    charsmap = base64.b64decode(doc["normalizer"]["precompiled_charsmap"])
    doc["normalizer"]["precompiled_charsmap"] = base64.b64encode(charsmap[:8]).decode()


def _template_without_its_special(doc: dict) -> None:
    assert "</s>" in json.dumps(doc["post_processor"]["single"])  # the template still names it
    doc["post_processor"]["special_tokens"] = {}


def _bert(tokenizer_json_change=None, **config) -> dict[str, str]:
    doc = json.loads((BERT / "tokenizer.json").read_text(encoding="utf-8"))
    if tokenizer_json_change:
        tokenizer_json_change(doc)
    return {"tokenizer.json": json.dumps(doc), "vocab.txt": (BERT / "vocab.txt").read_text(encoding="utf-8"),
            "config.json": (BERT / "config.json").read_text(encoding="utf-8"),
            "tokenizer_config.json": json.dumps({"do_lower_case": True, **config})}


def _set(path: tuple, value):
    def change(doc: dict) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
    return change


#: hostile repo name -> its files. The two panics are TokenizersBackend repos (tokenizer_config names
#: PreTrainedTokenizerFast): transformers loads their tokenizer.json as it is.
PANICS = {
    "t5-short-charsmap": {"tokenizer.json": _t5(_short_charsmap),
                          "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})},
    "t5-template-missing-special": {"tokenizer.json": _t5(_template_without_its_special),
                                    "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})},
}
#: hostile repo name -> (its files, what the fast path's refusal must say).
REFUSED = {
    "t5-short-charsmap": (PANICS["t5-short-charsmap"], ("tokenizer.json cannot be loaded: the tokenizers library "
                                                         "panicked (PanicException: Precompiled")),
    "t5-template-missing-special": (PANICS["t5-template-missing-special"],
                                    ("tokenizers fails to encode with this tokenizer: the tokenizers library "
                                     "panicked (PanicException: no entry found for key)")),
    "bert-strip-accents-string": (_bert(strip_accents="yes"),
                                  "tokenizer_config.json's strip_accents is a string, not true, false or null"),
    "bert-added-tokens-number": (_bert(_set(("added_tokens",), 7)), "tokenizer.json's added_tokens is not a list"),
    "bert-added-token-id-list": (_bert(_set(("added_tokens", 0, "id"), [0])),
                                 "tokenizer.json's added_tokens: an added token id is a list, not an integer"),
    # found by fuzzing the fields the fast path reads (each escaped as TypeError, Exception or PanicException):
    "t5-charsmap-a-list": ({**PANICS["t5-short-charsmap"], "tokenizer.json": _t5(
        _set(("normalizer", "precompiled_charsmap"), ["x"]))}, "panicked (PanicException: Precompiled"),
    "t5-unk-id-null": ({**PANICS["t5-short-charsmap"], "tokenizer.json": _t5(_set(("model", "unk_id"), None))},
                       "tokenizers fails to encode with this tokenizer (Exception: Encountered an unknown token"),
    "bert-vocab-empty": (_bert(_set(("model", "vocab"), {})), ("tokenizers fails to encode with this tokenizer "
                                                                "(Exception: WordPiece error: Missing [UNK] token")),
    "bert-lower-case-string": (_bert(do_lower_case="false"),
                               "tokenizer_config.json's do_lower_case is a string, not true, false or null"),
    "bert-added-token-id-huge": (_bert(_set(("added_tokens", 0, "id"), 2**40)),
                                 f"an added token id {2**40} is outside [0, {2**32 - 1}]"),
    "bert-decoder-key-not-a-number": (_bert(added_tokens_decoder={"zero": {"content": "[PAD]"}}),
                                      "tokenizer_config.json's added_tokens_decoder: an added token id is a string"),
}

#: Custom code that makes tokenizers abort the process: a padding of 2**58 ids, then an encode (Rust's allocation
#: of 2**60 bytes fails: "memory allocation of ... bytes failed", SIGABRT). No ``except`` in the child sees it.
ABORTING_CODE = '''from transformers import PreTrainedTokenizerFast


class AbortTokenizer(PreTrainedTokenizerFast):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tokenizer.enable_padding(length=2**58)
        self._tokenizer.encode("x")
'''


def _hub(tmp_path: Path, repos: dict[str, dict[str, str]]) -> Path:
    """A test Hub folder: the healthy fixtures, and ``hostile/<name>`` holding each repo's files."""
    hub = tmp_path / "hub"
    for repo_id in HEALTHY:
        shutil.copytree(HUB / repo_id, hub / repo_id)
    shutil.copy(HUB / "legacy_ids.json", hub / "legacy_ids.json")
    for name, files in repos.items():
        for path, text in files.items():
            (hub / "hostile" / name).mkdir(parents=True, exist_ok=True)
            (hub / "hostile" / name / path).write_text(text, encoding="utf-8")
    return hub


def _check(cache: Path, *args: str) -> tuple[int, dict, str]:
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", "--text", GOLDEN["text"], *args], timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _assert_healthy_rows(report: dict) -> None:
    rows = {r["repo_id"]: r for r in report["tokenizers"]}
    for repo_id in HEALTHY:
        assert rows[repo_id]["ok"] is True, rows[repo_id]
        assert rows[repo_id]["input_ids"] == GOLDEN["repos"][repo_id]["input_ids"], repo_id
        assert rows[repo_id]["fast_path"] == "equal", rows[repo_id]


@pytest.mark.parametrize("name", sorted(PANICS))
def test_check_names_the_panicking_tokenizer_and_gives_the_others_their_results(tmp_path, name):
    cache = tmp_path / "cache"
    warm(cache, *HEALTHY, f"hostile/{name}", root=_hub(tmp_path, {name: PANICS[name]}))
    code, report, _ = _check(cache)
    assert code == 1, report  # was 70: "the offline probe process failed (exit 1): pyo3_runtime.PanicException"
    assert (report["ok"], report["exit_code"]) == (False, 1)
    assert [r["repo_id"] for r in report["tokenizers"]] == [HEALTHY[0], f"hostile/{name}", HEALTHY[1]]
    _assert_healthy_rows(report)
    (bad,) = [r for r in report["tokenizers"] if r["repo_id"] == f"hostile/{name}"]
    assert bad["ok"] is False and bad["input_ids"] is None and bad["fast_path"] is None and bad["commit"] is None
    want = "Precompiled: Error(" if name == "t5-short-charsmap" else "no entry found for key"
    assert bad["error"].startswith("PanicException: ") and want in bad["error"], bad
    assert "\n" not in bad["error"]
    assert bad["cause"] == ("the tokenizers library panicked on this repo's tokenizer files (a malformed or hostile "
                            "tokenizer.json): it cannot be loaded")
    # The table says the same in one line per repo, and the summary counts it.
    proc = run_hfcache(["check", "--cache-dir", str(cache)], env=clean_env(COLUMNS="400"), timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "2 loaded, 1 failed" in proc.stdout
    assert f"hostile/{name}@main: PanicException: " in proc.stdout


def test_check_gives_the_others_their_results_when_a_load_aborts_the_process(tmp_path):
    """Rust aborts on a failed allocation: the child dies (SIGABRT) in the middle of one repo's load. That repo
    fails with how the child ended; the repos before it keep their results and those after it load in a new child."""
    repo = {"tokenizer.json": T5.read_text(encoding="utf-8"), "tokenization_abort.py": ABORTING_CODE,
            "config.json": json.dumps({"model_type": "t5"}),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "AbortTokenizer",
                                                 "auto_map": {"AutoTokenizer": [None, "tokenization_abort.AbortTokenizer"]}})}
    cache = tmp_path / "cache"
    warm(cache, *HEALTHY, "hostile/aborts", root=_hub(tmp_path, {"aborts": repo}))
    code, report, _ = _check(cache, "--trust-remote-code", "hostile/aborts")
    assert code == 1, report
    assert [r["repo_id"] for r in report["tokenizers"]] == [HEALTHY[0], "hostile/aborts", HEALTHY[1]]
    _assert_healthy_rows(report)
    (bad,) = [r for r in report["tokenizers"] if r["repo_id"] == "hostile/aborts"]
    assert bad["ok"] is False and bad["trust_remote_code"] is True
    assert bad["error"].startswith(f"{CRASHED} (killed by SIGABRT): memory allocation of "), bad
    assert bad["cause"].startswith("loading this repo killed the process"), bad
    # Not opted in, its code does not run: nothing crashes, the repo is "not run", the others pass.
    code, report, _ = _check(cache)
    assert code == 0, report
    assert [r["not_run"] for r in report["tokenizers"]] == [False, True, False]


@pytest.fixture(scope="module")
def hostile_cache(tmp_path_factory) -> Path:
    """Every hostile repo of :data:`REFUSED`, warmed by hfcache from the test Hub."""
    base = tmp_path_factory.mktemp("hostile")
    cache = base / "cache"
    warm(cache, *HEALTHY[:1], *(f"hostile/{name}" for name in REFUSED),
         root=_hub(base, {name: files for name, (files, _) in REFUSED.items()}))
    return cache


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_fast_path_refuses_a_hostile_tokenizer_with_its_reason(hostile_cache, name):
    with pytest.raises(FastTokenizerRefused) as refused:
        hfcache.load_tokenizer(f"hostile/{name}", cache_dir=hostile_cache, backend="tokenizers")
    assert REFUSED[name][1] in refused.value.reason, refused.value.reason
    assert "\n" not in str(refused.value) and refused.value.exit_code == 4
    assert refused.value.hint == 'use backend="transformers" (AutoTokenizer) for this repo'
    # the healthy repo of the same cache still loads
    tok = hfcache.load_tokenizer(HEALTHY[0], cache_dir=hostile_cache, backend="tokenizers")
    assert tok.encode(GOLDEN["text"]).ids == GOLDEN["repos"][HEALTHY[0]]["input_ids"]


LOAD = r"""
import json, sys
import hfcache
from hfcache.offline.env import OfflineLoadError
try:
    hfcache.load_tokenizer(sys.argv[1], cache_dir=sys.argv[2])
    print(json.dumps({"loaded": True}))
except OfflineLoadError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc), "cause": exc.cause}))
"""


def test_load_tokenizer_with_transformers_reports_a_panic_as_an_offline_load_error(hostile_cache, tmp_path):
    proc = subprocess.run([sys.executable, "-c", LOAD, "hostile/t5-short-charsmap", str(hostile_cache)],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
                          env=clean_env(HF_HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stderr  # was: pyo3_runtime.PanicException out of load_tokenizer
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] == "OfflineLoadError", result
    assert "PanicException: Precompiled" in result["message"] or "panicked" in result["message"], result
    assert result["cause"].startswith("the tokenizers library panicked on this repo's tokenizer files"), result


NETWORK_LOAD = r"""
import json, sys
import hfcache
from hfcache.errors import HubError
try:
    hfcache.load_tokenizer(sys.argv[1], cache_dir=sys.argv[2], allow_network=True)
    print(json.dumps({"loaded": True}))
except HubError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


def test_load_tokenizer_reports_a_panic_of_the_network_load_as_a_hub_error(tmp_path):
    """``allow_network=True`` on a repo the cache lacks: the endpoint serves the panicking file, and the load from it
    fails with HubError naming both attempts (the panic escaped load_tokenizer before)."""
    from tests.testhub import HubServer

    with HubServer(_hub(tmp_path, {"t5-short-charsmap": PANICS["t5-short-charsmap"]})) as server:
        proc = subprocess.run([sys.executable, "-c", NETWORK_LOAD, "hostile/t5-short-charsmap", str(tmp_path / "cache")],
                              capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
                              env=clean_env(HF_HOME=str(tmp_path / "home"), HF_ENDPOINT=server.endpoint))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] == "HubError", result
    assert "and the network load failed: PanicException: Precompiled: Error(" in result["message"], result
    assert "\n" not in result["message"]
