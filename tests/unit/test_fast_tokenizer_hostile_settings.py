"""The fast tokenizer path (hfcache/integrity/fast_tokenizer.py, fast_inputs.py) on hostile settings: every field it
reads from ``tokenizer_config.json``, ``config.json``, ``special_tokens_map.json`` and ``tokenizer.json`` replaced by
a value of each other JSON type (list, object, negative and huge numbers, float, null, bool, string, a 5,000-digit
string, nesting 60 levels deep, a list of objects, and strings UTF-8 cannot encode: lone surrogates, alone,
inside a word, reversed, in a list, as a token's content; and in the keys the library takes). ``build`` and a first
encode must either work or raise the documented refusal (``FastPathRefused``; ``NotCached``/``CacheError`` for the
layout). Before, cases escaped as ``TypeError``
(``strip_accents``, ``added_tokens``, an added token's ``id``), ``Exception`` at the first encode, or
``pyo3_runtime.PanicException`` (a ``BaseException``: ``precompiled_charsmap``): 105 of 5,112 in a wider run.

The bases are small real tokenizers trained here with tokenizers (WordPiece BERT-style, byte-level BPE GPT-2-style,
Unigram with t5-small's ``Precompiled`` normalizer), laid out as a cache snapshot.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from hfcache.errors import CacheError
from hfcache.integrity import fast_inputs
from hfcache.integrity.fast_tokenizer import FastPathRefused, NotCached, build

HUB = Path(__file__).resolve().parents[1] / "data" / "hub"
COMMIT = "b" * 40
CORPUS = ["hello world the cache is offline", "an embed model of the token", "深度学习 café naïve", "<s> [CLS] x"] * 20


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


VALUES = {"list": ["x"], "object": {"x": 1}, "negative": -1, "huge number": 2**64, "float": 1.5, "null": None,
          "true": True, "string": "x", "digits": "9" * 5000, "deep": _deep(60), "list of objects": [{}],
          # strings UTF-8 cannot encode (JSON spells them \\ud800): pyo3 raised UnicodeEncodeError out of build()
          "lone surrogate": "\ud800", "surrogate in a word": "ab\udfffc", "reversed pair": "\udc00\ud800",
          "list of a surrogate": ["\ud800"], "object of a surrogate": {"content": "\ud800", "special": True}}

TOKENIZER_CONFIG = ["auto_map", "tokenizer_class", "bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                    "cls_token", "mask_token", "added_tokens_decoder", "extra_special_tokens",
                    "additional_special_tokens", "tokenize_chinese_chars", "strip_accents", "do_lower_case",
                    "add_prefix_space", "legacy", "split_special_tokens"]
FIELDS = ([("tokenizer_config.json", (k,)) for k in TOKENIZER_CONFIG]
          + [("tokenizer_config.json", p) for p in (("added_tokens_decoder", "FIRST"), ("added_tokens_decoder", "0", "content"),
                                                   ("added_tokens_decoder", "0", "special"), ("extra_special_tokens", 0))]
          + [("config.json", (k,)) for k in ("auto_map", "tokenizer_class", "model_type", "_name_or_path",
                                              "transformers_version")]
          + [("tokenizer.json", p) for p in (
              ("model",), ("model", "type"), ("model", "vocab"), ("model", "merges"), ("model", "unk_token"),
              ("model", "unk_id"), ("model", "merges", 0), ("model", "vocab", "FIRST"), ("added_tokens",),
              ("added_tokens", 0), ("added_tokens", 0, "id"), ("added_tokens", 0, "content"),
              ("added_tokens", 0, "special"), ("post_processor",), ("post_processor", "special_tokens"),
              ("decoder",), ("normalizer",), ("normalizer", "precompiled_charsmap"), ("pre_tokenizer",),
              ("truncation",), ("padding",))]
          + [("special_tokens_map.json", (k,)) for k in ("unk_token", "cls_token", "additional_special_tokens")]
          + [(name, ()) for name in ("tokenizer_config.json", "config.json", "special_tokens_map.json",
                                     "tokenizer.json")])


def _trained(kind: str) -> dict:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=200,
                                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    elif kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=100, special_tokens=["<pad>", "</s>", "<unk>"],
                                          unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    if kind == "wordpiece":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    if kind == "unigram":
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                           special_tokens=[("</s>", tok.token_to_id("</s>"))])
    doc = json.loads(tok.to_str())
    if kind == "unigram":  # t5-small's real Precompiled normalizer
        doc["normalizer"] = json.loads((HUB / "google-t5/t5-small/tokenizer.json").read_text())["normalizer"]
    return doc


def _bases() -> dict[str, dict]:
    special_map = json.loads((HUB / "sentence-transformers/all-MiniLM-L6-v2/special_tokens_map.json").read_text())
    bert_config = json.loads((HUB / "sentence-transformers/all-MiniLM-L6-v2/tokenizer_config.json").read_text())
    wordpiece = _trained("wordpiece")
    decoder = {str(e["id"]): {k: v for k, v in e.items() if k != "id"} for e in wordpiece["added_tokens"]}
    return {
        "bert, added_tokens_decoder": {"tokenizer.json": wordpiece, "config.json": {"model_type": "bert"},
                                       "tokenizer_config.json": {**bert_config, "added_tokens_decoder": decoder}},
        "bert, legacy special_tokens_map": {"tokenizer.json": wordpiece, "config.json": {"model_type": "bert"},
                                            "tokenizer_config.json": bert_config,
                                            "special_tokens_map.json": special_map},
        "gpt2": {"tokenizer.json": _trained("bytelevel"), "tokenizer_config.json": {"add_prefix_space": False},
                 "config.json": {"model_type": "gpt2", "transformers_version": "4.26.0"}},
        "unigram": {"tokenizer.json": _trained("unigram"), "config.json": {"transformers_version": "4.0"},
                    "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
                                              "extra_special_tokens": ["<x>"]}},
    }


def _set(doc, path: tuple, value) -> bool:
    """Set ``path`` (keys and list indexes; ``FIRST``: the first entry) in ``doc``; False where it does not exist."""
    for key in path[:-1]:
        if isinstance(doc, list) and isinstance(key, int) and doc or isinstance(doc, dict) and doc.get(key) is not None:
            doc = doc[key]
        else:
            return False
    last = path[-1]
    if last == "FIRST":
        if not doc or not isinstance(doc, (list, dict)):
            return False
        last = 0 if isinstance(doc, list) else next(iter(doc))
    if isinstance(doc, list) and isinstance(last, int) and doc or isinstance(doc, dict):
        doc[last] = value
        return True
    return False


def _verdict(cache: Path, files: dict) -> str:
    folder = cache / "models--fuzz--repo"
    shutil.rmtree(folder, ignore_errors=True)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    for name, doc in files.items():
        if doc is not None:
            (snapshot / name).write_text(json.dumps(doc))
    try:
        tok = build(cache, "fuzz/repo").tokenizer
        tok.encode("Hello world, 深度学习 <s> [CLS]")  # what the application does next
        tok.encode("Hello world", "a pair")
        return "ok"
    except (FastPathRefused, NotCached, CacheError):
        return "refused"
    except BaseException as exc:  # a PanicException is one
        if isinstance(exc, KeyboardInterrupt):
            raise
        return fast_inputs.one_line(exc)


@pytest.fixture(scope="module")
def bases() -> dict[str, dict]:
    return _bases()


@pytest.mark.parametrize("base", ["bert, added_tokens_decoder", "bert, legacy special_tokens_map", "gpt2",
                                  "unigram"])
def test_every_field_of_another_type_loads_or_is_refused(bases, base, tmp_path):
    files = bases[base]
    assert _verdict(tmp_path, files) == "ok"
    verdicts: dict[str, list[str]] = {}
    for name, path in FIELDS:
        for label, value in VALUES.items():
            changed = copy.deepcopy(files)
            if not path:
                changed[name] = value
            else:
                if changed.get(name) is None:  # a file the base lacks: written with just this field
                    changed[name] = {}
                if not _set(changed[name], path, copy.deepcopy(value)):
                    continue
            verdicts.setdefault(_verdict(tmp_path, changed), []).append(f"{name}:{'/'.join(map(str, path))}={label}")
    escaped = {v: cases for v, cases in verdicts.items() if v not in ("ok", "refused")}
    assert not escaped, "\n".join(f"{v}: {cases[:5]}" for v, cases in escaped.items())
    assert len(verdicts.get("refused", [])) > 100 and len(verdicts.get("ok", [])) > 50  # both paths were exercised


def test_is_panic_knows_the_tokenizers_librarys_panic_which_except_exception_misses():
    from tokenizers import Tokenizer

    doc = {"version": "1.0", "normalizer": {"type": "Precompiled", "precompiled_charsmap": ""},
           "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}
    with pytest.raises(BaseException) as raised:  # the point: it is no Exception
        Tokenizer.from_str(json.dumps(doc))
    assert not isinstance(raised.value, Exception) and fast_inputs.is_panic(raised.value)
    assert fast_inputs.one_line(raised.value).startswith("PanicException: Precompiled: Error(")
    with pytest.raises(FastPathRefused, match="panicked"), fast_inputs.library_call("tokenizer.json cannot be loaded"):
        Tokenizer.from_str(json.dumps(doc))
    assert not fast_inputs.is_panic(KeyboardInterrupt()) and not fast_inputs.is_panic(ValueError("x"))
    with pytest.raises(KeyboardInterrupt), fast_inputs.library_call("x"):  # never swallowed
        raise KeyboardInterrupt


@pytest.mark.parametrize(("value", "before"), [(None, True), ("4.57.1", True), ("5.0", False), ("05", False),
                                               ("10.1", False), ("9" * 5000, False), ("dev", True)])
def test_transformers_version_is_read_by_its_leading_number_of_any_length(value, before):
    assert fast_inputs.version_before_5(value) is before  # int("9" * 5000) raised ValueError (Python's 4,300 digits)


@pytest.mark.parametrize("value", [4.57, ["4"], {"v": 4}, True])
def test_transformers_version_of_another_type_is_refused(value):
    with pytest.raises(FastPathRefused, match="transformers_version is"):
        fast_inputs.version_before_5(value)


@pytest.mark.parametrize("base", ["bert, added_tokens_decoder", "gpt2", "unigram"])
def test_a_surrogate_in_a_key_loads_or_is_refused(bases, base, tmp_path):
    """Keys the fast path hands to the library: a vocabulary's tokens, an added token's id text."""
    files = copy.deepcopy(bases[base])
    vocab = files["tokenizer.json"]["model"]["vocab"]
    if isinstance(vocab, dict):
        first = next(iter(vocab))
        vocab["\ud800" + first] = vocab.pop(first)
    else:
        vocab[0] = ["\ud800", *vocab[0][1:]] if isinstance(vocab[0], list) else "\ud800"
    assert _verdict(tmp_path, files) in ("ok", "refused")
    decoder = files["tokenizer_config.json"].get("added_tokens_decoder")
    if decoder:
        decoder["\ud800"] = decoder.pop(next(iter(decoder)))
        assert _verdict(tmp_path, files) == "refused"
