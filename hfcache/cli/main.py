"""The ``hfcache`` command: parse arguments, call one core function, render, exit.

Exit codes (README "Exit codes"): 0 ok; 1 a check failed; 2 usage or bad input; 3 Hub or network;
4 offline violation; 5 cache or filesystem; 70 internal error (a bug: please report it); 130 interrupted;
``exec``: 126/127 command not executable/not found, else the command's own status.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

import click

from .._version import __version__
from .options import lock_timeout_option as _lock_timeout_option
from .options import parsed as _parsed
from .stdout import GuardedStdout, abandon_if_blocked
from ..errors import HfcacheError, UsageError

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process killed by SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (``docker stop``, the kubelet) arrived: handled exactly like Ctrl-C, exit 143."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _read_token(token: str | None, token_file: str | None, option: str = "--token-file") -> str | bool | None:
    """The token to send: --token, else --token-file, else None (huggingface_hub's own lookup: HF_TOKEN, file).
    ``option`` names the file's option in errors."""
    if token and token_file:
        raise UsageError("--token and --token-file are mutually exclusive", hint="give one of them")
    if token_file:
        try:
            value = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"cannot read {option} {token_file}: {exc.strerror}",
                             hint="give a readable file holding the token") from None
        if not value:
            raise UsageError(f"{option} {token_file} is empty", hint="write the token into it, or drop the option")
        return value
    return token or None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hfcache")
def cli() -> None:
    """Provision Hugging Face tokenizer and model caches for images, volumes and clusters."""


def _cache_dir_option(what: str = "Cache root"):
    return click.option("--cache-dir", type=click.Path(file_okay=False),
                        help=f"{what} [default: HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub].")


def _common_hub_options(fn):
    for decorator in reversed([
        click.option("--endpoint", "endpoints", metavar="URL", multiple=True,
                     help="Hub endpoint; repeat to give fallbacks, tried in order per repo (an in-cluster mirror "
                          "first) [default: the manifest's, HF_ENDPOINT or https://huggingface.co]."),
        click.option("--token", metavar="TOKEN", help="Hub token (visible in `ps`; prefer --token-file or HF_TOKEN)."),
        click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the Hub token."),
        click.option("--max-workers", type=click.IntRange(min=1), default=8, show_default=True,
                     help="Connections to the endpoint at once (repo resolutions, files, ranges of large files)."),
        click.option("--timeout", metavar="SECONDS", default="10", show_default=True, callback=_parsed("parse_timeout"),
                     help="Seconds to wait for a connection or for any byte of an answer."),
        click.option("--retries", type=click.IntRange(min=0), default=5, show_default=True,
                     help="Retries of a 429, 502, 503, 504 or cut connection, per request or file (exponential "
                          "backoff with jitter; Retry-After honoured)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; no progress."),
    ]):
        fn = decorator(fn)
    return fn


@cli.command()
@click.argument("repos", nargs=-1, metavar="REPO_ID[@REVISION]...")
@_cache_dir_option()
@click.option("--kind", type=click.Choice(["tokenizer", "model", "all"]), default="tokenizer", show_default=True,
              help="tokenizer: tokenizer files + config.json; model: + configs and weights in one format; "
                   "all: the whole repo.")
@click.option("--include", multiple=True, metavar="GLOB", help="Also fetch files matching GLOB (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Never fetch files matching GLOB (repeatable).")
@click.option("--repo-type", type=click.Choice(["model", "dataset"]), default="model", show_default=True)
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Install exactly this lock (no REPO_ID arguments then).")
@click.option("--locked", is_flag=True, help="With --lock: fail (exit 1) if the manifest and the lock disagree.")
@click.option("--manifest", type=click.Path(dir_okay=False),
              help="With --lock: the manifest [default: hfcache.toml or pyproject.toml beside the lock].")
