"""The other names runtimes read for the settings of ``hfcache env``: each alias is printed beside its canonical
variable, with the same value, so that a runtime that reads only the alias uses the same cache and stays offline.

Each was checked in the source that reads it (huggingface_hub 2.4.0 and transformers 5.24.0 as installed;
text-generation-inference db931fc (2026-01-08); text-embeddings-inference 0d124dc (2026-07-24); hf-hub v0.4.3 and
v0.5.0; sentence-transformers cad2119 (6.1.0.dev0) and v2.3.0; datasets b7cb10b; llama.cpp ``common/hf-cache.cpp``
and ``common/arg.cpp``):

- ``HUGGINGFACE_HUB_CACHE`` (for ``HF_HUB_CACHE``): TGI's router (``router/src/server.rs``: its tokenizer download,
  and the offline ``Cache`` when ``HF_HUB_OFFLINE`` is exactly ``1``), launcher (``launcher/src/main.rs``
  ``--huggingface-hub-cache``, clap ``env``: passed to the shards and the download) and Python server
  (``server/text_generation_server/utils/hub.py``: ``constants.HUGGINGFACE_HUB_CACHE``, which does not follow
  ``HF_HUB_CACHE``); TEI (``router/src/main.rs`` ``--huggingface-hub-cache``); huggingface_hub (``constants.py``:
  the legacy name, when ``HF_HUB_CACHE`` is unset); llama.cpp (``get_cache_directory``, after ``HF_HUB_CACHE``).
- ``SENTENCE_TRANSFORMERS_HOME`` (for ``HF_HUB_CACHE``): sentence-transformers >= 2.3 (``base/model.py``; 2.3:
  ``SentenceTransformer.py``): its ``cache_folder``, passed as ``cache_dir`` to every hub download, so it wins over
  ``HF_HUB_CACHE`` when a base image set it elsewhere (2.2 used its own layout under ``~/.cache/torch``).
- ``TRANSFORMERS_OFFLINE`` (for ``HF_HUB_OFFLINE``): huggingface_hub (``constants.py``: ``HF_HUB_OFFLINE or
  TRANSFORMERS_OFFLINE``) and transformers < 5.
- ``HF_DATASETS_OFFLINE`` (for ``HF_HUB_OFFLINE``): datasets (``src/datasets/config.py``: replaces it for datasets).
- ``LLAMA_OFFLINE`` (for ``HF_HUB_OFFLINE``): llama.cpp's ``--offline`` (``common/arg.cpp``, ggml-org/llama.cpp#13804,
  release b5501): ``-hf`` downloads use the cache only; truthy (``1``) counts.

Checked and not printed: ``TRANSFORMERS_CACHE`` (transformers 5.24 reads it nowhere; ``hfcache doctor`` flags it);
``HUGGINGFACE_HUB_OFFLINE`` (no runtime above reads it); ``DISABLE_TELEMETRY``/``DO_NOT_TRACK`` (alternatives to
``HF_HUB_DISABLE_TELEMETRY``, which is set); ``LLAMA_CACHE`` (llama.cpp's old flat cache, read only to migrate it).
The Rust ``hf-hub`` crate (0.4/0.5: TGI's launcher ``get_config``, TEI without ``--huggingface-hub-cache``; 1.0
release candidates read no variable) reads only ``HF_HOME`` (the cache is ``$HF_HOME/hub``) and ``HF_ENDPOINT`` and
has no offline switch: ``hfcache env`` sets ``HF_HOME`` when the cache folder is named ``hub`` (name it so); the
network layers make it offline (docs/offline.md). vLLM loads through huggingface_hub and transformers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Alias:
    """Another ``name`` (e.g. ``HUGGINGFACE_HUB_CACHE``) for the variable ``canonical`` of ``hfcache env`` (e.g.
    ``HF_HUB_CACHE``), whose value it carries; ``readers``: who reads it, ``project (file)`` each."""

    name: str
    canonical: str
    readers: tuple[str, ...]


ALIASES: tuple[Alias, ...] = (
    Alias("HUGGINGFACE_HUB_CACHE", "HF_HUB_CACHE", (
        "text-generation-inference (router/src/server.rs, launcher/src/main.rs)",
        "text-embeddings-inference (router/src/main.rs)",
        "huggingface_hub (constants.py, legacy name)",
        "llama.cpp (common/hf-cache.cpp)")),
    Alias("SENTENCE_TRANSFORMERS_HOME", "HF_HUB_CACHE", (
        "sentence-transformers >= 2.3 (base/model.py: cache_folder)",)),
    Alias("TRANSFORMERS_OFFLINE", "HF_HUB_OFFLINE", (
        "huggingface_hub (constants.py, when HF_HUB_OFFLINE is unset)", "transformers < 5")),
    Alias("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", ("datasets (src/datasets/config.py)",)),
    Alias("LLAMA_OFFLINE", "HF_HUB_OFFLINE", ("llama.cpp (common/arg.cpp: --offline)",)),
)


def aliases_of(canonical: str) -> tuple[Alias, ...]:
    """The aliases of ``canonical`` (str), in output order; empty when it has none."""
    return tuple(alias for alias in ALIASES if alias.canonical == canonical)


def with_aliases(variables: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``variables`` (``(name, value)`` pairs in output order) with each canonical variable followed by its aliases,
    carrying the same value. ValueError when a pair is an alias already (printed twice, maybe with another value)."""
    names = {alias.name for alias in ALIASES}
    out: list[tuple[str, str]] = []
    for name, value in variables:
        if name in names:
            raise ValueError(f"{name} is an alias: give its canonical variable")
        out.append((name, value))
        out.extend((alias.name, value) for alias in aliases_of(name))
    return tuple(out)


def alias_map(variables: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``{alias: canonical}`` for the aliases among ``variables`` (names of ``(name, value)`` pairs)."""
    by_name = {alias.name: alias.canonical for alias in ALIASES}
    return {name: by_name[name] for name, _ in variables if name in by_name}
