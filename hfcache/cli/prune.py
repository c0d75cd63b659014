"""``hfcache prune``: parse, plan, confirm, call :mod:`hfcache.prune`, render (:mod:`hfcache.cli.render.prune`)."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError
from .options import cache_dir_option, lock_timeout_option, parsed


@click.command()
@cache_dir_option()
@click.option("--older-than", metavar="DURATION", callback=parsed("parse_duration"),
              help="Remove unpinned revisions not used for longer than this: 45s, 90m, 12h, 30d, 2w.")
@click.option("--max-size", metavar="SIZE", callback=parsed("parse_size"),
              help="Then remove least-recently-used unpinned revisions until the cache is at most SIZE: "
                   "50GB, 1.5G (powers of 1000), 500MiB, 20Gi (powers of 1024), or bytes.")
@click.option("--keep-lock", "keep_locks", multiple=True, type=click.Path(dir_okay=False),
              help="Never remove a revision this hfcache.lock pins (repeatable).")
@click.option("--keep", multiple=True, metavar="REPO_ID[@REVISION]",
              help="Never remove this repo's revisions, or the one a ref or commit names (repeatable).")
@click.option("--superseded", is_flag=True, help="Remove at once, without the one-hour grace, each revision no ref "
              "names any more while the repo's refs name another (the one an update replaced).")
@click.option("--missing-ok", is_flag=True, help="Exit 0 (with a warning) when the cache folder does not exist yet "
              "(a job that may run before the first warm); without it, exit 5.")
@click.option("--dry-run", is_flag=True, help="Print the plan; remove nothing.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (cron jobs, CI).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (needs --yes or --dry-run).")
@lock_timeout_option
def prune(cache_dir, older_than, max_size, keep_locks, keep, superseded, missing_ok, dry_run, yes, as_json,
          lock_timeout) -> None:
    """Remove what a cache no longer needs, never what is pinned or being downloaded.

    In order: detached revisions (no ref; unused for an hour, or at once with --superseded); revisions unused for longer than --older-than; then
    least-recently-used revisions until the cache fits --max-size. Also blobs no snapshot uses, .incomplete files
    older than an hour whose download is dead, .locks files of removed blobs, and empty repo folders. Safe while
    `hfcache warm` runs.
    A cache folder that does not exist is exit 5 (unless --missing-ok), one that is not a cache (an HF_HOME: the
    cache is DIR/hub) exit 5; an empty folder (a fresh volume) is exit 0, "empty cache: nothing to prune".

    \b
    Examples:
      hfcache prune --dry-run
      hfcache prune --superseded --yes
      hfcache prune --older-than 30d --max-size 50GB --keep-lock hfcache.lock --yes
    """
    from ..prune import execute, plan_prune
    from .render import common
    from .render import prune as render

    if as_json and not (yes or dry_run):
        raise UsageError("--json needs --yes or --dry-run", hint="machines cannot answer the confirmation prompt")
    if not (yes or dry_run) and not sys.stdin.isatty():
        raise UsageError("no terminal to ask for confirmation", hint="pass --yes (cron jobs, CI) or --dry-run")
    plan = plan_prune(cache_dir, older_than=older_than, max_size=max_size, keep=keep, keep_locks=keep_locks,
                      missing_ok=missing_ok, superseded=superseded)
    if dry_run:
        render.show_prune(plan, as_json=as_json, dry_run=True)
        sys.exit(5 if plan.unreadable else 0)  # a repo it cannot read: a filesystem problem to fix
    if asked := bool(plan.items) and not yes:
        render.show_prune(plan, as_json=False, dry_run=False)
        if not click.confirm(render.prune_question(plan), default=False, err=True):
            common.stderr.print("nothing removed")
            return
    with render.PruneProgress(len(plan.items), enabled=not as_json and bool(plan.items)) as progress:
        result = execute(plan, on_item=progress.advance, lock_timeout=lock_timeout,
                         on_lock_wait=common.lock_wait_notice)
    render.show_prune(plan, result, as_json=as_json, dry_run=False, tables=not asked)
    sys.exit(result.exit_code)
