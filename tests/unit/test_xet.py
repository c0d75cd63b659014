"""The test Hub's Xet building blocks against the specification's facts and xet-core's published test vectors.

Vectors: chunk boundaries from huggingface/xet-core ``xet_data/src/deduplication/chunking.rs`` tests
(``test_correctness_1mb_const_data``, ``test_correctness_100kb_hitting_data``); aggregated (xorb) and file hashes
from ``xet_core_structures/src/merklehash/aggregated_hashes.rs`` ``test_correctness`` (leaves by seed, size
``seed * 100``); hash strings from huggingface/hub-docs docs/xet/api.md and ``data_hash.rs``
``test_hash_hex_string_endianness``; BLAKE3 keyed vectors (key ``whats the Elvish word for friend``, input bytes
``i % 251``) of the BLAKE3 reference test vectors.
"""

from __future__ import annotations

import io
import os
import random

import pytest

from tests.testhub.xet import blake3_py
from tests.testhub.xet.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, chunk_boundaries, iter_chunks
from tests.testhub.xet.hashing import DATA_KEY, chunk_hash, file_hash, hash_from_hex, hash_to_hex, keyed_hash, xorb_hash
from tests.testhub.xet.xorb import CHUNK_HEADER_SIZE, build_xet_file, chunk_header

# --- chunking ---------------------------------------------------------------------------------------------------

#: get_triggering_base_data's 128-byte pattern (chunking.rs): it makes the gear hash hit once per repetition.
_TRIGGER = bytes([
    154, 52, 42, 34, 159, 75, 126, 224, 70, 236, 12, 196, 79, 236, 178, 124, 127, 50, 99, 178, 44, 176, 174,
    126, 250, 235, 205, 174, 252, 122, 35, 10, 20, 101, 214, 69, 193, 8, 115, 105, 158, 228, 120, 111, 136,
    162, 198, 251, 211, 183, 253, 252, 164, 147, 63, 16, 186, 162, 117, 23, 170, 36, 205, 187, 174, 76, 210,
    174, 211, 175, 12, 173, 145, 59, 2, 70, 222, 181, 159, 227, 182, 156, 189, 51, 226, 106, 24, 50, 183, 157,
    140, 10, 8, 23, 212, 70, 10, 234, 23, 33, 219, 254, 39, 236, 70, 49, 191, 116, 9, 115, 15, 101, 26, 159,
    165, 220, 15, 170, 56, 125, 92, 163, 94, 235, 38, 40, 49, 81,
])  # fmt: skip

#: padding -> (data[11111], chunk boundaries), from test_correctness_100kb_hitting_data.
_HITTING = {
    0: (236, [8256, 16448, 24640, 32832, 41024, 49216, 57408, 65536]),
    1: (50, [8320, 16576, 24832, 33088, 41344, 49600, 57856, 65536]),
    2: (36, [8254, 16574, 24894, 33214, 41534, 49854, 58174, 65536]),
    3: (116, [8317, 16570, 24823, 33076, 41329, 49582, 57835, 65536]),
    31: (0, [8332, 16600, 24868, 33136, 41404, 49672, 57940, 65536]),
    38: (0, [8198, 16498, 24798, 33098, 41398, 49698, 57998, 65536]),
    126: (None, [8192, 16574, 24956, 33338, 41720, 50102, 58484, 65536]),
    127: (0, [8224, 16639, 25054, 33469, 41884, 50299, 58714, 65536]),
}


def _triggering_data(n: int, padding: int) -> bytes:
    """chunking.rs ``get_triggering_base_data``: the pattern, ``padding`` zeros, repeated to ``n`` bytes."""
    data = bytearray(_TRIGGER + bytes(padding))
    while len(data) < n:
        data += data[: min(n - len(data), len(data))]
    return bytes(data)


@pytest.mark.parametrize("padding", sorted(_HITTING))
def test_boundaries_match_xet_core_on_data_hitting_the_mask(padding):
    data = _triggering_data(65536, padding)
    sample, expected = _HITTING[padding]
    if sample is not None:
        assert data[11111] == sample  # the input is the one xet-core chunked
    assert chunk_boundaries(data) == expected


def test_boundary_can_fall_exactly_at_the_minimum_size():
    assert chunk_boundaries(_triggering_data(65536, 126))[0] == MIN_CHUNK_SIZE == 8 * 1024


