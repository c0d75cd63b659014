"""``hfcache export``, ``import`` and ``link``: parse, call :mod:`hfcache.move`, render (``render/move.py``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from ..errors import UsageError
from .options import cache_dir_option, json_option, lock_timeout_option


def _parse_chown(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    uid, sep, gid = value.partition(":")
    if not (uid.isdigit() and sep and gid.isdigit()):
        raise UsageError(f"--chown {value!r}: expected numeric UID:GID",
                         hint="e.g. --chown 1000:1000 (`id -u`:`id -g`)")
    return int(uid), int(gid)


@click.command(name="export")
@click.argument("dest")
@click.argument("specs", nargs=-1, metavar="[REPO_ID[@REVISION]]...")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), help="Export exactly what this lock pins.")
@cache_dir_option("Source cache")
@click.option("--materialize", is_flag=True, help="Real files in snapshots/ (hardlinks of the blobs), no symlinks.")
@click.option("--format", "fmt", type=click.Choice(["dir", "tar"]), default=None,
              help="dir: a new cache directory; tar: a reproducible tar [default: tar for '-' or *.tar, else dir].")
@click.option("--chown", metavar="UID:GID", help="Owner of every entry (tar header, or lchown for dir).")
@click.option("--group-writable", is_flag=True, help="Modes 0775/0664 instead of 0755/0644.")
@click.option("--flat", is_flag=True, help="One REPO_ID@REVISION's files as real files at DEST (DEST/config.json, "
              "...), hashed; a rerun over the same files changes nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (not with DEST '-').")
def export_command(dest, specs, lock_file, cache_dir, materialize, fmt, chown, group_writable, flat,
                   as_json) -> None:
    """Copy a cache (or the repos/lock given) to DEST: a new cache directory or a reproducible tar ('-': stdout).

    Links stay relative (relocatable), each distinct blob is stored once (hardlinks), every blob is hashed on the
    way; the same content always gives a byte-identical tar (a stable Docker layer digest). DEST may not be
    inside the source cache (exit 2). --flat writes one revision's files at DEST, for runtimes that take a folder.
    """
    from ..move.destination import refuse_dest_inside
    from ..move.export import plan_export, write_tar
    from ..move.export_dir import write_dir
    from ..warming.lockfile import read_lock
    from ..warming.project import reading_cache_dir
    from .render import move as render

    if flat:
        return _export_flat(dest, specs, lock_file, cache_dir, materialize, fmt, chown, group_writable, as_json)
    fmt = fmt or ("tar" if dest == "-" or dest.endswith(".tar") else "dir")
    if dest == "-" and fmt != "tar":
        raise UsageError("DEST '-' (stdout) needs --format tar", hint="add --format tar")
    if dest == "-" and as_json:
        raise UsageError("--json cannot share stdout with the tar stream",
                         hint="drop --json, or write the tar to a file")
    owner = _parse_chown(chown)
    root = reading_cache_dir(cache_dir, lock_file)
    if dest != "-":  # DEST is the user's and written by path (atomic_output, write_dir): never inside the cache
        refuse_dest_inside(root, dest, "export")
    plan = plan_export(root, specs, lock=read_lock(lock_file) if lock_file else None, materialize=materialize)
    digest = None
    if fmt == "tar":
        from ..cache.atomic import atomic_output

        with contextlib.nullcontext(sys.stdout.buffer) if dest == "-" else atomic_output(Path(dest)) as out:
            digest = write_tar(plan, out, chown=owner or (0, 0), group_writable=group_writable)
    else:
        write_dir(plan, Path(dest), chown=owner, group_writable=group_writable)
    render.show_export(plan, dest, fmt, digest, as_json=as_json)


def _export_flat(dest, specs, lock_file, cache_dir, materialize, fmt, chown, group_writable, as_json) -> None:
    """``export DEST REPO_ID@REVISION --flat``: the revision's files as real files at DEST."""
    from ..move.destination import refuse_dest_inside
    from ..move.export import plan_export
    from ..move.export_flat import write_flat
    from ..warming.project import reading_cache_dir
    from .render import move as render

    if len(specs) != 1 or lock_file or materialize or fmt == "tar" or chown or dest == "-":
        raise UsageError("--flat takes one REPO_ID[@REVISION] and a folder DEST (no --lock, --materialize, "
                         "--format tar, --chown or '-')", hint="e.g. hfcache export /models/x org/name@main --flat")
    root = reading_cache_dir(cache_dir, None)
    refuse_dest_inside(root, dest, "export")
    spec = specs[0] if "@" in specs[0] else f"{specs[0]}@main"
    result = write_flat(plan_export(root, [spec]), Path(dest), spec.partition("@")[0], group_writable=group_writable)
    render.show_flat(result, as_json=as_json)


@click.command(name="import")
@click.argument("src")
@cache_dir_option("Target cache")
@click.option("--move-refs", is_flag=True,
              help="Move a ref the target has at another commit to the source's commit (default: refuse).")
@lock_timeout_option
@json_option
def import_command(src, cache_dir, move_refs, lock_timeout, as_json) -> None:
    """Merge an exported cache (directory, tar, or '-' for a tar on stdin) into the cache, verified first.

    Refuses absolute or '..' paths, links leaving the cache, devices, sparse files, content that does not match its
    hash, and any entry the target already holds with other content (exit 1); then nothing is written.
    """
    from ..cache.root import resolve_cache_dir
    from ..move.importer import import_cache
    from .render import move as render
    from .render.common import lock_wait_notice

    report = import_cache(src, resolve_cache_dir(cache_dir), move_refs=move_refs, lock_timeout=lock_timeout,
                          on_lock_wait=lock_wait_notice)
    render.show_import(report, as_json=as_json)


@click.command(name="link")
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("dest", type=click.Path())
@click.option("--mode", type=click.Choice(["symlink", "hardlink", "copy"]), default="symlink", show_default=True,
              help="symlink: DEST -> SRC; hardlink: per-file hardlinks (same filesystem, no extra bytes); copy.")
@json_option
def link_command(src, dest, mode, as_json) -> None:
    """Make the cache at DEST use the cache at SRC (e.g. the runtime user's default path, or a volume mount)."""
    from ..move.link import link_cache
    from .render import move as render

    report = link_cache(Path(src), Path(dest), mode)
    render.show_link(report, as_json=as_json)
