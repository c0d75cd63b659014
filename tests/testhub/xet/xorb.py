"""Xorbs and file reconstructions: how a served file's chunks are packed into xorbs and read back as xorb bytes.

Facts, from huggingface/hub-docs docs/xet/xorb.md, docs/xet/file-reconstruction.md and docs/xet/download-protocol.md,
checked against huggingface/xet-core ``xet_core_structures/src/xorb_object/xorb_chunk_format.rs``:

- a xorb is its chunks in order, each an 8-byte header then the chunk data: version ``0`` (1 byte), compressed
  size (3 bytes, little-endian), compression scheme (1 byte: ``0`` none, ``1`` LZ4, ``2`` byte-grouping + LZ4),
  uncompressed size (3 bytes, little-endian); a chunk that does not shrink is stored with scheme ``0``, which is
  what this server always writes (so a xorb range maps onto file bytes and is read from the file on demand);
- a xorb holds at most 64 MiB serialized and 8192 chunks (xorb.md; xet-core ``MAX_XORB_BYTES``, ``MAX_XORB_CHUNKS``);
- a reconstruction is a list of terms ``(xorb hash, chunk range [start, end))`` whose decoded bytes, concatenated,
  are the file; this server packs a file's chunks into consecutive xorbs of its own, so each xorb appears in one
  term of its file (no cross-file deduplication).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from .chunking import iter_chunks
from .hashing import chunk_hash, file_hash, hash_to_hex, xorb_hash

__all__ = ["CHUNK_HEADER_SIZE", "MAX_XORB_BYTES", "MAX_XORB_CHUNKS", "Term", "XetFile", "Xorb", "build_xet_file",
           "chunk_header"]

CHUNK_HEADER_SIZE = 8
MAX_XORB_BYTES = 64 * 1024 * 1024
MAX_XORB_CHUNKS = 8 * 1024
_COMPRESSION_NONE = 0
_READ_SIZE = 1024 * 1024


def chunk_header(length: int) -> bytes:
    """The 8-byte header of an uncompressed chunk of ``length`` bytes (xorb.md, "Chunk Header Structure")."""
    size = length.to_bytes(3, "little")
    return bytes([0]) + size + bytes([_COMPRESSION_NONE]) + size


@dataclass(frozen=True)
class Xorb:
    """One xorb of a file: a run of the file's chunks, stored uncompressed.

    Attributes:
        hash (str): the xorb hash string (64 hex).
        file_offset (int): offset in the file of the xorb's first chunk (bytes).
        lengths (tuple[int, ...]): each chunk's size (bytes).
        starts (tuple[int, ...]): serialized offset of each chunk in the xorb, plus the xorb's size (bytes).
        file_starts (tuple[int, ...]): offset in the file of each chunk, plus the end of the last (bytes).
    """

    hash: str
    file_offset: int
    lengths: tuple[int, ...]
    starts: tuple[int, ...]
    file_starts: tuple[int, ...]

    @property
    def size(self) -> int:
        """Serialized size in bytes."""
        return self.starts[-1]

    def read(self, open_file: Callable[[], BinaryIO], first: int, last: int) -> Iterator[bytes]:
        """The serialized bytes ``first..last`` (inclusive, as in HTTP ranges) of this xorb, streamed.

        ``open_file`` opens the file the chunks come from; it is read from the chunks' offsets on.
        """
        with open_file() as stream:
            for index, length in enumerate(self.lengths):
                begin, end = self.starts[index], self.starts[index + 1]
                if end <= first or begin > last:
                    continue
                lo, hi = max(first, begin) - begin, min(last + 1, end) - begin
                yield from self._chunk_piece(stream, index, length, lo, hi)

    def _chunk_piece(self, stream: BinaryIO, index: int, length: int, lo: int, hi: int) -> Iterator[bytes]:
        """Bytes ``lo..hi`` (exclusive) of chunk ``index`` serialized (header included)."""
        if lo < CHUNK_HEADER_SIZE:
            yield chunk_header(length)[lo : min(hi, CHUNK_HEADER_SIZE)]
        data_lo, data_hi = max(lo, CHUNK_HEADER_SIZE) - CHUNK_HEADER_SIZE, hi - CHUNK_HEADER_SIZE
        if data_hi <= data_lo:
            return
        stream.seek(self.file_starts[index] + data_lo)
        left = data_hi - data_lo
        while left > 0:
            block = stream.read(min(left, _READ_SIZE))
            if not block:
                raise OSError("the file is shorter than when it was chunked")
            left -= len(block)
            yield block


@dataclass(frozen=True)
class Term:
    """One reconstruction term: chunks ``[start, end)`` of ``xorb``, ``unpacked_length`` bytes once decoded."""

    xorb: Xorb
    start: int
    end: int

    @property
    def unpacked_length(self) -> int:
        """Decoded size in bytes."""
        return sum(self.xorb.lengths[self.start : self.end])

    @property
    def byte_range(self) -> tuple[int, int]:
        """The serialized bytes of the term's chunks in the xorb: (first, last), inclusive as an HTTP range."""
        return self.xorb.starts[self.start], self.xorb.starts[self.end] - 1


