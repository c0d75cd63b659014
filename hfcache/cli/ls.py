"""``hfcache ls``: parse, scan the cache (:mod:`hfcache.cache.scan`), render (:mod:`hfcache.cli.render.ls`)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from .options import cache_dir_option, json_option


@click.command(name="ls")
@click.argument("repo_ids", nargs=-1, metavar="[REPO_ID]...")
@cache_dir_option()
@click.option("--revisions", is_flag=True, help="One row per revision instead of per repo.")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False, exists=False),
              help="Mark the revisions this lock pins (cache: --cache-dir, else the lock's manifest's).")
@click.option("--sort", type=click.Choice(["name", "size", "last-used"]), default="name", show_default=True,
              help="name: A-Z; size: largest first; last-used: most recent first.")
@json_option
def ls_command(repo_ids, cache_dir, revisions, lock_file, sort, as_json) -> None:
    """List what a cache holds: repos, refs, files, size, last use, pins and health.

    Reads metadata only (no hashing, no writes). Damaged repos are listed with what is wrong, never hidden.
    A folder that is not a cache (an HF_HOME: the cache is DIR/hub) is exit 5; an empty folder lists nothing.
    A REPO_ID the cache does not hold is a warning and exit 1.
    """
    import gc

    from ..cache.root import require_hub_cache
    from ..cache.scan import scan_cache
    from ..cache.scan_stream import stream_repos
    from ..warming.lockfile import pinned_revisions, read_lock
    from ..warming.project import reading_cache_dir
    from .render import common
    from .render import ls as render

    pinned = pinned_revisions(read_lock(lock_file)) if lock_file else None
    root = reading_cache_dir(cache_dir, lock_file)
    if require_hub_cache(root).kind == "empty":  # a folder that holds other things: exit 5, naming DIR/hub
        common.warn(f"{root} is an empty cache: nothing was warmed into it yet", "hfcache: note: ")
    gc.disable()  # a short-lived process building one large document: the cyclic collector only costs time
    wanted = set(repo_ids) if repo_ids else None
    missing = _not_cached(Path(root), wanted)
    for line in missing:  # a REPO_ID the cache does not hold: said, and exit 1 (a CI check must not go green)
        common.warn(line, "hfcache: warning: ")
    summaries = (stream_repos(Path(root), functools.partial(render.repo_summary, pinned=pinned), wanted)
                 if as_json and sort == "name" else None)
    if summaries is not None:  # a large cache: one repo at a time, never the whole document in memory
        try:
            unreadable = render.stream_ls_json(str(Path(root)), summaries, sys.stdout)
        finally:
            summaries.close()  # on Ctrl-C too: the scan's worker processes end now (scan_stream.stream_repos)
        sys.exit(1 if unreadable or missing else 0)
    info = scan_cache(root, wanted)
    render.show_ls(info, pinned, sort=sort, revisions=revisions, as_json=as_json)
    sys.exit(1 if missing or any(r.unreadable for r in info.repos) else 0)  # health: a repo this user cannot read


def _not_cached(root: Path, wanted: set[str] | None) -> list[str]:
    """One line per REPO_ID asked for that has no folder in the cache, naming the cached ids it probably meant (same
    id in another case, or the same name under an org)."""
    if not wanted:
        return []
    from ..cache.scan import repo_folders

    held = sorted({entry[1] for entry in repo_folders(root)[0]})
    lines = []
    for repo_id in sorted(wanted - set(held)):
        name = repo_id.rsplit("/", 1)[-1].lower()
        near = [h for h in held if h.lower() == repo_id.lower() or h.rsplit("/", 1)[-1].lower() == name][:3]
        lines.append(f"{repo_id} is not in the cache {root}" + (f"; did you mean {', '.join(near)}?" if near else ""))
    return lines
