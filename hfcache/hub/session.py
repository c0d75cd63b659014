"""huggingface_hub's shared HTTP client, built ahead of the first request, off the critical path; its hooks.

``get_session()`` (huggingface_hub utils/_http.py) builds one ``httpx2.Client`` per process on first use: importing
httpcore2, h11, anyio and truststore and loading the CA bundle (~85 ms on the 2-core benchmark machine, half of it
in ``_ssl``, without the GIL). :func:`prepare_session` starts that in a thread before ``hfcache.warming.orchestrate``
is imported, so it overlaps those imports (docs/benchmarks.md). CPython raises ``_DeadlockError`` in one of two
threads importing modules that depend on each other in opposite orders: the calling thread imports huggingface_hub's
HTTP module itself, and the thread only builds the client, whose modules no other hfcache code imports meanwhile
(tests/unit/test_import_graph.py). Nothing is imported at module import time.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["hub_session", "no_agent_registry_fetch", "prepare_session"]

#: What building the client imports (and nothing else may be importing meanwhile).
CLIENT_MODULES = ("httpcore2", "h11", "anyio", "truststore")


def prepare_session() -> threading.Thread:
    """Import huggingface_hub's HTTP module here, then build its shared client in a daemon thread (a failure there is
    ignored: the first request builds it again and reports it). Returns the started thread (no join needed)."""
    from huggingface_hub.utils import get_session

    thread = threading.Thread(target=_make_session, args=(get_session,), name="hfcache-session", daemon=True)
    thread.start()
    return thread


def _make_session(get_session) -> None:
    with contextlib.suppress(Exception):  # best effort: the first request raises the real error
        get_session()


def no_agent_registry_fetch() -> None:
    """Keep huggingface_hub's agent detection from fetching its registry: hfcache talks only to its endpoints.

    Library gap (huggingface_hub >= 1.x, utils/_detect_agent.py; huggingface/huggingface_hub#4325): unless telemetry
    is off, ``build_hf_headers`` calls ``detect_agent()``, whose first call fetches
    ``{constants.ENDPOINT}/api/agent-harnesses`` (the public Hub whatever endpoint hfcache was given, 3 s timeout,
    from every worker thread racing to it) and writes ``$HF_HOME/.agent_harnesses.json`` (into an image layer under
    ``RUN hfcache warm``). No public API turns off only the fetch (``HF_HUB_DISABLE_TELEMETRY`` also drops the user
    agent's fields), so the module's registry is set here, once: from that file if it exists (a detected agent is still
    named), else empty. A huggingface_hub without this module is left alone.
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
    """huggingface_hub's shared ``httpx2.Client`` (``get_session()``) with hfcache's request hooks:
    :func:`hfcache.hub.bodies.watch_hook` (a :func:`~hfcache.hub.bodies.watched` block bounds a whole answer, headers
    included, also inside ``get_hf_file_metadata``) and :func:`hfcache.hub.retry.count_request`. Installed again if
    huggingface_hub made a new client."""
    from huggingface_hub.utils import get_session

    from .bodies import watch_hook
    from .retry import count_request

    session = get_session()
    hooks = session.event_hooks
    missing = [h for h in (watch_hook, count_request) if h not in hooks["request"]]
    if missing:
        session.event_hooks = {**hooks, "request": [*hooks["request"], *missing]}
    return session
