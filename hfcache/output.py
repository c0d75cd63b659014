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
    retried = any(r.retries for r in report.repos)
    if retried:
        table.add_column("retries", justify="right")
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
            *([str(r.retries)] if retried else []),
            status,
        )
    failed = sum(not r.ok for r in report.repos)
    table.caption = (
        f"{len(report.repos) - failed} ok, {failed} failed; {human_size(report.bytes_downloaded)} downloaded "
        f"in {report.seconds:.2f}s"
    )
    table.caption_justify = "left"
    return table


def lock_wait_notice(wait: Any) -> None:
    """Tell the user on stderr which lock a command waits for, who holds it, and how long it will wait at most
    (a :class:`hfcache.locking.LockWait`; the ``on_lock_wait`` callback of warm, prune, repair and import)."""
    holder = f", held by {wait.holder}" if wait.holder else ""
    stderr.print(Text(f"hfcache: waiting for the lock {wait.path}{holder} (gives up after {wait.timeout:g}s: "
                      "--lock-timeout)", style="yellow"), soft_wrap=True)


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
            "unreadable": list(repo.unreadable),
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
                 "trust_remote_code": r.target.trust_remote_code,
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
                "bytes_new": report.bytes_new, "moved_refs": list(report.moved)}
    if as_json:
        print_json(document)
        return
    stderr.print(f"imported {len(report.repos)} repo(s), {report.files} snapshot entries into {report.cache_dir}: "
                 f"{report.blobs_new} new blob(s) ({human_size(report.bytes_new)}), "
                 f"{report.blobs_existing} already there")
    for ref in report.moved:
        stderr.print(Text(f"moved the target's {ref} to the source's commit (--move-refs)", style="yellow"))


def show_link(report, *, as_json: bool) -> None:
    document = {"src": report.src, "dest": report.dest, "mode": report.mode, "files": report.files,
                "bytes_added": report.bytes_added}
    if as_json:
        print_json(document)
        return
    stderr.print(f"{report.dest} -> {report.src} ({report.mode}; {report.files} files, "
                 f"{human_size(report.bytes_added)} added)")


# ------------------------------------------------------------------------------------------------ prune

if TYPE_CHECKING:
    from .prune import PrunePlan, PruneResult

_PRUNE_WHY = {"detached": "detached (no ref)", "over_budget": "least recently used, cache over --max-size"}
_HOUSEKEEPING = {"orphan": "orphan blob", "stale_incomplete": "stale .incomplete", "interrupted":
                 "left by an interrupted prune", "empty": "empty repo folder"}


def prune_dict(plan: PrunePlan, result: PruneResult | None = None, *, dry_run: bool) -> dict[str, Any]:
    """``hfcache prune --json``: the plan (what, why, bytes freed), and with a real run each item's status."""
    outcomes = {o.item: o for o in result.outcomes} if result is not None else {}
    items = []
    for item in plan.items:
        entry = {"kind": item.kind, "repo_id": item.repo_id, "repo_type": item.repo_type, "path": item.path,
                 "revision": item.revision, "reason": item.reason, "detail": item.detail,
                 "bytes_freed": item.bytes_freed}
        if item in outcomes:
            entry.update(status=outcomes[item].status, note=outcomes[item].note)
        items.append(entry)
    snapshot_status = {(o.item.folder, o.item.revision): o.status for o in outcomes.values()
                       if o.item.kind == "snapshot"}
    revisions = []
    for r in plan.revisions:
        entry = {"repo_id": r.repo_id, "repo_type": r.repo_type, "commit_hash": r.commit_hash, "refs": list(r.refs),
                 "last_used": iso_time(r.last_used), "size_on_disk": r.size_on_disk, "reason": r.reason,
                 "detail": r.detail, "bytes_freed": r.bytes_freed}
        if result is not None:
            entry["status"] = snapshot_status.get((r.folder, r.commit_hash), "removed")
        revisions.append(entry)
    policy = plan.policy
    document: dict[str, Any] = {
        "cache_dir": plan.cache_dir,
        "dry_run": dry_run,
        "executed": result is not None,
        "ok": result.ok if result is not None else True,
        "exit_code": result.exit_code if result is not None else (5 if plan.unreadable else 0),
        "unreadable": list(plan.unreadable),
        "policy": {"older_than": policy.older_than, "max_size": policy.max_size,
                   "keep": [str(k) for k in policy.keep], "keep_locks": list(policy.keep_locks),
                   "grace": policy.grace},
        "summary": {
            "repos_before": plan.repos_before, "repos_removed": plan.repos_removed,
            "repos_kept": plan.repos_before - plan.repos_removed,
            "revisions_before": plan.revisions_before, "revisions_removed": len(plan.revisions),
            "revisions_kept": plan.revisions_before - len(plan.revisions), "revisions_pinned": len(plan.pinned),
            "bytes_before": plan.bytes_before, "bytes_freed": plan.bytes_freed, "bytes_kept": plan.bytes_kept,
            "bytes_pinned": plan.bytes_pinned, "budget_met": plan.budget_met,
        },
        "pinned": [{"repo_type": t, "repo_id": i, "commit_hash": c} for t, i, c in plan.pinned],
        "revisions": revisions,
        "items": items,
        "warnings": list(plan.warnings),
    }
    if result is not None:
        document["result"] = {status: result.count(status) for status in ("removed", "gone", "skipped", "failed")}
        document["result"].update(bytes_freed=result.bytes_freed, seconds=round(result.seconds, 3))
    return document


