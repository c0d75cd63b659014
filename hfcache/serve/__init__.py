"""A Hub-compatible, read-only HTTP server over a store of repos: plain repo folders or a warmed HF cache.

The test Hub of the test suite and benchmarks, and ``hfcache serve``'s mirror. Modules, lowest first (each imports
only modules above it in this list, never back; tests/unit/test_import_graph.py checks that there is no cycle, and
what the vocabulary and the stores may import):

- :mod:`.vocabulary`    RepoFile, RepoSnapshot, StoreMiss, the Store protocol, git/LFS hashing (imports nothing here)
- :mod:`.folder_store`  FolderStore: plain ``<org>/<name>/`` repo folders
- :mod:`.cache_store`   CacheStore: a Hugging Face hub cache, answered as the Hub would
- :mod:`.metrics`       MirrorMetrics: ``GET /metrics`` (Prometheus text, prometheus_client)
- :mod:`.upstream_listing` an upstream commit's listing as a snapshot and as ``trees/<commit>.json``
- :mod:`.pruner`        ``serve --max-size``: prune's planner in a background thread
- :mod:`.pullthrough`   PullThroughStore: a cache that fetches what it lacks from upstream (``serve --upstream``)
- :mod:`.faults`        Faults: misbehaviours of poorer mirrors and flaky networks, for tests (imports nothing here)
- :mod:`.http`          error answers, request-target parsing
- :mod:`.accesslog`     RequestRecord and the access log line
- :mod:`.body`          FileBody and the Responder contract of the server stacks
- :mod:`.answers`       the protocol's answers: repo info, tree pages, file bodies, redirects
- :mod:`.xet`           Xet (opt-in): chunking, hashing, xorbs, the CAS origin (huggingface/hub-docs docs/xet/)
- :mod:`.routing`       Router: which answer a request gets (auth, gating, routes)
- :mod:`.wsgi`, :mod:`.asgi`  werkzeug and uvicorn server stacks
- :mod:`.hub_server`    HubServer: lifecycle, request and access logs
- :mod:`.mirror`        ``hfcache serve``: production settings, signals, graceful shutdown
- ``python -m hfcache.serve ROOT``  (:mod:`.__main__`) the server from a shell
"""

import importlib.util as _importlib_util

from ..errors import UsageError as _UsageError

#: The extra ``serve`` (pyproject.toml), which a core install lacks: checked before anything below imports them,
#: so that ``hfcache serve`` (and ``python -m hfcache.serve``) says which extra to install instead of a traceback;
#: uvicorn is imported only when a server starts, hence find_spec and not an ImportError handler.
SERVE_EXTRA = ("werkzeug", "uvicorn", "prometheus_client")
_missing = [name for name in SERVE_EXTRA if _importlib_util.find_spec(name) is None]
if _missing:
    raise _UsageError(f"the Hub server needs {', '.join(_missing)}, not installed", hint="pip install 'hfcache[serve]'")

from .accesslog import RequestRecord
from .cache_store import CacheStore
from .faults import Faults
from .folder_store import FolderStore
from .hub_server import HubServer
from .vocabulary import (
    LFS_PATTERNS,
    LFS_SIZE_THRESHOLD,
    RepoFile,
    RepoSnapshot,
    Store,
    StoreMiss,
    git_blob_sha1,
    is_lfs_file,
    lfs_pointer,
)

__all__ = [
    "LFS_PATTERNS",
    "LFS_SIZE_THRESHOLD",
    "CacheStore",
    "Faults",
    "FolderStore",
    "HubServer",
    "RepoFile",
    "RepoSnapshot",
    "RequestRecord",
    "Store",
    "StoreMiss",
    "git_blob_sha1",
    "is_lfs_file",
    "lfs_pointer",
]
