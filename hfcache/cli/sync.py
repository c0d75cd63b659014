"""``hfcache sync``: parse, loop over :func:`hfcache.fleet.sync.sync_once` passes, render each."""

from __future__ import annotations

import os
import sys
import time

import click

from ..errors import HfcacheError
from .options import cache_dir_option, hub_options, lock_timeout_option, parsed

_WATCH_EVERY = 1.0  # seconds between two looks at the locks folder for a change


@click.command(name="sync")
@click.option("--locks", "locks_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="The folder of locks (*.lock) the cache must hold: a mounted ConfigMap.")
@cache_dir_option("The node cache")
@click.option("--bucket", metavar="s3://BUCKET/PREFIX",
              help="Take file bodies from this bucket (as `push s3://` lays it out) instead of --endpoint.")
@click.option("--once", is_flag=True, help="One pass, then exit: 0 when every lock is ready, else the highest "
              "exit code of the locks that are not (1 verify, 2 an unreadable lock, 3 a fetch, 5 the cache).")
@click.option("--interval", default="60s", show_default=True, metavar="DURATION", callback=parsed("parse_duration"),
              help="Time between two passes; a change in --locks starts one at once.")
@click.option("--grace", default="1h", show_default=True, metavar="DURATION", callback=parsed("parse_duration"),
              help="Remove a revision no lock pins once it has not been used for this long (0s: at once).")
@click.option("--no-prune", is_flag=True, help="Warm and verify only; remove nothing.")
@click.option("--ready-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write DIR/<lock>.json when a lock is ready (complete and verified); remove it when it is not.")
@lock_timeout_option
@hub_options
def sync_command(locks_dir, cache_dir, bucket, once, interval, grace, no_prune, ready_dir, lock_timeout, hub,
                 as_json) -> None:
    """Keep the cache equal to the union of the locks in DIR: warm what they pin, verify it, remove what none pins.

    Each pass warms every lock (from --endpoint, or --bucket), verifies its snapshots, then removes the revisions no
    lock pins that were not used within --grace. A lock is ready when its content is complete and verified
    (--ready-dir, --json). Without --once it repeats every --interval, and at once when DIR changes.

    \b
    Examples:
      hfcache sync --locks /etc/hfcache/locks --cache-dir /var/lib/hfcache --endpoint http://hfcache-mirror
      hfcache sync --locks ./locks --bucket s3://models/hf --once --grace 0s --json
    """
    from ..fleet.sync import sync_once
    from .render.sync import show_sync

    while True:
        signature = _signature(locks_dir)
        try:
            report = sync_once(locks_dir, cache_dir, hub, bucket=bucket, grace=grace, ready_dir=ready_dir,
                               lock_timeout=lock_timeout, prune=not no_prune)
        except HfcacheError as exc:
            if once:
                raise
            show_sync(None, as_json=as_json, error=exc)
        else:
            show_sync(report, as_json=as_json)
            if once:
                sys.exit(report.exit_code)
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline and _signature(locks_dir) == signature:
            time.sleep(min(_WATCH_EVERY, max(0.0, deadline - time.monotonic())))


def _signature(folder: str) -> tuple:
    """What changes when a lock in ``folder`` is added, removed or rewritten (a ConfigMap swaps its ``..data``)."""
    try:
        return tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size, os.path.realpath(e.path))
                            for e in os.scandir(folder)))
    except OSError:
        return ()
