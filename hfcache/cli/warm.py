"""``hfcache warm`` and ``hfcache lock``: parse, call :mod:`hfcache.warming` (install, orchestrate, pin),
render (:mod:`hfcache.cli.render.warm`)."""

from __future__ import annotations

import contextlib
import sys

import click

from .options import cache_dir_option as _cache_dir_option
from .options import common_hub_options as _common_hub_options
from .options import lock_timeout_option as _lock_timeout_option
from .options import apply_revision as _apply_revision
from .options import read_token as _read_token
from .options import revision_option as _revision_option
from .options import token_notice as _token_notice
from .options import trust_manifest_endpoint_option as _trust_manifest_endpoint_option
from ..errors import UsageError


@click.command()
@click.argument("repos", nargs=-1, metavar="REPO_ID[@REVISION]...")
@_cache_dir_option()
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
@_trust_manifest_endpoint_option
@_common_hub_options
@_lock_timeout_option
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary; errors only.")
@_revision_option
def warm(repos, cache_dir, kind, include, exclude, repo_type, lock_file, locked, manifest, trust_manifest_endpoint,
         endpoints, token, token_file, max_workers, timeout, retries, lock_timeout, as_json, quiet, revision) -> None:
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
    from .render import warm as render
    from .render.common import lock_wait_notice

    repos = _apply_revision(repos, revision, with_lock=bool(lock_file))
    resolved_token = _read_token(token, token_file)
    if lock_file:
        if repos:
            raise UsageError("give REPO_ID arguments or --lock, not both",
                             hint="add the repos to the manifest and run `hfcache lock`, or drop --lock")
        from ..warming.install import warm_lock
        from ..warming.project import resolve_install

        target = resolve_install(lock_file, manifest=manifest, locked=locked, cache_dir=cache_dir, endpoint=endpoints,
                                 trust_manifest_endpoint=trust_manifest_endpoint)
        drifted = target.drift_warning(lock_file)
        _refuse_misplaced(target.cache_dir)
        with _progress(render, [r.request for r in target.lock.repos], target.cache_dir, as_json=as_json,
                       quiet=quiet, lock=target.lock) as progress:
            report = warm_lock(target.lock, cache_dir=target.cache_dir, endpoint=target.endpoint, token=resolved_token,
                               max_workers=max_workers, timeout=timeout, progress=progress, retries=retries,
                               lock_timeout=lock_timeout, on_lock_wait=None if quiet else lock_wait_notice,
                               withheld=target.withheld, on_notice=_token_notice)
    else:
        if locked or manifest or trust_manifest_endpoint:
            raise UsageError("--locked, --manifest and --trust-manifest-endpoint go with --lock",
                             hint="add --lock hfcache.lock")
        if not repos:
            raise UsageError("nothing to warm", hint="give REPO_ID arguments or --lock FILE")
        drifted = None
        from ..records import WarmRequest

        requests = [
            WarmRequest.parse(spec, repo_type=repo_type, kind=kind, include=tuple(include), exclude=tuple(exclude))
            for spec in repos
        ]
        from ..hub.session import prepare_session

        prepare_session()  # the HTTP client is made while hfcache.warming.orchestrate imports (hub/session.py)
        from ..warming.orchestrate import warm as warm_repos

        _refuse_misplaced(cache_dir)
        with _progress(render, requests, cache_dir, as_json=as_json, quiet=quiet) as progress:
            report = warm_repos(requests, cache_dir=cache_dir, endpoint=list(endpoints) or None, token=resolved_token,
                                max_workers=max_workers, timeout=timeout, progress=progress, retries=retries,
                                lock_timeout=lock_timeout, on_lock_wait=None if quiet else lock_wait_notice)
    report, warnings = _with_warnings(report, drifted)
    render.show_warm_report(report, as_json=as_json, quiet=quiet, warnings=warnings)
    sys.exit(report.exit_code)


def _refuse_misplaced(cache_dir) -> None:
    """An HF_HOME (or a repo folder) given as the cache is exit 5 naming the cache meant (cache/root.py)."""
    from ..cache.root import refuse_misplaced_cache, resolve_cache_dir

    refuse_misplaced_cache(resolve_cache_dir(cache_dir))


