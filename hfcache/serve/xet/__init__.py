"""Xet for the test Hub server: chunking, hashing, xorbs and the CAS origin, from the published specification.

The Xet protocol specification is huggingface/hub-docs ``docs/xet/`` (chunking.md, hashing.md, xorb.md,
file-reconstruction.md, download-protocol.md, api.md, auth.md, file-id.md); where it is terse, the reference
implementation huggingface/xet-core was read. Modules, lowest first:

- :mod:`.blake3_py`  BLAKE3 keyed hashing in pure Python (fallback when the ``blake3`` package is missing)
- :mod:`.hashing`    chunk, node, xorb and file hashes; hash strings
- :mod:`.chunking`   gearhash content-defined chunking (64 KiB target, 8 KiB min, 128 KiB max)
- :mod:`.xorb`       uncompressed xorbs of a file's chunks, reconstruction terms, xorb byte ranges
- :mod:`.index`      :class:`XetMode` (which files go through Xet) and the memo of chunked files
- :mod:`.cas`        :class:`CasService`: resolve headers, the read token, reconstructions and xorb bytes

Standard library, werkzeug, and the ``blake3`` package when installed; nothing of hfcache outside ``serve``.
"""

from .cas import CasService
from .index import XetIndex, XetMode
from .xorb import XetFile, build_xet_file

__all__ = ["CasService", "XetFile", "XetIndex", "XetMode", "build_xet_file"]
