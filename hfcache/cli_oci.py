"""``hfcache push`` and ``hfcache pull``: parse, call :mod:`hfcache.oci`, render (self-contained on purpose)."""

from __future__ import annotations

import sys

import click

from .errors import UsageError


def _credentials(username: str | None, password_stdin: bool):
    """``--username`` + ``--password-stdin`` (as ``docker login``): the password is one line read from stdin."""
    from .oci import Credentials

    if password_stdin and not username:
        raise UsageError("--password-stdin needs --username")
    if username and not password_stdin:
        raise UsageError("--username needs --password-stdin (the password is never taken from the command line)")
    if not username:
        return None
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("--password-stdin: no password on stdin")
    return Credentials(username, password)


def _registry_options(fn):
    for decorator in reversed([
        click.option("--plain-http", is_flag=True, help="Talk HTTP, not HTTPS (a local or test registry)."),
        click.option("--username", metavar="USER", help="Registry user (with --password-stdin) [default: the "
                     "credentials of REGISTRY_AUTH_FILE, containers auth.json or ~/.docker/config.json]."),
        click.option("--password-stdin", is_flag=True, help="Read the registry password from stdin (one line)."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
                     help="Seconds to wait for a connection or for any byte of an answer."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; no progress."),
        click.option("--cache-dir", type=click.Path(file_okay=False),
                     help="Cache root [default: HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub]."),
    ]):
        fn = decorator(fn)
    return fn


class _Progress:
    """A rich progress bar on stderr per blob transferred (implements :class:`hfcache.oci.TransferSink`)."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        from .output import stderr

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                  TransferSpeedColumn(), console=stderr, disable=not enabled)
        self._task = None

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def begin(self, label: str, total: int) -> None:
        self._task = self._progress.add_task(label[:60], total=total)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, nbytes)


def _layers_json(layers) -> list[dict]:
    return [{"digest": x.digest, "size": x.size, "diff_id": x.diff_id, "repos": list(x.repos),
             "transferred": x.transferred} for x in layers]


@click.command(name="push")
@click.argument("reference", metavar="REF")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), help="Push exactly what this lock pins.")
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
    from .cache import existing_cache_dir
    from .oci import push
    from .output import human_size, print_json, stderr

    credentials = _credentials(username, password_stdin)
    with _Progress(enabled=not as_json) as progress:
        report = push(reference, existing_cache_dir(cache_dir), specs, lock_path=lock_file, split=split,
                      plain_http=plain_http, credentials=credentials, timeout=timeout, sink=progress, arch=arch)
    if as_json:
        print_json({"reference": report.reference, "digest": report.digest, "split": report.split,
                    "repos": list(report.repos), "layers": _layers_json(report.layers),
                    "bytes_total": report.bytes_total, "bytes_uploaded": report.bytes_uploaded})
        return
    stderr.print(f"pushed {len(report.repos)} revision(s) in {len(report.layers)} layer(s) "
                 f"({human_size(report.bytes_uploaded)} sent of {human_size(report.bytes_total)})")
    click.echo(f"{report.reference}@{report.digest}")


@click.command(name="pull")
@click.argument("reference", metavar="REF")
@_registry_options
@click.option("--move-refs", is_flag=True,
              help="Move a ref the target has at another commit to the image's commit (default: refuse).")
@click.option("--lock-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, metavar="SECONDS",
              help="Wait at most this long for a repo lock another process holds (exit 5 then, naming the lock).")
def pull_command(reference, cache_dir, plain_http, username, password_stdin, timeout, as_json, move_refs,
                 lock_timeout) -> None:
    """Pull the image REF and merge its cache into the cache, every digest checked before anything is written.

    The same refusals as `hfcache import`; what the target already has is never overwritten (an entry it holds with
    other content, or a ref at another commit without --move-refs, refuses the pull: exit 1).
    """
    from .cache import resolve_cache_dir
    from .oci import pull
    from .output import human_size, lock_wait_notice, print_json, stderr

    credentials = _credentials(username, password_stdin)
    with _Progress(enabled=not as_json) as progress:
        report = pull(reference, resolve_cache_dir(cache_dir), plain_http=plain_http, credentials=credentials,
                      timeout=timeout, sink=progress, move_refs=move_refs, lock_timeout=lock_timeout,
                      on_lock_wait=lock_wait_notice)
    imported = report.imported
    if as_json:
        print_json({"reference": report.reference, "digest": report.digest, "layers": _layers_json(report.layers),
                    "bytes_downloaded": report.bytes_downloaded, "cache_dir": imported.cache_dir,
                    "repos": list(imported.repos), "files": imported.files, "blobs_new": imported.blobs_new,
                    "blobs_existing": imported.blobs_existing, "bytes_new": imported.bytes_new,
                    "moved_refs": list(imported.moved)})
        return
    stderr.print(f"pulled {report.reference} ({report.digest[:19]}): {len(report.layers)} layer(s), "
                 f"{human_size(report.bytes_downloaded)}; {len(imported.repos)} repo(s) into {imported.cache_dir}, "
                 f"{imported.blobs_new} new blob(s), {imported.blobs_existing} already there")
    for ref in imported.moved:
        stderr.print(f"moved the target's {ref} to the image's commit (--move-refs)")
