"""Rendering of ``hfcache ls``: one document (``--json``), and the table built from that same document."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from . import common
from .common import ago, human_size, iso_time, print_json

if TYPE_CHECKING:
    from rich.table import Table

    from ...cache.scan import CacheInfo, RepoInfo

__all__ = ["RepoSummary", "ls_dict", "ls_table", "repo_dict", "repo_summary", "show_ls", "stream_ls_json"]


def repo_dict(repo: RepoInfo, pinned: set[tuple[str, str, str]] | None) -> dict[str, Any]:
    """One repo of ``hfcache ls --json`` (an element of its ``repos``)."""

    def is_pinned(rev) -> bool | None:
        return None if pinned is None else (repo.repo_type, repo.repo_id, rev.commit_hash) in pinned

    revisions = [{"commit_hash": rev.commit_hash, "refs": list(rev.refs), "files": len(rev.files),
                  "size_on_disk": rev.size_on_disk, "last_used": iso_time(rev.last_used), "pinned": is_pinned(rev),
                  "health": "; ".join(rev.problems) or ("ok" if rev.files else "empty: no file")}
                 for rev in repo.revisions]
    return {"repo_id": repo.repo_id, "repo_type": repo.repo_type, "folder": repo.folder,
            "refs": dict(sorted(repo.refs.items())), "revisions": revisions,
            "files": len({f.path for rev in repo.revisions for f in rev.files}), "size_on_disk": repo.size_on_disk,
            "last_used": iso_time(repo.last_used),
            "pinned": None if pinned is None else any(r["pinned"] for r in revisions), "health": repo.health,
            "problems": list(repo.problems), "unreadable": list(repo.unreadable), "incomplete": list(repo.incomplete)}


_SIZE_NOTE = "bytes shared between revisions or repos (hardlinks) are counted once"


def ls_dict(info: CacheInfo, pinned: set[tuple[str, str, str]] | None) -> dict[str, Any]:
    """``hfcache ls --json``: sizes in bytes, times ISO 8601; ``pinned`` is null without --lock."""
    return {"cache_dir": info.cache_dir, "size_on_disk": info.size_on_disk, "size_note": _SIZE_NOTE,
            "repos": [repo_dict(repo, pinned) for repo in info.repos],
            "totals": {"repos": len(info.repos), "revisions": sum(len(r.revisions) for r in info.repos),
                       "size_on_disk": info.size_on_disk, "unhealthy": sum(1 for r in info.repos if r.health != "ok")}}


class RepoSummary(NamedTuple):
    """One repo of ``ls --json`` as :func:`stream_ls_json` writes it (small and picklable: it may come from a worker
    process, :func:`hfcache.cache.scan_stream.stream_repos`)."""

    json: str  # the repo's compact JSON object
    inodes: dict[tuple[int, int], int]  # (st_dev, st_ino) -> size of its files, for the deduplicated total
    revisions: int
    unhealthy: bool
    unreadable: bool


def repo_summary(repo: RepoInfo, pinned: set[tuple[str, str, str]] | None) -> RepoSummary:
    """``repo`` rendered for :func:`stream_ls_json` (a module-level function: it runs in scan workers)."""
    return RepoSummary(_dumps(repo_dict(repo, pinned)), repo.inodes, len(repo.revisions), repo.health != "ok",
                       bool(repo.unreadable))


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def stream_ls_json(cache_dir: str, repos: Iterable[RepoSummary], out: TextIO) -> bool:
    """Write ``hfcache ls --json``'s compact document to ``out`` one repo (:func:`repo_summary`) at a time, byte for
    byte what ``print_json(ls_dict(...), compact=True)`` prints (sorted keys put ``repos`` before the totals, summed
    on the way); return whether any repo had an unreadable part (exit 1)."""
    seen: dict[tuple[int, int], int] = {}
    count = revisions = unhealthy = 0
    unreadable = False
    chunk: list[str] = [f'{{"cache_dir":{_dumps(cache_dir)},"repos":[']
    for repo in repos:
        chunk.append(("," if count else "") + repo.json)
        seen.update(repo.inodes)
        count += 1
        revisions += repo.revisions
        unhealthy += repo.unhealthy
        unreadable = unreadable or repo.unreadable
        if len(chunk) >= 256:
            out.write("".join(chunk))
            chunk.clear()
    size = sum(seen.values())
    totals = {"repos": count, "revisions": revisions, "size_on_disk": size, "unhealthy": unhealthy}
    chunk.append(f'],"size_note":{_dumps(_SIZE_NOTE)},"size_on_disk":{size},"totals":{_dumps(totals)}}}\n')
    out.write("".join(chunk))
    out.flush()
    return unreadable


def ls_table(document: dict[str, Any], revisions: bool, now: float) -> Table:
    """The ``hfcache ls`` table, built from the same document ``--json`` prints."""
    from rich.text import Text

    def ts(value: str | None) -> float:
        return datetime.datetime.fromisoformat(value).timestamp() if value else 0.0

    totals = document["totals"]
    caption = (f"{totals['repos']} repos, {totals['revisions']} revisions, {human_size(totals['size_on_disk'])} on "
               f"disk (shared bytes counted once), {totals['unhealthy']} with problems")
    table = common.table(f"hfcache ls {document['cache_dir']}", ("repo", "type", "revision" if revisions else "refs",
                         "files", "size", "last used", "pinned", "health"), right=("files", "size"), caption=caption,
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
    return table


_SORT_KEYS = {
    "name": lambda r: r["repo_id"].lower(),
    "size": lambda r: -r["size_on_disk"],
    "last-used": lambda r: "" if r["last_used"] is None else r["last_used"],
}


def show_ls(info: CacheInfo, pinned: set[tuple[str, str, str]] | None, *, sort: str, revisions: bool,
            as_json: bool) -> None:
    """``hfcache ls``: the document sorted by ``sort`` (``name`` A-Z, ``size`` largest first, ``last-used`` most
    recent first), as JSON or as the table, on stdout (one row per revision with ``revisions``)."""
    document = ls_dict(info, pinned)
    document["repos"].sort(key=_SORT_KEYS[sort], reverse=(sort == "last-used"))
    if as_json:
        print_json(document, compact=len(document["repos"]) > 100)
    else:
        common.stdout.print(ls_table(document, revisions, time.time()))