@contextlib.contextmanager
def _progress(render, requests, cache_dir, *, as_json: bool, quiet: bool, lock=None):
    """warm's progress display (:class:`render.WarmProgress`, bars only on a terminal) around the warm; on Ctrl-C or
    SIGTERM, once the bars are gone, the summary of what finished and what was ``interrupted`` (the table on stdout,
    or with ``--json`` the report document, exit_code 130; not with ``-q``, nor when no repo had finished), then the
    interrupt goes on to the CLI's one error line and exit 130/143. ``lock``: ``warm --lock``'s Lockfile, whose
    repos the cache already held were never started (they are rows as ``warm --lock`` reports them, not
    interrupted). ``requests``: WarmRequests in order."""
    import time

    started = time.monotonic()
    progress = render.WarmProgress(len(requests), enabled=not (as_json or quiet))
    try:
        with progress:
            yield progress
    except KeyboardInterrupt:
        if not quiet:
            with contextlib.suppress(Exception):  # the summary is a courtesy: the interrupt itself must go on
                _show_interrupted(render, requests, cache_dir, progress, time.monotonic() - started, as_json,
                                  lock)
        raise


def _show_interrupted(render, requests, cache_dir, progress, seconds: float, as_json: bool, lock) -> None:
    """Print the summary of an interrupted warm (:func:`_progress`), unless stdout's reader is not reading (a write
    would wait: the exit must not)."""
    import select

    from ..cache.root import resolve_cache_dir

    if not select.select([], [1], [], 0)[1]:
        return
    root = resolve_cache_dir(cache_dir)
    finished = list(progress.finished.values())
    if lock is not None:  # the repos warm --lock found complete in the cache: never started, so not in `finished`
        from ..warming.lockfile import cache_statuses
        from ..records import WarmedFile, RepoResult

        done = {r.request for r in finished}
        finished += [RepoResult(request=s.repo.request, endpoint=None, canonical_id=s.repo.canonical_id,
                                commit_hash=s.repo.commit_hash, metadata="lock",
                                files=tuple(WarmedFile(f.path, f.size, f.hash, "cached") for f in s.repo.files))
                     for s in cache_statuses(lock, root) if s.satisfied and s.repo.request not in done]
    if not finished:  # nothing ended before the stop: the CLI's one "interrupted" line says it all
        return
    report = render.interrupted_report(requests, finished, cache_dir=str(root), seconds=seconds)
    render.show_warm_report(report, as_json=as_json, quiet=False)


def _with_warnings(report, drifted: str | None):
    """``report`` with each repo's selection notes added (:func:`hfcache.warming.selection.selection_notes`: a
    ``--kind model`` without weights, an ``--include`` that matched nothing), and the run's own warnings: a lock
    that drifted from its manifest, a root umask that leaves the cache unreadable by other users."""
    import dataclasses
    import os

    warnings: list[str] = [drifted] if drifted else []
    repos = []
    for r in report.repos:
        req = r.request
        if r.ok and (req.kind == "model" or req.include):
            from ..warming.selection import selection_notes

            r = dataclasses.replace(r, notes=r.notes + selection_notes(req.kind, req.include, req.exclude,
                                                                       [f.path for f in r.files]))
        repos.append(r)
    mask = _umask()
    if os.geteuid() == 0 and mask & 0o044 and report.bytes_downloaded:
        warnings.append(f"umask {mask:04o}: what this warm wrote into {report.cache_dir} is unreadable by other users "
                        "(a pod's non-root uid cannot load it); warm under `umask 022`, or fix it now: "
                        f"chmod -R a+rX {report.cache_dir}")
    return dataclasses.replace(report, repos=tuple(repos)), tuple(warnings)


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
@_trust_manifest_endpoint_option
@_common_hub_options
def lock(upgrade_ids, manifest, output_file, upgrade, check, trust_manifest_endpoint, endpoints, token, token_file,
         max_workers, timeout, retries, as_json) -> None:
    """Resolve the manifest to exact commits and write hfcache.lock (sizes and hashes of every file).

    An existing lock keeps its commits for entries that did not change, unless --upgrade names them.

    \b
    Examples:
      hfcache lock
      hfcache lock --upgrade bert-base-uncased
      hfcache lock --check
    """
    from ..errors import CheckFailed
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

    resolved_token = _read_token(token, token_file)
    spinner = render.stderr.status("resolving manifest entries", spinner="dots")
    with spinner if not as_json else contextlib.nullcontext():
        run = lock_project(manifest, lock_path=output_file, upgrade=upgrade, upgrade_ids=upgrade_ids,
                           endpoint=endpoints, token=resolved_token, timeout=timeout, max_workers=max_workers,
                           retries=retries, trust_manifest_endpoint=trust_manifest_endpoint,
                           on_notice=_token_notice)
    render.show_pin_result(run.result, run.lock_path, run.written, as_json=as_json)
    if run.result.failures:
        sys.exit(run.result.failures[0].exit_code)


def _umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``, Linux 4.7+); else by setting it
    back at once (no other thread writes files now: the warm is over)."""
    import os

    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

