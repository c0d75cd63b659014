"""Click option helpers shared by the command modules (cli/main.py, cli/oci.py): presentation layer only."""

from __future__ import annotations

import click

from ..errors import UsageError


def parsed(name: str):
    """A Click callback running ``hfcache.units.<name>``: a bad value is a usage error naming the option (exit 2)."""
    def callback(ctx, param, value):
        from .. import units

        if value is None:
            return None
        try:
            return getattr(units, name)(value)
        except UsageError as exc:
            raise click.BadParameter(f"{exc.message} ({exc.hint})" if exc.hint else exc.message) from None
    return callback


def lock_timeout_option(fn):
    """``--lock-timeout SECONDS`` (default 600): how long a command waits for a lock another process holds."""
    return click.option("--lock-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
                        metavar="SECONDS", help="Wait at most this long for a lock another process holds (exit 5 "
                        "then, naming the lock).")(fn)
