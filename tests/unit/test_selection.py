"""Pure selection rules: which files each kind fetches, and which absent names get .no_exist markers."""

import json

import pytest

from hfcache.warming.selection import TOKENIZER_FILENAMES, select, shards_from_index

BERT = ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "README.md", ".gitattributes",
        "model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "onnx/model.onnx",
        "coreml/fill-mask/float32_model.mlpackage/Manifest.json", "rust_model.ot"]


def test_tokenizer_kind_takes_tokenizer_files_and_config_only():
    sel = select(BERT, "tokenizer")
    assert sel.paths == ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")
    assert "special_tokens_map.json" in sel.absent and "config.json" not in sel.absent
    assert set(sel.absent) | {"config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"} == set(
        TOKENIZER_FILENAMES)


def test_tokenizer_kind_covers_sentencepiece_tiktoken_and_chat_templates():
    paths = ["tokenizer.model", "spiece.model", "qwen.tiktoken", "tekken.json", "chat_template.jinja",
             "additional_chat_templates/tool_use.jinja", "additional_chat_templates/notes.txt",
             "sub/tokenizer.json", "model.bin"]
    sel = select(paths, "tokenizer")
    assert sel.paths == ("additional_chat_templates/tool_use.jinja", "chat_template.jinja", "qwen.tiktoken",
                         "spiece.model", "tekken.json", "tokenizer.model")
    assert "config.json" in sel.absent


def test_model_kind_prefers_safetensors_and_skips_other_formats():
    sel = select(BERT, "model")
    assert "model.safetensors" in sel.paths
    for skipped in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "onnx/model.onnx", "rust_model.ot",
                    "coreml/fill-mask/float32_model.mlpackage/Manifest.json", "README.md"):
        assert skipped not in sel.paths
    assert {"config.json", "tokenizer.json", "vocab.txt"} <= set(sel.paths)


def test_model_kind_falls_back_to_pytorch_and_follows_index():
    assert "pytorch_model.bin" in select(["config.json", "pytorch_model.bin", "tf_model.h5"], "model").paths
    paths = ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors", "consolidated.safetensors"]
    sel = select(paths, "model")
    assert sel.needs_index == ("model.safetensors.index.json",)
    assert "consolidated.safetensors" not in sel.paths
    index = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                       "b": "model-00002-of-00002.safetensors"}}).encode()
    assert shards_from_index(index, paths, "model.safetensors.index.json") == {
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}


def test_index_naming_missing_shard_or_garbage_is_an_error():
    with pytest.raises(ValueError, match="does not have"):
        shards_from_index(b'{"weight_map": {"a": "gone.safetensors"}}', ["x.safetensors"], "m.index.json")
    with pytest.raises(ValueError, match="not a sharded weight index"):
        shards_from_index(b"[1, 2]", [], "m.index.json")


def test_include_adds_and_exclude_wins():
    sel = select(BERT, "model", include=["onnx/"], exclude=["tokenizer.json", "onnx/model.onnx"])
    assert "tokenizer.json" not in sel.paths
    assert "onnx/model.onnx" not in sel.paths
    sel = select(BERT, "tokenizer", include=["*.h5"])
    assert "tf_model.h5" in sel.paths


def test_all_kind_takes_everything_and_still_writes_markers():
    sel = select(BERT, "all")
    assert set(sel.paths) == set(BERT)
    assert "special_tokens_map.json" in sel.absent and "config.json" not in sel.absent


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError):
        select(BERT, "weights")


def test_an_index_nested_too_deep_or_too_large_is_refused():
    from hfcache.warming.selection import MAX_INDEX_BYTES, check_index_size

    with pytest.raises(ValueError, match="not a sharded weight index: JSON nested deeper than 64 levels"):
        shards_from_index(b'{"weight_map": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", [], "m.index.json")
    check_index_size("m.index.json", MAX_INDEX_BYTES)
    with pytest.raises(ValueError, match="more than the"):
        check_index_size("m.index.json", MAX_INDEX_BYTES + 1)