@_common_hub_options
@_lock_timeout_option
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary; errors only.")
def warm(repos, cache_dir, kind, include, exclude, repo_type, lock_file, locked, manifest, endpoints, token,
         token_file, max_workers, timeout, retries, lock_timeout, as_json, quiet) -> None:
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

    resolved_token = _read_token(token, token_file)
    if lock_file:
        if repos:
            raise UsageError("give REPO_ID arguments or --lock, not both",
                             hint="add the repos to the manifest and run `hfcache lock`, or drop --lock")
        from ..warming.install import warm_lock
        from ..warming.project import resolve_install

        target = resolve_install(lock_file, manifest=manifest, locked=locked, cache_dir=cache_dir, endpoint=endpoints)
        with render.WarmProgress(len(target.lock.repos), enabled=not (as_json or quiet)) as progress:
            report = warm_lock(target.lock, cache_dir=target.cache_dir, endpoint=target.endpoint, token=resolved_token,
                               max_workers=max_workers, timeout=timeout, progress=progress, retries=retries,
                               lock_timeout=lock_timeout, on_lock_wait=None if quiet else lock_wait_notice)
    else:
        if locked or manifest:
            raise UsageError("--locked and --manifest go with --lock", hint="add --lock hfcache.lock")
        if not repos:
            raise UsageError("nothing to warm", hint="give REPO_ID arguments or --lock FILE")
        from ..records import WarmRequest

        requests = [
            WarmRequest.parse(spec, repo_type=repo_type, kind=kind, include=tuple(include), exclude=tuple(exclude))
            for spec in repos
        ]
        from ..hub.session import prepare_session

        prepare_session()  # the HTTP client is made while hfcache.warming.orchestrate imports (hub/session.py)
        from ..warming.orchestrate import warm as warm_repos

        with render.WarmProgress(len(requests), enabled=not (as_json or quiet)) as progress:
            report = warm_repos(requests, cache_dir=cache_dir, endpoint=list(endpoints) or None, token=resolved_token,
                                max_workers=max_workers, timeout=timeout, progress=progress, retries=retries,
                                lock_timeout=lock_timeout, on_lock_wait=None if quiet else lock_wait_notice)
    render.show_warm_report(report, as_json=as_json, quiet=quiet)
    sys.exit(report.exit_code)


@cli.command()
@click.argument("upgrade_ids", nargs=-1, metavar="[REPO_ID]...")
@click.option("--manifest", type=click.Path(dir_okay=False),
              help="Manifest [default: ./hfcache.toml, or ./pyproject.toml with [tool.hfcache]].")
@click.option("--output", "output_file", type=click.Path(dir_okay=False),
              help="Lock file to write [default: hfcache.lock beside the manifest].")
@click.option("--upgrade", is_flag=True,
              help="Re-resolve the REPO_IDs given (all entries when none) even if their entry did not change.")
@click.option("--check", is_flag=True, help="Only check that the lock matches the manifest (no network); exit 1 "
              "when it does not.")
@_common_hub_options
def lock(upgrade_ids, manifest, output_file, upgrade, check, endpoints, token, token_file, max_workers, timeout,
         retries, as_json) -> None:
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
                           retries=retries)
    render.show_pin_result(run.result, run.lock_path, run.written, as_json=as_json)
    if run.result.failures:
        sys.exit(run.result.failures[0].exit_code)


@cli.command(name="ls")
@click.argument("repo_ids", nargs=-1, metavar="[REPO_ID]...")
@_cache_dir_option()
@click.option("--revisions", is_flag=True, help="One row per revision instead of per repo.")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False, exists=False),
              help="Mark the revisions this lock pins (cache: --cache-dir, else the lock's manifest's).")
