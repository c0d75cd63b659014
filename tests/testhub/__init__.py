"""The tests' Hub: ``hfcache serve``'s server with faults, Xet, a CDN origin and a request log (tests/README.md).

- :mod:`.server`  :class:`HubServer`: the product's :class:`hfcache.serve.HubServer` with the test-only options
- :mod:`.routes`  a request's route and sub-requests, for the wrappers below
- :mod:`.cdn`     the CDN origin and the 302s to it
- :mod:`.faults`  :class:`Faults` and the wrapper that injects them
- :mod:`.xet`     the Xet side: chunking, hashing, xorbs, the CAS origin, the main origin's Xet headers
- :mod:`.wsgi`    the werkzeug stack
- ``python -m tests.testhub ROOT`` (:mod:`.__main__`) from a shell, at the repository root
"""

import hfcache.serve  # noqa: F401 - first: without the extra `serve` it names the extra to install (test_install.py)

from .faults import Faults, parse_faults
from .server import HubServer, RequestRecord
from .xet import XetMode

__all__ = ["Faults", "HubServer", "RequestRecord", "XetMode", "parse_faults"]
