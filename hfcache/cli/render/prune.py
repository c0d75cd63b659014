"""Rendering of ``hfcache prune``: the plan (revisions, housekeeping, summary), the confirmation, the outcome."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from . import common
from .common import Bar, ago, human_size, inert, iso_time, print_json, stdout

if TYPE_CHECKING:
    from ...prune import PrunePlan, PruneResult

__all__ = ["PruneProgress", "prune_dict", "prune_question", "prune_tables", "show_prune"]

_PRUNE_WHY = {"detached": "detached (no ref)", "superseded": "superseded (no ref names it)", "over_budget": "least recently used, cache over --max-size"}
_HOUSEKEEPING = {"orphan": "orphan blob", "stale_incomplete": "stale .incomplete", "interrupted":
                 "left by an interrupted prune", "empty": "empty repo folder"}


def prune_dict(plan: PrunePlan, result: PruneResult | None = None, *, dry_run: bool) -> dict[str, Any]:
    """``hfcache prune --json``: the plan (what, why, bytes freed), and with a real run each item's status."""
    outcomes = {o.item: o for o in result.outcomes} if result is not None else {}
    items = []
    for item in plan.items:
        entry = {k: v for k, v in asdict(item).items() if k != "folder"}
        if item in outcomes:
            entry.update(status=outcomes[item].status, note=outcomes[item].note)
        items.append(entry)
    snapshot_status = {(o.item.folder, o.item.revision): o.status for o in outcomes.values()
                       if o.item.kind == "snapshot"}
    revisions = []
    for r in plan.revisions:
        entry = {k: v for k, v in asdict(r).items() if k != "folder"} | {"last_used": iso_time(r.last_used)}
        if result is not None:
            entry["status"] = snapshot_status.get((r.folder, r.commit_hash), "removed")
        revisions.append(entry)
    policy = plan.policy
    document: dict[str, Any] = {
        "cache_dir": plan.cache_dir, "dry_run": dry_run, "executed": result is not None,
        "ok": result.ok if result is not None else True,
        "exit_code": result.exit_code if result is not None else (5 if plan.unreadable else 0),
        "unreadable": list(plan.unreadable), "empty_cache": plan.empty,
        "policy": asdict(policy) | {"keep": [str(k) for k in policy.keep]},
        "summary": {
            "repos_before": plan.repos_before, "repos_removed": plan.repos_removed,
            "repos_kept": plan.repos_before - plan.repos_removed,
            "revisions_before": plan.revisions_before, "revisions_removed": len(plan.revisions),
            "revisions_kept": plan.revisions_before - len(plan.revisions), "revisions_pinned": len(plan.pinned),
            "bytes_before": plan.bytes_before, "bytes_freed": plan.bytes_freed, "bytes_kept": plan.bytes_kept,
            "bytes_pinned": plan.bytes_pinned, "budget_met": plan.budget_met},
        "pinned": [{"repo_type": t, "repo_id": i, "commit_hash": c} for t, i, c in plan.pinned],
        "revisions": revisions, "items": items, "warnings": list(plan.warnings),
        "kept": [asdict(k) | {"last_used": iso_time(k.last_used)} for k in plan.kept]}
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
        renderables.append(_revisions_table(plan, result, outcomes, title))
    groups: dict[tuple[str, str], list] = {}
    for item in plan.items:
        if item.reason in _HOUSEKEEPING:
            label = _HOUSEKEEPING[item.reason] + (" lock file" if item.kind == "lock" else
                                                  " (shared Xet payload)" if item.kind == "payload" else "")
            groups.setdefault((item.repo_id, label), []).append(item)
    if groups:
        renderables.append(_housekeeping_table(groups, result, outcomes, title))
    if plan.kept:
        kept = common.table(title + " - kept by the grace period", ("repo", "what", "last used", "why"),
                            overflow="fold")
        for k in plan.kept:
            kept.add_row(k.repo_id, k.revision[:12] if k.revision else k.path.rsplit("/", 1)[-1],
                         ago(k.last_used, plan.now), k.why)
        renderables.append(kept)
    renderables.append(_summary_table(plan, result, "summary" if (plan.revisions or groups) else title))
    for warning in plan.warnings:
        renderables.append(Text(f"warning: {inert(warning)}", style="yellow"))
    if not plan.items:
        renderables.append(Text("empty cache: nothing to prune" if plan.empty else "nothing to prune"
                                + (f" ({len(plan.kept)} kept by the grace period: see above)" if plan.kept else ""),
                                style="green"))
    elif result is not None:
        renderables.extend(_prune_outcome_lines(result))
    return renderables


def _revisions_table(plan: PrunePlan, result: PruneResult | None, outcomes: dict, title: str) -> Table:
    table = common.table(title + " - revisions", ("repo", "revision", "refs", "last used", "why", "frees")
                         + (("status",) if result else ()), right=("frees",), overflow="fold")
    status = {(o.item.folder, o.item.revision): o for o in outcomes.values() if o.item.kind == "snapshot"}
    for r in plan.revisions:
        row = [r.repo_id, r.commit_hash[:12], ", ".join(r.refs) or "-", ago(r.last_used, plan.now),
               _PRUNE_WHY.get(r.reason, r.detail), human_size(r.bytes_freed)]
        if result is not None:
            outcome = status.get((r.folder, r.commit_hash))
            row.append(_status_text(outcome.status if outcome else "removed", outcome.note if outcome else ""))
        table.add_row(*row)
    return table


def _housekeeping_table(groups: dict[tuple[str, str], list], result: PruneResult | None, outcomes: dict,
                        title: str) -> Table:
    table = common.table(title + " - housekeeping", ("repo", "what", "count", "frees")
                         + (("status",) if result else ()), right=("count", "frees"), overflow="fold")
    for (repo_id, label), items in groups.items():
        row = [repo_id, label, str(len(items)), human_size(sum(i.bytes_freed for i in items))]
        if result is not None:
            counts: dict[str, int] = {}
            for i in items:
                counts[outcomes[i].status] = counts.get(outcomes[i].status, 0) + 1
            row.append(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        table.add_row(*row)
    return table


def _summary_table(plan: PrunePlan, result: PruneResult | None, title: str) -> Table:
    pinned_repos = len({(t, i) for t, i, _ in plan.pinned})
    summary = common.table(title, ("", "repos", "revisions", "size"), right=("repos", "revisions", "size"))
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
    return summary


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
    """prune's plan or outcome: one JSON document on stdout, or tables on stdout (see :func:`prune_tables`)."""
    if as_json:
        print_json(prune_dict(plan, result, dry_run=dry_run), compact=len(plan.items) > 100)
        return
    for renderable in prune_tables(plan, result, dry_run=dry_run, tables=tables):
        stdout.print(renderable, soft_wrap=isinstance(renderable, Text))


def prune_question(plan: PrunePlan) -> str:
    """The confirmation question for a real run without --yes."""
    others = len(plan.items) - sum(1 for i in plan.items if i.kind in ("ref", "snapshot"))
    return (f"Remove {len(plan.revisions)} revision(s) and {others} other item(s) from {plan.cache_dir}, "
            f"freeing {human_size(plan.bytes_freed)}?")


class PruneProgress(Bar):
    """A progress bar on stderr while prune removes items (call :meth:`advance` once per item)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        super().__init__(enabled, total, TextColumn("pruning"), BarColumn(),
                         TextColumn("{task.completed}/{task.total} items"), TimeElapsedColumn())

    def advance(self, _outcome: Any = None) -> None:
        super().advance(1)
