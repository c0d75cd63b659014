"""huggingface_hub's shared HTTP client (``get_session()``: ~85 ms of imports and CA bundle), built in a thread while
``hfcache.warming.orchestrate`` is imported (docs/benchmarks.md), and its hooks. The calling thread imports the HTTP
module first: threads importing interdependent modules in opposite orders deadlock (tests/unit/test_import_graph.py).
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["hub_session", "no_agent_registry_fetch", "prepare_session"]

#: What building the client imports (and nothing else may be importing meanwhile).
CLIENT_MODULES = ("httpcore2", "h11", "anyio", "truststore")


def prepare_session() -> threading.Thread:
    """Import huggingface_hub's HTTP module, then build its shared client in a daemon thread (a failure there is
    ignored: the first request reports it). Returns the started thread."""
    from huggingface_hub.utils import get_session

    thread = threading.Thread(target=_make_session, args=(get_session,), name="hfcache-session", daemon=True)
    thread.start()
    return thread


def _make_session(get_session) -> None:
    with contextlib.suppress(Exception):  # best effort: the first request raises the real error
        get_session()


def no_agent_registry_fetch() -> None:
    """Keep huggingface_hub's agent detection from fetching its registry (set here once, from its cached file if it
    exists, else empty): hfcache talks only to its endpoints. Library gap (huggingface_hub >= 1.x,
    utils/_detect_agent.py; huggingface/huggingface_hub#4325): ``build_hf_headers`` calls ``detect_agent()``, whose
    first call fetches ``{constants.ENDPOINT}/api/agent-harnesses`` (the public Hub whatever the endpoint); no public
    API turns off only the fetch."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import _detect_agent as agent
        if agent._registry is None:
            cached = agent._read_cached_registry(constants.AGENT_HARNESSES_PATH, max_age=None)
            agent._registry = cached or agent._EMPTY_REGISTRY
    except (ImportError, AttributeError):
        pass


def hub_session():
    """huggingface_hub's shared ``httpx2.Client`` (``get_session()``) with hfcache's request hooks,
    :func:`hfcache.hub.bodies.watch_hook` and :func:`hfcache.hub.retry.count_request` (installed again on a new client).
    """
    from huggingface_hub.utils import get_session

    from .bodies import watch_hook
    from .retry import count_request

    session = get_session()
    hooks = session.event_hooks
    missing = [h for h in (watch_hook, count_request) if h not in hooks["request"]]
    if missing:
        session.event_hooks = {**hooks, "request": [*hooks["request"], *missing]}
    return session
