"""The other names runtimes read for the settings of ``hfcache env``, each printed beside its canonical variable with
the same value (the table, each reader's file, what was left out: docs/offline.md, "Aliases"). Checked in
huggingface_hub 2.4.0, transformers 5.24.0, text-generation-inference db931fc (2026-01-08), text-embeddings-inference
0d124dc (2026-07-24), hf-hub v0.4.3 and v0.5.0, sentence-transformers cad2119 (6.1.0.dev0) and v2.3.0, datasets b7cb10b,
llama.cpp ``common/hf-cache.cpp`` and ``common/arg.cpp``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Alias:
    """Another ``name`` for the ``hfcache env`` variable ``canonical``, carrying its value; ``readers``: ``project
    (file)``."""

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
    return tuple(alias for alias in ALIASES if alias.canonical == canonical)


def with_aliases(variables: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``variables`` (``(name, value)`` pairs, in order) with each canonical one followed by its aliases, same value.
    ValueError when a pair is an alias already."""
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
