"""``hfcache push`` and ``pull``: parse, call :mod:`hfcache.oci.image` or :mod:`hfcache.oci.pull`, render."""

from __future__ import annotations

from pathlib import Path

import click

from ..bucket.store import is_bucket_url
from ..errors import UsageError
from .options import cache_dir_option, lock_timeout_option, parsed, stdin_password


def _credentials(username: str | None, password_stdin: bool):
    """``--username`` + ``--password-stdin`` (as ``docker login``): the password is one line read from stdin."""
    from ..oci.credentials import Credentials

    usage = "echo \"$REGISTRY_PASSWORD\" | hfcache ... --username USER --password-stdin"
    if password_stdin and not username:
        raise UsageError("--password-stdin needs --username", hint=usage)
    if username and not password_stdin:
        raise UsageError("--username needs --password-stdin (the password is never taken from the command line)",
                         hint=usage)
    return Credentials(username, stdin_password(usage)) if username else None


def _registry_options(fn):
    for decorator in reversed([
        click.option("--plain-http", is_flag=True, help="Talk HTTP, not HTTPS (a local or test registry)."),
        click.option("--username", metavar="USER", help="Registry user (with --password-stdin) [default: the "
                     "credentials of REGISTRY_AUTH_FILE, containers auth.json or ~/.docker/config.json]."),
        click.option("--password-stdin", is_flag=True, help="Read the registry password from stdin (one line)."),
        click.option("--timeout", metavar="SECONDS", default="60", show_default=True, callback=parsed("parse_timeout"),
                     help="Seconds to wait for a connection or for any byte of an answer. Each metadata answer "
                          "(manifest, config, token) must also end within HFCACHE_METADATA_DEADLINE seconds [120], and "
                          "each blob keep HFCACHE_MIN_RATE [1KB/s] over HFCACHE_RATE_WINDOW seconds [60]."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; no progress."),
        cache_dir_option(),
    ]):
        fn = decorator(fn)
    return fn


@click.command(name="push")
@click.argument("reference", metavar="REF")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Push exactly what this lock pins (cache: --cache-dir, else the lock's manifest's).")
@click.option("--layers", "split", type=click.Choice(["repo", "single"]), default=None,
              help="repo: one layer per repo (an update re-sends one layer); single: one layer (each blob once) "
                   "[default: repo; image format only].")
@click.option("--arch", metavar="ARCH", help="The image config's architecture (amd64, arm64, ...) [default: this "
              "machine's]; pin it in CI for a digest that does not depend on the runner (image format only).")
@click.option("--format", "fmt", type=click.Choice(["image", "modelpack"]), default="image", show_default=True,
              help="image: the cache as the image's root filesystem (containerd, podman, kubelet image volumes); "
                   "modelpack: a CNCF ModelPack artifact of ONE repo@revision, a raw layer per file (CRI-O, modctl, "
                   "KitOps, Harbor).")
@click.option("--prefix", metavar="DIR", help="Put the cache under DIR in the image/artifact (KServe: --prefix "
              "models for a Modelcar's /models or an oci+native:// volume's subPath: models).")
@click.option("--sign-key", type=click.Path(dir_okay=False, exists=True), metavar="KEY.pem",
              help="Sign every pushed snapshot's files (model-signing v1.0, EC key; an encrypted key's password "
                   "from HFCACHE_SIGN_KEY_PASSWORD) and attach each bundle as a referrer of the pushed manifest.")
@click.option("--base", metavar="IMAGE", help="Put the cache's layers on this image (on the same registry, by tag or "
              "digest), e.g. one with a shell for KServe's Modelcar; its Env/Entrypoint/Cmd are kept (image format).")
@_registry_options
def push_command(reference, specs, lock_file, split, arch, fmt, prefix, sign_key, base, cache_dir, plain_http,
                 username, password_stdin, timeout, as_json) -> None:
    """Push the cache (or the repos / lock given) to REF as an OCI image whose root is the cache, or one repo at one
    revision as a CNCF ModelPack artifact (--format modelpack).

    Mount the image read-only at /opt/hf-cache (Kubernetes `image` volume, podman --mount type=image) with
    HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1. The same cache always gives the same manifest digest.
    """
    from ..oci.image import push
    from ..warming.project import reading_cache_dir
    from .render import oci as render

    if is_bucket_url(reference):
        _refuse_for_bucket(reference, {"--layers": split, "--arch": arch, "--format": fmt != "image", "--prefix": prefix,
                                       "--sign-key": sign_key, "--base": base, "--plain-http": plain_http,
                                       "--username": username})
        from ..bucket.push import push_bucket

        with render.TransferProgress(enabled=not as_json) as progress:
            report = push_bucket(reference, reading_cache_dir(cache_dir, lock_file), specs, lock_path=lock_file,
                                 timeout=timeout, sink=progress)
        render.show_bucket_push(report, as_json=as_json)
        return
    credentials = _credentials(username, password_stdin)
    with render.TransferProgress(enabled=not as_json) as progress:
        report = push(reference, reading_cache_dir(cache_dir, lock_file), specs, lock_path=lock_file, split=split,
                      plain_http=plain_http, credentials=credentials, timeout=timeout, sink=progress, arch=arch,
                      format=fmt, prefix=prefix, sign_key=Path(sign_key) if sign_key else None, base=base)
    render.show_push(report, as_json=as_json)


@click.command(name="pull")
@click.argument("reference", metavar="REF")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@_registry_options
@click.option("--move-refs", is_flag=True,
              help="Move a ref the target has at another commit to the image's commit (default: refuse).")
@click.option("--max-size", metavar="SIZE", callback=parsed("parse_size"),
              help="Refuse an image whose layers unpack to more than SIZE (e.g. 20GB, 500MiB) [default: no bound but "
                   "the free space of the cache's filesystem].")
@click.option("--verify-key", metavar="PUB", type=click.Path(exists=True, dir_okay=False),
              help="Public key (PEM): the artifact's model-signing signatures (OCI referrers) must sign every pulled "
                   "file under it, and its refs must name signed commits, checked before anything is written "
                   "(unsigned or wrongly signed: exit 1; a ref to a commit no signature covers: exit 3).")
@lock_timeout_option
def pull_command(reference, specs, cache_dir, plain_http, username, password_stdin, timeout, as_json, move_refs,
                 max_size, verify_key, lock_timeout) -> None:
    """Pull the image or ModelPack artifact REF and merge its cache into the cache, every digest checked before
    anything is written; layers whose content the cache already holds are not downloaded.

    The same refusals as `hfcache import`; what the target already has is never overwritten (an entry it holds with
    other content, or a ref at another commit without --move-refs, refuses the pull: exit 1). Needs free space for
    the uncompressed image on the cache's filesystem (nothing goes to TMPDIR).
    """
    from ..cache.root import resolve_cache_dir
    from ..oci.pull import pull
    from .render import oci as render
    from .render.common import lock_wait_notice

    if is_bucket_url(reference):
        _refuse_for_bucket(reference, {"--plain-http": plain_http, "--username": username, "--move-refs": move_refs,
                                       "--max-size": max_size, "--verify-key": verify_key})
        _pull_bucket(reference, specs, cache_dir, timeout, lock_timeout, as_json)
        return
    if specs:
        raise UsageError(f"repo ids ({specs[0]}...) are taken by a pull from a bucket (s3://) only",
                         hint="an image or artifact is pulled whole")
    credentials = _credentials(username, password_stdin)
    with render.TransferProgress(enabled=not as_json) as progress:
        report = pull(reference, resolve_cache_dir(cache_dir), plain_http=plain_http, credentials=credentials,
                      timeout=timeout, sink=progress, move_refs=move_refs, max_size=max_size,
                      lock_timeout=lock_timeout, on_lock_wait=lock_wait_notice,
                      verify_key=Path(verify_key) if verify_key else None)
    render.show_pull(report, as_json=as_json)


def _refuse_for_bucket(reference: str, given: dict) -> None:
    """UsageError (exit 2) naming the first registry-only option given with an ``s3://`` URL."""
    for option, value in given.items():
        if value:
            raise UsageError(f"{option} applies to a registry, not to a bucket ({reference[:60]})",
                             hint="a bucket takes the cache, repo ids or --lock; credentials come from AWS_* settings")


def _pull_bucket(reference, specs, cache_dir, timeout, lock_timeout, as_json) -> None:
    """``pull s3://...``: warm's engine from the bucket, warm's report (exit code included)."""
    import sys

    from ..bucket.pull import pull_bucket
    from ..records import HubOptions
    from .render import warm as render
    from .render.common import lock_wait_notice

    with render.WarmProgress(as_json=as_json, quiet=False) as progress:
        report = pull_bucket(reference, cache_dir, specs, hub=HubOptions(timeout=timeout), progress=progress,
                             lock_timeout=lock_timeout, on_lock_wait=lock_wait_notice)
    render.show_warm_report(report, as_json=as_json, quiet=False)
    sys.exit(report.exit_code)
