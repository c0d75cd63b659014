"""Xet hashes: chunk hashes, the aggregated (Merkle) node hash, xorb hashes, file hashes and their hex strings.

Facts, from huggingface/hub-docs docs/xet/hashing.md and docs/xet/api.md, checked against huggingface/xet-core
``xet_core_structures/src/merklehash/{data_hash.rs,aggregated_hashes.rs}``:

- every hash is 32 bytes; a chunk hash is ``blake3(chunk, key=DATA_KEY)``;
- an internal node hashes the text ``"{child_hex} : {child_size}\\n"`` of each child, in order, with
  ``key=INTERNAL_NODE_KEY``; its size is the sum of its children's sizes;
- the tree (aggregated_hashes.rs ``next_merge_cut``): a level is cut into groups of 2 to 9 nodes; scanning a group
  from its third node on, the group ends after the first node whose hash, read as the little-endian u64 of
  bytes 24..32, is divisible by 4 (``DataHash % 4``: ``self[3] % 4``); levels repeat until one node is left;
- the xorb hash is the root of the tree over the xorb's (chunk hash, chunk size) pairs; the file hash is
  ``blake3(root, key=32 zero bytes)`` over the file's chunks (no chunks: 32 zero bytes for both);
- as a string, each 8-byte quarter of a hash is printed as a little-endian u64 in 16 hex digits (api.md,
  "Converting Hashes to Strings"), and the node text uses that same string form.

BLAKE3 comes from the ``blake3`` package when it is installed, else from :mod:`.blake3_py` (pure Python, slow).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .blake3_py import keyed_hash as _py_keyed_hash

try:  # the Rust bindings: ~1000x faster than the pure Python fallback
    from blake3 import blake3 as _blake3
except ImportError:  # pragma: no cover - exercised where the package is missing
    _blake3 = None

__all__ = [
    "DATA_KEY",
    "INTERNAL_NODE_KEY",
    "ZERO_HASH",
    "aggregated_hash",
    "chunk_hash",
    "file_hash",
    "hash_from_hex",
    "hash_to_hex",
    "keyed_hash",
    "xorb_hash",
]

DATA_KEY = bytes([
    102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28,
    157, 228, 33, 16, 155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41,
])  # fmt: skip
INTERNAL_NODE_KEY = bytes([
    1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230,
    93, 221, 83, 111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63,
])  # fmt: skip
ZERO_HASH = bytes(32)
_MEAN_BRANCHING = 4  # AGGREGATED_HASHES_MEAN_TREE_BRANCHING_FACTOR
_MAX_GROUP = 2 * _MEAN_BRANCHING + 1


def keyed_hash(key: bytes, data: bytes) -> bytes:
    """BLAKE3 keyed hash (32-byte key, 32-byte digest), through the ``blake3`` package when available."""
    if _blake3 is not None:
        return _blake3(data, key=key).digest()
    return _py_keyed_hash(key, data)


def chunk_hash(data: bytes) -> bytes:
    """The chunk hash of one chunk's bytes (hashing.md, "Chunk Hashes")."""
    return keyed_hash(DATA_KEY, data)


def hash_to_hex(raw: bytes) -> str:
    """The string form of a 32-byte hash: each 8-byte quarter as a little-endian u64, 16 hex digits each."""
    return "".join(f"{word:016x}" for word in struct.unpack("<4Q", raw))


def hash_from_hex(text: str) -> bytes:
    """The 32 raw bytes of a hash string (inverse of :func:`hash_to_hex`).

    Raises:
        ValueError: not 64 hex digits.
    """
    if len(text) != 64:
        raise ValueError(f"a Xet hash is 64 hex digits, got {len(text)}")
    return struct.pack("<4Q", *(int(text[i : i + 16], 16) for i in range(0, 64, 16)))


def _merge(group: Sequence[tuple[bytes, int]]) -> tuple[bytes, int]:
    """One internal node over ``group`` of (hash, size): (its hash, the sum of sizes)."""
    text = "".join(f"{hash_to_hex(h)} : {size}\n" for h, size in group)
    return keyed_hash(INTERNAL_NODE_KEY, text.encode("ascii")), sum(size for _, size in group)


def _next_cut(nodes: Sequence[tuple[bytes, int]], start: int) -> int:
    """End (exclusive) of the group starting at ``start`` (aggregated_hashes.rs ``next_merge_cut``)."""
    left = len(nodes) - start
    if left <= 2:
        return len(nodes)
    end = min(_MAX_GROUP, left)
    for i in range(2, end):
        last_word = struct.unpack_from("<Q", nodes[start + i][0], 24)[0]
        if last_word % _MEAN_BRANCHING == 0:
            return start + i + 1
    return start + end


def aggregated_hash(nodes: Sequence[tuple[bytes, int]]) -> bytes:
    """Root hash of the aggregated tree over (hash, size) leaves; 32 zero bytes for no leaves."""
    level = list(nodes)
    if not level:
        return ZERO_HASH
    while len(level) > 1:
        merged, start = [], 0
        while start < len(level):
            cut = _next_cut(level, start)
            merged.append(_merge(level[start:cut]))
            start = cut
        level = merged
    return level[0][0]


def xorb_hash(chunks: Sequence[tuple[bytes, int]]) -> bytes:
    """The xorb hash: the aggregated root over the xorb's (chunk hash, chunk size) pairs."""
    return aggregated_hash(chunks)


def file_hash(chunks: Sequence[tuple[bytes, int]], salt: bytes = ZERO_HASH) -> bytes:
    """The file hash: ``blake3(aggregated root, key=salt)`` (salt: 32 zero bytes); zero bytes for an empty file."""
    if not chunks:
        return ZERO_HASH
    return keyed_hash(salt, aggregated_hash(chunks))
