"""``hfcache verify`` and ``check``: parse, call :mod:`hfcache.integrity`, render (``render/verify.py``)."""

from __future__ import annotations

import contextlib
import sys

import click

from ..errors import UsageError
from .options import apply_revision, cache_dir_option, hub_options, json_option, lock_timeout_option, revision_option


@click.command()
@click.argument("repo_ids", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@cache_dir_option()
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Expected files, sizes and hashes [default: blob names and trees/ listings] (cache: --cache-dir, "
                   "else the lock's manifest's).")
@click.option("--repair", "do_repair", is_flag=True,
              help="Fix what is broken (re-download from the endpoint, rewrite refs and links), then verify again.")
@click.option("--fast", is_flag=True,
              help="Skip blobs unchanged (inode, size, mtime, ctime) since an earlier --fast run hashed them right, "
                   "and record this run's in .locks/ [default: hash every blob, write nothing].")
@click.option("--signature", type=click.Path(dir_okay=False), metavar="FILE",
              help="Check this model-signing bundle (hfcache sign, model_signing sign) against REPO_ID[@REVISION]'s "
                   "snapshot instead (with --verify-key): exit 1 naming every file unsigned, changed or missing.")
@click.option("--verify-key", type=click.Path(dir_okay=False), metavar="PUB",
              help="PEM EC public key the --signature must verify with.")
@click.option("--rehash", is_flag=True,
              help="With --signature: hash every file's bytes [default: an LFS file's blob name is its sha256].")
@click.option("--allow-empty", is_flag=True,
              help="A cache with nothing to verify is success [default: exit 1, 'nothing was verified'].")
@revision_option
@hub_options
@lock_timeout_option
def verify(repo_ids, cache_dir, lock_file, do_repair, fast, signature, verify_key, rehash, allow_empty, revision,
           hub, lock_timeout, as_json) -> None:
    """Check a cache's integrity offline: every blob's hash, links, refs, and the lock's files.

    Without --repair it makes no network request. Exit 1 when any integrity problem remains. With --signature FILE
    --verify-key PUB: check that bundle's signature, then its file list against one snapshot (REPO_ID[@REVISION]).
    """
    repo_ids = apply_revision(repo_ids, revision, with_lock=bool(lock_file))
    if signature or verify_key or rehash:
        _verify_signature(repo_ids, cache_dir, signature, verify_key, rehash,
                          lock_file or do_repair or fast, as_json)
        return
    from ..errors import CheckFailed
    from ..warming.lockfile import read_lock
    from ..warming.project import reading_cache_dir
    from .render import verify as render
    from .render.common import lock_wait_notice, print_error

    lock = read_lock(lock_file) if lock_file else None
    root = reading_cache_dir(cache_dir, lock_file)
    if do_repair:
        from ..integrity.repair import verify_and_repair

        run = verify_and_repair(root, repo_ids or None, hub=hub, lock=lock, max_workers=hub.max_workers, fast=fast,
                                lock_timeout=lock_timeout, on_lock_wait=lock_wait_notice,
                                progress=lambda: render.HashProgress(enabled=not as_json))
        report, actions, before = run.report, run.actions, run.before
        exit_code, errors = run.exit_code, run.error_lines()
    else:
        from ..integrity.verify import verify_cache

        with render.HashProgress(enabled=not as_json) as progress:
            report = verify_cache(root, repo_ids or None, lock=lock, max_workers=hub.max_workers,
                                  progress=progress, fast=fast)
        actions, before = (), None
        exit_code, errors = report.exit_code, ()
    if not report.repos and not allow_empty and exit_code == 0:  # a CI check on a mistyped path must not go green
        raise CheckFailed(f"nothing was verified: the cache {root} holds no repo (or none of those named)",
                          hint="warm it first, check --cache-dir, or pass --allow-empty where an empty cache is fine")
    render.show_verify(report, actions, before, as_json=as_json, exit_code=exit_code)
    for n, (message, hint) in enumerate(errors, 1):  # a revision no endpoint could serve: a line each, exit 3
        print_error(message, hint if n == len(errors) else None)
    sys.exit(exit_code)


def _verify_signature(repo_ids, cache_dir, signature, verify_key, rehash, other, as_json) -> None:
    from ..integrity.sign import check_signature
    from ..integrity.signatures import SignatureMismatch
    from ..warming.project import reading_cache_dir
    from .sign import show_mismatch, show_signature

    if not signature or not verify_key:
        raise UsageError("--signature FILE and --verify-key PUB go together (--rehash needs them)",
                         hint="hfcache verify ORG/NAME@REVISION --signature B.sig.json --verify-key key.pub")
    if len(repo_ids) != 1 or other:
        raise UsageError("--signature checks one snapshot: name exactly one REPO_ID[@REVISION] (no --lock, --repair, "
                         "--fast)", hint="run plain `hfcache verify` for the cache's integrity")
    root = reading_cache_dir(cache_dir)
    try:
        verdict = check_signature(root, repo_ids[0], signature, verify_key, rehash=rehash)
    except SignatureMismatch as exc:
        show_mismatch(exc, repo_ids[0], as_json=as_json)
    show_signature(verdict, as_json=as_json)


@click.command()
@click.argument("repo_ids", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@cache_dir_option()
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Check the lock's tokenizers, by the ids and revisions of its manifest (cache: --cache-dir, else "
                   "the lock's manifest's).")
@click.option("--text", default=None, help="Probe text to encode [default: a mixed English/Chinese sentence].")
@click.option("--trust-remote-code", "trusted", multiple=True, metavar="REPO_ID[@REVISION]",
              help="Run the custom code (auto_map) of this repo when loading it (repeatable; '*': every repo "
                   "checked) [default: only a --lock's repos; others are 'needs custom code: not run']. As root, "
                   "refused for a cache other users can write.")
@json_option
@revision_option
def check(repo_ids, cache_dir, lock_file, text, trusted, as_json, revision) -> None:
    """Prove each tokenizer loads offline: AutoTokenizer in a child with no network, encoding a probe text.

    Without arguments: every cached revision with a tokenizer (by ref, or by commit when no ref points to it). A repo
    whose auto_map names custom code loads with trust_remote_code=True only when named by --trust-remote-code or
    pinned by --lock; any other is reported 'needs custom code: not run'. On failure it names the missing piece
    (config.json and its .no_exist marker, a Python package, custom code, a chat template, a ref). Exit 1 if any
    tokenizer fails, or if nothing loaded because every tokenizer needs custom code that was not opted in to; exit 2
    when run as root with code to run from a cache other users can write.
    """
    from ..integrity.check import DEFAULT_TEXT, check_tokenizers
    from ..integrity.check_targets import select_targets, targets_from_cache, targets_from_lock
    from ..integrity.check_trust import TrustPolicy
    from ..warming.lockfile import read_lock
    from ..warming.project import reading_cache_dir
    from .render import common
    from .render import verify as render

    repo_ids = apply_revision(repo_ids, revision, with_lock=bool(lock_file))
    root = reading_cache_dir(cache_dir, lock_file)
    if lock_file:
        targets = select_targets(targets_from_lock(read_lock(lock_file)), repo_ids)
    else:
        targets = targets_from_cache(root, repo_ids)
    if not targets:
        raise UsageError("no tokenizer to check", hint="warm one first, or name REPO_IDs / --lock")
    trust = TrustPolicy.parse(trusted, targets if lock_file else ())
    if unmatched := trust.unmatched(targets):
        raise UsageError(f"--trust-remote-code {unmatched[0]}: no such tokenizer is checked",
                         hint="name a repo_id being checked (or '*' for all of them)")
    with common.stderr.status(f"loading {len(targets)} tokenizer(s) offline", spinner="dots") \
            if not as_json else contextlib.nullcontext():
        report = check_tokenizers(root, targets, text or DEFAULT_TEXT, trust=trust)
    render.show_check(report, as_json=as_json)
    if report.not_run:
        names = ", ".join(r.target.spec for r in report.not_run[:3]) + (" ..." if len(report.not_run) > 3 else "")
        common.warn(f"{len(report.not_run)} tokenizer(s) need custom code and were not run ({names}): name them with "
                    "--trust-remote-code to load them")
    sys.exit(report.exit_code)