def test_constant_data_is_cut_at_the_maximum_size():
    # test_correctness_1mb_const_data: the mask never matches, so every chunk is 128 KiB but the last.
    assert chunk_boundaries(bytes([59]) * 1_000_000) == [131072, 262144, 393216, 524288, 655360, 786432, 917504,
                                                         1000000]
    assert MAX_CHUNK_SIZE == 128 * 1024


def test_small_and_empty_inputs():
    assert chunk_boundaries(b"") == []
    assert chunk_boundaries(b"x") == [1]
    assert chunk_boundaries(bytes(MIN_CHUNK_SIZE - 1)) == [MIN_CHUNK_SIZE - 1]


def test_random_data_chunks_stay_within_the_limits_and_stream_the_same():
    data = random.Random(7).randbytes(3 * 1024 * 1024)
    ends = chunk_boundaries(data)
    sizes = [end - start for start, end in zip([0, *ends], ends, strict=False)]
    assert ends[-1] == len(data)
    assert all(MIN_CHUNK_SIZE <= size <= MAX_CHUNK_SIZE for size in sizes[:-1])
    assert 20 <= len(sizes) <= 60  # a 64 KiB mean: about 48 chunks

    class Trickle(io.RawIOBase):  # short reads: the chunker must not depend on read sizes
        def __init__(self) -> None:
            self.pos = 0

        def read(self, size: int = -1) -> bytes:
            piece = data[self.pos : self.pos + 777]
            self.pos += len(piece)
            return piece

    assert [len(chunk) for chunk in iter_chunks(Trickle())] == sizes


# --- hashes -----------------------------------------------------------------------------------------------------

_SEEDS = {  # MerkleHash::random_from_seed(seed) as printed by xet-core (seed 0: the zero hash)
    0: "0000000000000000000000000000000000000000000000000000000000000000",
    1: "cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6",
    2: "c3e67584b5c4fc2a89837ec39e40f2c8a6bb0b2987ac94cd4b31e5fbdd210a72",
    3: "0d2beb91b9196929a5ddec9f6e306924ddf4a24268e3e59fd8464738d525af37",
    4: "adf8773496a9b7319b2e50dc98093f344053b17d8ad37100b9c07d9805988784",
    5: "4ac202caf347fc1e9c874b1ef6a1c5e619141eb775a6f43f0f0124ccd0060d9e",
    6: "b3b28636f65c149ea52eb1f94669466f70f033b54cea792824c696ba6ef3c389",
    7: "0e2c1a002aae913d2c0fc8ddfa4e9e14b7b311b3b0d458726d5d9f6a6318013c",
}
_AGGREGATED = [  # (leaf seeds, xorb hash, file hash with the zero salt)
    ([], "0" * 64, "0" * 64),
    ([0], "0" * 64, "638a6bc391964a85939d48f008e8bdbae6a7975e7ca2d87a3ce2492f4e4d8a4c"),
    ([1], _SEEDS[1], "8e16257caa3fe079d484d872a8975264b2ff683b0d6db9028cc7c0f968a45661"),
    ([1, 2, 3], "71ec1275fca074724e2dd666921b3277c7cee603e4d025bcab2d4050015be2bc",
     "54e55dccc6653c612bdb5576c5d3cb34bb31bc4e100248abccf4c908b3ef7715"),
    ([1, 0], "e8660f81494ca836a58e395c1395ef97870ed71e2b113eec1fab6b3361f46dd6",
     "274d92f7e2acebaa2b8d63c0b5e7a4fc15814a606e3e3825d55609e671bcc5d9"),
    ([3, 4, 5, 5, 5], "2c1fd1eca47e284512fcb40fcf45a1874939f9b91c774d46aeba5d004d9d263d",
     "0799ba7ee2c3fed173a8e8d832cd13970ddc16070ffbc8aa6dcd77476f66dc73"),
    (list(range(8)) * 8, "6554007c9b5d0a5e7918f79596a1b68815c1407535585435f5735db761f21b88",
     "a8640ab81d48854e00078e12b1ea8be5d90be0ffb5f73a15b7009981d093ddd8"),
    ([1] * 32, "0a0123c1617921883b7e13902095fcb86676e77c49120c33b233003b0af0e0a6",
     "53af4711fd1d5e5bdc7f931b6be932314d8d673cb16ad2482f6f5222eaf9e63d"),
    ([s for s in range(8) for _ in (0, 1)], "636c65db520ec16e8166f9ec7a0cf9f74b26369077ac60160ec0221c86bc9f77",
     "6a90ad0d6f5246ac61f1de898c6944c03e14004a1368e6fb23387108c4d039e0"),
]


