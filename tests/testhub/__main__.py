"""``python -m tests.testhub ROOT``, run at the repository root: the test Hub from a shell (tests, benchmarks).

``python -m tests.testhub ROOT [--host 127.0.0.1] [--port 8080] [--throttle-bps N] [--layout cache]
[--backend uvicorn] [--no-cdn] [--token T] [--fault NAME[=VALUE]]... [--xet [--xet-min-size N]]`` (tests/README.md).
To serve files to people or pods: ``hfcache serve``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from pathlib import Path

from hfcache.serve.hub_server import LAYOUTS

from .faults import Faults, parse_faults
from .server import BACKENDS, HubServer
from .xet import XetMode

__all__ = ["main"]

_DESCRIPTION = "The tests' Hub: hfcache serve's server with faults, Xet, a CDN origin (tests/README.md)."


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.testhub ROOT``: serve until Ctrl-C or SIGTERM, then shut down cleanly."""
    parser = argparse.ArgumentParser(prog="python -m tests.testhub", description=_DESCRIPTION)
    parser.add_argument("root", type=Path, help="folder of <org>/<name> repo folders (or a hub cache, --layout cache)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="main origin port (0 = any free port)")
    parser.add_argument("--throttle-bps", type=int, default=None, help="pace file bodies to N bytes/s")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' on the main origin")
    parser.add_argument("--layout", choices=LAYOUTS, default="repos", help="what ROOT is (default: repos)")
    parser.add_argument("--backend", choices=BACKENDS, default="werkzeug", help="server stack (default: werkzeug)")
    parser.add_argument("--no-cdn", action="store_true", help="serve LFS files from the main origin (one port)")
    parser.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]",
                        help="inject a fault (tests.testhub.Faults field), e.g. no_blobs, no_tree, rate_limit=3, "
                             "failing_bodies=2, body_failure=reset (repeatable)")
    parser.add_argument("--xet", action="store_true",
                        help="serve LFS files through Xet (X-Xet-Hash, read token, a CAS origin), as the Hub does")
    parser.add_argument("--xet-min-size", type=int, default=None, metavar="BYTES",
                        help="with --xet: every file of at least BYTES bytes goes through Xet, LFS or not")
    args = parser.parse_args(argv)
    if args.xet_min_size is not None and (not args.xet or args.xet_min_size < 0):
        parser.error("--xet-min-size needs --xet and a size >= 0")
    try:
        faults = parse_faults(args.fault)
    except ValueError as exc:
        parser.error(str(exc))
    if faults != Faults() and args.backend != "werkzeug":
        parser.error("--fault needs the werkzeug backend (a reset needs the raw socket)")
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    server = HubServer(args.root, host=args.host, port=args.port, throttle_bps=args.throttle_bps, token=args.token,
                       layout=args.layout, backend=args.backend, lfs_redirect=not args.no_cdn, record_requests=False,
                       faults=faults, xet=XetMode(min_size=args.xet_min_size) if args.xet else False)
    with server:
        print(f"serving {args.root} at {server.endpoint}", flush=True)
        if server.cas_endpoint:
            print(f"Xet CAS at {server.cas_endpoint}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
