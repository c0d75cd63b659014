"""Which files of a repo to fetch (the tokenizer set, a model in one weight format, or everything), from a file
listing. The tokenizer names come from transformers 5.x (``tokenization_utils_base.py``, the tokenizers'
``vocab_files_names``, and ``config.json``, which ``AutoTokenizer`` reads: ``models/auto/tokenization_auto.py``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..bounds import TooDeep, loads_json
from ..records import KINDS

#: Root-level names a tokenizer load may ask for; one the repo lacks gets a ``.no_exist/<commit>/<name>`` marker, so an
#: offline load knows it is absent instead of failing (docs/cache-layout.md, 'Traps the libraries leave').
TOKENIZER_FILENAMES: tuple[str, ...] = (
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "config.json", "merges.txt",
    "special_tokens_map.json", "tekken.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
    "vocab.json", "vocab.txt",
)  # fmt: skip

#: Root-level globs for vocab files whose names vary by model family.
TOKENIZER_GLOBS: tuple[str, ...] = (
    "*.model",  # SentencePiece: spiece.model, sentencepiece.bpe.model, tokenizer.model, ...
    "*.spm",  # Marian source.spm / target.spm
    "*.tiktoken",  # tiktoken BPE ranks (qwen.tiktoken, cl100k_base.tiktoken)
    "tiktoken.model",
    "tokenizer.model.v*",  # Mistral's versioned SentencePiece files (tokenizer.model.v3)
    "vocab.*",  # vocab.bpe, vocab.model, ...
    "spiece.*",
    "*.vocab",
    "additional_chat_templates/*.jinja",
)

#: Weight formats, in order of preference for ``kind="model"``: (index file, single file, glob).
_WEIGHT_FORMATS: tuple[tuple[str, str, str], ...] = (
    ("model.safetensors.index.json", "model.safetensors", "*.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin", "*.bin"),
)

#: Weight files of every format. ``kind="model"`` skips them unless they belong to the chosen format or an
#: ``include`` glob asks for them (the TF/Flax/ONNX/GGUF/... duplicates of a model).
WEIGHT_GLOBS: tuple[str, ...] = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.onnx_data",
    "*.ot", "*.gguf", "*.ggml", "*.tflite", "*.mlmodel", "*.npz", "*.pb", "*.keras", "*.pdparams",
)

#: Folders that hold other runtimes' exports; skipped by ``kind="model"``.
EXPORT_DIRS: tuple[str, ...] = ("onnx/", "openvino/", "coreml/", "tflite/", "tf/", "flax/", "gguf/", "mlx/")

#: Small text files a model load reads besides its weights (configs, custom code, processor files).
MODEL_SIDE_GLOBS: tuple[str, ...] = ("*.json", "*.py", "*.txt", "*.jinja", "*.yaml", "*.yml")


@dataclass(frozen=True)
class Selection:
    """A selection, each sorted: ``paths`` to fetch; ``absent`` optional tokenizer names (``.no_exist`` markers);
    ``needs_index``: sharded indexes to follow (:func:`shards_from_index`); ``needs_config``: configs whose
    ``auto_map`` (and ``modules.json``) may add files (:func:`hfcache.warming.custom_code.follow_configs`)."""

    paths: tuple[str, ...]
    absent: tuple[str, ...]
    needs_index: tuple[str, ...] = ()
    needs_config: tuple[str, ...] = ()


def matches(path: str, patterns: Iterable[str]) -> bool:
    """fnmatch a repo path against globs; a pattern ending in ``/`` matches a whole folder (huggingface_hub
    ``utils/_paths.py`` ``filter_repo_objects``)."""
    for pattern in patterns:
        if pattern.endswith("/"):
            pattern += "*"
        if fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def tokenizer_paths(paths: Iterable[str]) -> set[str]:
    """The paths a tokenizer load can need, of all the repo's ``paths``."""
    chosen = set()
    for path in paths:
        if ("/" not in path and (path in TOKENIZER_FILENAMES or matches(path, TOKENIZER_GLOBS))
                or path.startswith("additional_chat_templates/") and path.endswith(".jinja")):
            chosen.add(path)
    # A root "*.model"/"vocab.*" glob can catch weights ("vocab.bin" is rare, "model.bin" is not matched).
    return {p for p in chosen if not matches(p, WEIGHT_GLOBS)}


def weight_paths(paths: set[str]) -> tuple[set[str], tuple[str, ...]]:
    """``(paths, index_files)``: root weights in one format, safetensors when present, else PyTorch ``.bin``; a
    sharded index is returned for :func:`shards_from_index` instead (no shard is guessed)."""
    root = {p for p in paths if "/" not in p}
    for index_name, single_name, glob in _WEIGHT_FORMATS:
        if index_name in root:
            return {index_name}, (index_name,)
        if single_name in root:
            return {single_name}, ()
        candidates = {p for p in root if fnmatch.fnmatchcase(p, glob) and p != "training_args.bin"}
        if candidates:
            return candidates, ()
    return set(), ()


