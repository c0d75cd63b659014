"""``hfcache serve``: a Hub-compatible, read-only HTTP server over plain repo folders or a warmed HF cache, and its
pull-through mirror. The modules, lowest first, are docs/architecture.md's "The server package" table; the tests'
Hub (faults, Xet, werkzeug, a CDN origin) is ``tests/testhub``, built from these parts."""

import importlib.util as _importlib_util

from ..errors import UsageError as _UsageError

#: The extra ``serve`` (pyproject.toml): checked before anything below imports them, so that ``hfcache serve`` names
#: the extra instead of a traceback (find_spec: uvicorn is imported only when a server starts).
SERVE_EXTRA = ("werkzeug", "uvicorn", "prometheus_client")
_missing = [name for name in SERVE_EXTRA if _importlib_util.find_spec(name) is None]
if _missing:
    raise _UsageError(f"the Hub server needs {', '.join(_missing)}, not installed", hint="pip install 'hfcache[serve]'")

from .cache_store import CacheStore
from .folder_store import FolderStore
from .hub_server import HubServer
from .vocabulary import RepoFile, RepoSnapshot, Store, StoreMiss

__all__ = ["CacheStore", "FolderStore", "HubServer", "RepoFile", "RepoSnapshot", "Store", "StoreMiss"]