@dataclass(frozen=True)
class XetFile:
    """A file as Xet sees it: its file hash, size and xorbs.

    Attributes:
        hash (str): the file hash string (64 hex), the ``X-Xet-Hash`` the Hub sends.
        size (int): size in bytes.
        xorbs (tuple[Xorb, ...]): the file's chunks, in order, packed into xorbs.
    """

    hash: str
    size: int
    xorbs: tuple[Xorb, ...]

    def terms(self, first: int, last: int) -> tuple[int, list[Term]]:
        """The terms covering file bytes ``first..last`` (inclusive) and the offset of ``first`` in the first one.

        Returns:
            tuple[int, list[Term]]: (``offset_into_first_range`` in bytes, the terms in file order).
        """
        terms: list[Term] = []
        offset = 0
        for xorb in self.xorbs:
            chosen = [i for i in range(len(xorb.lengths))
                      if xorb.file_starts[i] <= last and xorb.file_starts[i + 1] > first]
            if not chosen:
                continue
            if not terms:
                offset = first - xorb.file_starts[chosen[0]]
            terms.append(Term(xorb, chosen[0], chosen[-1] + 1))
        return offset, terms


def build_xet_file(stream: BinaryIO, *, max_xorb_bytes: int = MAX_XORB_BYTES) -> XetFile:
    """Chunk and hash a file read from ``stream`` to its end, packing its chunks into xorbs.

    Args:
        stream (BinaryIO): the file's bytes from offset 0.
        max_xorb_bytes (int): serialized size limit of one xorb (at most 64 MiB; lower to test many xorbs).
    """
    pending: list[tuple[bytes, int]] = []  # (chunk hash, size) of the xorb being filled
    all_chunks: list[tuple[bytes, int]] = []
    xorbs: list[Xorb] = []
    offset = xorb_offset = serialized = 0
    for data in iter_chunks(stream):
        entry = (chunk_hash(data), len(data))
        if pending and (serialized + len(data) + CHUNK_HEADER_SIZE > max_xorb_bytes
                        or len(pending) >= MAX_XORB_CHUNKS):
            xorbs.append(_xorb(pending, xorb_offset))
            xorb_offset, pending, serialized = offset, [], 0
        pending.append(entry)
        serialized += len(data) + CHUNK_HEADER_SIZE
        all_chunks.append(entry)
        offset += len(data)
    if pending:
        xorbs.append(_xorb(pending, xorb_offset))
    return XetFile(hash=hash_to_hex(file_hash(all_chunks)), size=offset, xorbs=tuple(xorbs))


def _xorb(chunks: list[tuple[bytes, int]], file_offset: int) -> Xorb:
    """A Xorb over ``chunks`` (hash, size) that start at ``file_offset`` in the file."""
    starts, file_starts = [0], [file_offset]
    for _, size in chunks:
        starts.append(starts[-1] + CHUNK_HEADER_SIZE + size)
        file_starts.append(file_starts[-1] + size)
    return Xorb(hash=hash_to_hex(xorb_hash(chunks)), file_offset=file_offset,
                lengths=tuple(size for _, size in chunks), starts=tuple(starts), file_starts=tuple(file_starts))
