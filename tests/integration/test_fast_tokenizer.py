"""The fast tokenizer path on every fixture tokenizer: identical ids to AutoTokenizer on the built-in corpus, or a
refusal naming why; ``hfcache check`` proving and recording it; ``load_tokenizer`` honouring the record."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hfcache.integrity import fast_record
from tests.canary import Canary
from tests.helpers import REPO, clean_env, run_hfcache, warm

FIXTURES = ["bert-base-uncased", "gpt2", "google-bert/bert-base-chinese", "FacebookAI/roberta-base",
            "mistralai/Mistral-7B-v0.1", "sentence-transformers/all-MiniLM-L6-v2",
            "distilbert/distilbert-base-uncased", "google-t5/t5-small", "microsoft/Phi-3-mini-4k-instruct"]
#: The fixtures the fast path refuses, and the reason it must name.
REFUSED = {"mistralai/Mistral-7B-v0.1": "no tokenizer.json in the snapshot (a slow-only tokenizer"}

AUTO = r"""
import json, sys
from transformers import AutoTokenizer
from hfcache.integrity.tokenizer_corpus import corpus
out = {}
for repo_id in sys.argv[1:]:
    tok = AutoTokenizer.from_pretrained(repo_id)
    lines = corpus([*map(str, tok.all_special_tokens), *tok.get_added_vocab()])
    out[repo_id] = {"lines": lines, "ids": [tok(line)["input_ids"] for line in lines]}
print(json.dumps(out))
"""

FAST = r"""
import json, sys
import hfcache
from hfcache.offline.api import FastTokenizerRefused
repo_id, cache, lines = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
try:
    tok = hfcache.load_tokenizer(repo_id, cache_dir=cache, backend="tokenizers")
    result = {"ids": [tok.encode(line).ids for line in lines]}
except FastTokenizerRefused as exc:
    result = {"refused": str(exc), "hint": exc.hint}
result["modules"] = sorted(m for m in ("transformers", "huggingface_hub") if m in sys.modules)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fast") / "cache"
    warm(root, *FIXTURES)
    return root


@pytest.fixture(scope="module")
def auto(cache) -> dict:
    """AutoTokenizer's lines and ids per fixture, from one offline subprocess."""
    env = clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "home"),
                    TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, "-c", AUTO, *FIXTURES], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("repo_id", FIXTURES)
