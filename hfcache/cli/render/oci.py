"""Rendering of ``hfcache push`` and ``hfcache pull``: a progress bar per blob, the image reference, what merged."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

from . import common
from .common import human_size, live_on_terminal, print_json
from .move import import_dict

__all__ = ["TransferProgress", "show_pull", "show_push"]


class TransferProgress:
    """A rich progress bar on stderr per blob transferred (a :class:`hfcache.oci.image.TransferSink`), only on a
    terminal (:func:`live_on_terminal`); disabled, it draws nothing and imports no rich."""

    def __init__(self, enabled: bool) -> None:
        self._progress = None
        self._task = None
        if not live_on_terminal(enabled):
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        # transient: the result line says what was sent; an error line is not left under half-full bars.
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                  TransferSpeedColumn(), console=common.stderr, transient=True)

    def __enter__(self):
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def begin(self, label: str, total: int) -> None:
        """A new bar: ``label`` (a blob's digest or repo, cut to 60 characters), ``total`` bytes."""
        if self._progress is not None:
            self._task = self._progress.add_task(common.inert(label[:60]), total=total)

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more of the current blob transferred."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, nbytes)


def show_push(report: Any, *, as_json: bool) -> None:
    """push's result: JSON, or one line on stderr and ``REF@DIGEST`` on stdout (for scripts)."""
    if as_json:
        print_json({"ok": True, "reference": report.reference, "digest": report.digest, "split": report.split,
                    "format": report.format, "prefix": report.prefix, "signature": report.signature or None,
                    "repos": list(report.repos), "layers": [asdict(x) for x in report.layers],
                    "bytes_total": report.bytes_total, "bytes_uploaded": report.bytes_uploaded})
        return
    kind = "a ModelPack artifact" if report.format == "modelpack" else "an image"
    where = f" under {report.prefix}/" if report.prefix else ""
    common.stderr.print(f"pushed {len(report.repos)} revision(s) as {kind}{where} in {len(report.layers)} layer(s) "
                 f"({human_size(report.bytes_uploaded)} sent of {human_size(report.bytes_total)})"
                 + (f"; signed (referrer {report.signature[:19]})" if report.signature else ""))
    sys.stdout.write(f"{report.reference}@{report.digest}\n")
    sys.stdout.flush()


def show_bucket_push(report: Any, *, as_json: bool) -> None:
    """push to a bucket: JSON, or one line on stderr and the bucket URL on stdout."""
    if as_json:
        print_json({"ok": True, **asdict(report)})
        return
    common.stderr.print(f"pushed {len(report.snapshots)} snapshot(s) and {len(report.refs)} ref(s): "
                        f"{report.blobs_uploaded} blob(s) sent ({human_size(report.bytes_uploaded)}), "
                        f"{report.blobs_present} already in the bucket (of {human_size(report.bytes_total)})")
    sys.stdout.write(f"{report.url}\n")
    sys.stdout.flush()


def show_pull(report: Any, *, as_json: bool) -> None:
    """pull's result: JSON, or what was downloaded and merged (stdout)."""
    imported = report.imported
    if as_json:
        print_json({**import_dict(imported), "ok": True, "reference": report.reference, "digest": report.digest,
                    "layers": [asdict(x) for x in report.layers], "bytes_downloaded": report.bytes_downloaded,
                    "bytes_unpacked": report.bytes_unpacked, "format": getattr(report, "format", "image"),
                    "skipped_layers": list(getattr(report, "skipped", ())),
                    "signed_by": getattr(report, "signed_by", None)})
        return
    skipped = len(getattr(report, "skipped", ()))
    held = f" ({skipped} already in the cache, not downloaded)" if skipped else ""
    common.stdout.print(f"pulled {report.reference} ({report.digest[:19]}): {len(report.layers)} layer(s){held}, "
                 f"{human_size(report.bytes_downloaded)}; {len(imported.repos)} repo(s) into {imported.cache_dir}, "
                 f"{imported.blobs_new} new blob entries, {imported.blobs_existing} already there; "
                 f"{imported.blob_contents} distinct blobs")
    if getattr(report, "signed_by", None) is not None:
        common.stdout.print(f"signatures verified (key {report.signed_by or 'given'}) before anything was written")
    for ref in imported.moved:
        common.stdout.print(f"moved the target's {ref} to the image's commit (--move-refs)")