def model_paths(paths: set[str]) -> tuple[set[str], tuple[str, ...]]:
    """``(paths, index_files)`` a model load reads from ``paths`` (a repo's, or a module folder's): tokenizer files,
    small side files (not other runtimes' exports) and the root weights in one format (:func:`weight_paths`)."""
    weights, index_files = weight_paths(paths)
    side = {p for p in paths if matches(p, MODEL_SIDE_GLOBS) and not p.startswith(EXPORT_DIRS)}
    return tokenizer_paths(paths) | side | weights, index_files


def select(paths: Iterable[str], kind: str = "tokenizer", include: Sequence[str] = (),
           exclude: Sequence[str] = ()) -> Selection:
    """Select the files of one repo listing (``paths``: every file at one commit) for ``kind`` (:data:`KINDS`, else
    ValueError); ``include`` globs add files, ``exclude`` globs win."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    all_paths = set(paths)
    needs_index: tuple[str, ...] = ()
    if kind == "all":
        chosen = set(all_paths)
    elif kind == "model":  # root weights; module folders: custom_code.follow_configs
        chosen, needs_index = model_paths(all_paths)
    else:
        chosen = tokenizer_paths(all_paths)
    chosen |= {p for p in all_paths if include and matches(p, include)}
    chosen = {p for p in chosen if not (exclude and matches(p, exclude))}
    # Markers for every kind: a tokenizer load from a "model" or "all" warm needs them just the same.
    absent = tuple(sorted(n for n in TOKENIZER_FILENAMES if n not in all_paths))
    needs_index = tuple(i for i in needs_index if i in chosen)
    needs_config: tuple[str, ...] = ()
    if kind != "all":
        needs_config = tuple(c for c in AUTO_MAP_FILES if c in chosen)
        if kind == "model" and MODULES_FILE in chosen:
            needs_config += (MODULES_FILE,)
    return Selection(paths=tuple(sorted(chosen)), absent=absent, needs_index=needs_index, needs_config=needs_config)


def selection_notes(kind: str, include: Sequence[str], exclude: Sequence[str],
                    selected: Iterable[str]) -> tuple[str, ...]:
    """One-line warnings about a selection probably not what was asked (``selected``: the paths warmed)."""
    paths = list(selected)
    notes = []
    after = " (after --exclude)" if exclude else ""
    if kind == "model" and not any(matches(p, WEIGHT_GLOBS) for p in paths):
        notes.append(f"no weight file matched{after}: this repo has no *.safetensors or *.bin at its root, so "
                     "--kind model warmed its configs and tokenizer only (another format or folder: --include "
                     "'onnx/*' or '*.gguf'; everything: --kind all)")
    for glob in include:
        if not any(matches(p, (glob,)) for p in paths):
            notes.append(f"--include {glob!r} matched no file of this repo{after} (globs match the whole path "
                         "from the repo root, e.g. 'onnx/*'; a folder: 'onnx/')")
    return tuple(notes)


#: Largest sharded weight index read into memory, bytes (real ones are about 1 MiB at most).
MAX_INDEX_BYTES = 64 * 1024 * 1024


def check_index_size(index_path: str, size: int) -> None:
    """ValueError when an index of ``size`` bytes (as published) is larger than ``MAX_INDEX_BYTES``."""
    if size > MAX_INDEX_BYTES:
        raise ValueError(f"{index_path} is {size} bytes, more than the {MAX_INDEX_BYTES} a sharded weight index "
                         "may have")


def shards_from_index(index_bytes: bytes, available: Iterable[str], index_path: str) -> set[str]:
    """The shard paths (from the repo root) the index at ``index_path`` names in its ``weight_map``; ``available``:
    every path of the repo. Raises ValueError: no ``weight_map`` object, too large or deep, or a shard missing."""
    if len(index_bytes) > MAX_INDEX_BYTES:
        raise ValueError(f"{index_path} is larger than {MAX_INDEX_BYTES} bytes: not read as a sharded weight index")
    try:
        weight_map = loads_json(index_bytes, index_path)["weight_map"]
        shard_names = set(weight_map.values())
    except TooDeep as exc:  # a ValueError: named by its bound, not by its class
        raise ValueError(f"{index_path} is not a sharded weight index: {str(exc).split(': ', 1)[-1]}") from None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise ValueError(f"{index_path} is not a sharded weight index: {type(exc).__name__} {exc}") from None
    odd = sorted(repr(n) for n in shard_names if not isinstance(n, str) or not n)
    if odd:
        raise ValueError(f"{index_path} is not a sharded weight index: its weight_map names {odd[0]}, not a file name")
    folder = index_path.rsplit("/", 1)[0] + "/" if "/" in index_path else ""
    shards = {folder + name for name in shard_names}
    if missing := sorted(shards - set(available)):
        raise ValueError(f"{index_path} names shards the repo does not have: {', '.join(missing[:3])}")
    return shards


#: Root files whose ``auto_map`` names the custom code a load runs (:mod:`hfcache.warming.custom_code`).
AUTO_MAP_FILES: tuple[str, ...] = ("tokenizer_config.json", "config.json")

#: sentence-transformers' list of modules (``SentenceTransformer._load_sbert_model``): each ``{"path": folder}`` is
#: loaded from that folder (``""`` or ``"."``: the repo root), e.g. ``1_Pooling/config.json``,
#: ``2_Dense/model.safetensors``, ``0_StaticEmbedding/{model.safetensors,tokenizer.json}`` (model2vec/static models).
MODULES_FILE = "modules.json"