def test_fast_path_gives_autotokenizers_ids_or_names_its_refusal(cache, auto, repo_id, tmp_path):
    lines = tmp_path / "lines.json"
    lines.write_text(json.dumps(auto[repo_id]["lines"]))
    env = clean_env(HF_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-c", FAST, repo_id, str(cache), str(lines)], capture_output=True,
                          text=True, env=env, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["modules"] == []  # neither transformers nor huggingface_hub was imported
    if repo_id in REFUSED:
        assert REFUSED[repo_id] in result["refused"], result
        assert 'backend="transformers"' in result["hint"]
        return
    assert "refused" not in result, result
    for line, want, got in zip(auto[repo_id]["lines"], auto[repo_id]["ids"], result["ids"], strict=True):
        assert got == want, (repo_id, line[:60])
    assert max(map(len, result["ids"])) > 8192  # the long line: past model_max_length, not truncated


def _load(cache: Path, repo_id: str, **kwargs) -> subprocess.CompletedProcess[str]:
    code = ("import sys, hfcache\n"
            "try:\n"
            f"    tok = hfcache.load_tokenizer({repo_id!r}, cache_dir={str(cache)!r}, backend='tokenizers', "
            f"**{kwargs!r})\n"
            "    print('ids', tok.encode('Hello world').ids)\n"
            "except hfcache.HfcacheError as exc:\n"
            "    print(type(exc).__name__, exc.exit_code, exc)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                          timeout=120, cwd=REPO)


def test_check_proves_and_records_the_fast_path_and_load_tokenizer_honours_it(cache, tmp_path):
    canary = Canary(tmp_path)
    record = cache / ".locks" / fast_record.RECORD[-1]
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    verdicts = {t["repo_id"]: t["fast_path"] for t in report["tokenizers"]}
    for repo_id in FIXTURES:
        if repo_id in REFUSED:
            assert verdicts[repo_id].startswith("refused: ") and REFUSED[repo_id] in verdicts[repo_id]
        else:
            assert verdicts[repo_id] == "equal", (repo_id, verdicts[repo_id])
    assert report["fast_path_recorded"] is True
    assert stat.S_IMODE(record.stat().st_mode) == 0o644 and record.stat().st_uid == os.geteuid()
    entries = json.loads(record.read_text())["repos"]
    bert = next(t for t in report["tokenizers"] if t["repo_id"] == "bert-base-uncased")
    key = fast_record.key("model", "bert-base-uncased", bert["commit"])
    assert entries[key]["verdict"] == "equal"
    assert not any("Mistral" in k for k in entries)  # a static refusal is not recorded
    assert _load(cache, "bert-base-uncased", require_proof=True).stdout.startswith("ids [101, 7592, 2088, 102]")
    # The table shows the column and the refusal's reason.
    table = run_hfcache(["check", "--cache-dir", str(cache), "mistralai/Mistral-7B-v0.1", "bert-base-uncased"])
    assert table.returncode == 0 and "fast path" in table.stdout
    assert "fast path mistralai/Mistral-7B-v0.1@main: refused: no tokenizer.json" in table.stdout
    # A repo recorded as differing (as check records one) is refused, naming the recorded difference.
    entries[key] = {"verdict": "differs: corpus line 4 'x': from id 0, transformers [1] vs tokenizers [2]",
                    "tokenizers": entries[key]["tokenizers"]}
    record.write_text(json.dumps({"version": 1, "repos": entries}))
    out = _load(cache, "bert-base-uncased").stdout
    assert out.startswith("FastTokenizerRefused 4 bert-base-uncased@main: the fast tokenizer path refuses it: "
                          "hfcache check recorded that its ids differ"), out
    # check proves it again and replaces the verdict.
    assert run_hfcache(["check", "--cache-dir", str(cache), "bert-base-uncased"]).returncode == 0
    assert _load(cache, "bert-base-uncased").stdout.startswith("ids ")
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0
    canary.assert_unchanged()


@pytest.mark.skipif(os.geteuid() != 0, reason="a record owned by a group member needs chown")
def test_a_members_forged_record_cannot_prove_or_lift_a_refusal(cache, tmp_path):
    """A group member of a shared cache rewrites the record: "equal" for everything, the slow-only repo included."""
    canary = Canary(tmp_path)
    record = cache / ".locks" / fast_record.RECORD[-1]
    import tokenizers

    commits = {r: (cache / f"models--{r.replace('/', '--')}" / "refs" / "main").read_text().strip()
               for r in ("bert-base-uncased", "mistralai/Mistral-7B-v0.1")}
    forged = {fast_record.key("model", r, c): {"verdict": "equal", "tokenizers": tokenizers.__version__}
              for r, c in commits.items()}
    record.unlink(missing_ok=True)
    record.write_text(json.dumps({"version": 1, "repos": forged}))
    os.chown(record, 4101, 4100)
    os.chmod(record, 0o664)
    out = _load(cache, "mistralai/Mistral-7B-v0.1").stdout
    assert out.startswith("FastTokenizerRefused 4") and "no tokenizer.json" in out, out
    out = _load(cache, "bert-base-uncased", require_proof=True).stdout
    assert out.startswith("FastTokenizerRefused 4") and "no proof recorded" in out, out
    assert _load(cache, "bert-base-uncased").stdout.startswith("ids ")  # unrecorded is the static contract
    # check replaces the member's record with its own (0644, this uid).
    assert run_hfcache(["check", "--cache-dir", str(cache), "bert-base-uncased"]).returncode == 0
    assert record.stat().st_uid == os.geteuid() and stat.S_IMODE(record.stat().st_mode) == 0o644
    assert not any("Mistral" in k for k in json.loads(record.read_text())["repos"])
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0
    canary.assert_unchanged()


_PHI3 = json.loads((REPO / "tests/data/hub/microsoft/Phi-3-mini-4k-instruct/tokenizer_config.json").read_text())
#: tokenizer_config.json changes transformers applies (or drops) on load, on copies of the fixtures: the fast path
#: must follow each (BERT's normalizer rebuilt from do_lower_case/strip_accents/tokenize_chinese_chars, Llama's
#: Metaspace from legacy/add_prefix_space, GPT-2's ByteLevel from add_prefix_space, add_bos_token/add_eos_token
#: dropped when there is a tokenizer.json, extra special tokens added, split_special_tokens; and an
#: added_tokens_decoder other than the file's added tokens, which a rebuilding class takes instead of the file's).
VARIANTS = [
    ("microsoft/Phi-3-mini-4k-instruct",
     {"added_tokens_decoder": {k: v for k, v in _PHI3["added_tokens_decoder"].items() if int(k) < 32003}}),
    ("openai-community/gpt2", {"added_tokens_decoder": {}}),
    ("google-bert/bert-base-uncased", {"added_tokens_decoder": {"0": {"content": "[PAD]", "special": True}}}),
    ("google-bert/bert-base-uncased", {"do_lower_case": False}),
    ("google-bert/bert-base-uncased", {"strip_accents": True}),
    ("google-bert/bert-base-uncased", {"tokenize_chinese_chars": False}),
    ("google-bert/bert-base-uncased", {"split_special_tokens": True}),
    ("microsoft/Phi-3-mini-4k-instruct", {"add_bos_token": True, "add_eos_token": True}),
    ("microsoft/Phi-3-mini-4k-instruct", {"legacy": True}),
    ("microsoft/Phi-3-mini-4k-instruct", {"add_prefix_space": False}),
    ("openai-community/gpt2", {"add_prefix_space": True}),
    ("FacebookAI/roberta-base", {"add_bos_token": True, "bos_token": "<s>"}),
    ("google-t5/t5-small", {"extra_special_tokens": ["<x1>", "<x2>"]}),
]

BOTH = r"""
import json, sys
from transformers import AutoTokenizer
import hfcache
from hfcache.integrity.tokenizer_corpus import corpus
out = []
for repo_id, cache in json.loads(sys.argv[1]):
    tok = AutoTokenizer.from_pretrained(repo_id, cache_dir=cache)
    fast = hfcache.load_tokenizer(repo_id, cache_dir=cache, backend="tokenizers")
    lines = corpus([*map(str, tok.all_special_tokens), *tok.get_added_vocab(),
                    *(t.content for t in fast.get_added_tokens_decoder().values())])
    rows = []
    for line in lines:
        ids, got = tok(line)["input_ids"], fast.encode(line).ids
        rows.append([line[:40], ids, got, tok.decode(ids, clean_up_tokenization_spaces=False),
                     fast.decode(got, skip_special_tokens=False)])
    out.append(rows)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> list:
    import shutil

    from tests.helpers import HUB

    base = tmp_path_factory.mktemp("variants")
    pairs = []
    for i, (repo_id, change) in enumerate(VARIANTS):
        hub = base / f"hub{i}"
        shutil.copytree(HUB / repo_id, hub / repo_id)
        shutil.copy(HUB / "legacy_ids.json", hub / "legacy_ids.json")
        config = hub / repo_id / "tokenizer_config.json"
        config.write_text(json.dumps({**(json.loads(config.read_text()) if config.exists() else {}), **change}))
        warm(base / f"cache{i}", repo_id, root=hub)
        pairs.append([repo_id, str(base / f"cache{i}")])
    env = clean_env(HF_HUB_OFFLINE="1", HF_HOME=str(base / "home"), TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, "-c", BOTH, json.dumps(pairs)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=[f"{r.split('/')[-1]}-{'-'.join(c)}-{i}" for i, (r, c) in enumerate(VARIANTS)])
def test_fast_path_follows_the_load_time_settings_of_tokenizer_config(variants, index):
    for line, want, got, want_text, got_text in variants[index]:
        assert got == want, (VARIANTS[index], line)
        if VARIANTS[index][0] == "openai-community/gpt2":  # a rebuilt byte-level backend keeps the file's decoder
            assert got_text == want_text, (VARIANTS[index], line)  # (was 'Hello , Ġworld !': no decoder)