@click.option("--sort", type=click.Choice(["name", "size", "last-used"]), default="name", show_default=True,
              help="name: A-Z; size: largest first; last-used: most recent first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def ls_command(repo_ids, cache_dir, revisions, lock_file, sort, as_json) -> None:
    """List what a cache holds: repos, refs, files, size, last use, pins and health.

    Reads metadata only (no hashing, no writes). Damaged repos are listed with what is wrong, never hidden.
    """
    import gc

    from ..warming.lockfile import pinned_revisions, read_lock
    from ..warming.project import reading_cache_dir
    from .render import ls as render
    from ..cache.scan import scan_cache, stream_repos

    pinned = pinned_revisions(read_lock(lock_file)) if lock_file else None
    root = reading_cache_dir(cache_dir, lock_file)
    gc.disable()  # a short-lived process building one large document: the cyclic collector only costs time
    wanted = set(repo_ids) if repo_ids else None
    summaries = (stream_repos(Path(root), functools.partial(render.repo_summary, pinned=pinned), wanted)
                 if as_json and sort == "name" else None)
    if summaries is not None:  # a large cache: one repo at a time, never the whole document in memory
        try:
            unreadable = render.stream_ls_json(str(Path(root)), summaries, sys.stdout)
        finally:
            summaries.close()  # on Ctrl-C too: the scan's worker processes end now (scan.stream_repos)
        sys.exit(1 if unreadable else 0)
    info = scan_cache(root, wanted)
    render.show_ls(info, pinned, sort=sort, revisions=revisions, as_json=as_json)
    sys.exit(1 if any(r.unreadable for r in info.repos) else 0)  # health: a repo this user cannot read


@cli.command()
@click.argument("repo_ids", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@_cache_dir_option()
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Expected files, sizes and hashes [default: blob names and trees/ listings] (cache: --cache-dir, "
                   "else the lock's manifest's).")
@click.option("--repair", "do_repair", is_flag=True,
              help="Fix what is broken (re-download from the endpoint, rewrite refs and links), then verify again.")
@click.option("--fast", is_flag=True,
              help="Skip blobs unchanged (inode, size, mtime, ctime) since an earlier --fast run hashed them right, "
                   "and record this run's in .locks/ [default: hash every blob, write nothing].")
@_common_hub_options
@_lock_timeout_option
def verify(repo_ids, cache_dir, lock_file, do_repair, fast, endpoints, token, token_file, max_workers, timeout,
           retries, lock_timeout, as_json) -> None:
    """Check a cache's integrity offline: every blob's hash, links, refs, and the lock's files.

    Without --repair it makes no network request. Exit 1 when any integrity problem remains.
    """
    from ..warming.lockfile import read_lock
    from ..warming.project import reading_cache_dir
    from .render import verify as render

    lock = read_lock(lock_file) if lock_file else None
    root = reading_cache_dir(cache_dir, lock_file)
    if do_repair:
        from .render.common import lock_wait_notice
        from ..integrity.repair import verify_and_repair

        def client():  # repair downloads from the first endpoint given (fallbacks are a warm feature)
            from ..hub.client import HubClient
            from ..warming.orchestrate import resolve_token

            return HubClient(endpoint=endpoints[0] if endpoints else None,
                             token=resolve_token(_read_token(token, token_file)), timeout=timeout, retries=retries)

        run = verify_and_repair(root, repo_ids or None, client_factory=client, lock=lock, max_workers=max_workers,
                                fast=fast, lock_timeout=lock_timeout, on_lock_wait=lock_wait_notice,
                                progress=lambda: render.HashProgress(enabled=not as_json))
        report, actions, before = run.report, run.actions, run.before
    else:
        from ..integrity.verify import verify_cache

        with render.HashProgress(enabled=not as_json) as progress:
            report = verify_cache(root, repo_ids or None, lock=lock, max_workers=max_workers, progress=progress,
                                  fast=fast)
        actions, before = (), None
    render.show_verify(report, actions, before, as_json=as_json)
    sys.exit(report.exit_code)


@cli.command()
@click.argument("repo_ids", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@_cache_dir_option()
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Check the lock's tokenizers, by the ids and revisions of its manifest (cache: --cache-dir, else "
                   "the lock's manifest's).")
@click.option("--text", default=None, help="Probe text to encode [default: a mixed English/Chinese sentence].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def check(repo_ids, cache_dir, lock_file, text, as_json) -> None:
    """Prove each tokenizer loads offline: AutoTokenizer in a child with no network, encoding a probe text.

    Without arguments: every cached revision with a tokenizer (by ref, or by commit when no ref points to it). A repo
    whose auto_map names custom code loads with trust_remote_code=True. On failure it names the missing piece
    (config.json and its .no_exist marker, a Python package, custom code, a chat template, a ref). Exit 1 if any
    tokenizer fails.
    """
    from ..integrity.check import DEFAULT_TEXT, check_tokenizers, select_targets, targets_from_cache, targets_from_lock
    from ..warming.lockfile import read_lock
    from ..warming.project import reading_cache_dir
    from .render import verify as render

    root = reading_cache_dir(cache_dir, lock_file)
    if lock_file:
        targets = select_targets(targets_from_lock(read_lock(lock_file)), repo_ids)
    else:
        targets = targets_from_cache(root, repo_ids)
    if not targets:
        raise UsageError("no tokenizer to check", hint="warm one first, or name REPO_IDs / --lock")
    with render.stderr.status(f"loading {len(targets)} tokenizer(s) offline", spinner="dots") \
            if not as_json else contextlib.nullcontext():
        report = check_tokenizers(root, targets, text or DEFAULT_TEXT)
    render.show_check(report, as_json=as_json)
    sys.exit(report.exit_code)


def _parse_chown(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    uid, sep, gid = value.partition(":")
    if not (uid.isdigit() and sep and gid.isdigit()):
        raise UsageError(f"--chown {value!r}: expected numeric UID:GID",
                         hint="e.g. --chown 1000:1000 (`id -u`:`id -g`)")
    return int(uid), int(gid)


@cli.command(name="export")
@click.argument("dest")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), help="Export exactly what this lock pins.")
@_cache_dir_option("Source cache")
@click.option("--materialize", is_flag=True, help="Real files in snapshots/ (hardlinks of the blobs), no symlinks.")
@click.option("--format", "fmt", type=click.Choice(["dir", "tar"]), default=None,
              help="dir: a new cache directory; tar: a reproducible tar [default: tar for '-' or *.tar, else dir].")
@click.option("--chown", metavar="UID:GID", help="Owner of every entry (tar header, or lchown for dir).")
@click.option("--group-writable", is_flag=True, help="Modes 0775/0664 instead of 0755/0644.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (not with DEST '-').")
def export_command(dest, specs, lock_file, cache_dir, materialize, fmt, chown, group_writable, as_json) -> None:
    """Copy a cache (or the repos/lock given) to DEST: a new cache directory or a reproducible tar ('-': stdout).

    Links stay relative (relocatable), each distinct blob is stored once (hardlinks), every blob is hashed on the
    way; the same content always gives a byte-identical tar (a stable Docker layer digest).
    """
    from ..move.export import plan_export, write_dir, write_tar
    from ..warming.lockfile import read_lock
    from ..warming.project import reading_cache_dir
    from .render import transfer as render

    fmt = fmt or ("tar" if dest == "-" or dest.endswith(".tar") else "dir")
    if dest == "-" and fmt != "tar":
        raise UsageError("DEST '-' (stdout) needs --format tar", hint="add --format tar")
    if dest == "-" and as_json:
        raise UsageError("--json cannot share stdout with the tar stream",
                         hint="drop --json, or write the tar to a file")
    owner = _parse_chown(chown)
    root = reading_cache_dir(cache_dir, lock_file)
    plan = plan_export(root, specs, lock=read_lock(lock_file) if lock_file else None, materialize=materialize)
    digest = None
    if fmt == "tar":
        if dest == "-":
            digest = write_tar(plan, sys.stdout.buffer, chown=owner or (0, 0), group_writable=group_writable)
        else:
            from ..cache.layout import atomic_output

            with atomic_output(Path(dest)) as out:
                digest = write_tar(plan, out, chown=owner or (0, 0), group_writable=group_writable)
    else:
        write_dir(plan, Path(dest), chown=owner, group_writable=group_writable)
    render.show_export(plan, dest, fmt, digest, as_json=as_json)


@cli.command(name="import")
@click.argument("src")
@_cache_dir_option("Target cache")
@click.option("--move-refs", is_flag=True,
              help="Move a ref the target has at another commit to the source's commit (default: refuse).")
@_lock_timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def import_command(src, cache_dir, move_refs, lock_timeout, as_json) -> None:
    """Merge an exported cache (directory, tar, or '-' for a tar on stdin) into the cache, verified first.

    Refuses absolute or '..' paths, links leaving the cache, devices, sparse files, content that does not match its
    hash, and any entry the target already holds with other content (exit 1); then nothing is written.
    """
    from ..cache.layout import resolve_cache_dir
    from ..move.importer import import_cache
    from .render import transfer as render
    from .render.common import lock_wait_notice

    report = import_cache(src, resolve_cache_dir(cache_dir), move_refs=move_refs, lock_timeout=lock_timeout,
                          on_lock_wait=lock_wait_notice)
    render.show_import(report, as_json=as_json)


@cli.command(name="link")
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("dest", type=click.Path())
@click.option("--mode", type=click.Choice(["symlink", "hardlink", "copy"]), default="symlink", show_default=True,
              help="symlink: DEST -> SRC; hardlink: per-file hardlinks (same filesystem, no extra bytes); copy.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def link_command(src, dest, mode, as_json) -> None:
    """Make the cache at DEST use the cache at SRC (e.g. the runtime user's default path, or a volume mount)."""
    from ..move.link import link_cache
    from .render import transfer as render

    report = link_cache(Path(src), Path(dest), mode)
    render.show_link(report, as_json=as_json)


@cli.command()
@_cache_dir_option()
@click.option("--older-than", metavar="DURATION", callback=_parsed("parse_duration"),
              help="Remove unpinned revisions not used for longer than this: 45s, 90m, 12h, 30d, 2w.")
@click.option("--max-size", metavar="SIZE", callback=_parsed("parse_size"),
              help="Then remove least-recently-used unpinned revisions until the cache is at most SIZE: "
                   "50GB, 1.5G (powers of 1000), 500MiB, 20Gi (powers of 1024), or bytes.")
@click.option("--keep-lock", "keep_locks", multiple=True, type=click.Path(dir_okay=False),
              help="Never remove a revision this hfcache.lock pins (repeatable).")
@click.option("--keep", multiple=True, metavar="REPO_ID[@REVISION]",
              help="Never remove this repo's revisions, or the one a ref or commit names (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the plan; remove nothing.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (cron jobs, CI).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (needs --yes or --dry-run).")
@_lock_timeout_option
def prune(cache_dir, older_than, max_size, keep_locks, keep, dry_run, yes, as_json, lock_timeout) -> None:
    """Remove what a cache no longer needs, never what is pinned or being downloaded.

    In order: detached revisions (no ref; unused for an hour); revisions unused for longer than --older-than; then
    least-recently-used revisions until the cache fits --max-size. Also blobs no snapshot uses, .incomplete files older than an hour
    whose download is dead, .locks files of removed blobs, and empty repo folders. Safe while `hfcache warm` runs.

    \b
    Examples:
      hfcache prune --dry-run
      hfcache prune --older-than 30d --max-size 50GB --keep-lock hfcache.lock --yes
    """
    from ..prune import execute, plan_prune
    from .render import prune as render
    from .render.common import lock_wait_notice

    if as_json and not (yes or dry_run):
        raise UsageError("--json needs --yes or --dry-run", hint="machines cannot answer the confirmation prompt")
    if not (yes or dry_run) and not sys.stdin.isatty():
        raise UsageError("no terminal to ask for confirmation", hint="pass --yes (cron jobs, CI) or --dry-run")
    plan = plan_prune(cache_dir, older_than=older_than, max_size=max_size, keep=keep, keep_locks=keep_locks)
    if dry_run:
        render.show_prune(plan, as_json=as_json, dry_run=True)
        sys.exit(5 if plan.unreadable else 0)  # a repo it cannot read: a filesystem problem to fix
    asked = bool(plan.items) and not yes
    if asked:
        render.show_prune(plan, as_json=False, dry_run=False)
        if not click.confirm(render.prune_question(plan), default=False, err=True):
            render.stderr.print("nothing removed")
            return
    with render.PruneProgress(len(plan.items), enabled=not as_json and bool(plan.items)) as progress:
        result = execute(plan, on_item=progress.advance, lock_timeout=lock_timeout,
                         on_lock_wait=lock_wait_notice)
    render.show_prune(plan, result, as_json=as_json, dry_run=False, tables=not asked)
    sys.exit(result.exit_code)


@cli.command()
@_cache_dir_option("Hub cache to serve")
@click.option("--repos", "repos_dir", type=click.Path(file_okay=False),
              help="Serve a directory of plain repo folders (<org>/<name>/...) instead of a cache.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (0.0.0.0 to accept connections from other hosts, e.g. in a pod).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port (0: any free port).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Require 'Authorization: Bearer TOKEN' with the token in this file (401 otherwise).")
@click.option("--access-log", metavar="FILE",
              help="Append one line per request (time, method, path, status, bytes, seconds) to FILE; '-': stdout.")
@click.option("--upstream", "upstreams", multiple=True, metavar="URL",
              help="Pull through: fetch what the cache lacks from this Hub endpoint, verified, and keep it "
                   "(repeatable: tried in order).")
@click.option("--upstream-token-file", type=click.Path(dir_okay=False),
              help="Token sent to the upstreams only (never logged, never answered). Default: none.")
@click.option("--allow", multiple=True, metavar="REPO_GLOB",
              help="Only pull through repos whose id matches (fnmatch, repeatable); others get 403. Default: all.")
@click.option("--max-size", metavar="SIZE", callback=_parsed("parse_size"),
              help="Prune least-recently-served revisions to keep the cache at most SIZE (50GB, 20GiB, ...).")
@click.option("--revalidate", metavar="DURATION", callback=_parsed("parse_duration"),
              help="Ask upstream again for a branch or tag at most this often [default: 5m].")
def serve(cache_dir, repos_dir, host, port, token_file, access_log, upstreams, upstream_token_file, allow,
          max_size, revalidate) -> None:
    """Serve a cache as a Hub mirror (HF_ENDPOINT / --endpoint for every pod); with --upstream, pull through.

    It answers what the cache holds, at its commits and refs, including what its .no_exist markers know is
    absent; unmodified huggingface_hub and transformers clients download from it. With --upstream, what the
    cache lacks is fetched with warm's code path (hash-checked before anyone sees it), kept, then answered;
    when upstream is down, the cache is still served. GET /metrics is Prometheus text; GET /healthz says
    whether upstream answers. Runs until SIGTERM or Ctrl-C, then lets downloads in flight finish (up to 20 s).

    \b
    Examples:
      hfcache serve --cache-dir /data/hf-cache
      hfcache serve --cache-dir /data/hf-cache --host 0.0.0.0 --token-file /run/secrets/mirror-token
      hfcache serve --cache-dir /data/hf-cache --upstream https://huggingface.co \\
          --upstream-token-file /run/secrets/hf-token --allow 'google-bert/*' --max-size 200GB
    """
    from .render import offline as render
    from ..serve.mirror import serve as serve_mirror
    from ..serve.pullthrough import DEFAULT_REVALIDATE, PullThroughConfig

    token = _read_token(None, token_file) if token_file else None
    upstream = None
    if upstreams:
        upstream_token = _read_token(None, upstream_token_file, "--upstream-token-file") if upstream_token_file else None
        upstream = PullThroughConfig(upstreams=tuple(upstreams), token=upstream_token or None, allow=tuple(allow),
                                     revalidate=DEFAULT_REVALIDATE if revalidate is None else revalidate,
                                     max_size=max_size)
    elif upstream_token_file or allow or max_size is not None or revalidate is not None:
        raise UsageError("--upstream-token-file, --allow, --max-size and --revalidate need --upstream",
                         hint="add --upstream URL (e.g. https://huggingface.co) to pull through")
    run = serve_mirror(cache_dir=cache_dir, repos_dir=repos_dir, host=host, port=port, token=token,
                       access_log=access_log, ready=render.show_mirror_ready, upstream=upstream)
    render.show_mirror_stopped(run)


@cli.command(name="env")
@_cache_dir_option()
@click.option("--format", "fmt", type=click.Choice(["sh", "dotenv", "dockerfile", "k8s", "json"]), default="sh",
              show_default=True, help="sh: export lines; dotenv: NAME=value; dockerfile: one ENV instruction; "
              "k8s: a container env: list; json: one object.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (same as --format json).")
def env_command(cache_dir, fmt, as_json) -> None:
    """Print the variables that make a process use only the cache (offline, no telemetry, no token lookups).

    \b
    Examples:
      eval "$(hfcache env --cache-dir /opt/hf-cache)"
      hfcache env --cache-dir /opt/hf-cache --format dockerfile >> Dockerfile
      hfcache env --cache-dir /opt/hf-cache --format k8s
    """
    from ..offline.env import format_env, offline_environment
    from .render import offline as render

    render.show_env(format_env(offline_environment(cache_dir), "json" if as_json else fmt))


@cli.command(name="exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache root [default: the lock's manifest, "
              "HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub].")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Refuse to start (exit 4) unless the cache holds this lock (sizes only: milliseconds).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST[:PORT]",
              help="Let Python children connect to this host (repeatable); everything else fails at once.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def exec_cmd(cache_dir, lock_file, allow_hosts, command) -> None:
    """Run COMMAND offline: with the variables of `hfcache env` and, for Python, a network guard.

    The guard (a sitecustomize on PYTHONPATH, chained to any existing one) makes every connection or DNS lookup
    to a host not allowed fail at once with a message, instead of hanging. hfcache replaces itself with COMMAND
    (exec): signals reach it directly and its exit status is hfcache's.

    \b
    Examples:
      hfcache exec --cache-dir /opt/hf-cache -- python serve.py
      hfcache exec --lock hfcache.lock --allow-host redis:6379 -- gunicorn app:app
    """
    from ..offline.env import exec_command, prepare_exec

    if command and command[0].startswith("-"):  # ignore_unknown_options passes a mistyped option on as the command
        raise UsageError(f"no such option: {command[0]}", hint="see `hfcache exec --help`; put the command after --")
    exec_command(prepare_exec(command, cache_dir=cache_dir, lock=lock_file, allow_hosts=allow_hosts))


@cli.command(name="doctor")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Cache to examine [default: the one "
              "huggingface_hub would use here].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def doctor_command(cache_dir, as_json) -> None:
    """Diagnose this environment's Hugging Face settings and cache: which cache, offline or not, conflicts,
    permissions and owner, read-only filesystem, symlinks, free space, versions. Exit 1 if any error.
    """
    from ..offline.doctor import doctor
    from .render import offline as render

    report = doctor(cache_dir)
    render.show_doctor(report, as_json=as_json)
    sys.exit(report.exit_code)




def _register_oci() -> None:
    from .oci import pull_command, push_command

    cli.add_command(push_command)
    cli.add_command(pull_command)


_register_oci()


def _fail(message: str, hint: str | None, exit_code: int, as_json: bool) -> None:
    """Report a command-level error: one or two lines on stderr, and with --json also one JSON document."""
    from .render.common import print_error, print_json

    print_error(message, hint)
    if as_json and not getattr(sys.stdout, "started", False):  # never a second document after a begun one
        print_json({"ok": False, "error": message, "hint": hint, "exit_code": exit_code})
    sys.exit(exit_code)


def _command_path(args: list[str]) -> str:
    """``hfcache CMD`` for the first argument naming a command, else ``hfcache``."""
    name = next((a for a in args if not a.startswith("-")), None)
    return f"hfcache {name}" if name in cli.commands else "hfcache"


def _usage_hint(exit_code: int, hint: str | None, args: list[str]) -> str | None:
    """Every usage error (exit 2) gets a hint line: its own, else where the command's usage is explained."""
    if hint or exit_code != UsageError.exit_code:
        return hint
    return f"see `{_command_path(args)} --help`"


def _interrupted(code: int, as_json: bool) -> None:
    """Ctrl-C (exit 130) or SIGTERM (exit 143): the error line (and with --json the error document), then exit at
    once (:func:`_exit_now`)."""
    from .render.common import print_error, print_json

    message = "terminated" if code == EXIT_TERMINATED else "interrupted"
    hint = "run the command again; what was interrupted was not published (partial downloads resume)"
    abandoned = abandon_if_blocked(sys.stdout)  # a reader that does not read must not hold the exit up
    with contextlib.suppress(BaseException):  # an output that fails now (a reader gone) changes nothing
        print_error(message, hint)
        if as_json and not abandoned:
            print_json({"ok": False, "error": message, "hint": hint, "exit_code": code})
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit at once after Ctrl-C/SIGTERM (and at the end of :func:`run`): the work has been told to stop and
    publishes nothing more; a download thread blocked on a silent socket must not hold the exit up to --timeout
    (partial files stay resumable)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # cli_stdout ends a failed write with SystemExit
            stream.flush()
    os._exit(code)


def run() -> NoReturn:
    """The ``hfcache`` program (console script and ``python -m hfcache``): :func:`main`, then an exit without the
    interpreter's teardown.

    Library gap: CPython's finalization tears down every imported module one by one (~27 ms after ``warm``'s
    imports, 6% of a cold warm of nine tokenizers: issue 18), work no command needs: by then every file hfcache
    wrote is closed and every lock released. What a normal exit does that matters is done first, in the same order:
    non-daemon threads joined, atexit handlers run (``atexit._run_exitfuncs``: no public API runs them early),
    stdout and stderr flushed. In-process callers use :func:`main`, which returns or raises SystemExit as usual.
    """
    sys.stdout = GuardedStdout(sys.stdout)  # a failed write of the output: exit 141 or 5, no traceback
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as the interpreter prints it
        sys.stderr.write(f"{code}\n")
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()  # the output's last buffered bytes: their failure is the command's
    except SystemExit as exc:
        code = exc.code
    _exit_now(code)


def main(argv: list[str] | None = None) -> None:
    """In-process entry point (:func:`run` is the program): run the CLI and map every hfcache error to its exit code, without traceback."""
    args = sys.argv[1:] if argv is None else argv
    head = args[:args.index("--")] if "--" in args else args
    as_json = "--json" in head and head[:1] != ["exec"]  # exec has no --json: its COMMAND's arguments are not ours
    debug = os.environ.get("HFCACHE_DEBUG") not in (None, "", "0")
    signal.signal(signal.SIGTERM, _on_sigterm)  # `serve` installs its own graceful handler; `exec` replaces us
    try:
        cli.main(args=args, prog_name="hfcache", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # `hfcache` alone: the help a newcomer asked for, not an error
        sys.stdout.write(exc.format_message() + "\n")
        sys.exit(0)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else _command_path(args)
        _fail(exc.format_message(), f"see `{command} --help`", UsageError.exit_code, as_json)
    except click.ClickException as exc:
        _fail(exc.format_message(), _usage_hint(exc.exit_code, None, args), exc.exit_code, as_json)
    except click.Abort as exc:  # click turns KeyboardInterrupt (and so Terminated) into Abort
        _interrupted(EXIT_TERMINATED if isinstance(exc.__cause__, Terminated) else EXIT_INTERRUPTED, as_json)
    except Terminated:
        _interrupted(EXIT_TERMINATED, as_json)
    except HfcacheError as exc:
        if debug:
            raise
        _fail(exc.message, _usage_hint(exc.exit_code, exc.hint, args), exc.exit_code, as_json)
    except KeyboardInterrupt:
        _interrupted(EXIT_INTERRUPTED, as_json)
    except PermissionError as exc:
        # A part of a cache (or a file given) this user cannot read or write, in a path no command anticipated: a
        # filesystem problem (exit 5) naming the path, never an internal error.
        if debug:
            raise
        from ..errors import CacheError

        _fail(f"{exc.filename or 'a file'}: permission denied for uid {os.geteuid()}",
              "check its permissions (`hfcache doctor` shows what this user can read and write in a cache)",
              CacheError.exit_code, as_json)
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors are turned into an exit code
        if debug:
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc}",
              "rerun with HFCACHE_DEBUG=1 for the traceback and report it", EXIT_INTERNAL, as_json)
