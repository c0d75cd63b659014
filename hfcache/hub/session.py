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

Also here: :func:`hub_session` (that client with the watchdog's request hook, :mod:`hfcache.hub.bodies`) and
:func:`no_agent_registry_fetch`. Imports nothing at module import time (the command-line entry point calls :func:`prepare_session` before the
heavy imports).
"""

from __future__ import annotations

import threading

__all__ = ["hub_session", "no_agent_registry_fetch", "prepare_session"]

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


def no_agent_registry_fetch() -> None:
    """Keep huggingface_hub's agent detection from fetching its registry: hfcache talks only to its endpoints.

    Library gap: ``build_hf_headers`` (utils/_headers.py, also inside ``get_hf_file_metadata``) calls
    ``detect_agent()`` unless telemetry is disabled, and its first call (utils/_detect_agent.py, huggingface_hub
    >= 1.x) fetches ``{constants.ENDPOINT}/api/agent-harnesses`` -- the public Hub even when hfcache was given
    another endpoint, with a 3 s timeout, once from every worker thread that races to it -- and writes
    ``$HF_HOME/.agent_harnesses.json`` (into an image layer, under ``RUN hfcache warm``). Here the registry is taken
    from that file if it exists (so the user agent still names a detected agent) and is otherwise empty; it is
    never fetched. A huggingface_hub without this module is left alone.
    """
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import _detect_agent as agent
        if agent._registry is None:
            cached = agent._read_cached_registry(constants.AGENT_HARNESSES_PATH, max_age=None)
            agent._registry = cached or agent._EMPTY_REGISTRY
    except (ImportError, AttributeError):
        pass


def hub_session():
    """huggingface_hub's shared ``httpx2.Client`` (``get_session()``), with :func:`hfcache.hub.bodies.watch_hook`
    among its request hooks, so a :func:`~hfcache.hub.bodies.watched` block bounds a whole answer, headers
    included, even inside ``get_hf_file_metadata``. Installed again if huggingface_hub made a new client."""
    from huggingface_hub.utils import get_session

    from .bodies import watch_hook
    from .retry import count_request

    session = get_session()
    hooks = session.event_hooks
    missing = [h for h in (watch_hook, count_request) if h not in hooks["request"]]
    if missing:
        session.event_hooks = {**hooks, "request": [*hooks["request"], *missing]}
    return session
