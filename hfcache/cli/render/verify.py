"""Rendering of ``hfcache verify`` (hashing progress, problems, repairs) and ``hfcache check`` (offline loads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.text import Text

from . import common
from .common import Bar, human_size, print_json, stdout

if TYPE_CHECKING:
    from ...integrity.check import CheckReport
    from ...integrity.repair import RepairAction
    from ...integrity.verify_report import VerifyReport

__all__ = ["HashProgress", "show_check", "show_verify"]


class HashProgress(Bar):
    """A bytes progress bar on stderr while verify hashes (implements verify's HashProgress)."""

    def __init__(self, enabled: bool = True) -> None:
        super().__init__(enabled, 0, TextColumn("hashing"), BarColumn(), DownloadColumn(binary_units=True),
                         TransferSpeedColumn(), TimeElapsedColumn())


def _problem_dict(p) -> dict[str, Any]:
    return {"repo_id": p.repo_id, "revision": p.revision, "path": p.path, "kind": p.kind, "detail": p.detail,
            "error": p.is_error, "linked_from": list(p.linked_from)}


def show_verify(report: VerifyReport, actions: tuple[RepairAction, ...], before: VerifyReport | None, *,
                as_json: bool, exit_code: int | None = None) -> None:
    """verify's result: JSON, or a table of every problem and a summary; ``exit_code``: the command's (``verify
    --repair``: 3 when no endpoint could serve a revision), default the report's."""
    if as_json:
        document = {"cache_dir": report.cache_dir, "ok": report.ok, "repos": list(report.repos),
                    "exit_code": report.exit_code if exit_code is None else exit_code,
                    "blobs_hashed": report.blobs_hashed, "bytes_hashed": report.bytes_hashed,
                    "blobs_skipped": report.blobs_skipped, "seconds": round(report.seconds, 3),
                    "problems": [_problem_dict(p) for p in report.problems]}
        if before is not None:
            document["before_repair"] = [_problem_dict(p) for p in before.problems]
            document["repairs"] = [{"repo_id": a.repo_id, "revision": a.revision, "path": a.path,
                                    "action": a.action, "detail": a.detail, "ok": a.ok} for a in actions]
        print_json(document)
        return
    if before is not None:
        table = common.table("repairs", ("repo", "revision", "path", "action", "detail"), overflow="fold")
        for a in actions:
            table.add_row(a.repo_id, a.revision[:12], a.path, Text(a.action, style="green" if a.ok else "red"),
                          a.detail)
        stdout.print(table)
    if report.problems:
        table = common.table(f"hfcache verify {report.cache_dir}", ("repo", "revision", "path", "problem", "detail"),
                             overflow="fold")
        for p in report.problems:
            table.add_row(p.repo_id, p.revision[:12] if len(p.revision) == 40 else p.revision, p.path,
                          Text(p.kind, style="red" if p.is_error else "yellow"), p.detail)
        stdout.print(table)
    errors = len(report.errors)
    notes = len(report.problems) - errors
    verdict = Text("ok", style="green") if report.ok else Text(f"{errors} integrity problem(s)", style="bold red")
    stdout.print(Text.assemble(
        verdict, f": {len(report.repos)} repos, {report.blobs_hashed} distinct blobs "
        f"({human_size(report.bytes_hashed)}) "
        f"hashed in {report.seconds:.2f}s"
        + (f", {report.blobs_skipped} unchanged since a --fast run (not hashed)" if report.blobs_skipped else "")
        + (f", {notes} note(s)" if notes else "")))


def show_check(report: CheckReport, *, as_json: bool) -> None:
    """check's result: JSON, or a table (repo, class, vocab, load time, ids or the cause of the failure)."""
    if as_json:
        print_json({"cache_dir": report.cache_dir, "text": report.text, "ok": report.ok, "exit_code": report.exit_code,
                    "import_seconds": report.import_seconds, "fast_path_recorded": report.fast_recorded,
                    "tokenizers": [
                        {"repo_id": r.target.repo_id, "revision": r.target.revision, "repo_type": r.target.repo_type,
                         "ok": r.ok, "trust_remote_code": r.target.trust_remote_code,
                         "class": r.tokenizer_class, "vocab_size": r.vocab_size,
                         "input_ids": list(r.input_ids) if r.input_ids is not None else None,
                         "seconds": r.seconds, "error": r.error, "cause": r.cause, "skipped": r.skipped,
                         "not_run": r.not_run, "fast_path": r.fast_path, "commit": r.commit}
                        for r in report.results]})
        return
    table = common.table(f"hfcache check {report.cache_dir} (offline)",
                         ("tokenizer", "class", "vocab", "load", "fast path", "result"), right=("vocab", "load"),
                         overflow="fold")
    for r in report.results:
        if r.skipped:
            result = Text(f"skipped: {r.skipped}", style="yellow")
        elif r.ok:
            ids = list(r.input_ids or ())
            shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
            result = Text(f"ok [{shown}]", style="green")
        else:
            result = Text(r.cause or r.error or "failed", style="red")
        table.add_row(r.target.spec, r.tokenizer_class or "-", str(r.vocab_size or "-"), f"{r.seconds:.2f}s",
                      _fast_cell(r.fast_path), result)
    stdout.print(table)
    failed = sum(not r.ok for r in report.results)
    skipped = sum(bool(r.skipped) and not r.not_run for r in report.results)
    not_run = sum(r.not_run for r in report.results)
    stdout.print(Text(f"{len(report.results) - failed - skipped - not_run} loaded, {failed} failed"
                      + (f", {skipped} skipped" if skipped else "")
                      + (f", {not_run} not run (custom code not trusted)" if not_run else ""),
                      style="green" if report.ok and not failed else "red"))
    for r in report.results:
        if not r.ok and r.cause and r.error and r.error != r.cause:
            stdout.print(Text(f"{r.target.spec}: {r.error.splitlines()[0][:300]}", style="dim"), soft_wrap=True)
    for r in report.results:
        if r.fast_path and r.fast_path != "equal":
            stdout.print(Text(f"fast path {r.target.spec}: {r.fast_path.splitlines()[0][:400]}", style="dim"),
                         soft_wrap=True)
    if report.fast_recorded is False:
        stdout.print(Text("fast path: not recorded (the cache's .locks/ cannot be written): load_tokenizer cannot "
                          "refuse the repos that differ", style="yellow"), soft_wrap=True)


def _fast_cell(verdict: str | None) -> Text:
    if not verdict:
        return Text("-")
    word = verdict.split(":", 1)[0]
    return Text(word, style={"equal": "green", "differs": "red"}.get(word, "yellow"))