@pytest.mark.parametrize(("seeds", "expected_xorb", "expected_file"), _AGGREGATED)
def test_xorb_and_file_hashes_match_xet_core(seeds, expected_xorb, expected_file):
    leaves = [(hash_from_hex(_SEEDS[s]), s * 100) for s in seeds]
    assert hash_to_hex(xorb_hash(leaves)) == expected_xorb
    assert hash_to_hex(file_hash(leaves)) == expected_file


def test_hash_strings_reverse_each_eight_byte_word():
    # api.md's example, whose printed string drops the "10" of the third word (62 digits): the procedure gives 64.
    assert hash_to_hex(bytes(range(32))) == "07060504030201000f0e0d0c0b0a090817161514131211101f1e1d1c1b1a1918"
    raw = bytes([22, 175, 58, 132, 4, 75, 131, 214, 190, 153, 138, 66, 226, 3, 153, 242, 204, 86, 80, 234, 249, 153,
                 80, 99, 159, 80, 65, 138, 236, 231, 149, 78])
    assert hash_to_hex(raw) == "d6834b04843aaf16f29903e2428a99be635099f9ea5056cc4e95e7ec8a41509f"
    assert hash_from_hex(hash_to_hex(raw)) == raw


_ELVISH = b"whats the Elvish word for friend"


@pytest.mark.parametrize(("length", "expected"), [
    (0, "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"),
    (1025, "357dc55de0c7e382c900fd6e320acc04146be01db6a8ce7210b7189bd664ea69"),
])
def test_pure_python_blake3_matches_reference_vectors(length, expected):
    data = bytes(i % 251 for i in range(length))
    assert blake3_py.keyed_hash(_ELVISH, data).hex() == expected
    assert keyed_hash(_ELVISH, data).hex() == expected


def test_pure_python_blake3_matches_the_package_across_tree_shapes():
    blake3 = pytest.importorskip("blake3")
    key = os.urandom(32)
    for length in (1, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 3072, 4097, 9000):
        data = os.urandom(length)
        assert blake3_py.keyed_hash(key, data) == blake3.blake3(data, key=key).digest(), length


def test_chunk_hash_is_the_keyed_blake3_of_the_chunk():
    assert chunk_hash(b"hello") == blake3_py.keyed_hash(DATA_KEY, b"hello")


# --- xorbs ------------------------------------------------------------------------------------------------------


def test_chunk_header_layout():
    # version 0, compressed size (3 bytes LE), scheme 0 (none), uncompressed size (3 bytes LE)
    assert chunk_header(0x012345) == bytes([0, 0x45, 0x23, 0x01, 0, 0x45, 0x23, 0x01])


def test_xorbs_serialize_chunks_and_read_back_any_range(tmp_path):
    data = random.Random(3).randbytes(700_000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        xet_file = build_xet_file(f, max_xorb_bytes=300_000)
    assert len(xet_file.xorbs) >= 3 and xet_file.size == len(data)
    rebuilt = b""
    for xorb in xet_file.xorbs:
        whole = b"".join(xorb.read(lambda: open(path, "rb"), 0, xorb.size - 1))  # noqa: SIM115 - an opener: read() closes it
        assert len(whole) == xorb.size <= 300_000
        pos = 0
        for length in xorb.lengths:
            assert whole[pos : pos + CHUNK_HEADER_SIZE] == chunk_header(length)
            rebuilt += whole[pos + CHUNK_HEADER_SIZE : pos + CHUNK_HEADER_SIZE + length]
            pos += CHUNK_HEADER_SIZE + length
        assert b"".join(xorb.read(lambda: open(path, "rb"), 5, 20))  # noqa: SIM115 - an opener == whole[5:21]
    assert rebuilt == data

    offset, terms = xet_file.terms(200_000, 450_000)
    first = terms[0]
    assert first.xorb.file_starts[first.start] + offset == 200_000
    covered = sum(t.unpacked_length for t in terms)
    assert first.xorb.file_starts[first.start] + covered > 450_000


def test_file_hash_agrees_with_hf_xet(tmp_path):
    hf_xet = pytest.importorskip("hf_xet")
    paths = []
    for size in (5, MIN_CHUNK_SIZE + 1, 1_500_000):
        path = tmp_path / f"f{size}"
        path.write_bytes(random.Random(size).randbytes(size))
        paths.append(path)
    expected = [info.hash for info in hf_xet.hash_files([str(p) for p in paths])]
    ours = []
    for path in paths:
        with open(path, "rb") as f:
            ours.append(build_xet_file(f).hash)
    assert ours == expected
