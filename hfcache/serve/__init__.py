"""``hfcache serve``: a Hub-compatible, read-only HTTP server over a store of repos (plain repo folders or a warmed
HF cache), and its pull-through mirror. Modules, lowest first (each imports only modules above it, never back:
tests/unit/test_import_graph.py):

- :mod:`.vocabulary`    RepoFile, RepoSnapshot, StoreMiss, the Store protocol, git/LFS hashing (imports nothing here)
- :mod:`.folder_store`, :mod:`.cache_store`  the stores: plain ``<org>/<name>/`` folders; a hub cache
- :mod:`.metrics`       MirrorMetrics: ``GET /metrics`` (Prometheus text, prometheus_client)
- :mod:`.upstream_listing`, :mod:`.upstream_ids`, :mod:`.upstream_pool`, :mod:`.upstream_errors`, :mod:`.pruner`,
  :mod:`.pullthrough`   PullThroughStore: a cache that fetches what it lacks from upstream (``serve --upstream``)
- :mod:`.http`, :mod:`.accesslog`, :mod:`.body`  error answers and request targets; the access log; FileBody
- :mod:`.answers`, :mod:`.routing`  the protocol's answers; Router: which answer a request gets
- :mod:`.asgi`, :mod:`.hub_server`, :mod:`.mirror`  the uvicorn stack; HubServer; ``hfcache serve`` (signals)

The tests' Hub (faults, Xet, werkzeug, a CDN origin) is ``tests/testhub``, built from these parts.
"""

import importlib.util as _importlib_util

from ..errors import UsageError as _UsageError

#: The extra ``serve`` (pyproject.toml), which a core install lacks: checked before anything below imports them,
#: so that ``hfcache serve`` says which extra to install instead of a traceback (uvicorn is imported only when a
#: server starts, hence find_spec and not an ImportError handler).
SERVE_EXTRA = ("werkzeug", "uvicorn", "prometheus_client")
_missing = [name for name in SERVE_EXTRA if _importlib_util.find_spec(name) is None]
if _missing:
    raise _UsageError(f"the Hub server needs {', '.join(_missing)}, not installed", hint="pip install 'hfcache[serve]'")

from .accesslog import RequestRecord
from .cache_store import CacheStore
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
