"""``hfcache path``: parse, resolve offline (:mod:`hfcache.offline.paths`), render (:mod:`hfcache.cli.render.path`)."""

from __future__ import annotations

import click

from .options import cache_dir_option


@click.command(name="path")
@click.argument("spec", metavar="REPO_ID[@REVISION]")
@click.argument("pattern", required=False, metavar="[PATTERN]")
@cache_dir_option()
@click.option("--repo-type", type=click.Choice(["model", "dataset", "kernel"]), default=None,
              help="Repo type [default: model; a datasets/ or kernels/ prefix on REPO_ID sets it too].")
@click.option("--one", is_flag=True, help="Exit 1 unless exactly one file matches PATTERN (says how many did).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document: repo_id, repo_type, revision, commit_hash, snapshot, files.")
def path_command(spec, pattern, cache_dir, repo_type, one, as_json) -> None:
    """Print the absolute snapshot folder of REPO_ID@REVISION in the cache, or each file in it matching PATTERN
    (a glob as warm's --include: '*' crosses '/'), one a line. Offline: from the cache alone.

    Exit 1 when something is missing (the repo, the ref, the snapshot, a matching file, a blob), naming it and the
    `hfcache warm` command that would fetch it.

    \b
    Examples:
      vllm serve "$(hfcache path org/model@COMMIT)"
      llama-server -m "$(hfcache path org/model-GGUF '*Q8_0*.gguf' --one)"
      hfcache path datasets/org/name --json
    """
    from ..cache.root import resolve_cache_dir
    from ..errors import UsageError
    from ..offline.paths import resolve
    from .render import path as render

    if one and pattern is None:
        raise UsageError("--one needs a PATTERN", hint="e.g. hfcache path org/model '*.gguf' --one")
    resolved = resolve(resolve_cache_dir(cache_dir), spec, pattern, repo_type=repo_type)
    if one:
        resolved.one()
    render.show_path(resolved, as_json=as_json)
