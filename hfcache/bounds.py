"""Limits on what a cache, a peer or a manifest supplies: JSON nesting and folder depth.

A group member of a shared cache, an upstream or a registry can hand hfcache a document or a folder chain deep
enough to exhaust Python's recursion (``json.loads`` near 1,000 levels; ``os.walk`` recurses once per level on
Python 3.11). A breach is a :class:`TooDeep` (a ``ValueError``): a problem of the one repo or answer it came from,
never an internal error (docs/security.md, "Member-controlled state").
"""

from __future__ import annotations

import json
from typing import Any

#: Deepest JSON nesting hfcache accepts from a cache, an endpoint or a registry. Hub listings, configs, tokenizer
#: files, safetensors indexes and OCI manifests are a handful of levels deep.
MAX_JSON_DEPTH = 64

#: Deepest folder chain hfcache walks below a snapshot (or any folder a cache supplies). Hub repos are a few
#: levels deep; a chain deeper than this is refused as a layout problem of its repo.
MAX_TREE_DEPTH = 64


class TooDeep(ValueError):
    """A document or folder chain nested deeper than the bound for it."""


def json_depth(doc: Any) -> int:
    """Nesting depth (int) of a parsed JSON value (a scalar is 0, ``[]`` is 1), computed without recursion."""
    if not isinstance(doc, (dict, list)):
        return 0
    deepest, stack = 0, [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        depth += 1
        deepest = max(deepest, depth)
        # A scalar child adds no depth beyond its container's: only containers are pushed (a tokenizer.json's
        # vocabulary is 100k+ scalars, and the fast tokenizer path pays for every one visited).
        stack.extend((child, depth) for child in (value.values() if isinstance(value, dict) else value)
                     if isinstance(child, (dict, list)))
    return deepest


def loads_json(raw: bytes | str, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of ``raw`` (already bounded in size by its reader) for text hfcache did not write, nesting
    bounded by ``max_depth``; ``what`` names it in the error (``"trees/<commit>.json"``). Returns the parsed value.
    Raises TooDeep: nested deeper than ``max_depth`` (also where the C parser itself ran out of stack). ValueError: not
    JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``)."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise TooDeep(f"{what}: JSON nested deeper than {max_depth} levels") from None
    if json_depth(doc) > max_depth:
        raise TooDeep(f"{what}: JSON nested deeper than {max_depth} levels")
    return doc
