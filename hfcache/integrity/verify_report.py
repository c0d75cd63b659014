"""verify_report: what ``verify`` finds: :class:`Problem` (one finding), :data:`ERROR_KINDS` (the kinds that are
integrity errors, exit 1; the others are notes) and :class:`VerifyReport` (the outcome of
:func:`hfcache.integrity.verify.verify_cache`).
"""

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
    """One finding, sortable into a stable report order (repo, revision, path, kind).

    Attributes:
        repo_id (str): the repo (as its folder names it).
        revision (str): commit hash, ``refs/<name>`` for ref problems, or ``""`` for blob-level findings.
        path (str): repo path, or ``blobs/<etag>`` for a blob.
        kind (str): machine-readable kind, e.g. ``blob_mismatch``, ``link_broken``, ``ref_malformed``,
            ``file_missing``, ``file_unlisted``, ``incomplete``, ``no_symlinks``, ``unverified``.
        detail (str): one line for people.
        folder (str): the repo folder name.
        linked_from (tuple[str, ...]): for a blob finding, the snapshot entries that use the blob, each
            ``REPO_ID@REVISION:PATH`` (the revision is a ref pointing to the snapshot, else its commit hash).
    """

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
    """The outcome of :func:`verify_cache`.

    Attributes:
        cache_dir (str): the cache verified.
        repos (tuple[str, ...]): repo ids checked, sorted.
        blobs_hashed (int): distinct contents hashed.
        bytes_hashed (int): their total size.
        seconds (float): wall time.
        problems (tuple[Problem, ...]): every finding, errors and notes, sorted.
        blobs_skipped (int): with ``fast``: blobs not hashed because the record shows them unchanged since they last
            hashed right (0 otherwise).
    """

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
