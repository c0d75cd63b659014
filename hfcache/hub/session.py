"""Create huggingface_hub's shared HTTP client ahead of the first request, off the critical path.

``get_session()`` (huggingface_hub utils/_http.py) builds one ``httpx2.Client`` per process on first use; building
it imports httpcore2, h11, anyio and truststore and creates an SSL context that loads the CA bundle (~85 ms on this
project's 2-core benchmark machine, half of it in ``_ssl``, which runs without the GIL). Started in a thread before
``hfcache.warming.orchestrate`` is imported, it overlaps with those imports: the first request of a cold ``warm`` starts that
much sooner (docs/benchmarks.md). The client is exactly the one the first request would have made.

Concurrent imports: CPython raises ``_DeadlockError`` in one of two threads that import modules depending on each
other in opposite orders. So the calling thread imports huggingface_hub's HTTP module (and httpx2) itself, and the
thread only builds the client: the modules that imports (httpcore2, h11, anyio, truststore) are imported by no
other hfcache code path at that time (checked in tests/unit/test_import_graph.py).

Imports nothing at module import time (the command-line entry point calls :func:`prepare_session` before the
heavy imports).
"""

from __future__ import annotations

import threading

__all__ = ["prepare_session"]

#: What building the client imports (and nothing else may be importing meanwhile).
CLIENT_MODULES = ("httpcore2", "h11", "anyio", "truststore")


def prepare_session() -> threading.Thread:
    """Import huggingface_hub's HTTP module here, then build its shared HTTP client in a daemon thread.

    Any failure of the thread is ignored: the first request builds the client again and reports it.

    Returns:
        threading.Thread: the started thread (joining it is never required).
    """
    from huggingface_hub.utils import get_session

    thread = threading.Thread(target=_make_session, args=(get_session,), name="hfcache-session", daemon=True)
    thread.start()
    return thread


def _make_session(get_session) -> None:
    try:
        get_session()
    except Exception:  # noqa: BLE001 - best effort; the first request raises the real error
        pass
