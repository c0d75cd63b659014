"""Every string a cache supplies to the tokenizers library goes through the fast path's refusal: a lone surrogate
(``"\\ud800"``, which JSON can spell but UTF-8 cannot encode) as a token's content made ``AddedToken(...)`` raise
``UnicodeEncodeError`` out of ``load_tokenizer(backend="tokenizers")``: in ``tokenizer_config.json``'s
``added_tokens_decoder``, ``tokenizer.json``'s ``added_tokens``, a dict value of ``special_tokens_map.json``. Now
each is ``FastTokenizerRefused`` naming the lone surrogate (the unit fuzz, tests/unit/
test_fast_tokenizer_hostile_settings.py, puts one in every string field). Loaded in a real process, from a cache
warmed by hfcache from the test Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile_tokenizer_repos import GPT2, HEALTHY, T5, load_in_a_process, warmed

SURROGATE = '"\\ud800"'  # JSON text: the escape of a lone surrogate


def _gpt2(tokenizer_config: str, special_tokens_map: str | None = None, tokenizer_json: str | None = None) -> dict:
    files = {"tokenizer.json": tokenizer_json or (GPT2 / "tokenizer.json").read_text(encoding="utf-8"),
             "tokenizer_config.json": tokenizer_config}
    if special_tokens_map is not None:
        files["special_tokens_map.json"] = special_tokens_map
    return files


def _t5_with_added(content: str) -> str:
    doc = json.loads(T5.read_text(encoding="utf-8"))
    doc["added_tokens"].append({"id": 32100, "content": "SURROGATE", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    return json.dumps(doc).replace('"SURROGATE"', content)


#: repo name -> its files (each holding a lone surrogate where a token's text goes)
STRINGS = {
    "added-tokens-decoder": _gpt2('{"tokenizer_class": "GPT2Tokenizer", "added_tokens_decoder": {"50257": '
                                  f'{{"content": {SURROGATE}, "special": true}}}}}}'),
    "tokenizer-json-added-tokens": {"tokenizer.json": _t5_with_added(SURROGATE),
                                    "tokenizer_config.json": '{"tokenizer_class": "PreTrainedTokenizerFast"}'},
    "special-tokens-map-dict": _gpt2('{"tokenizer_class": "GPT2Tokenizer"}', f'{{"bos_token": {{"content": '
                                                                            f'{SURROGATE}}}}}'),
    "special-tokens-map-string": _gpt2('{"tokenizer_class": "GPT2Tokenizer"}', f'{{"eos_token": {SURROGATE}}}'),
    "unk-token": _gpt2(f'{{"tokenizer_class": "GPT2Tokenizer", "unk_token": {SURROGATE}}}'),
    "extra-special-tokens": _gpt2('{"tokenizer_class": "GPT2Tokenizer", "extra_special_tokens": ["x\\udfffy"]}'),
}


@pytest.fixture(scope="module")
def strings_cache(tmp_path_factory) -> Path:
    return warmed(tmp_path_factory.mktemp("strings"), STRINGS)


def test_a_lone_surrogate_anywhere_a_token_goes_is_refused(strings_cache):
    results = load_in_a_process(strings_cache, *HEALTHY, *(f"hostile/{name}" for name in STRINGS))
    for repo_id in HEALTHY:
        assert results[repo_id]["loaded"] > 0, results[repo_id]
    for name in STRINGS:
        result = results[f"hostile/{name}"]
        assert "holds a lone surrogate" in result.get("refused", ""), (name, result)
        assert "\n" not in result["message"] and result["message"].isascii(), result
