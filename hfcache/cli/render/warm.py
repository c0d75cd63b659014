"""Rendering of ``hfcache warm`` and ``lock`` (rich imported only where a table or a bar is drawn: goal P1)."""

from __future__ import annotations

import contextlib
import select
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ...records import RepoResult, WarmReport
from . import common
from .common import human_size, live_on_terminal, print_error, print_json, usage_hint

if TYPE_CHECKING:
    from rich.progress import TaskID
    from rich.table import Table

    from ...warming.pin import PinResult
    from ...warming.project import LockCheck

__all__ = ["WarmProgress", "interrupted_report", "repo_result_dict", "show_lock_check", "show_pin_result",
           "show_warm_report", "warm_report_dict", "warm_summary_line", "warm_summary_table"]


def repo_result_dict(result: RepoResult) -> dict[str, Any]:
    """A RepoResult as plain JSON data (sizes in bytes, times in seconds)."""
    data = asdict(result)
    request = data.pop("request")
    data.update({key: request[key] for key in ("repo_id", "revision", "repo_type", "kind")},
                include=list(request["include"]), exclude=list(request["exclude"]), ok=result.ok,
                seconds=round(result.seconds, 3))
    return data


def warm_report_dict(report: WarmReport) -> dict[str, Any]:
    """``warm --json``; ``warnings`` holds every warning line the text output prints: the run's
    (:attr:`WarmReport.warnings`), then each repo's notes as ``REPO_ID: note``."""
    return {"cache_dir": report.cache_dir, "ok": report.ok, "exit_code": report.exit_code,
            "bytes_downloaded": report.bytes_downloaded, "requests": report.requests,
            "satisfied_by_cache": report.satisfied_by_cache, "seconds": round(report.seconds, 3),
            "endpoints": list(report.endpoints), "repos": [repo_result_dict(r) for r in report.repos],
            "warnings": [*report.warnings, *(f"{r.request.repo_id}: {note}" for r in report.repos for note in r.notes)]}


def warm_summary_table(report: WarmReport) -> Table:
    from rich.text import Text

    several = len(report.endpoints) > 1 or len({r.endpoint for r in report.repos if r.endpoint}) > 1
    retried = any(r.retries for r in report.repos)
    columns = ["repo", "commit", "files", "size", "downloaded", "requests", "time", *(["endpoint"] if several else []),
               *(["retries"] if retried else []), "status"]
    table = common.table(f"hfcache warm -> {report.cache_dir}", columns, caption=warm_summary_line(report),
                         right=("files", "size", "downloaded", "requests", "time", "retries"))
    for r in report.repos:
        label = r.request.spec
        if r.canonical_id and r.canonical_id != r.request.repo_id:
            label += f" -> {r.canonical_id}"
        status = Text("ok", style="green") if r.ok else Text(f"failed (exit {r.exit_code})", style="red")
        if r.error_type == "Interrupted":
            status = Text("interrupted", style="yellow")
        table.add_row(label, (r.commit_hash or "-")[:12], str(len(r.files)) if r.ok else "-",
                      human_size(sum(f.size for f in r.files)) if r.ok else "-", human_size(r.bytes_downloaded),
                      str(r.requests), f"{r.seconds:.2f}s",
                      *([r.endpoint or ("- (cache)" if r.ok else "-")] if several else []),
                      *([str(r.retries)] if retried else []), status)
    return table


def warm_summary_line(report: WarmReport) -> str:
    """The line under warm's table: repos ok, failed and interrupted, bytes downloaded, HTTP requests sent, time."""
    stopped = sum(r.error_type == "Interrupted" for r in report.repos)  # Ctrl-C: not a failure of the repo
    failed = sum(not r.ok for r in report.repos) - stopped
    if report.satisfied_by_cache:
        return (f"{len(report.repos)} ok; lock satisfied by the cache: 0 requests, 0 B downloaded "
                f"in {report.seconds:.2f}s")
    requests = f"{report.requests} request{'' if report.requests == 1 else 's'}"
    interrupted = f", {stopped} interrupted" if stopped else ""
    return (f"{len(report.repos) - failed - stopped} ok, {failed} failed{interrupted}; "
            f"{human_size(report.bytes_downloaded)} downloaded, "
            f"{requests} in {report.seconds:.2f}s")


