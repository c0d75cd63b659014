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
    """A mirror that is listening: the ``endpoint`` clients use (wildcard binds shown as loopback), the absolute
    ``root`` served, its ``layout`` (``"cache"``/``"repos"``), the ``host`` and ``port`` bound, whether a token is
    required, the ``access_log`` path (``"-"``: stdout), the pull-through ``upstreams`` (empty: static) and ``allow``
    globs, and the ``unreadable`` repo folders (:func:`.cache_store.unreadable_repos`)."""

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
    """A mirror that has stopped: its ``info``, the ``seconds`` it served, the ``signal`` that stopped it
    (``"SIGTERM"``, ``"SIGINT"``, ``"stop"``: the event), the responses ``cut_short`` by the end of the grace period."""

    info: MirrorInfo
    seconds: float
    signal: str
    cut_short: int


def serve(*, cache_dir: str | os.PathLike[str] | None = None, repos_dir: str | os.PathLike[str] | None = None,
          host: str = "127.0.0.1", port: int = 8080, token: str | None = None, access_log: str | None = None,
          grace: float = GRACE_SECONDS, ready: Callable[[MirrorInfo], None] | None = None,
          stop: threading.Event | None = None, upstream: PullThroughConfig | None = None,
          store: str | None = None) -> MirrorRun:
    """Serve a hub cache (default) or a folder of repo folders with :class:`hfcache.serve.HubServer` until SIGTERM,
    SIGINT or ``stop``, then let in-flight responses finish for up to ``grace`` seconds (a second signal cuts them).

    Args:
        cache_dir: the hub cache (None: huggingface_hub's default). repos_dir: ``<org>/<name>/`` folders instead.
        host, port, token, upstream: as :class:`hfcache.serve.HubServer`'s (with ``upstream`` the cache is created
            if missing). access_log: a file (``"-"``: stdout) for one line per request, no headers.
        ready: called once with the MirrorInfo when the port is bound. stop: an event that stops it like SIGTERM
            (signal handlers are installed only from the main thread). store: ``s3://BUCKET/PREFIX`` to serve instead
            of a cache (:mod:`.bucket_store`; with ``upstream``, filled from it: :mod:`.bucket_fill`).

    Raises:
        UsageError: both directories, the port cannot be bound, the access log cannot be opened.
        CacheError: the directory to serve does not exist.
    """
    bucket_store = None
    if store is not None:
        if cache_dir is not None or repos_dir is not None:
            raise UsageError("--store serves a bucket: it goes without --cache-dir and --repos",
                             hint="serve one of them")
        bucket_store = _bucket_store(store, upstream)
        layout, root = "bucket", bucket_store.root
    else:
        layout, root = _served_root(cache_dir, repos_dir, pull_through=upstream is not None)
    log_stream = _open_access_log(access_log)
    stop_event = stop or threading.Event()
    signals: list[str] = []
    installed = _install_signals(stop_event, signals)
    server = HubServer(root, host=host, port=port, token=token, layout=layout, access_log=log_stream,
                       upstream=upstream if bucket_store is None else None, store=bucket_store)
    try:
        try:
            server.start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                             hint="choose another --port (or stop the process using it)") from None
        started = time.monotonic()
        shown = str(bucket_store.bucket.url) if bucket_store is not None else str(root)
        info = MirrorInfo(endpoint=server.endpoint, root=shown, layout=layout, host=host,
                          port=int(server.endpoint.rsplit(":", 1)[1]), token_required=token is not None,
                          access_log=access_log, upstreams=upstream.upstreams if upstream else (),
                          allow=upstream.allow if upstream else (),
                          unreadable=unreadable_repos(root) if layout == "cache" else ())
        if ready is not None:
            ready(info)
        stop_event.wait()
        signal_stop = _second_signal(server.stopping)  # a second signal ends the grace period
        try:
            cut = server.stop(grace=grace)
        finally:
            signal_stop()
        return MirrorRun(info=info, seconds=time.monotonic() - started, signal=signals[0] if signals else "stop",
                         cut_short=cut)
    finally:
        _restore_signals(installed)
        server.stop()
        if log_stream is not None and log_stream is not sys.stdout:
            log_stream.close()


def _served_root(cache_dir: str | os.PathLike[str] | None, repos_dir: str | os.PathLike[str] | None, *,
                 pull_through: bool = False) -> tuple[str, Path]:
    """(layout, absolute root) of what to serve (a pull-through mirror's cache created if missing)."""
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


def _bucket_store(url: str, upstream: PullThroughConfig | None):
    """The store of ``serve --store s3://...``, filled from ``upstream`` when given. Raises UsageError: a bad URL,
    no boto3."""
    from ..bucket.store import Bucket, parse_bucket_url
    from .bucket_store import BucketStore

    bucket = Bucket(parse_bucket_url(url))
    fill = None
    if upstream is not None:
        from .bucket_fill import BucketFill

        fill = BucketFill(bucket, upstream)
    return BucketStore(bucket, fill)


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
    """Another SIGTERM/SIGINT sets ``stopping`` (main thread only); returns an undo function."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    return lambda: _restore_signals(previous)


def _restore_signals(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
