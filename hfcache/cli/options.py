"""Click options and values shared by the command modules of :mod:`hfcache.cli`."""

from __future__ import annotations

import functools
import sys

import click

from ..errors import UsageError
from ..records import DEFAULT_MAX_WORKERS, DEFAULT_RETRIES, DEFAULT_TIMEOUT, HubOptions


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


lock_timeout_option = click.option("--lock-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
                                   metavar="SECONDS", help="Wait at most this long for a lock another process holds "
                                   "(exit 5 then, naming the lock).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")


def stdin_password(hint: str) -> str:
    """The one line ``--password-stdin`` reads; UsageError (with ``hint``) for an empty one."""
    if not (password := sys.stdin.readline().rstrip("\r\n")):
        raise UsageError("--password-stdin: no password on stdin", hint=hint)
    return password


def token_notice(message: str) -> None:
    """One line on stderr for ``on_notice`` callbacks (a token withheld from an endpoint); never the token."""
    click.echo(f"hfcache: note: {message}", err=True)


def cache_dir_option(what: str = "Cache root"):
    return click.option("--cache-dir", type=click.Path(file_okay=False),
                        help=f"{what} [default: HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub].")


def hub_options(fn):
    """The Hub options (handed to the command as one :class:`~hfcache.records.HubOptions` ``hub``) and ``--json``."""
    @functools.wraps(fn)
    def command(*args, endpoints, token, token_file, max_workers, timeout, retries, **kwargs):
        hub = HubOptions(endpoints=endpoints, token=token or None, token_file=token_file, timeout=timeout,
                         retries=retries, max_workers=max_workers)
        return fn(*args, hub=hub, **kwargs)

    for decorator in reversed([
        click.option("--endpoint", "endpoints", metavar="URL", multiple=True,
                     help="Hub endpoint; repeat to give fallbacks, tried in order per repo (an in-cluster mirror "
                          "first) [default: the manifest's, HF_ENDPOINT or https://huggingface.co]."),
        click.option("--token", metavar="TOKEN", help="Hub token (visible in `ps`; prefer --token-file or HF_TOKEN)."),
        click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the Hub token."),
        click.option("--max-workers", type=click.IntRange(min=1), default=DEFAULT_MAX_WORKERS, show_default=True,
                     help="Connections to the endpoint at once (repo resolutions, files, ranges of large files)."),
        click.option("--timeout", metavar="SECONDS", default=f"{DEFAULT_TIMEOUT:g}", show_default=True,
                     callback=parsed("parse_timeout"),
                     help="Seconds to wait for a connection or for any byte of an answer (a whole metadata "
                          "answer: 12 x this, 10 to 120 s, or HFCACHE_METADATA_DEADLINE; a body's least rate: "
                          "HFCACHE_MIN_RATE)."),
        click.option("--retries", type=click.IntRange(min=0), default=DEFAULT_RETRIES, show_default=True,
                     help="Retries of a 429, 502, 503, 504 or cut connection, per request or file (exponential "
                          "backoff with jitter; Retry-After honoured)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; no progress."),
    ]):
        command = decorator(command)
    return command


#: A hidden ``--revision REV`` (``hf download``'s spelling of ``REPO_ID@REV``: :func:`apply_revision`).
revision_option = click.option("--revision", metavar="REV", hidden=True,
                               help="Same as REPO_ID@REV, for a single REPO_ID.")


def apply_revision(specs: tuple[str, ...] | list[str], revision: str | None, *,
                   with_lock: bool = False) -> tuple[str, ...]:
    """``specs`` with ``revision`` folded into the one ``REPO_ID`` given (``with_lock``: ``--lock`` given). Raises
    UsageError: no or several REPO_IDs, ``--lock``, an empty value, another revision."""
    specs = tuple(specs)
    if revision is None:
        return specs
    example = "use REPO_ID@REVISION (e.g. bert-base-uncased@main)"
    if with_lock:
        raise UsageError("--revision does not go with --lock: the lock pins each repo's commit",
                         hint=f"{example}, without --lock")
    if not revision.strip() or "@" in revision:
        raise UsageError(f"--revision {revision!r} is not a revision", hint=example)
    if len(specs) != 1:
        raise UsageError(f"--revision goes with a single REPO_ID ({len(specs)} given): {example}",
                         hint="give each repo its own revision: org/a@main org/b@v1.0")
    spec = specs[0]
    if "@" in spec:
        if spec.rsplit("@", 1)[1] == revision:
            return specs
        raise UsageError(f"{spec} names a revision already, and --revision says {revision!r}", hint=example)
    return (f"{spec}@{revision}",)