def prune_tables(plan: PrunePlan, result: PruneResult | None = None, *, dry_run: bool,
                 tables: bool = True) -> list[Any]:
    """The people's view of a plan (or of its execution): removed revisions, housekeeping, the summary (without
    ``tables``, only the outcome lines: the plan was already shown before the confirmation)."""
    if not tables and result is not None:
        return _prune_outcome_lines(result)
    outcomes = {o.item: o for o in result.outcomes} if result is not None else {}
    renderables: list[Any] = []
    title = f"hfcache prune {plan.cache_dir}" + (" (dry run: nothing is removed)" if dry_run else "")
    if plan.revisions:
        table = Table(title=title + " - revisions", title_justify="left")
        for column in ("repo", "revision", "refs", "last used", "why", "frees") + (("status",) if result else ()):
            table.add_column(column, justify="right" if column == "frees" else "left", overflow="fold")
        status = {(o.item.folder, o.item.revision): o for o in outcomes.values() if o.item.kind == "snapshot"}
        for r in plan.revisions:
            row = [r.repo_id, r.commit_hash[:12], ", ".join(r.refs) or "-", ago(r.last_used, plan.now),
                   _PRUNE_WHY.get(r.reason, r.detail), human_size(r.bytes_freed)]
            if result is not None:
                outcome = status.get((r.folder, r.commit_hash))
                row.append(_status_text(outcome.status if outcome else "removed", outcome.note if outcome else ""))
            table.add_row(*row)
        renderables.append(table)
    groups: dict[tuple[str, str], list] = {}
    for item in plan.items:
        if item.reason in _HOUSEKEEPING:
            label = _HOUSEKEEPING[item.reason] + (" lock file" if item.kind == "lock" else "")
            groups.setdefault((item.repo_id, label), []).append(item)
    if groups:
        table = Table(title=title + " - housekeeping", title_justify="left")
        for column in ("repo", "what", "count", "frees") + (("status",) if result else ()):
            table.add_column(column, justify="right" if column in ("count", "frees") else "left", overflow="fold")
        for (repo_id, label), items in groups.items():
            row = [repo_id, label, str(len(items)), human_size(sum(i.bytes_freed for i in items))]
            if result is not None:
                counts: dict[str, int] = {}
                for i in items:
                    counts[outcomes[i].status] = counts.get(outcomes[i].status, 0) + 1
                row.append(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
            table.add_row(*row)
        renderables.append(table)
    pinned_repos = len({(t, i) for t, i, _ in plan.pinned})
    summary = Table(title="summary" if (plan.revisions or groups) else title, title_justify="left")
    for column in ("", "repos", "revisions", "size"):
        summary.add_column(column, justify="left" if not column else "right")
    summary.add_row("before", str(plan.repos_before), str(plan.revisions_before), human_size(plan.bytes_before))
    summary.add_row("removed" if result else "to remove", str(plan.repos_removed), str(len(plan.revisions)),
                    human_size(plan.bytes_freed))
    summary.add_row("kept", str(plan.repos_before - plan.repos_removed), str(plan.revisions_before -
                    len(plan.revisions)), human_size(plan.bytes_kept))
    summary.add_row("pinned", str(pinned_repos), str(len(plan.pinned)), human_size(plan.bytes_pinned))
    if plan.policy.max_size is not None:
        summary.caption = (f"--max-size {plan.policy.max_size:,} bytes ({human_size(plan.policy.max_size)}): "
                           + ("met" if plan.budget_met else "NOT met (see the warning)"))
        summary.caption_justify = "left"
    renderables.append(summary)
    for warning in plan.warnings:
        renderables.append(Text(f"warning: {warning}", style="yellow"))
    if not plan.items:
        renderables.append(Text("nothing to prune", style="green"))
    elif result is not None:
        renderables.extend(_prune_outcome_lines(result))
    return renderables


def _prune_outcome_lines(result: PruneResult) -> list[Text]:
    lines = [Text(f"{result.count('removed')} removed, {result.count('gone')} already gone, "
                  f"{result.count('skipped')} skipped, {result.count('failed')} failed; "
                  f"{human_size(result.bytes_freed)} freed in {result.seconds:.2f}s",
                  style="green" if result.ok else "red")]
    notes = [o for o in result.outcomes if o.status in ("skipped", "failed")]
    for o in notes[:20]:
        lines.append(Text(f"{o.status}: {o.item.path}: {o.note}", style="yellow" if o.status == "skipped" else "red"))
    if len(notes) > 20:
        lines.append(Text(f"... and {len(notes) - 20} more (see --json)", style="yellow"))
    return lines


def _status_text(status: str, note: str) -> Text:
    style = {"removed": "green", "gone": "dim", "skipped": "yellow", "failed": "red"}.get(status, "")
    return Text(status + (f" ({note})" if note else ""), style=style)


def show_prune(plan: PrunePlan, result: PruneResult | None = None, *, as_json: bool, dry_run: bool,
               tables: bool = True) -> None:
    """prune's plan or outcome: one JSON document on stdout, or tables on stderr (see :func:`prune_tables`)."""
    if as_json:
        print_json(prune_dict(plan, result, dry_run=dry_run), compact=len(plan.items) > 100)
        return
    for renderable in prune_tables(plan, result, dry_run=dry_run, tables=tables):
        stderr.print(renderable, soft_wrap=isinstance(renderable, Text))


def prune_question(plan: PrunePlan) -> str:
    """The confirmation question for a real run without --yes."""
    others = len(plan.items) - sum(1 for i in plan.items if i.kind in ("ref", "snapshot"))
    return (f"Remove {len(plan.revisions)} revision(s) and {others} other item(s) from {plan.cache_dir}, "
            f"freeing {human_size(plan.bytes_freed)}?")


class PruneProgress:
    """A progress bar on stderr while prune removes items (call :meth:`advance` once per item)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self._progress = Progress(TextColumn("pruning"), BarColumn(), TextColumn("{task.completed}/{task.total} items"),
                                  TimeElapsedColumn(), console=stderr, disable=not enabled, transient=True)
        self._task = self._progress.add_task("prune", total=total)

    def __enter__(self) -> PruneProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def advance(self, _outcome: Any = None) -> None:
        self._progress.advance(self._task, 1)


def show_mirror_ready(info: Any) -> None:
    """``hfcache serve`` is listening: what it serves and where (stderr; the endpoint is the last word)."""
    what = "cache" if info.layout == "cache" else "repo folders"
    token = ", bearer token required" if info.token_required else ""
    stderr.print(Text(f"hfcache: serving {what} {info.root}{token} at {info.endpoint}"), soft_wrap=True)


def show_mirror_stopped(run: Any) -> None:
    """``hfcache serve`` has shut down (stderr)."""
    cut = f"; {run.cut_short} download(s) cut short" if run.cut_short else ""
    stderr.print(Text(f"hfcache: stopped on {run.signal} after {run.seconds:.0f} s{cut}"), soft_wrap=True)


if TYPE_CHECKING:
    from .doctor import DoctorReport


def show_env(text: str) -> None:
    """``hfcache env``: the rendered variables, exactly as given, on stdout (no colour, nothing else)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def doctor_dict(report: DoctorReport) -> dict[str, Any]:
    """``hfcache doctor --json``: the report as plain data (sizes in bytes)."""
    return {
        "ok": report.ok,
        "exit_code": report.exit_code,
        "cache_dir": report.cache_dir,
        "effective_cache_dir": report.effective_cache_dir,
        "cache_source": report.cache_source,
        "offline": report.offline,
        "user": {"uid": report.uid, "gid": report.gid, "groups": list(report.groups)},
        "cache": {"owner_uid": report.owner_uid, "owner_gid": report.owner_gid, "writable": report.writable,
                  "read_only_fs": report.read_only_fs, "symlinks": report.symlinks, "free_bytes": report.free_bytes},
        "versions": dict(report.versions),
        "findings": [{"code": f.code, "severity": f.severity, "message": f.message, "fix": f.fix}
                     for f in report.findings],
    }


def show_doctor(report: DoctorReport, *, as_json: bool) -> None:
    """doctor's result: JSON, or a table of findings (errors first, each with its fix) and a verdict on stderr."""
    if as_json:
        print_json(doctor_dict(report))
        return
    styles = {"error": "bold red", "warning": "yellow", "info": "dim"}
    table = Table(title=f"hfcache doctor {report.cache_dir}", title_justify="left")
    for column in ("severity", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for f in report.findings:
        table.add_row(Text(f.severity, style=styles[f.severity]), f.message, f.fix or "")
    stderr.print(table)
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    verdict = Text("ok", style="green") if not errors else Text(f"{errors} error(s)", style="bold red")
    stderr.print(Text.assemble(verdict, f", {warnings} warning(s)"))
