"""Create huggingface_hub's shared HTTP client ahead of the first request, off the critical path.

``get_session()`` (huggingface_hub utils/_http.py) builds one ``httpx2.Client`` per process on first use; building
it imports httpcore and creates an SSL context that loads the CA bundle (~40 ms on 2 cores, measured
in ``benchmarks/bench_warm.py``'s cold warm). CPython's ``_ssl`` loads the bundle without the GIL, so a thread started
before ``hfcache.warming`` is imported makes the client while the main thread imports: the first request of a cold
``warm`` starts that much sooner (issue 18). The client is exactly the one the first request would have made.

Imports nothing at import time (the command-line entry point calls :func:`prepare_session` before the heavy imports).
"""

from __future__ import annotations

import threading

__all__ = ["prepare_session"]


def prepare_session() -> threading.Thread:
    """Start building huggingface_hub's shared HTTP client in a daemon thread.

    Any failure is ignored here: the first request builds the client again and reports it.

    Returns:
        threading.Thread: the started thread (joining it is never required).
    """
    thread = threading.Thread(target=_make_session, name="hfcache-session", daemon=True)
    thread.start()
    return thread


def _make_session() -> None:
    try:
        from huggingface_hub.utils import get_session

        get_session()
    except Exception:  # noqa: BLE001 - best effort; the first request raises the real error
        pass
