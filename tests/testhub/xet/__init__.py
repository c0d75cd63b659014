"""Xet for the test Hub: chunking, hashing, xorbs, the CAS origin and the main origin's Xet side, from the published
specification.

The Xet protocol specification is huggingface/hub-docs ``docs/xet/`` (chunking.md, hashing.md, xorb.md,
file-reconstruction.md, download-protocol.md, api.md, auth.md, file-id.md); where it is terse, the reference
implementation huggingface/xet-core was read. Modules, lowest first:

- :mod:`.blake3_py`  BLAKE3 keyed hashing in pure Python (fallback when the ``blake3`` package is missing)
- :mod:`.hashing`    chunk, node, xorb and file hashes; hash strings
- :mod:`.chunking`   gearhash content-defined chunking (64 KiB target, 8 KiB min, 128 KiB max)
- :mod:`.xorb`       uncompressed xorbs of a file's chunks, reconstruction terms, xorb byte ranges
- :mod:`.index`      :class:`XetMode` (which files go through Xet) and the memo of chunked files
- :mod:`.cas`        :class:`CasService`: resolve headers, the read token, reconstructions and xorb bytes
- :mod:`.hub`        :class:`XetHub`: the product's main-origin answers with the Hub's Xet headers, hashes and routes

Standard library, werkzeug, the ``blake3`` package when installed, and the product's HTTP helpers and vocabulary.
"""

from .cas import CasService
from .hub import XetHub
from .index import XetIndex, XetMode
from .xorb import XetFile, build_xet_file

__all__ = ["CasService", "XetFile", "XetHub", "XetIndex", "XetMode", "build_xet_file"]
