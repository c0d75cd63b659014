"""``load_tokenizer(backend="tokenizers")`` refuses a ``tokenizer.json`` whose chains can blow a text (or its ids)
up, before the library runs them (hfcache/integrity/fast_inputs.py ``growth``): a normalizer that doubles the text,
and the other constructs of the same kind (pre-tokenizers, decoders, post-processors, Unicode steps fed by a
``Replace``, charsmaps).

Before: a normalizer ``Sequence`` of ``Replace("l" -> "ll")`` 25 times hung the calling process in the fast path's
smoke encode, 40 times aborted it (``memory allocation ... failed``, SIGABRT). Each load here runs in its own process
under a 4 GiB address-space limit and a 120 s timeout, so a regression fails the test, never the test run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfcache.integrity import fast_inputs
from tests.hostile_tokenizer_repos import HEALTHY, HUB, T5, load_in_a_process, t5_backend, warmed


def _replace(pattern: str, content: str) -> dict:
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


def _sequence(key: str, steps: list) -> dict:
    return {"type": "Sequence", key: steps}


CHARSMAP = json.loads(T5.read_text(encoding="utf-8"))["normalizer"]
A_TWICE = [{"Sequence": {"id": "A", "type_id": 0}}] * 1000
#: repo name -> (its files, the chain the refusal names)
BLOWUPS = {
    "doubling-25": (t5_backend(normalizer=_sequence("normalizers", [_replace("l", "ll")] * 25)), "normalizer"),
    "doubling-40": (t5_backend(normalizer=_sequence("normalizers", [_replace("l", "ll")] * 40)), "normalizer"),
    "regex-doubling": (t5_backend(normalizer=_sequence("normalizers", [
        {"type": "Replace", "pattern": {"Regex": "l+"}, "content": "lll"}] * 20)), "normalizer"),
    "nfkc-fed-by-replace": (t5_backend(normalizer=_sequence("normalizers",
                                                            [_replace("ア", "㌂"), {"type": "NFKC"}] * 30)),
                            "normalizer"),
    "two-charsmaps": (t5_backend(normalizer=_sequence("normalizers", [CHARSMAP] * 2)), "normalizer"),
    "prepend-60": (t5_backend(normalizer=_sequence("normalizers", [{"type": "Prepend", "prepend": "x" * 1000}] * 60)),
                   "normalizer"),
    "bytelevel-30": (t5_backend(pre_tokenizer=_sequence("pretokenizers", [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}] * 30)),
                     "pre_tokenizer"),
    "template-a-1000": (t5_backend(post_processor={"type": "TemplateProcessing", "single": A_TWICE, "pair": A_TWICE,
                                            "special_tokens": {}}), "post_processor"),
    "decoder-doubling": (t5_backend(decoder=_sequence("decoders", [_replace("l", "ll")] * 40)), "decoder"),
    # A second red team: Python's regex parser reads Oniguruma's POSIX brackets and class intersections as wider
    # than the one character they match, so each Replace of 64 characters looked like no growth (x262,144 in three
    # steps: 25 s for the smoke encode; five aborted the process).
    "posix-brackets": (t5_backend(normalizer=_sequence("normalizers", [
        {"type": "Replace", "pattern": {"Regex": "[" + "[:alpha:]" * 63 + "]"}, "content": "a" * 64}] * 3)),
                       "normalizer"),
    "class-intersection": (t5_backend(normalizer=_sequence("normalizers", [
        {"type": "Replace", "pattern": {"Regex": "[a-z&&[a-z]]" * 8}, "content": "a" * 64}] * 3)), "normalizer"),
}
#: A step ``type`` of another JSON type: ``TypeError: unhashable type`` escaped load_tokenizer (a second red team).
ODD_TYPES = {
    "normalizer-type-list": t5_backend(normalizer={"type": ["NFKC"]}),
    "pre-tokenizer-type-object": t5_backend(pre_tokenizer={"type": {"Sequence": 1}, "pretokenizers": []}),
    "decoder-step-type-list": t5_backend(decoder=_sequence("decoders", [{"type": ["Replace"]}])),
}

@pytest.fixture(scope="module")
def blowup_cache(tmp_path_factory) -> Path:
    return warmed(tmp_path_factory.mktemp("growth"), {name: files for name, (files, _) in BLOWUPS.items()})


def test_every_blowup_is_refused_before_the_library_runs_it(blowup_cache):
    results = load_in_a_process(blowup_cache, *HEALTHY, *(f"hostile/{name}" for name in BLOWUPS))
    for repo_id in HEALTHY:
        assert results[repo_id]["loaded"] > 0, results[repo_id]
    for name, (_, chain) in BLOWUPS.items():
        result = results[f"hostile/{name}"]
        assert result.get("refused", "").startswith(f"tokenizer.json's {chain} can make "), (name, result)
        assert f"over the {fast_inputs.MAX_GROWTH} the fast path takes" in result["refused"], result
        assert "\n" not in result["message"]


def test_a_step_type_of_another_json_type_is_refused(tmp_path):
    cache = warmed(tmp_path, ODD_TYPES)
    results = load_in_a_process(cache, *HEALTHY, *(f"hostile/{name}" for name in ODD_TYPES))
    for repo_id in HEALTHY:
        assert results[repo_id]["loaded"] > 0, results[repo_id]
    for name in ODD_TYPES:
        result = results[f"hostile/{name}"]
        assert "refused" in result and "unhashable" not in result["message"], (name, result)
    for chains in ODD_TYPES.values():  # the static check itself: no TypeError, nothing to refuse
        assert fast_inputs.growth(json.loads(chains["tokenizer.json"])) is None


def _real_chains() -> list[Path]:
    return sorted(HUB.glob("*/*/tokenizer.json"))


@pytest.mark.parametrize("path", _real_chains(), ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_the_fixtures_real_chains_are_within_the_bound(path):
    fast_inputs.growth(json.loads(path.read_text(encoding="utf-8")))


def test_real_converter_chains_are_within_the_bound():
    """The chains transformers' converters write (convert_slow_tokenizer.py): ALBERT/XLNet (NFKD, lower case and a
    charsmap in one run), Llama/Mistral (Prepend + Replace), BERT-like NFD runs, a byte-level Qwen/Llama-3."""
    regex = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
    for normalizer in (
        _sequence("normalizers", [_replace("``", '"'), _replace("''", '"'), {"type": "NFKD"},
                                  {"type": "StripAccents"}, {"type": "Lowercase"}, CHARSMAP, regex]),
        _sequence("normalizers", [{"type": "Prepend", "prepend": "\u2581"}, _replace(" ", "\u2581")]),
        _sequence("normalizers", [{"type": "NFD"}, {"type": "Lowercase"}, {"type": "StripAccents"}]),
        {"type": "NFC"},
    ):
        fast_inputs.growth({"normalizer": normalizer, "pre_tokenizer": _sequence("pretokenizers", [
            {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}])})


def test_the_bound_is_the_product_of_the_worst_growths():
    fast_inputs.growth({"normalizer": _sequence("normalizers", [_replace("l", "ll")] * 4)})  # 16: taken
    with pytest.raises(fast_inputs.FastPathRefused, match="a text 32 times longer"):
        fast_inputs.growth({"normalizer": _sequence("normalizers", [_replace("l", "ll")] * 5)})
    with pytest.raises(fast_inputs.FastPathRefused, match="a text 18 times longer"):  # the second NFKC counts
        fast_inputs.growth({"normalizer": _sequence("normalizers", [_replace("ア", "㌂"), {"type": "NFKC"}] * 2)})
    with pytest.raises(fast_inputs.FastPathRefused, match="an encoding's ids 17 times longer"):
        fast_inputs.growth({"post_processor": {"type": "TemplateProcessing", "single": A_TWICE[:17], "pair": []}})
    nested = {"type": "Replace", "pattern": {"String": "a"}, "content": "aaa"}
    for _ in range(4):
        nested = _sequence("normalizers", [nested, nested])  # 16 steps of x3, nested four deep
    with pytest.raises(fast_inputs.FastPathRefused, match="times longer"):
        fast_inputs.growth({"normalizer": nested})
