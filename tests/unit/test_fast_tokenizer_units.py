"""The fast tokenizer path's builder and record (hfcache/integrity/fast_tokenizer.py, fast_record.py) on caches built
here: which class it replays, what it refuses, that truncation/padding of tokenizer.json are off, that hostile
layouts (links out, FIFOs, deep JSON) are refused without blocking, and who may write the record."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import hfcache
from hfcache.errors import CacheError
from hfcache.integrity import fast_record
from hfcache.integrity.fast_tokenizer import FastPathRefused, build, resolve_class
from hfcache.offline.api import FastTokenizerRefused
from hfcache.offline.probe import _first_difference
from tests.canary import Canary

COMMIT = "a" * 40
REPO = "org/tiny"
FOLDER = "models--org--tiny"


def tiny_tokenizer_json(**extra) -> str:
    """A WordLevel tokenizer.json with a truncation and a padding section (as some Hub repos ship)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {"[UNK]": 0, "[PAD]": 1, "hello": 2, "world": 3, "x": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_truncation(max_length=3)
    tok.enable_padding(length=8, pad_id=1, pad_token="[PAD]")
    doc = json.loads(tok.to_str())
    doc.update(extra)
    return json.dumps(doc)


def make_repo(cache: Path, files: dict[str, str | bytes]) -> Path:
    snap = cache / FOLDER / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (cache / FOLDER / "refs").mkdir()
    (cache / FOLDER / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        (snap / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return snap


@pytest.mark.parametrize(("tk_config", "config", "expected"), [
    ({}, None, "TokenizersBackend"),
    ({"tokenizer_class": "BertTokenizerFast"}, None, "BertTokenizer"),
    ({}, {"model_type": "gpt2"}, "GPT2Tokenizer"),
    ({"tokenizer_class": "LlamaTokenizer"}, {"model_type": "phi3"}, "TokenizersBackend"),
    ({"tokenizer_class": "PreTrainedTokenizerFast"}, None, "TokenizersBackend"),
])
def test_resolve_class_replays_autotokenizers_choice(tk_config, config, expected):
    assert resolve_class(tk_config, config) == expected


@pytest.mark.parametrize(("tk_config", "config", "reason"), [
    ({"auto_map": {"AutoTokenizer": ["x.Tok", None]}}, None, "custom code"),
    ({}, {"auto_map": {"AutoTokenizer": "x.Tok"}}, "custom code"),
    ({"tokenizer_class": "XLNetTokenizer"}, None, "XLNetTokenizer rewrites the tokenizer on load"),
    ({}, {"model_type": "t5"}, "model_type 't5'"),
    ({"tokenizer_class": "BertTokenizer"}, {"model_type": "gpt2"}, "tokenizer_class BertTokenizer and model_type"),
    ({"tokenizer_class": ["x"]}, None, "not a string"),
])
def test_resolve_class_refuses_what_it_does_not_replicate(tk_config, config, reason):
    with pytest.raises(FastPathRefused, match=reason):
        resolve_class(tk_config, config)


def test_truncation_and_padding_of_tokenizer_json_are_off(tmp_path):
    """transformers' __call__ neither truncates nor pads by default; tokenizers would apply the file's sections."""
    from tokenizers import Tokenizer

    cache = tmp_path / "cache"
    snap = make_repo(cache, {"tokenizer.json": tiny_tokenizer_json()})
    text = "hello world x hello world"
    assert len(Tokenizer.from_file(str(snap / "tokenizer.json")).encode(text).ids) == 8  # the trap: cut and padded
    tok = hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers")
    assert tok.encode(text).ids == [2, 3, 4, 2, 3]
    assert tok.truncation is None and tok.padding is None


def test_added_tokens_decoder_and_split_special_tokens_apply(tmp_path):
    cache = tmp_path / "cache"
    config = {"added_tokens_decoder": {"5": {"content": "<sep>", "lstrip": False, "rstrip": False,
                                             "normalized": False, "single_word": False, "special": True}},
              "split_special_tokens": False}
    make_repo(cache, {"tokenizer.json": tiny_tokenizer_json(), "tokenizer_config.json": json.dumps(config)})
    tok = build(cache, REPO).tokenizer
    assert tok.encode("hello<sep>world").ids == [2, 5, 3]
    assert tok.encode_special_tokens is False


@pytest.mark.parametrize(("files", "reason"), [
    ({"tokenizer.model": b"\x00spm"}, "no tokenizer.json in the snapshot (a slow-only tokenizer"),
    ({"tokenizer.json": "{}"}, "tokenizer.json has no model"),
    ({"tokenizer.json": "[" * 5000 + "]" * 5000}, "nested deeper than 64"),
    ({"tokenizer.json": "x", "tokenizer_config.json": "{" * 3000}, "tokenizer_config.json cannot be parsed"),
    ({"tokenizer.json": "x", "tokenizer_config.json": '{"auto_map": {"AutoTokenizer": ["m.T", null]}}'},
     "custom code"),
])
def test_load_tokenizer_refuses_with_the_reason_and_the_hint(tmp_path, files, reason):
    cache = tmp_path / "cache"
    make_repo(cache, files)
    with pytest.raises(FastTokenizerRefused) as info:
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers")
    assert reason in str(info.value) and 'backend="transformers"' in info.value.hint
    assert info.value.exit_code == 4


def test_a_link_out_of_the_repo_or_a_fifo_is_refused_without_reading_or_blocking(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    snap = make_repo(cache, {"tokenizer_config.json": "{}"})
    (snap / "tokenizer.json").symlink_to(canary.secret)
    with pytest.raises(CacheError, match="links outside its repo folder"):
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers")
    (snap / "tokenizer.json").unlink()
    os.mkfifo(snap / "tokenizer.json")
    with pytest.raises(CacheError, match="not a regular file"):
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers")
    canary.assert_unchanged()


def test_missing_repo_and_ref_are_offline_load_errors_with_the_warm_command(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(hfcache.HfcacheError, match="not in the cache") as info:
        hfcache.load_tokenizer("org/absent", cache_dir=cache, backend="tokenizers")
    assert "hfcache warm org/absent@main" in info.value.hint and info.value.exit_code == 4
    make_repo(cache, {"tokenizer.json": tiny_tokenizer_json()})
    with pytest.raises(hfcache.HfcacheError, match="no ref 'v2'"):
        hfcache.load_tokenizer(REPO, "v2", cache_dir=cache, backend="tokenizers")


def test_bad_backend_and_arguments_are_usage_errors(tmp_path):
    with pytest.raises(hfcache.HfcacheError, match="not a backend") as info:
        hfcache.load_tokenizer(REPO, cache_dir=tmp_path, backend="sentencepiece")
    assert info.value.exit_code == 2
    with pytest.raises(hfcache.HfcacheError, match="takes no use_fast"):
        hfcache.load_tokenizer(REPO, cache_dir=tmp_path, backend="tokenizers", use_fast=True)


def write_record(cache: Path, entries: dict[str, str], *, uid: int = 0, mode: int = 0o644) -> Path:
    locks = cache / ".locks"
    locks.mkdir(exist_ok=True)
    path = locks / fast_record.RECORD[-1]
    path.write_text(json.dumps({"version": 1, "repos": {k: {"verdict": v, "tokenizers": _tokenizers_version()}
                                                        for k, v in entries.items()}}))
    os.chmod(path, mode)
    os.chown(path, uid, -1)
    return path


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


def test_a_recorded_difference_refuses_whoever_wrote_it(tmp_path):
    cache = tmp_path / "cache"
    make_repo(cache, {"tokenizer.json": tiny_tokenizer_json()})
    key = fast_record.key("model", REPO, COMMIT)
    write_record(cache, {key: "differs: corpus line 3 'x'"}, uid=4101, mode=0o664)  # a group member's, writable
    with pytest.raises(FastTokenizerRefused, match="hfcache check recorded that its ids differ"):
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_forged_equal_proves_nothing_and_never_lifts_a_static_refusal(tmp_path):
    cache = tmp_path / "cache"
    make_repo(cache, {"tokenizer.json": tiny_tokenizer_json()})
    key = fast_record.key("model", REPO, COMMIT)
    record = write_record(cache, {key: "equal"}, uid=4101, mode=0o644)  # owned by a member: not trusted
    with pytest.raises(FastTokenizerRefused, match="no proof recorded"):
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers", require_proof=True)
    os.chown(record, 0, -1)
    os.chmod(record, 0o664)  # root's, but group-writable: not trusted either
    with pytest.raises(FastTokenizerRefused, match="no proof recorded"):
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers", require_proof=True)
    os.chmod(record, 0o644)
    assert hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers", require_proof=True)
    # A trusted "equal" for a slow-only repo does not make it load.
    (cache / FOLDER / "snapshots" / COMMIT / "tokenizer.json").unlink()
    with pytest.raises(FastTokenizerRefused, match="no tokenizer.json"):
        hfcache.load_tokenizer(REPO, cache_dir=cache, backend="tokenizers")


def test_the_record_is_written_0644_through_fds_and_a_planted_link_is_not_followed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    canary = Canary(tmp_path)
    assert fast_record.save(str(cache), {"model/a/b@" + COMMIT: "equal", "model/c/d@" + COMMIT: "refused: x"}, "1")
    path = cache / ".locks" / fast_record.RECORD[-1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert list(json.loads(path.read_text())["repos"]) == ["model/a/b@" + COMMIT]  # refusals are not recorded
    path.unlink()
    path.symlink_to(canary.secret)
    assert fast_record.load(str(cache)) == ({}, False)
    canary.assert_unchanged()


def test_first_difference_names_the_line_and_both_ids():
    verdict = _first_difference(["ok", "bad line"], [[1, 2], [1, 2, 3]], [[1, 2], [1, 9, 3]])
    assert verdict.startswith("differs: corpus line 1 'bad line'")
    assert "transformers [1, 2, 3] vs tokenizers [1, 9, 3]" in verdict
    assert _first_difference(["a"], [[1]], [[1]]) is None


def test_the_fast_path_does_not_import_transformers_or_huggingface_hub(tmp_path):
    cache = tmp_path / "cache"
    make_repo(cache, {"tokenizer.json": tiny_tokenizer_json()})
    code = ("import sys, hfcache\n"
            f"tok = hfcache.load_tokenizer({REPO!r}, cache_dir={str(cache)!r}, backend='tokenizers')\n"
            "assert tok.encode('hello world').ids == [2, 3]\n"
            "from hfcache.offline import guard\n"
            "print(sorted(m for m in ('transformers', 'huggingface_hub') if m in sys.modules), "
            "guard.current() is not None)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]
