"""Generate small model repos with real files, for the test Hub server (``HubServer`` over ``<org>/<name>/``).

Run: ``python tests/make_model_repos.py OUT_DIR`` (or call :func:`make_model_repos`). The output is deterministic:
the same bytes on every run (fixed seeds, sorted JSON, no timestamps), so the server's commits are stable too.

What each repo holds, and what a loader reads from it (``EXPECTED_MODEL_FILES``: what ``warm --kind model`` must
fetch, nothing more; ``EXPECTED_TOKENIZER_FILES``: what ``warm`` with the default ``--kind tokenizer`` must fetch):

- ``hfcache-test/tiny-bert``: BERT-shaped ``model.safetensors`` (``safetensors.numpy``), tokenizer, config; plus the
  duplicates a Hub repo carries for other runtimes, which must NOT be fetched: ``pytorch_model.bin`` (the same
  weights in PyTorch's format), ``tf_model.h5``, ``flax_model.msgpack``, ``onnx/``, ``openvino/``, ``README.md``.
- ``hfcache-test/tiny-bert-sharded``: ``model.safetensors.index.json`` over two shards, and a stale
  ``model-00001-of-00003.safetensors`` / ``model-00003-of-00003.safetensors`` pair from an older upload that the index
  no longer names (transformers ``modeling_utils`` loads only the shards of the index's ``weight_map``).
- ``hfcache-test/tiny-sentence-transformer``: sentence-transformers layout: ``modules.json`` naming the root
  Transformer, ``1_Pooling`` (``config.json``) and ``2_Dense`` (``config.json`` + ``model.safetensors``; its
  ``pytorch_model.bin`` duplicate is not fetched), ``config_sentence_transformers.json``,
  ``sentence_bert_config.json``; ONNX and OpenVINO exports that are not fetched.
- ``hfcache-test/tiny-bert-bin``: PyTorch weights only (``pytorch_model.bin``, a real ``torch.save`` zip archive
  written without torch: see :func:`torch_zip`), ``training_args.bin`` (not weights: not fetched), TF/Flax
  duplicates (not fetched).
- ``hfcache-test/tiny-model2vec``: a model2vec static embedding model written by ``model2vec.StaticModel
  .save_pretrained`` itself (``config.json``, ``model.safetensors`` with ``embeddings``, ``tokenizer.json``,
  ``modules.json`` naming ``1_Normalize``), plus an ONNX export that is not fetched.
- ``hfcache-test/acme-tokenizer``: a custom-code tokenizer: ``tokenizer_config.json`` ``auto_map`` names
  ``tokenization_acme.AcmeTokenizer`` (a ``BertTokenizer`` subclass importing ``.acme_text``), ``config.json``
  ``auto_map`` names ``configuration_acme.AcmeConfig`` (``model_type`` "acme" is unknown to transformers) and
  ``modeling_acme.AcmeModel`` (not needed by a tokenizer load: a tokenizer warm does not fetch it).

The ONNX/OpenVINO/TF/Flax duplicates hold deterministic placeholder bytes, not valid files of those formats (no test
loads them: only their names decide the selection).
"""

from __future__ import annotations

import io
import json
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

ORG = "hfcache-test"
#: The custom-code tokenizer, its cache folder and its code file; APPENDED is what a hostile edit adds to that code.
ACME, ACME_FOLDER, CODE = f"{ORG}/acme-tokenizer", f"models--{ORG}--acme-tokenizer", "tokenization_acme.py"
APPENDED = b"\nimport os\nos.system('id > /tmp/hfcache-owned')\n"
TEXTS = ["Hello world, the cache is offline.", "an embed model of the token"]

_WORDS = ["hello", "world", "the", "cache", "model", "offline", "token", "an", "is", "of", "and", "to", "embed"]
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + _WORDS + list("abcdefghijklmnopqrstuvwxyz0123456789,.!?")
         + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"])
HIDDEN = 8

TOKENIZER = ("config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")

