"""Rendering of ``hfcache env``, ``doctor``, ``serve`` and ``path`` (one absolute path a line, or one JSON document)."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.text import Text

from . import common
from .common import print_json, stderr, stdout

if TYPE_CHECKING:
    from ...offline.doctor import DoctorReport

__all__ = ["doctor_dict", "path_document", "show_doctor", "show_env", "show_mirror_ready", "show_mirror_stopped",
           "show_path"]


def show_env(text: str) -> None:
    """``hfcache env``: the rendered variables, exactly as given, on stdout (no colour, nothing else)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def doctor_dict(report: DoctorReport) -> dict[str, Any]:
    """``hfcache doctor --json``: the report as plain data (sizes in bytes)."""
    return {
        "ok": report.ok, "exit_code": report.exit_code, "cache_dir": report.cache_dir, "offline": report.offline,
        "effective_cache_dir": report.effective_cache_dir, "cache_source": report.cache_source,
        "user": {"uid": report.uid, "gid": report.gid, "groups": list(report.groups),
                 "umask": None if report.umask is None else f"{report.umask:04o}"},
        "cache": {"owner_uid": report.owner_uid, "owner_gid": report.owner_gid, "writable": report.writable,
                  "read_only_fs": report.read_only_fs, "symlinks": report.symlinks, "free_bytes": report.free_bytes},
        "versions": dict(report.versions),
        "shared_store": None if report.shared_store is None else asdict(report.shared_store),
        "findings": [asdict(f) for f in report.findings],
    }


def show_doctor(report: DoctorReport, *, as_json: bool) -> None:
    """doctor's result: JSON, or a table of findings (errors first, each with its fix) and a verdict on stdout."""
    if as_json:
        print_json(doctor_dict(report))
        return
    styles = {"error": "bold red", "warning": "yellow", "info": "dim"}
    table = common.table(f"hfcache doctor {report.cache_dir}", ("severity", "finding", "fix"), overflow="fold")
    for f in report.findings:
        table.add_row(Text(f.severity, style=styles[f.severity]), f.message, f.fix or "")
    stdout.print(table)
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    verdict = Text("ok", style="green") if not errors else Text(f"{errors} error(s)", style="bold red")
    stdout.print(Text.assemble(verdict, f", {warnings} warning(s)"))


def show_mirror_ready(info: Any) -> None:
    """``hfcache serve`` is listening: what it serves and where (stderr; the endpoint is the last word)."""
    what = {"cache": "cache", "bucket": "bucket"}.get(info.layout, "repo folders")
    token = ", bearer token required" if info.token_required else ""
    pull = f", pulling through from {', '.join(info.upstreams)}" if info.upstreams else ""
    allow = (f" (allowed: {', '.join(info.allow)})" if info.allow
             else " (any repo: no --allow)" if info.upstreams else "")
    if unreadable := info.unreadable:
        shown = ", ".join(unreadable[:4]) + (f" (and {len(unreadable) - 4} more)" if len(unreadable) > 4 else "")
        stderr.print(Text(f"hfcache: warning: {len(unreadable)} repo folder(s) of {info.root} cannot be read by uid "
                          f"{os.geteuid()}: {shown}; requests for them get 500 CacheUnreadable (`hfcache doctor "
                          f"--cache-dir {info.root}` prints the fix)"), soft_wrap=True)
    # A wildcard bind is said as such (clients elsewhere reach it by this machine's address); the endpoint this
    # machine uses stays the last word, for scripts.
    bound = (f", listening on {info.host}:{info.port} (every interface)" if info.host in ("0.0.0.0", "::", "")
             else "")
    stderr.print(Text(f"hfcache: serving {what} {info.root}{token}{pull}{allow}{bound} at {info.endpoint}"),
                 soft_wrap=True)


def show_mirror_stopped(run: Any) -> None:
    """``hfcache serve`` has shut down (stderr)."""
    cut = f"; {run.cut_short} download(s) cut short" if run.cut_short else ""
    stderr.print(Text(f"hfcache: stopped on {run.signal} after {run.seconds:.0f} s{cut}"), soft_wrap=True)


def path_document(resolved: Any) -> dict[str, Any]:
    """The ``--json`` document of a :class:`hfcache.offline.paths.ResolvedPath` (paths absolute; ``files`` empty
    without a PATTERN)."""
    return {"repo_id": resolved.repo_id, "repo_type": resolved.repo_type, "revision": resolved.revision,
            "commit_hash": resolved.commit_hash, "snapshot": str(resolved.snapshot),
            "files": [str(p) for p in resolved.files]}


def show_path(resolved: Any, *, as_json: bool) -> None:
    """Print the snapshot folder (no PATTERN) or each matching file on its own line, nothing else; or the JSON
    document. Every path was checked to be one printable line (hfcache/offline/paths.py)."""
    if as_json:
        print_json(path_document(resolved))
        return
    lines = [str(p) for p in resolved.files] if resolved.pattern is not None else [str(resolved.snapshot)]
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
