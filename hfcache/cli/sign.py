"""``hfcache sign`` and the output of ``hfcache verify --signature``: parse, call :mod:`hfcache.integrity.sign`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import UsageError
from .options import cache_dir_option, json_option, stdin_password
from .render.common import inert, print_error, print_json


@click.command(name="sign")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@click.option("--key", "key", required=True, type=click.Path(dir_okay=False),
              help="PEM EC private key (P-256; `openssl ecparam -name prime256v1 -genkey -noout -out key.pem`).")
@click.option("--password-stdin", is_flag=True, help="Read the key's password from stdin (one line).")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Sign every snapshot this lock pins (cache: --cache-dir, else the lock's manifest's).")
@click.option("--output", "-o", type=click.Path(), metavar="FILE|DIR|-",
              help="Folder for the bundles (an existing one, or a path ending with '/': created), the bundle file "
                   "for one snapshot, or '-' for standard output (one snapshot) [default: the current folder; never "
                   "inside the cache]. A link, device, FIFO or socket there is refused, never replaced.")
@click.option("--force", is_flag=True, help="Replace bundle files that exist (regular files only).")
@click.option("--rehash", is_flag=True,
              help="Hash every file's bytes [default: an LFS file's blob name is its sha256; others are hashed].")
@cache_dir_option()
@json_option
def sign_command(specs, key, password_stdin, lock_file, output, force, rehash, cache_dir, as_json) -> None:
    """Write an OpenSSF model-signing v1.0 bundle for each cached snapshot, signed with KEY.

    One bundle per snapshot, named <repo folder>@<commit>.sig.json (e.g. models--ORG--NAME@<commit>.sig.json),
    over every file of the snapshot with its sha256 (a snapshot holding a git path such as .gitattributes is
    refused: model_signing leaves those out of every bundle). It verifies with `hfcache verify REPO_ID@COMMIT
    --signature B --verify-key PUB` and with
    `model_signing verify key --signature B --public_key PUB --allow_symlinks <cache>/models--ORG--NAME/snapshots/
    <commit>`. Only files the cache proves are what was fetched are signed (with --lock: its pins, path, size and
    hash; else warm's record, a trees/ listing, a link's blob name): any other is refused (exit 5, naming it).
    Nothing is sent anywhere; nothing in the cache is written. A bundle file that exists is replaced
    only with --force. An encrypted key's password: --password-stdin, else HFCACHE_SIGN_KEY_PASSWORD.
    """
    from ..integrity.sign import sign_snapshots
    from ..warming.project import reading_cache_dir

    if specs and lock_file:
        raise UsageError("give REPO_ID arguments or --lock, not both", hint="--lock signs every snapshot it pins")
    if not specs and not lock_file:
        raise UsageError("name the snapshots to sign: REPO_ID[@REVISION]... or --lock FILE")
    root = reading_cache_dir(cache_dir, lock_file)
    lock = None
    if lock_file:
        from ..warming.lockfile import read_lock

        lock = read_lock(lock_file)  # its pins are what each file signed must match
        if not (targets := [(f"{r.request.repo_id}@{r.commit_hash}", r.request.repo_type) for r in lock.repos]):
            raise UsageError(f"{lock_file} pins no repo: nothing to sign")
    else:
        targets = [(spec, "model") for spec in specs]
    if output == "-" and as_json:
        raise UsageError("--output - writes the bundle on stdout: --json cannot go there too",
                         hint="drop --json, or give --output a file or folder")
    if password_stdin:  # the key's password: one line of stdin (never the command line), else the environment's
        password = stdin_password("echo \"$KEY_PASSWORD\" | hfcache sign ... --key KEY.pem --password-stdin").encode()
    else:
        from ..integrity.signatures import env_password

        password = env_password()
    signed = sign_snapshots(root, targets, Path(key), output, password=password, rehash=rehash, force=force,
                            lock=lock)
    if output == "-":
        sys.stdout.buffer.write(signed[0].data)
        sys.stdout.buffer.flush()
        click.echo(inert(f"signed {signed[0].repo_id}@{signed[0].commit}: {signed[0].files} file(s) -> standard "
                         "output"), err=True)
        return
    _show_signed(signed, str(root), as_json)


def _show_signed(signed, cache_dir: str, as_json: bool) -> None:
    if as_json:
        print_json({"ok": True, "cache_dir": cache_dir, "bundles": [
            {"repo_id": s.repo_id, "commit": s.commit, "path": s.path, "files": s.files, "hashed": s.hashed}
            for s in signed]})
        return
    for s in signed:
        click.echo(inert(f"signed {s.repo_id}@{s.commit}: {s.files} file(s) -> {s.path}"))


def show_signature(verdict, *, as_json: bool) -> None:
    """The ok line (or document) of ``verify --signature``."""
    check = verdict.check
    how = f"{verdict.hashed} file(s) hashed" if verdict.hashed else "digests from blob names"
    if as_json:
        print_json({"ok": True, "repo_id": verdict.repo_id, "commit": verdict.commit, "snapshot": verdict.snapshot,
                    "signature": {"signed": list(check.signed), "key_fingerprint": check.key_fingerprint,
                                  "root_digest": check.root_digest, "model_name": check.model_name},
                    "hashed": verdict.hashed})
        return
    click.echo(inert(f"ok: {verdict.repo_id}@{verdict.commit}: {len(check.signed)} file(s) signed by key "
                     f"sha256:{check.key_fingerprint[:16]}... ({how})"))


def show_mismatch(exc, spec: str, *, as_json: bool) -> None:
    """``verify --signature``'s failure: the one-line error (and with --json one document naming every file)."""
    print_error(exc.message, exc.hint)
    if as_json:
        print_json({"ok": False, "spec": spec, "error": exc.message, "reason": exc.reason,
                    "unsigned": list(exc.unsigned), "changed": list(exc.changed), "missing": list(exc.missing),
                    "exit_code": exc.exit_code})
    sys.exit(exc.exit_code)
