"""``hfcache serve``: the Hub-compatible server as a read-only mirror until SIGTERM or Ctrl-C (docs/serve.md): the
signals, the access log file and the graceful shutdown around :class:`hfcache.serve.HubServer`."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..cache.root import ensure_cache_root, existing_cache_dir, resolve_cache_dir
from ..errors import CacheError, UsageError
from .cache_store import unreadable_repos
from .hub_server import HubServer
from .pullthrough import PullThroughConfig

__all__ = ["GRACE_SECONDS", "MirrorInfo", "MirrorRun", "serve"]

#: Seconds in-flight downloads get to finish after SIGTERM (Kubernetes waits 30 s before SIGKILL by default).
GRACE_SECONDS = 20.0


@dataclass(frozen=True)
class MirrorInfo:
    """A mirror that is listening.

    Attributes:
        endpoint (str): base URL clients use as ``HF_ENDPOINT`` / ``--endpoint`` (wildcard binds shown as loopback).
        root (str): the directory served (absolute). layout (str): ``"cache"`` or ``"repos"``.
        host (str), port (int): the interface and port bound. token_required (bool): requests need the token.
        access_log (str | None): the access log's path (``"-"`` for stdout), if any.
        upstreams (tuple[str, ...]): pull-through upstream endpoints, in order (empty: a static mirror).
        allow (tuple[str, ...]): repo id globs that may be pulled through (empty: all).
        unreadable (tuple[str, ...]): repo folders (or their parts) of the cache this user cannot read, relative to
            ``root``: requests for them get 500 ``CacheUnreadable`` (:func:`.cache_store.unreadable_repos`).
    """

    endpoint: str
    root: str
    layout: str
    host: str
    port: int
    token_required: bool
    access_log: str | None
    upstreams: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True)
class MirrorRun:
    """A mirror that has stopped.

    Attributes:
        info (MirrorInfo): what was served. seconds (float): how long it served.
        signal (str): what stopped it, e.g. ``"SIGTERM"``, ``"SIGINT"`` or ``"stop"`` (the ``stop`` event).
        cut_short (int): responses still streaming when the grace period ended (0 after a clean shutdown).
    """

    info: MirrorInfo
    seconds: float
    signal: str
    cut_short: int


def serve(*, cache_dir: str | os.PathLike[str] | None = None, repos_dir: str | os.PathLike[str] | None = None,
          host: str = "127.0.0.1", port: int = 8080, token: str | None = None, access_log: str | None = None,
          grace: float = GRACE_SECONDS, ready: Callable[[MirrorInfo], None] | None = None,
          stop: threading.Event | None = None, upstream: PullThroughConfig | None = None) -> MirrorRun:
    """Serve a hub cache (default) or a folder of repo folders with :class:`hfcache.serve.HubServer` until SIGTERM,
    SIGINT or ``stop``: then stop accepting connections, let in-flight responses finish for up to ``grace`` seconds
    (a second signal cuts them) and return the :class:`MirrorRun`.

    Args:
        cache_dir: the hub cache; None (and no ``repos_dir``): huggingface_hub's default (``HF_HUB_CACHE``,
            ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``). repos_dir: ``<org>/<name>/`` repo folders instead.
        host, port: where to listen (port 0: any free one, ``MirrorInfo.port``). token: if set, every request but
            ``/healthz`` and ``/metrics`` needs ``Authorization: Bearer <token>``; never logged.
        access_log: a file to append one line per request to (``TIME METHOD PATH STATUS BYTES SECONDS``; ``"-"``:
            stdout); headers, so tokens, are never written. grace: seconds in-flight responses get.
        ready: called once with the MirrorInfo when the port is bound. stop: an event that stops the mirror like
            SIGTERM; signal handlers are installed only when called from the main thread.
        upstream: fetch what the cache lacks from these upstreams (:mod:`.pullthrough`); the cache is created if
            missing. Cache layout only.

    Raises:
        UsageError: both directories, the port cannot be bound, the access log cannot be opened.
        CacheError: the directory to serve does not exist.
    """
    layout, root = _served_root(cache_dir, repos_dir, pull_through=upstream is not None)
    log_stream = _open_access_log(access_log)
    stop_event = stop or threading.Event()
    signals: list[str] = []
    installed = _install_signals(stop_event, signals)
    server = HubServer(root, host=host, port=port, token=token, layout=layout, access_log=log_stream, upstream=upstream)
    try:
        try:
            server.start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                             hint="choose another --port (or stop the process using it)") from None
        started = time.monotonic()
        info = _mirror_info(server, root, layout, host, token is not None, access_log, upstream)
        if ready is not None:
            ready(info)
        stop_event.wait()
        cut = _stop_gracefully(server, grace)
        return MirrorRun(info=info, seconds=time.monotonic() - started, signal=signals[0] if signals else "stop",
                         cut_short=cut)
    finally:
        _restore_signals(installed)
        server.stop()
        if log_stream is not None and log_stream is not sys.stdout:
            log_stream.close()


def _mirror_info(server: HubServer, root: Path, layout: str, host: str, token_required: bool,
                 access_log: str | None, upstream: PullThroughConfig | None) -> MirrorInfo:
    """What the started mirror serves, where, and to whom (the CLI prints it)."""
    return MirrorInfo(endpoint=server.endpoint, root=str(root), layout=layout, host=host,
                      port=int(server.endpoint.rsplit(":", 1)[1]), token_required=token_required,
                      access_log=access_log, upstreams=upstream.upstreams if upstream else (),
                      allow=upstream.allow if upstream else (),
                      unreadable=unreadable_repos(root) if layout == "cache" else ())


def _stop_gracefully(server: HubServer, grace: float) -> int:
    """Stop accepting, let in-flight responses finish for ``grace`` seconds (a second signal ends the grace period:
    its handler sets ``server.stopping``); the responses cut short."""
    signal_stop = _second_signal(server.stopping)
    try:
        return server.stop(grace=grace)
    finally:
        signal_stop()


def _served_root(cache_dir: str | os.PathLike[str] | None, repos_dir: str | os.PathLike[str] | None, *,
                 pull_through: bool = False) -> tuple[str, Path]:
    """(layout, absolute root) of what to serve; raises UsageError for both, CacheError for a missing directory.
    A pull-through mirror's cache is created if missing (CacheError if it cannot be)."""
    if cache_dir is not None and repos_dir is not None:
        raise UsageError("--cache-dir and --repos are mutually exclusive", hint="serve one of them")
    if pull_through and repos_dir is not None:
        raise UsageError("--upstream needs a cache to fill, not --repos", hint="pass --cache-dir DIR")
    if pull_through:
        root = resolve_cache_dir(cache_dir)
        ensure_cache_root(root)
        return "cache", root
    if repos_dir is None:
        return "cache", existing_cache_dir(cache_dir)
    root = Path(repos_dir).expanduser().absolute()
    if not root.is_dir():
        raise CacheError(f"no repo folders at {root}", hint="pass a directory of <org>/<name>/ folders")
    return "repos", root


def _open_access_log(path: str | None) -> IO[str] | None:
    if path is None:
        return None
    if path == "-":
        return sys.stdout
    try:
        return open(path, "a", encoding="utf-8", buffering=1)
    except OSError as exc:
        raise UsageError(f"cannot open --access-log {path}: {exc.strerror}",
                         hint="choose a writable file (or '-' for stdout)") from None


def _install_signals(stop: threading.Event, names: list[str]) -> dict[int, object]:
    """SIGTERM/SIGINT set ``stop`` (main thread only; elsewhere the caller's ``stop`` event is the only way)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, _frame: object) -> None:
        names.append(signal.Signals(signum).name)
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def _second_signal(stopping: threading.Event) -> Callable[[], None]:
    """During the grace period, another SIGTERM/SIGINT cuts remaining responses short; returns an undo function."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    return lambda: _restore_signals(previous)


def _restore_signals(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
