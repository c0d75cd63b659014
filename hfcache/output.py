"""Rendering: rich progress and tables on stderr for people, one JSON document on stdout for machines.

Nothing here decides anything; it only shows the dataclasses the core returns. ``NO_COLOR`` is honoured by rich.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from typing import TYPE_CHECKING

from .records import RepoResult, WarmReport

if TYPE_CHECKING:
    from .pin import PinResult
    from .repair import RepairAction
    from .scan import CacheInfo
    from .check import CheckReport
    from .verify import VerifyReport

stderr = Console(stderr=True, highlight=False)
if not stderr.is_terminal and "COLUMNS" not in os.environ:
    # rich assumes 80 columns off a terminal (CI logs, docker build output): tables would wrap every id.
    stderr = Console(stderr=True, highlight=False, width=120)


def print_json(document: Any, *, compact: bool = False) -> None:
    """Print exactly one JSON document on stdout (sorted keys, trailing newline; two-space indent unless
    ``compact``, which large listings use: indenting 10,000 repos costs more than scanning them)."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":")) if compact else json.dumps(
        document, indent=2, sort_keys=True)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_error(message: str, hint: str | None = None) -> None:
    """One or two lines on stderr: what failed, and what to do."""
    stderr.print(Text(f"hfcache: error: {message}", style="bold red"), soft_wrap=True)
    if hint:
        stderr.print(Text(f"hint: {hint}", style="yellow"), soft_wrap=True)


