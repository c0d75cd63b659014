"""verify_report: what ``verify`` finds (:class:`Problem`) and its outcome (:class:`VerifyReport`)."""

from __future__ import annotations

from dataclasses import dataclass

#: Problem kinds that are integrity errors (exit 1); the others are reported as notes.
ERROR_KINDS = frozenset({
    "blob_mismatch", "blob_size", "blob_not_file", "link_broken", "link_absolute", "link_outside",
    "ref_malformed", "ref_dangling", "file_missing", "file_mismatch", "revision_missing", "unreadable", "unsafe_layout",
    "record_refused",
})


@dataclass(frozen=True, order=True)
class Problem:
    """One finding, sortable into a stable report order: ``repo_id`` (as its ``folder`` names it), ``revision``
    (commit hash, ``refs/<name>`` for ref problems, ``""`` for blob-level findings), ``path`` (repo path, or
    ``blobs/<etag>``), ``kind`` (:data:`ERROR_KINDS`, or a note: ``file_unlisted``, ``incomplete``, ``no_symlinks``,
    ``unverified``, ``fast_record_ignored``), ``detail`` (one line for people), ``linked_from`` (a blob finding's
    users, each ``REPO_ID@REVISION:PATH``)."""

    repo_id: str
    revision: str
    path: str
    kind: str
    detail: str
    folder: str = ""
    linked_from: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.kind in ERROR_KINDS


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`hfcache.integrity.verify.verify_cache`: the ``repos`` ids checked (sorted), the distinct
    contents hashed (``blobs_hashed``, ``bytes_hashed``), the wall time ``seconds``, every finding (``problems``,
    sorted), and with ``fast`` the blobs not hashed, unchanged since they last hashed right (``blobs_skipped``)."""

    cache_dir: str
    repos: tuple[str, ...]
    blobs_hashed: int
    bytes_hashed: int
    seconds: float
    problems: tuple[Problem, ...]
    blobs_skipped: int = 0

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.is_error)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1
