"""BLAKE3 keyed hashing in pure Python: the fallback when the ``blake3`` package (Rust bindings) is not installed.

Xet hashes every chunk, tree node and file with a BLAKE3 keyed hash (huggingface/hub-docs docs/xet/hashing.md).
This module follows the BLAKE3 specification (github.com/BLAKE3-team/BLAKE3-specs, blake3.pdf: the compression
function, 1024-byte chunks of 64-byte blocks, the binary tree whose left subtree holds the largest power of two
of chunks, the CHUNK_START/CHUNK_END/PARENT/ROOT/KEYED_HASH flags); only the 32-byte output is produced.
It is slow (roughly 1 MB/s): :mod:`.hashing` uses the ``blake3`` package whenever it can be imported.
"""

from __future__ import annotations

import struct

__all__ = ["keyed_hash"]

_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_CHUNK_START, _CHUNK_END, _PARENT, _ROOT, _KEYED_HASH = 1, 2, 4, 8, 16
_CHUNK_LEN, _BLOCK_LEN = 1024, 64
_M32 = 0xFFFFFFFF
# (a, b, c, d) state indices of the 8 quarter-rounds of one round: 4 columns, then 4 diagonals.
_G_INDICES = ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
              (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14))


def _compress(cv: tuple[int, ...], block: bytes, counter: int, block_len: int, flags: int) -> list[int]:
    """The BLAKE3 compression function: 16 output words (the first 8 are the chaining value)."""
    m = list(struct.unpack("<16I", block.ljust(_BLOCK_LEN, b"\0")))
    s = [*cv, *_IV[:4], counter & _M32, (counter >> 32) & _M32, block_len, flags]
    for round_index in range(7):
        for i, (a, b, c, d) in enumerate(_G_INDICES):
            mx, my = m[2 * i], m[2 * i + 1]
            s[a] = (s[a] + s[b] + mx) & _M32
            x = s[d] ^ s[a]
            s[d] = ((x >> 16) | (x << 16)) & _M32
            s[c] = (s[c] + s[d]) & _M32
            x = s[b] ^ s[c]
            s[b] = ((x >> 12) | (x << 20)) & _M32
            s[a] = (s[a] + s[b] + my) & _M32
            x = s[d] ^ s[a]
            s[d] = ((x >> 8) | (x << 24)) & _M32
            s[c] = (s[c] + s[d]) & _M32
            x = s[b] ^ s[c]
            s[b] = ((x >> 7) | (x << 25)) & _M32
        if round_index < 6:
            m = [m[p] for p in _PERMUTATION]
    return [s[i] ^ s[i + 8] for i in range(8)] + [s[i + 8] ^ cv[i] for i in range(8)]


def _chunk(key: tuple[int, ...], data: bytes, index: int, flags: int, root: bool) -> list[int]:
    """Compress one chunk (up to 1024 bytes) with chunk counter ``index``; the last block gets ROOT if ``root``."""
    cv: tuple[int, ...] = key
    blocks = [data[i : i + _BLOCK_LEN] for i in range(0, len(data), _BLOCK_LEN)] or [b""]
    out: list[int] = []
    for i, block in enumerate(blocks):
        block_flags = flags | (_CHUNK_START if i == 0 else 0)
        if i == len(blocks) - 1:
            block_flags |= _CHUNK_END | (_ROOT if root else 0)
        out = _compress(cv, block, index, len(block), block_flags)
        cv = tuple(out[:8])
    return out


def _subtree(key: tuple[int, ...], data: bytes, first_chunk: int, flags: int, root: bool) -> list[int]:
    """Output words of the subtree over ``data`` (whole chunks from chunk ``first_chunk`` on)."""
    chunks = max(1, -(-len(data) // _CHUNK_LEN))
    if chunks == 1:
        return _chunk(key, data, first_chunk, flags, root)
    left_chunks = 1 << ((chunks - 1).bit_length() - 1)  # the largest power of two below `chunks`
    split = left_chunks * _CHUNK_LEN
    left = _subtree(key, data[:split], first_chunk, flags, False)[:8]
    right = _subtree(key, data[split:], first_chunk + left_chunks, flags, False)[:8]
    block = struct.pack("<16I", *left, *right)
    return _compress(key, block, 0, _BLOCK_LEN, flags | _PARENT | (_ROOT if root else 0))


def keyed_hash(key: bytes, data: bytes) -> bytes:
    """BLAKE3 keyed hash of ``data`` with a 32-byte ``key``: 32 bytes, equal to ``blake3.blake3(data, key=key)``.

    Raises:
        ValueError: the key is not 32 bytes.
    """
    if len(key) != 32:
        raise ValueError("a BLAKE3 key is 32 bytes")
    key_words = struct.unpack("<8I", key)
    out = _subtree(key_words, bytes(data), 0, _KEYED_HASH, True)
    return struct.pack("<8I", *out[:8])