def human_size(n: int | float) -> str:
    """1536 -> '1.5 KiB' (binary units, as ``du -h``)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def repo_result_dict(result: RepoResult) -> dict[str, Any]:
    """A RepoResult as plain JSON data (sizes in bytes, times in seconds)."""
    data = asdict(result)
    request = data.pop("request")
    data.update(
        repo_id=request["repo_id"],
        revision=request["revision"],
        repo_type=request["repo_type"],
        kind=request["kind"],
        include=list(request["include"]),
        exclude=list(request["exclude"]),
        ok=result.ok,
        seconds=round(result.seconds, 3),
    )
    return data


def warm_report_dict(report: WarmReport) -> dict[str, Any]:
    return {
        "cache_dir": report.cache_dir,
        "ok": report.ok,
        "exit_code": report.exit_code,
        "bytes_downloaded": report.bytes_downloaded,
        "seconds": round(report.seconds, 3),
        "endpoints": list(report.endpoints),
        "repos": [repo_result_dict(r) for r in report.repos],
    }


def warm_summary_table(report: WarmReport) -> Table:
    table = Table(title=f"hfcache warm -> {report.cache_dir}", title_justify="left")
    table.add_column("repo")
    table.add_column("commit")
    table.add_column("files", justify="right")
    table.add_column("size", justify="right")
    table.add_column("downloaded", justify="right")
    table.add_column("time", justify="right")
    several = len(report.endpoints) > 1 or len({r.endpoint for r in report.repos}) > 1
    if several:
        table.add_column("endpoint")
    table.add_column("status")
    for r in report.repos:
        label = r.request.spec
        if r.canonical_id and r.canonical_id != r.request.repo_id:
            label += f" -> {r.canonical_id}"
        status = Text("ok", style="green") if r.ok else Text(f"failed (exit {r.exit_code})", style="red")
        table.add_row(
            label,
            (r.commit_hash or "-")[:12],
            str(len(r.files)) if r.ok else "-",
            human_size(sum(f.size for f in r.files)) if r.ok else "-",
            human_size(r.bytes_downloaded),
            f"{r.seconds:.2f}s",
            *([r.endpoint] if several else []),
            status,
        )
    failed = sum(not r.ok for r in report.repos)
    table.caption = (
        f"{len(report.repos) - failed} ok, {failed} failed; {human_size(report.bytes_downloaded)} downloaded "
        f"in {report.seconds:.2f}s"
    )
    table.caption_justify = "left"
    return table


class WarmProgress:
    """A rich progress display on stderr: one bar per repo (bytes) and a total bar; implements ProgressSink."""

    def __init__(self, total_repos: int, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=stderr,
            disable=not enabled,
            transient=False,
        )
        self._lock = threading.Lock()
        self._tasks: dict[int, TaskID] = {}
        self._total = self._progress.add_task("[bold]total", total=0, status=f"0/{total_repos} repos")
        self._total_repos = total_repos
        self._done = 0

    def __enter__(self) -> WarmProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def repo_started(self, key: int, label: str, files: int, total_bytes: int) -> None:
        with self._lock:
            if key in self._tasks:  # the repo is retried on the next endpoint: start its bar again
                self._progress.reset(self._tasks[key], total=total_bytes)
                return
            self._tasks[key] = self._progress.add_task(label, total=total_bytes, status=f"{files} files")
            total = self._progress.tasks[self._total].total or 0
            self._progress.update(self._total, total=total + total_bytes)

    def advance(self, key: int, nbytes: int) -> None:
        task = self._tasks.get(key)
        if task is not None:
            self._progress.advance(task, nbytes)
        self._progress.advance(self._total, nbytes)

    def repo_finished(self, key: int, result: RepoResult) -> None:
        with self._lock:
            self._done += 1
            self._progress.update(self._total, status=f"{self._done}/{self._total_repos} repos")
            task = self._tasks.get(key)
            if task is None:
                task = self._tasks[key] = self._progress.add_task(result.request.spec, total=0, status="")
            self._progress.update(task, status="[green]ok" if result.ok else "[red]failed")


def show_warm_report(report: WarmReport, *, as_json: bool, quiet: bool) -> None:
    """JSON document on stdout, or the summary table and one error line per failed repo on stderr."""
    if as_json:
        print_json(warm_report_dict(report))
        return
    if not quiet:
        stderr.print(warm_summary_table(report))
    for r in report.repos:
        if not r.ok:
            print_error(r.error or "failed", r.hint)


def show_pin_result(result: PinResult, lock_path, written: bool, *, as_json: bool) -> None:
    """The outcome of ``hfcache lock``: JSON, or a table of pinned repos and one line per failure."""
    if as_json:
        print_json({
            "lock": str(lock_path),
            "written": written,
            "ok": not result.failures,
            "resolved": list(result.resolved),
            "kept": list(result.kept),
            "failures": [{"spec": f.spec, "error": f.error, "hint": f.hint, "exit_code": f.exit_code}
                         for f in result.failures],
            "repos": [
                {"repo_id": r.request.repo_id, "revision": r.request.revision, "canonical_id": r.canonical_id,
                 "commit_hash": r.commit_hash, "files": len(r.files), "bytes": sum(f.size for f in r.files)}
                for r in result.lock.repos
            ],
        })
        return
    table = Table(title=f"hfcache lock -> {lock_path}", title_justify="left")
    for column in ("repo", "commit", "files", "size", "status"):
        table.add_column(column, justify="right" if column in ("files", "size") else "left")
    for r in result.lock.repos:
        status = "resolved" if r.request.spec in result.resolved else "kept"
        table.add_row(r.request.spec, r.commit_hash[:12], str(len(r.files)),
                      human_size(sum(f.size for f in r.files)), status)
    if result.lock.repos:
        stderr.print(table)
    for f in result.failures:
        print_error(f.error, f.hint)
    if result.failures:
        stderr.print(f"{lock_path} not written: {len(result.failures)} entr{'y' if len(result.failures) == 1 else 'ies'} failed")
    else:
        stderr.print(f"{lock_path} {'written' if written else 'unchanged'}")


def iso_time(timestamp: float) -> str | None:
    """Seconds since the epoch -> ISO 8601 in UTC (None for 0: never)."""
    if not timestamp:
        return None
    import datetime

    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


def ago(timestamp: float, now: float) -> str:
    """Humanised age: '42s ago', '3m ago', '5h ago', '12d ago'."""
    if not timestamp:
        return "never"
    seconds = max(0.0, now - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def ls_dict(info: CacheInfo, pinned: set[tuple[str, str, str]] | None) -> dict[str, Any]:
    """``hfcache ls --json``: sizes in bytes, times ISO 8601; ``pinned`` is null without --lock."""

    def is_pinned(repo, rev) -> bool | None:
        return None if pinned is None else (repo.repo_type, repo.repo_id, rev.commit_hash) in pinned

    repos = []
    for repo in info.repos:
        revisions = [
            {
                "commit_hash": rev.commit_hash,
                "refs": list(rev.refs),
                "files": len(rev.files),
                "size_on_disk": rev.size_on_disk,
                "last_used": iso_time(rev.last_used),
                "pinned": is_pinned(repo, rev),
                "health": "ok" if not rev.problems else "; ".join(rev.problems),
            }
            for rev in repo.revisions
        ]
        repos.append({
            "repo_id": repo.repo_id,
            "repo_type": repo.repo_type,
            "folder": repo.folder,
            "refs": dict(sorted(repo.refs.items())),
            "revisions": revisions,
            "files": len({f.path for rev in repo.revisions for f in rev.files}),
            "size_on_disk": repo.size_on_disk,
            "last_used": iso_time(repo.last_used),
            "pinned": None if pinned is None else any(r["pinned"] for r in revisions),
            "health": repo.health,
            "problems": list(repo.problems),
            "incomplete": list(repo.incomplete),
        })
    return {
        "cache_dir": info.cache_dir,
        "size_on_disk": info.size_on_disk,
        "size_note": "bytes shared between revisions or repos (hardlinks) are counted once",
        "repos": repos,
        "totals": {
            "repos": len(info.repos),
            "revisions": sum(len(r.revisions) for r in info.repos),
            "size_on_disk": info.size_on_disk,
            "unhealthy": sum(1 for r in info.repos if r.problems),
        },
    }


def ls_table(document: dict[str, Any], revisions: bool, now: float) -> Table:
    """The ``hfcache ls`` table, built from the same document ``--json`` prints."""
    import datetime

    def ts(value: str | None) -> float:
        return datetime.datetime.fromisoformat(value).timestamp() if value else 0.0

    table = Table(title=f"hfcache ls {document['cache_dir']}", title_justify="left")
    for column in ("repo", "type", "revision" if revisions else "refs", "files", "size", "last used", "pinned",
                   "health"):
        table.add_column(column, justify="right" if column in ("files", "size") else "left",
                         overflow="fold")
    for repo in document["repos"]:
        rows = repo["revisions"] if revisions else [repo]
        for row in rows:
            if revisions:
                where = row["commit_hash"][:12] + (f" ({', '.join(row['refs'])})" if row["refs"] else " (detached)")
            else:
                where = ", ".join(f"{name}->{value[:10]}" for name, value in repo["refs"].items()) or "-"
            pinned = "-" if row["pinned"] is None else ("yes" if row["pinned"] else "no")
            health = Text("ok", style="green") if row["health"] == "ok" else Text(row["health"], style="red")
            table.add_row(repo["repo_id"], repo["repo_type"], where, str(row["files"]),
                          human_size(row["size_on_disk"]), ago(ts(row["last_used"]), now), pinned, health)
    totals = document["totals"]
    table.caption = (f"{totals['repos']} repos, {totals['revisions']} revisions, "
                     f"{human_size(totals['size_on_disk'])} on disk (shared bytes counted once), "
                     f"{totals['unhealthy']} with problems")
    table.caption_justify = "left"
    return table


class HashProgress:
    """A bytes progress bar on stderr while verify hashes (implements verify's HashProgress)."""

    def __init__(self, enabled: bool = True) -> None:
        self._progress = Progress(TextColumn("hashing"), BarColumn(), DownloadColumn(binary_units=True),
                                  TransferSpeedColumn(), TimeElapsedColumn(), console=stderr, disable=not enabled,
                                  transient=True)
        self._task = self._progress.add_task("hash", total=0)

    def __enter__(self) -> HashProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def start(self, total_bytes: int) -> None:
        self._progress.update(self._task, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        self._progress.advance(self._task, nbytes)


def _problem_dict(p) -> dict[str, Any]:
    return {"repo_id": p.repo_id, "revision": p.revision, "path": p.path, "kind": p.kind, "detail": p.detail,
            "error": p.is_error}


def show_verify(report: VerifyReport, actions: tuple[RepairAction, ...], before: VerifyReport | None, *,
                as_json: bool) -> None:
    """verify's result: JSON, or a table of every problem (errors first in severity, stable order) and a summary."""
    if as_json:
        document = {
            "cache_dir": report.cache_dir,
            "ok": report.ok,
            "exit_code": report.exit_code,
            "repos": list(report.repos),
            "blobs_hashed": report.blobs_hashed,
            "bytes_hashed": report.bytes_hashed,
            "seconds": round(report.seconds, 3),
            "problems": [_problem_dict(p) for p in report.problems],
        }
        if before is not None:
            document["before_repair"] = [_problem_dict(p) for p in before.problems]
            document["repairs"] = [{"repo_id": a.repo_id, "revision": a.revision, "path": a.path,
                                    "action": a.action, "detail": a.detail, "ok": a.ok} for a in actions]
        print_json(document)
        return
    if before is not None:
        table = Table(title="repairs", title_justify="left")
        for column in ("repo", "revision", "path", "action", "detail"):
            table.add_column(column, overflow="fold")
        for a in actions:
            table.add_row(a.repo_id, a.revision[:12], a.path, Text(a.action, style="green" if a.ok else "red"),
                          a.detail)
        stderr.print(table)
    if report.problems:
        table = Table(title=f"hfcache verify {report.cache_dir}", title_justify="left")
        for column in ("repo", "revision", "path", "problem", "detail"):
            table.add_column(column, overflow="fold")
        for p in report.problems:
            table.add_row(p.repo_id, p.revision[:12] if len(p.revision) == 40 else p.revision, p.path,
                          Text(p.kind, style="red" if p.is_error else "yellow"), p.detail)
        stderr.print(table)
    errors = len(report.errors)
    notes = len(report.problems) - errors
    verdict = Text("ok", style="green") if report.ok else Text(f"{errors} integrity problem(s)", style="bold red")
    stderr.print(Text.assemble(
        verdict, f": {len(report.repos)} repos, {report.blobs_hashed} blobs ({human_size(report.bytes_hashed)}) "
        f"hashed in {report.seconds:.2f}s" + (f", {notes} note(s)" if notes else "")))


def show_check(report: CheckReport, *, as_json: bool) -> None:
    """check's result: JSON, or a table (repo, class, vocab, load time, ids or the cause of the failure)."""
    if as_json:
        print_json({
            "cache_dir": report.cache_dir,
            "text": report.text,
            "ok": report.ok,
            "exit_code": report.exit_code,
            "import_seconds": report.import_seconds,
            "tokenizers": [
                {"repo_id": r.target.repo_id, "revision": r.target.revision, "ok": r.ok,
                 "class": r.tokenizer_class, "vocab_size": r.vocab_size,
                 "input_ids": list(r.input_ids) if r.input_ids is not None else None,
                 "seconds": r.seconds, "error": r.error, "cause": r.cause}
                for r in report.results
            ],
        })
        return
    table = Table(title=f"hfcache check {report.cache_dir} (offline)", title_justify="left")
    for column in ("tokenizer", "class", "vocab", "load", "result"):
        table.add_column(column, overflow="fold", justify="right" if column in ("vocab", "load") else "left")
    for r in report.results:
        if r.ok:
            ids = list(r.input_ids or ())
            shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
            result = Text(f"ok [{shown}]", style="green")
        else:
            result = Text(r.cause or r.error or "failed", style="red")
        table.add_row(r.target.spec, r.tokenizer_class or "-", str(r.vocab_size or "-"), f"{r.seconds:.2f}s", result)
    stderr.print(table)
    failed = sum(not r.ok for r in report.results)
    stderr.print(Text(f"{len(report.results) - failed} loaded, {failed} failed", style="green" if not failed else "red"))
    for r in report.results:
        if not r.ok and r.cause and r.error:
            stderr.print(Text(f"{r.target.spec}: {r.error.splitlines()[0][:300]}", style="dim"), soft_wrap=True)


def show_export(plan, dest: str, fmt: str, digest: str | None, *, as_json: bool) -> None:
    """export's result: what was written, the unique bytes, and the tar's sha256 (a stable layer digest)."""
    document = {"dest": dest, "format": fmt, "repos": list(plan.repos), "entries": len(plan.entries),
                "unique_bytes": plan.unique_bytes, "sha256": digest}
    if as_json:
        print_json(document)
        return
    stderr.print(f"exported {len(plan.repos)} repo(s), {len(plan.entries)} entries, "
                 f"{human_size(plan.unique_bytes)} of distinct content -> {dest} ({fmt})"
                 + (f"\nsha256:{digest}" if digest else ""))


def show_import(report, *, as_json: bool) -> None:
    document = {"cache_dir": report.cache_dir, "repos": list(report.repos), "files": report.files,
                "blobs_new": report.blobs_new, "blobs_existing": report.blobs_existing,
                "bytes_new": report.bytes_new, "kept_refs": list(report.kept)}
    if as_json:
        print_json(document)
        return
    stderr.print(f"imported {len(report.repos)} repo(s), {report.files} snapshot entries into {report.cache_dir}: "
                 f"{report.blobs_new} new blob(s) ({human_size(report.bytes_new)}), "
                 f"{report.blobs_existing} already there")
    for ref in report.kept:
        stderr.print(Text(f"kept the target's existing {ref} (it points elsewhere)", style="yellow"))


def show_link(report, *, as_json: bool) -> None:
    document = {"src": report.src, "dest": report.dest, "mode": report.mode, "files": report.files,
                "bytes_added": report.bytes_added}
    if as_json:
        print_json(document)
        return
    stderr.print(f"{report.dest} -> {report.src} ({report.mode}; {report.files} files, "
                 f"{human_size(report.bytes_added)} added)")