EXPECTED_MODEL_FILES: dict[str, frozenset[str]] = {
    f"{ORG}/tiny-bert": frozenset({*TOKENIZER, "model.safetensors"}),
    f"{ORG}/tiny-bert-sharded": frozenset({*TOKENIZER, "model.safetensors.index.json",
                                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}),
    f"{ORG}/tiny-sentence-transformer": frozenset({
        *TOKENIZER, "model.safetensors", "modules.json", "config_sentence_transformers.json",
        "sentence_bert_config.json", "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors"}),
    f"{ORG}/tiny-bert-bin": frozenset({*TOKENIZER, "pytorch_model.bin"}),
    f"{ORG}/tiny-model2vec": frozenset({"config.json", "model.safetensors", "tokenizer.json", "modules.json"}),
    f"{ORG}/acme-tokenizer": frozenset({
        "config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenization_acme.py",
        "acme_text.py", "configuration_acme.py", "modeling_acme.py"}),
}

#: ``warm`` (``--kind tokenizer``) of the custom-code repo: the tokenizer, its code and the config's code, not the
#: modeling code.
EXPECTED_TOKENIZER_FILES: dict[str, frozenset[str]] = {
    f"{ORG}/acme-tokenizer": frozenset({
        "config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenization_acme.py",
        "acme_text.py", "configuration_acme.py"}),
}

