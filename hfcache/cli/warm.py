"""``hfcache warm`` and ``lock``: parse, call ``warming.run.run``, ``pin.lock_project`` or ``project.check_lock``."""

from __future__ import annotations

import contextlib
import sys

import click

from ..errors import UsageError
from .options import apply_revision, cache_dir_option, hub_options, lock_timeout_option, revision_option, token_notice

#: ``--trust-manifest-endpoint`` (docs/warm.md).
trust_manifest_endpoint_option = click.option(
    "--trust-manifest-endpoint", is_flag=True, help="Send the Hub token to the manifest's endpoint too (default: only "
    "to --endpoint, HF_ENDPOINT or the Hub; also HFCACHE_TRUST_MANIFEST_ENDPOINT=1).")


@click.command()
@click.argument("repos", nargs=-1, metavar="REPO_ID[@REVISION]...")
@cache_dir_option()
@click.option("--kind", type=click.Choice(["tokenizer", "model", "all"]), default="tokenizer", show_default=True,
              help="tokenizer: tokenizer files + config.json; model: + configs and weights in one format; "
                   "all: the whole repo.")
@click.option("--include", multiple=True, metavar="GLOB", help="Also fetch files matching GLOB (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Never fetch files matching GLOB (repeatable).")
@click.option("--repo-type", type=click.Choice(["model", "dataset", "kernel"]), default="model", show_default=True)
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Install exactly this lock (no REPO_ID arguments then).")
@click.option("--locked", is_flag=True, help="With --lock: fail (exit 1) if the manifest and the lock disagree.")
@click.option("--manifest", type=click.Path(dir_okay=False),
              help="With --lock: the manifest [default: hfcache.toml or pyproject.toml beside the lock].")
@trust_manifest_endpoint_option
@hub_options
@lock_timeout_option
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary; errors only.")
@revision_option
def warm(repos, cache_dir, kind, include, exclude, repo_type, lock_file, locked, manifest, trust_manifest_endpoint,
         hub, lock_timeout, as_json, quiet, revision) -> None:
    """Download tokenizers (or models) into a cache that transformers loads offline.

    Every file is hashed against what the endpoint publishes (or the lock pins) before it becomes visible; the
    result is huggingface_hub's own cache layout, with .no_exist markers for optional files a repo lacks.
    With --lock, a cache that already holds the lock costs no request at all.

    \b
    Examples:
      hfcache warm bert-base-uncased
      hfcache warm openai-community/gpt2@main FacebookAI/roberta-base --cache-dir /opt/hf-cache
      hfcache warm --lock hfcache.lock --locked
    """
    from ..warming.run import WarmJob, run
    from .render import warm as render
    from .render.common import lock_wait_notice

    job = WarmJob(specs=apply_revision(repos, revision, with_lock=bool(lock_file)), kind=kind, include=include,
                  exclude=exclude, repo_type=repo_type, lock_file=lock_file, manifest=manifest, locked=locked,
                  trust_manifest_endpoint=trust_manifest_endpoint, cache_dir=cache_dir, hub=hub,
                  lock_timeout=lock_timeout)
    with render.WarmProgress(as_json=as_json, quiet=quiet) as progress:
        report = run(job, progress=progress, on_lock_wait=None if quiet else lock_wait_notice, on_notice=token_notice)
    render.show_warm_report(report, as_json=as_json, quiet=quiet)
    sys.exit(report.exit_code)


@click.command()
@click.argument("upgrade_ids", nargs=-1, metavar="[REPO_ID]...")
@click.option("--manifest", type=click.Path(dir_okay=False),
              help="Manifest [default: ./hfcache.toml, or ./pyproject.toml with [tool.hfcache]].")
@click.option("--output", "output_file", type=click.Path(dir_okay=False),
              help="Lock file to write [default: hfcache.lock beside the manifest].")
@click.option("--upgrade", is_flag=True,
              help="Re-resolve the REPO_IDs given (all entries when none) even if their entry did not change.")
@click.option("--check", is_flag=True, help="Only check that the lock matches the manifest (no network); exit 1 "
              "when it does not.")
@trust_manifest_endpoint_option
@hub_options
def lock(upgrade_ids, manifest, output_file, upgrade, check, trust_manifest_endpoint, hub, as_json) -> None:
    """Resolve the manifest to exact commits and write hfcache.lock (sizes and hashes of every file).

    An existing lock keeps its commits for entries that did not change, unless --upgrade names them.

    \b
    Examples:
      hfcache lock
      hfcache lock --upgrade bert-base-uncased
      hfcache lock --check
    """
    from ..errors import CheckFailed
    from .render import common
    from .render import warm as render

    if upgrade_ids and not upgrade:
        raise UsageError("REPO_ID arguments go with --upgrade", hint="hfcache lock --upgrade REPO_ID...")
    if check:
        from ..warming.project import check_lock

        status = check_lock(manifest, output_file)
        render.show_lock_check(status, as_json=as_json)
        if not status.ok:
            if as_json:
                sys.exit(CheckFailed.exit_code)
            raise status.error()
        return
    from ..warming.pin import lock_project

    with common.stderr.status("resolving manifest entries", spinner="dots") if not as_json \
            else contextlib.nullcontext():
        run = lock_project(manifest, lock_path=output_file, upgrade=upgrade, upgrade_ids=upgrade_ids, hub=hub,
                           trust_manifest_endpoint=trust_manifest_endpoint, on_notice=token_notice)
    render.show_pin_result(run.result, run.lock_path, run.written, as_json=as_json)
    if run.result.failures:
        sys.exit(run.result.failures[0].exit_code)