class WarmProgress:
    """warm's progress (a :class:`hfcache.records.ProgressSink`): on a terminal, one transient bar per repo (bytes)
    and a total bar on stderr. On Ctrl-C or SIGTERM, once the bars are gone, the summary of what finished and what was
    interrupted (:func:`interrupted_report`; not with ``-q``, nor when nothing finished)."""

    def __init__(self, *, as_json: bool, quiet: bool) -> None:
        self._enabled = not (as_json or quiet)  # --json / -q: no bar, and no rich import either
        self._as_json, self._quiet, self._started = as_json, quiet, time.monotonic()
        self._lock = threading.Lock()
        self._tasks: dict[int, TaskID] = {}
        self._early: dict[int, int] = {}  # key -> bytes advanced before repo_started
        self._total_repos = self._done = 0
        self.finished: dict[int, RepoResult] = {}
        self.cache_dir, self.requests, self.satisfied = "", [], []
        if not self._enabled:
            return
        from rich import progress as rp

        self._progress = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(),
                                     rp.DownloadColumn(binary_units=True), rp.TransferSpeedColumn(),
                                     rp.TextColumn("{task.fields[status]}"), rp.TimeElapsedColumn(),
                                     console=common.stderr, disable=not live_on_terminal(True), transient=True)

    def __enter__(self) -> WarmProgress:
        if self._enabled:
            self._progress.__enter__()
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self._enabled:
            self._progress.__exit__(kind, exc, tb)
        if kind is not None and issubclass(kind, KeyboardInterrupt) and not self._quiet:
            with contextlib.suppress(Exception):  # the summary is a courtesy: the interrupt itself must go on
                self._show_interrupted()

    def _show_interrupted(self) -> None:
        """The summary of an interrupted warm, unless stdout's reader is not reading."""
        finished = [*self.finished.values(), *self.satisfied]
        if not select.select([], [1], [], 0)[1] or not finished:  # nothing ended: the CLI's error line says it all
            return
        report = interrupted_report(self.requests, finished, cache_dir=self.cache_dir,
                                    seconds=time.monotonic() - self._started)
        show_warm_report(report, as_json=self._as_json, quiet=False)

    def planned(self, cache_dir: str, requests, satisfied) -> None:
        self.cache_dir, self.requests, self.satisfied = cache_dir, list(requests), list(satisfied)
        self._total_repos = len(self.requests)
        if self._enabled:
            self._total = self._progress.add_task("[bold]total", total=0, status=f"0/{self._total_repos} repos")

    def repo_started(self, key: int, label: str, files: int, total_bytes: int) -> None:
        """Repo ``key``'s bar: ``files`` files of ``total_bytes`` bytes, the bytes it reported already counted."""
        if not self._enabled:
            return
        with self._lock:
            early = self._early.pop(key, 0)
            if key in self._tasks:  # the repo is retried on the next endpoint: start its bar again
                self._progress.reset(self._tasks[key], total=total_bytes, completed=early)
                return
            self._tasks[key] = self._progress.add_task(label, total=total_bytes, completed=early,
                                                       status=f"{files} files")
            total = self._progress.tasks[self._total].total or 0
            self._progress.update(self._total, total=total + total_bytes)
            self._progress.advance(self._total, early)

    def advance(self, key: int, nbytes: int) -> None:
        """``nbytes`` more of repo ``key`` are in the cache (downloaded, resumed, linked or found cached)."""
        if not self._enabled:
            return
        with self._lock:
            task = self._tasks.get(key)
            if task is None:  # no bar yet (its total is not known): shown as done when repo_started adds it
                self._early[key] = self._early.get(key, 0) + nbytes
                return
            self._progress.advance(task, nbytes)
            self._progress.advance(self._total, nbytes)

    def repo_finished(self, key: int, result: RepoResult) -> None:
        """Repo ``key`` ended with ``result`` (kept in :attr:`finished`, also when no bar is shown)."""
        with self._lock:
            self.finished[key] = result
            if not self._enabled:
                return
            self._done += 1
            self._progress.update(self._total, status=f"{self._done}/{self._total_repos} repos")
            if (task := self._tasks.get(key)) is None:
                task = self._tasks[key] = self._progress.add_task(result.request.spec, total=0, status="")
            status = "[green]ok" if result.ok else (
                "[yellow]interrupted" if result.error_type == "Interrupted" else "[red]failed")
            self._progress.update(task, status=status)