#: Files that are never fetched by ``--kind model`` (duplicates for other runtimes, stale shards, model cards).
NEVER_FETCHED = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "onnx/", "openvino/", "README.md",
                 "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors", "training_args.bin",
                 "2_Dense/pytorch_model.bin")


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _json(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def build_tokenizer():
    """A real WordPiece tokenizer (``tokenizers``) over :data:`VOCAB`, BERT-style: lowercase, [CLS] ... [SEP]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB.index("[CLS]")), ("[SEP]", VOCAB.index("[SEP]"))])
    return tokenizer


def _tokenizer_files(repo: Path, tokenizer_config: dict | None = None) -> None:
    _write(repo / "tokenizer.json", build_tokenizer().to_str())
    _write(repo / "vocab.txt", "\n".join(VOCAB) + "\n")
    _write(repo / "tokenizer_config.json", _json(tokenizer_config or {
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 64}))


def _bert_repo(repo: Path) -> None:
    _tokenizer_files(repo)
    _write(repo / "special_tokens_map.json", _json({"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                                                    "sep_token": "[SEP]", "unk_token": "[UNK]"}))
    _write(repo / "config.json", _json({
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": len(VOCAB), "hidden_size": HIDDEN,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 64,
        "type_vocab_size": 2}))


def bert_tensors(seed: int) -> dict[str, np.ndarray]:
    """BERT-named float32 tensors of a 1-layer model (deterministic for ``seed``)."""
    rng = np.random.default_rng(seed)

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return {
        "embeddings.word_embeddings.weight": t(len(VOCAB), HIDDEN),
        "embeddings.position_embeddings.weight": t(64, HIDDEN),
        "embeddings.LayerNorm.weight": t(HIDDEN),
        "encoder.layer.0.attention.self.query.weight": t(HIDDEN, HIDDEN),
        "encoder.layer.0.attention.self.query.bias": t(HIDDEN),
        "encoder.layer.0.output.dense.weight": t(HIDDEN, 16),
        "pooler.dense.weight": t(HIDDEN, HIDDEN),
    }


def _placeholder(name: str) -> bytes:
    """Deterministic bytes standing in for a runtime's export (never loaded; only its name matters)."""
    return f"hfcache test placeholder for {name}: not a real file of this format\n".encode() * 8


def torch_zip(tensors: dict[str, np.ndarray]) -> bytes:
    """The bytes ``torch.save(state_dict)`` writes (its zip format, version 3), without torch.

    ``archive/data.pkl`` is a protocol-2 pickle of an ``OrderedDict`` whose values are
    ``torch._utils._rebuild_tensor_v2(<persistent storage id>, offset, size, stride, False, OrderedDict())`` with the
    storage id ``("storage", torch.FloatStorage, key, "cpu", numel)``, and ``archive/data/<key>`` the raw little-endian
    float32 storage: the layout of ``torch/serialization.py`` (``_save``). The pickle is written opcode by opcode
    because ``pickle`` cannot name ``torch`` globals without importing torch. Read back by :func:`read_torch_zip`.
    """
    def text(value: str) -> bytes:
        raw = value.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw

    def integer(value: int) -> bytes:
        return b"J" + struct.pack("<i", value)

    ordered_dict = b"ccollections\nOrderedDict\n)R"
    out = [b"\x80\x02", ordered_dict, b"("]
    for key, (name, array) in enumerate(tensors.items()):
        strides = [s // array.itemsize for s in array.strides]
        storage_id = b"(" + text("storage") + b"ctorch\nFloatStorage\n" + text(str(key)) + text("cpu") \
            + integer(array.size) + b"tQ"
        args = b"(" + storage_id + integer(0) + b"(" + b"".join(map(integer, array.shape)) + b"t" \
            + b"(" + b"".join(map(integer, strides)) + b"t" + b"\x89" + ordered_dict + b"t"
        out += [text(name), b"ctorch._utils\n_rebuild_tensor_v2\n", args, b"R"]
    out += [b"u", b"."]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(f"archive/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(info, data)
        add("data.pkl", b"".join(out))
        add("byteorder", b"little")
        for key, array in enumerate(tensors.values()):
            add(f"data/{key}", np.ascontiguousarray(array, dtype="<f4").tobytes())
        add("version", b"3\n")
    return buffer.getvalue()


def read_torch_zip(data: bytes) -> dict[str, np.ndarray]:
    """Read a :func:`torch_zip` archive back into numpy arrays, with a restricted unpickler (only the three globals
    of the format are resolved, to stand-ins; nothing else can be constructed)."""
    import pickle

    archive = zipfile.ZipFile(io.BytesIO(data))
    prefix = archive.namelist()[0].split("/", 1)[0]

    def rebuild(storage, offset, size, stride, requires_grad, hooks):
        return np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                               strides=[s * storage.itemsize for s in stride]).copy()

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            allowed = {("collections", "OrderedDict"): dict, ("torch._utils", "_rebuild_tensor_v2"): rebuild,
                       ("torch", "FloatStorage"): "float32"}
            if (module, name) not in allowed:
                raise pickle.UnpicklingError(f"unexpected global {module}.{name}")
            return allowed[(module, name)]

        def persistent_load(self, pid):
            _, dtype, key, _, numel = pid
            return np.frombuffer(archive.read(f"{prefix}/data/{key}"), dtype=f"<{dtype[0]}4", count=numel)

    return dict(Unpickler(io.BytesIO(archive.read(f"{prefix}/data.pkl"))).load())


def _save_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save

    _write(path, save(tensors, metadata={"format": "pt"}))


def make_tiny_bert(root: Path) -> None:
    repo = root / ORG / "tiny-bert"
    _bert_repo(repo)
    tensors = bert_tensors(1)
    _save_safetensors(repo / "model.safetensors", tensors)
    _write(repo / "pytorch_model.bin", torch_zip(tensors))
    for name in ("tf_model.h5", "flax_model.msgpack", "onnx/model.onnx", "openvino/openvino_model.xml",
                 "openvino/openvino_model.bin"):
        _write(repo / name, _placeholder(name))
    _write(repo / "onnx/config.json", _json({"model_type": "bert"}))
    _write(repo / "README.md", "# tiny-bert\n\nA generated test model.\n")


def shard_split(tensors: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    names = list(tensors)
    half = len(names) // 2
    return [{n: tensors[n] for n in names[:half]}, {n: tensors[n] for n in names[half:]}]


def make_tiny_bert_sharded(root: Path) -> None:
    repo = root / ORG / "tiny-bert-sharded"
    _bert_repo(repo)
    tensors = bert_tensors(2)
    weight_map = {}
    for i, shard in enumerate(shard_split(tensors), start=1):
        name = f"model-{i:05d}-of-00002.safetensors"
        _save_safetensors(repo / name, shard)
        weight_map.update({tensor: name for tensor in shard})
    total = sum(a.nbytes for a in tensors.values())
    _write(repo / "model.safetensors.index.json", _json({"metadata": {"total_size": total}, "weight_map": weight_map}))
    stale = bert_tensors(99)  # an older upload, split in three; the index no longer names these files
    _save_safetensors(repo / "model-00001-of-00003.safetensors", dict(list(stale.items())[:3]))
    _save_safetensors(repo / "model-00003-of-00003.safetensors", dict(list(stale.items())[3:]))


def make_sentence_transformer(root: Path) -> None:
    repo = root / ORG / "tiny-sentence-transformer"
    _bert_repo(repo)
    _save_safetensors(repo / "model.safetensors", bert_tensors(3))
    _write(repo / "modules.json", json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ], indent=2) + "\n")
    _write(repo / "config_sentence_transformers.json", _json({"__version__": {"sentence_transformers": "3.0.0"},
                                                              "prompts": {}, "similarity_fn_name": "cosine"}))
    _write(repo / "sentence_bert_config.json", _json({"do_lower_case": False, "max_seq_length": 64}))
    _write(repo / "1_Pooling/config.json", _json({"pooling_mode_mean_tokens": True,
                                                  "word_embedding_dimension": HIDDEN}))
    _write(repo / "2_Dense/config.json", _json({"activation_function": "torch.nn.modules.activation.Tanh",
                                                "bias": True, "in_features": HIDDEN, "out_features": 4}))
    dense = {"linear.weight": np.arange(4 * HIDDEN, dtype=np.float32).reshape(4, HIDDEN) / 10,
             "linear.bias": np.ones(4, dtype=np.float32)}
    _save_safetensors(repo / "2_Dense/model.safetensors", dense)
    _write(repo / "2_Dense/pytorch_model.bin", torch_zip(dense))
    for name in ("onnx/model.onnx", "openvino/openvino_model.xml", "openvino/openvino_model.bin"):
        _write(repo / name, _placeholder(name))
    _write(repo / "README.md", "# tiny-sentence-transformer\n")


def make_tiny_bert_bin(root: Path) -> None:
    repo = root / ORG / "tiny-bert-bin"
    _bert_repo(repo)
    _write(repo / "pytorch_model.bin", torch_zip(bert_tensors(4)))
    _write(repo / "training_args.bin", torch_zip({"learning_rate": np.array([5e-5], dtype=np.float32)}))
    for name in ("tf_model.h5", "flax_model.msgpack"):
        _write(repo / name, _placeholder(name))


def make_model2vec(root: Path) -> None:
    """Written by model2vec's own ``save_pretrained``, model card (``README.md``) included: the loader reads it for
    metadata only when present, so ``--kind model`` does not fetch it."""
    from model2vec import StaticModel

    repo = root / ORG / "tiny-model2vec"
    vectors = np.random.default_rng(5).standard_normal((len(VOCAB), 16)).astype(np.float32)
    StaticModel(vectors=vectors, tokenizer=build_tokenizer(), normalize=True).save_pretrained(repo, "tiny-model2vec")
    _write(repo / "onnx/model.onnx", _placeholder("onnx/model.onnx"))


def make_acme_tokenizer(root: Path) -> None:
    repo = root / ORG / "acme-tokenizer"
    _tokenizer_files(repo, {"tokenizer_class": "AcmeTokenizer", "do_lower_case": True, "model_max_length": 64,
                            "auto_map": {"AutoTokenizer": ["tokenization_acme.AcmeTokenizer", None]}})
    _write(repo / "config.json", _json({
        "model_type": "acme", "vocab_size": len(VOCAB),
        "auto_map": {"AutoConfig": "configuration_acme.AcmeConfig", "AutoModel": "modeling_acme.AcmeModel"}}))
    _write(repo / "configuration_acme.py", "from transformers import PretrainedConfig\n\n\n"
                                           "class AcmeConfig(PretrainedConfig):\n    model_type = \"acme\"\n")
    _write(repo / "tokenization_acme.py", "from transformers import BertTokenizer\n\nfrom .acme_text import MARKER\n\n\n"
                                          "class AcmeTokenizer(BertTokenizer):\n    acme_marker = MARKER\n")
    _write(repo / "acme_text.py", "MARKER = \"acme-v1\"\n")
    _write(repo / "modeling_acme.py", "raise ImportError(\"modeling code: a tokenizer load never imports it\")\n")


def make_model_repos(root: Path) -> Path:
    """Write every repo under ``root`` (``<org>/<name>/``); return ``root``."""
    for make in (make_tiny_bert, make_tiny_bert_sharded, make_sentence_transformer, make_tiny_bert_bin,
                 make_model2vec, make_acme_tokenizer):
        make(root)
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/make_model_repos.py OUT_DIR")
    print(make_model_repos(Path(sys.argv[1])))
