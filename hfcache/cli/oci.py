"""``hfcache push`` and ``hfcache pull``: parse, call :mod:`hfcache.oci.image` (push) or :mod:`hfcache.oci.pull`, render (:mod:`hfcache.cli.render.oci`)."""

from __future__ import annotations

import sys

import click

from .options import lock_timeout_option as _lock_timeout_option
from .options import parsed as _parsed
from ..errors import UsageError


def _credentials(username: str | None, password_stdin: bool):
    """``--username`` + ``--password-stdin`` (as ``docker login``): the password is one line read from stdin."""
    from ..oci.credentials import Credentials

    usage = "echo \"$REGISTRY_PASSWORD\" | hfcache ... --username USER --password-stdin"
    if password_stdin and not username:
        raise UsageError("--password-stdin needs --username", hint=usage)
    if username and not password_stdin:
        raise UsageError("--username needs --password-stdin (the password is never taken from the command line)",
                         hint=usage)
    if not username:
        return None
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("--password-stdin: no password on stdin", hint=usage)
    return Credentials(username, password)


def _registry_options(fn):
    for decorator in reversed([
        click.option("--plain-http", is_flag=True, help="Talk HTTP, not HTTPS (a local or test registry)."),
        click.option("--username", metavar="USER", help="Registry user (with --password-stdin) [default: the "
                     "credentials of REGISTRY_AUTH_FILE, containers auth.json or ~/.docker/config.json]."),
        click.option("--password-stdin", is_flag=True, help="Read the registry password from stdin (one line)."),
        click.option("--timeout", metavar="SECONDS", default="60", show_default=True, callback=_parsed("parse_timeout"),
                     help="Seconds to wait for a connection or for any byte of an answer. Each metadata answer "
                          "(manifest, config, token) must also end within HFCACHE_METADATA_DEADLINE seconds [120], and "
                          "each blob keep HFCACHE_MIN_RATE [1KB/s] over HFCACHE_RATE_WINDOW seconds [60]."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; no progress."),
        click.option("--cache-dir", type=click.Path(file_okay=False),
                     help="Cache root [default: HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub]."),
    ]):
        fn = decorator(fn)
    return fn


@click.command(name="push")
@click.argument("reference", metavar="REF")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Push exactly what this lock pins (cache: --cache-dir, else the lock's manifest's).")
@click.option("--layers", "split", type=click.Choice(["repo", "single"]), default="repo", show_default=True,
              help="repo: one layer per repo (an update re-sends one layer); single: one layer (each blob once).")
@click.option("--arch", metavar="ARCH", help="The image config's architecture (amd64, arm64, ...) [default: this "
              "machine's]; pin it in CI for a digest that does not depend on the runner.")
@_registry_options
def push_command(reference, specs, lock_file, split, arch, cache_dir, plain_http, username, password_stdin, timeout,
                 as_json) -> None:
    """Push the cache (or the repos / lock given) to REF as an OCI image whose root is the cache.

    Mount it read-only at /opt/hf-cache (Kubernetes `image` volume, podman --mount type=image) with
    HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1. The same cache always gives the same manifest digest.
    """
    from ..oci.image import push
    from ..warming.project import reading_cache_dir
    from .render import oci as render

    credentials = _credentials(username, password_stdin)
    with render.TransferProgress(enabled=not as_json) as progress:
        report = push(reference, reading_cache_dir(cache_dir, lock_file), specs, lock_path=lock_file, split=split,
                      plain_http=plain_http, credentials=credentials, timeout=timeout, sink=progress, arch=arch)
    render.show_push(report, as_json=as_json)


@click.command(name="pull")
@click.argument("reference", metavar="REF")
@_registry_options
@click.option("--move-refs", is_flag=True,
              help="Move a ref the target has at another commit to the image's commit (default: refuse).")
@click.option("--max-size", metavar="SIZE", callback=_parsed("parse_size"),
              help="Refuse an image whose layers unpack to more than SIZE (e.g. 20GB, 500MiB) [default: no bound but "
                   "the free space of the cache's filesystem].")
@_lock_timeout_option
def pull_command(reference, cache_dir, plain_http, username, password_stdin, timeout, as_json, move_refs,
                 max_size, lock_timeout) -> None:
    """Pull the image REF and merge its cache into the cache, every digest checked before anything is written.

    The same refusals as `hfcache import`; what the target already has is never overwritten (an entry it holds with
    other content, or a ref at another commit without --move-refs, refuses the pull: exit 1). Needs free space for
    the uncompressed image on the cache's filesystem (nothing goes to TMPDIR).
    """
    from ..cache.root import resolve_cache_dir
    from ..oci.pull import pull
    from .render import oci as render
    from .render.common import lock_wait_notice

    credentials = _credentials(username, password_stdin)
    with render.TransferProgress(enabled=not as_json) as progress:
        report = pull(reference, resolve_cache_dir(cache_dir), plain_http=plain_http, credentials=credentials,
                      timeout=timeout, sink=progress, move_refs=move_refs, max_size=max_size,
                      lock_timeout=lock_timeout, on_lock_wait=lock_wait_notice)
    render.show_pull(report, as_json=as_json)