def interrupted_report(requests, finished, *, cache_dir: str, seconds: float) -> WarmReport:
    """The report of an interrupted warm: per request (in order), its RepoResult among ``finished``, else an
    ``interrupted`` one (exit 130, nothing of it published)."""
    pool = list(finished)
    rows = []
    for request in requests:
        match = next((r for r in pool if r.request == request), None)
        if match is None:
            match = RepoResult(request=request, endpoint=None, error=f"{request.spec}: interrupted", exit_code=130,
                               error_type="Interrupted",
                               hint="run the command again: nothing of this repo was published (partial downloads "
                                    "resume)")
        else:
            pool.remove(match)
        rows.append(match)
    return WarmReport(cache_dir=cache_dir, repos=tuple(rows), seconds=seconds)


def show_warm_report(report: WarmReport, *, as_json: bool, quiet: bool) -> None:
    """JSON document on stdout, or the summary table on stdout and, on stderr, one line per warning (the run's, then
    each repo's notes) and per failed repo (not per interrupted one: the CLI prints that line)."""
    if as_json:
        print_json(warm_report_dict(report))
        return
    stopped = [r for r in report.repos if r.error_type == "Interrupted"]
    if not quiet and any(r.ok for r in report.repos):  # nothing warmed: the error lines say it all
        common.stdout.print(warm_summary_table(report))
    for warning in report.warnings:
        common.warn(warning)
    for r in report.repos:
        for note in r.notes:
            common.warn(f"{r.request.repo_id}: {note}")
        if not r.ok and r not in stopped:
            print_error(r.error or "failed", r.hint or usage_hint(r.exit_code, "hfcache warm"))


def show_pin_result(result: PinResult, lock_path, written: bool, *, as_json: bool) -> None:
    """The outcome of ``hfcache lock``: JSON, or a table of pinned repos and one line per failure."""
    if as_json:
        print_json({"lock": str(lock_path), "written": written, "ok": not result.failures,
                    "resolved": list(result.resolved), "kept": list(result.kept),
                    "failures": [asdict(f) for f in result.failures],
                    "repos": [{"repo_id": r.request.repo_id, "revision": r.request.revision,
                               "canonical_id": r.canonical_id, "commit_hash": r.commit_hash, "files": len(r.files),
                               "bytes": sum(f.size for f in r.files), "notes": list(r.notes)}
                              for r in result.lock.repos]})
        return
    table = common.table(f"hfcache lock -> {lock_path}", ("repo", "commit", "files", "size", "status"),
                         right=("files", "size"))
    for r in result.lock.repos:
        status = "resolved" if r.request.spec in result.resolved else "kept"
        table.add_row(r.request.spec, r.commit_hash[:12], str(len(r.files)),
                      human_size(sum(f.size for f in r.files)), status)
    if result.lock.repos:
        common.stdout.print(table)
    for r in result.lock.repos:
        for note in r.notes:
            common.warn(f"{r.request.repo_id}: {note}", soft_wrap=False)
    for f in result.failures:
        print_error(f.error, f.hint or usage_hint(f.exit_code, "hfcache lock"))
    if result.failures:
        entries = f"{len(result.failures)} entr{'y' if len(result.failures) == 1 else 'ies'}"
        common.stdout.print(f"{lock_path} not written: {entries} failed")
    else:
        common.stdout.print(f"{lock_path} {'written' if written else 'unchanged'}")


def show_lock_check(status: LockCheck, *, as_json: bool) -> None:
    """``hfcache lock --check``: JSON, or one line on stdout when the lock matches (a mismatch is an error line)."""
    if as_json:
        print_json({"lock": str(status.lock_path), "manifest": str(status.manifest), "ok": status.ok,
                    "drift": list(status.drift)})
    elif status.ok:
        common.stdout.print(f"{status.lock_path} matches {status.manifest}")
