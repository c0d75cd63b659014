"""Rendering of ``hfcache export``, ``import`` and ``link``: what moved where, and the bytes it took."""

from __future__ import annotations

from dataclasses import asdict

from rich.text import Text

from .common import human_size, print_json, stderr, stdout

__all__ = ["import_dict", "show_export", "show_flat", "show_import", "show_link"]


def show_export(plan, dest: str, fmt: str, digest: str | None, *, as_json: bool) -> None:
    """export's result: what was written, the unique bytes, and the tar's sha256 (a stable layer digest)."""
    document = {"dest": dest, "format": fmt, "repos": list(plan.repos), "entries": len(plan.entries),
                "unique_bytes": plan.unique_bytes, "sha256": digest}
    if as_json:
        print_json(document)
        return
    console = stderr if dest == "-" else stdout  # '-': stdout carries the tar
    console.print(f"exported {len(plan.repos)} repo(s), {len(plan.entries)} entries, "
                 f"{human_size(plan.unique_bytes)} of distinct content -> {dest} ({fmt})"
                 + (f"\nsha256:{digest}" if digest else ""))


def show_flat(result, *, as_json: bool) -> None:
    """``export --flat``'s result: the revision, its files and bytes at DEST, or that DEST already held them."""
    if as_json:
        print_json(asdict(result))
        return
    if result.unchanged:
        stdout.print(f"{result.dest} already holds the {len(result.files)} files of {result.repo}: nothing to do")
        return
    stdout.print(f"exported {result.repo}: {len(result.files)} files, {human_size(result.bytes)} -> {result.dest} "
                 "(flat)")


def import_dict(report) -> dict:
    """An :class:`hfcache.move.importer.ImportReport` as JSON data (``moved`` as ``moved_refs``)."""
    document = asdict(report)
    document["moved_refs"] = document.pop("moved")
    return document


def show_import(report, *, as_json: bool) -> None:
    if as_json:
        print_json(import_dict(report))
        return
    stdout.print(f"imported {len(report.repos)} repo(s), {report.files} snapshot entries into {report.cache_dir}: "
                 f"{report.blobs_new} new blob entries ({human_size(report.bytes_new)}), "
                 f"{report.blobs_existing} already there; {report.blob_contents} distinct blobs (an entry per repo "
                 "holding it, hardlinked)")
    for ref in report.moved:
        stdout.print(Text(f"moved the target's {ref} to the source's commit (--move-refs)", style="yellow"))


def show_link(report, *, as_json: bool) -> None:
    if as_json:
        print_json(asdict(report))
        return
    if report.unchanged:
        stdout.print(f"{report.dest} already is a {report.mode} of {report.src}: nothing to do")
        return
    stdout.print(f"{report.dest} -> {report.src} ({report.mode}; {report.files} files, "
                 f"{human_size(report.bytes_added)} added)")
