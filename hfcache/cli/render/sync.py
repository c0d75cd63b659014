"""Render ``hfcache sync`` passes: one JSON line per pass with ``--json``, else one line per pass on stderr and one
per lock that is not ready."""

from __future__ import annotations

from . import common
from .common import human_size, inert, print_json


def show_sync(report, *, as_json: bool, error=None) -> None:
    """A pass's :class:`hfcache.fleet.sync.SyncReport`, or the ``error`` that stopped it (the loop goes on)."""
    if error is not None:
        if as_json:
            print_json({"ok": False, "error": error.message, "hint": error.hint, "exit_code": error.exit_code},
                       compact=True)
        else:
            common.print_error(f"sync pass failed: {error.message}", error.hint)
        return
    if as_json:
        print_json(report.as_dict(), compact=True)
        return
    ready = sum(1 for lock in report.locks if lock.ready)
    removed = (f"; {report.revisions_removed} revision(s) removed ({human_size(report.bytes_freed)})"
               if report.revisions_removed else "")
    common.stderr.print(f"sync: {ready}/{len(report.locks)} lock(s) ready in {report.cache_dir}; "
                        f"{human_size(report.bytes_downloaded)} downloaded{removed} in {report.seconds:.2f}s")
    for lock in report.locks:
        if not lock.ready:
            common.stderr.print(f"  not ready: {inert(lock.name)}: {inert(lock.error or '?')}")
    for note in report.notes:
        common.stderr.print(f"  note: {inert(note)}")
