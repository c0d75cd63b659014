"""A failed warm of one repo taken back: nothing half-published, the space it used given back.

:func:`mark` notes what a repo folder held before the warm touched it (taken under the repo lock, after the commit
is known); :func:`roll_back`, still under that lock, removes what the failed attempt added: the ref, the snapshot
entries and ``.no_exist`` markers of that commit, warm's record, the blobs it fetched that no snapshot uses, the
partial downloads a rerun would not resume, and the repo folder itself when it made it and nothing is left. A
partial download a rerun resumes (a cut connection, a full disk, a stop) is kept and counted, to be said.
Everything is removed through folders opened from the cache root without following a link (:mod:`hfcache.cache.safefs`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..cache import extents, safefs, safefs_tree
from ..cache.atomic import atomic_write_at
from ..cache.fsops import remove_tree_at
from ..cache.layout import RepoFolder
from ..cache.published import MAX_RECORD_BYTES, record_parts
from ..errors import CacheError, EndpointUnreachable
from ..names import check_commit, check_ref_name

CACHEDIR_NAME = "CACHEDIR.TAG"


@dataclass(frozen=True)
class Mark:
    """A repo folder before the warm: whether it ``existed``; its ``blobs/`` names; the entries of
    ``snapshots/<commit>`` and ``.no_exist/<commit>`` (None: no such folder); the ``ref`` and ``record`` bytes (None:
    none)."""

    folder: RepoFolder
    commit: str
    revision: str
    existed: bool
    blobs: frozenset[str]
    snapshot: frozenset[str] | None
    markers: frozenset[str] | None
    ref: bytes | None
    record: bytes | None


@dataclass(frozen=True)
class Undone:
    """What :func:`roll_back` did: ``freed`` bytes of blobs and partial downloads removed; ``kept`` bytes of partial
    downloads left for a rerun to resume, in the folders ``kept_in``."""

    freed: int = 0
    kept: int = 0
    kept_in: tuple[str, ...] = ()

    def note(self) -> str | None:
        """The one-line note of a failed repo's result (None when nothing was done or kept)."""
        parts = []
        if self.freed:
            parts.append(f"gave back the {self.freed} bytes this attempt had stored")
        if self.kept:
            parts.append(f"kept {self.kept} bytes of partial downloads in {', '.join(self.kept_in)}/blobs for a "
                         "rerun to resume (`hfcache prune` removes them)")
        return "; ".join(parts) or None


def mark(folder: RepoFolder, commit: str, revision: str) -> Mark:
    """What ``folder`` holds now of the repo at ``commit`` (``revision``: the ref the warm writes); call it under the
    repo lock. Raises UnsafeLayout: a part of the folder is a link (the warm refuses it anyway)."""
    name = folder.name
    commit = check_commit(commit)
    ref = folder.read_ref(revision) if revision != commit else None
    try:
        record = safefs.read_small(folder.cache_dir, record_parts(name, commit), MAX_RECORD_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        record = None
    return Mark(folder, commit, revision, _is_dir(folder, ()), frozenset(_names(folder, ("blobs",))),
                _tree(folder, ("snapshots", commit)), _tree(folder, (".no_exist", commit)), ref, record)


def resumable(exc: BaseException) -> bool:
    """Whether a rerun resumes the partial downloads of a repo that failed with ``exc``: a connection cut, an endpoint
    unreachable or too slow, a full disk or another write error of the cache (exit 5). Not for a refusal, a wrong
    hash or id: a rerun gets the same answer."""
    return isinstance(exc, (EndpointUnreachable, CacheError, OSError))


def roll_back(marks: list[Mark], keep_partials: bool, keep_blobs: bool = False) -> Undone:
    """Take back what a failed attempt added to each marked folder (a step that fails is skipped: the next warm or
    ``hfcache prune`` finishes it); the partial downloads stay when ``keep_partials``, the blobs too when
    ``keep_blobs`` (a stop: the rerun uses them)."""
    freed = kept = 0
    kept_in = []
    for m in marks:
        with contextlib.suppress(OSError, safefs.UnsafeLayout):
            _unpublish(m)
        if keep_blobs:
            continue
        with contextlib.suppress(OSError, safefs.UnsafeLayout):
            gave, held = _drop_blobs(m, keep_partials)
            freed += gave
            kept += held
            if held:
                kept_in.append(m.folder.name)
        if not m.existed:
            with contextlib.suppress(OSError, safefs.UnsafeLayout):
                _drop_if_empty(m.folder)
    return Undone(freed, kept, tuple(kept_in))


def drop_new_root(root: Path) -> bool:
    """Remove the cache root a warm created when every repo failed and nothing but its ``CACHEDIR.TAG`` and lock files
    is in it (a mistyped id leaves no cache folder behind); whether it was removed."""
    try:
        names = set(os.listdir(root))
        if not names <= {CACHEDIR_NAME, ".locks"}:
            return False
        if ".locks" in names:
            for found in safefs_tree.walk(root, (".locks",)):
                if any(not stat.S_ISDIR(st.st_mode) and not n.endswith(".lock") for n, st in found.entries):
                    return False
        pfd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            remove_tree_at(pfd, root.name)
        finally:
            os.close(pfd)
    except (OSError, safefs.UnsafeLayout, safefs_tree.TooDeep):
        return False
    return True


def _unpublish(m: Mark) -> None:
    """The ref, record, snapshot entries and markers back to what :func:`mark` saw (in the reverse of publish's
    order: the ref first)."""
    folder, root = m.folder, m.folder.cache_dir
    if m.revision != m.commit and folder.read_ref(m.revision) != m.ref:
        if m.ref is None:
            safefs.unlink(root, (folder.name, "refs", *check_ref_name(m.revision).split("/")), missing_ok=True)
        else:
            folder.write_ref(m.revision, m.ref.decode("ascii"))
    parts = record_parts(folder.name, m.commit)
    if m.record is None:
        safefs.unlink(root, parts, missing_ok=True)
    else:
        with safefs.dir_fd(root, parts[:-1]) as fd:
            atomic_write_at(fd, parts[-1], m.record, folder.policy)
    for section, before in (("snapshots", m.snapshot), (".no_exist", m.markers)):
        top = (folder.name, section, m.commit)
        if before is None:
            safefs.rmtree(root, top, missing_ok=True)
            continue
        for rel in sorted((_tree(folder, (section, m.commit)) or frozenset()) - before):
            safefs.unlink(root, (*top, *rel.split("/")), missing_ok=True)


def _drop_blobs(m: Mark, keep_partials: bool) -> tuple[int, int]:
    """Remove the blobs added since :func:`mark` that no snapshot entry links to, and (unless ``keep_partials``) the
    partial downloads added; (bytes freed, bytes of partial downloads kept)."""
    folder, root = m.folder, m.folder.cache_dir
    used = _linked_blobs(folder)
    freed = kept = 0
    try:
        fd = safefs.open_dir(root, (folder.name, "blobs"))
    except (FileNotFoundError, NotADirectoryError):
        return 0, 0
    try:
        for name in sorted(set(os.listdir(fd))):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            partial = name.endswith(".incomplete")
            if not stat.S_ISREG(st.st_mode) or (not partial and (name in m.blobs or name in used)):
                continue
            if partial and keep_partials:
                kept += st.st_size
                continue
            if name in m.blobs:
                continue
            os.unlink(name, dir_fd=fd)
            freed += st.st_size if st.st_nlink == 1 else 0
            if partial:
                extents.remove(folder, name.split(".", 1)[0])
    finally:
        os.close(fd)
    return freed, kept


def _linked_blobs(folder: RepoFolder) -> set[str]:
    """The blob names the folder's snapshot links point to."""
    used = set()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, safefs_tree.TooDeep):
        for found in safefs_tree.walk(folder.cache_dir, (folder.name, "snapshots")):
            for name, st in found.entries:
                if stat.S_ISLNK(st.st_mode):
                    used.add(os.readlink(name, dir_fd=found.fd).rsplit("/", 1)[-1])
    return used


def _drop_if_empty(folder: RepoFolder) -> None:
    """Remove the repo folder when no file is left in it (only the empty folders a warm makes)."""
    with contextlib.suppress(FileNotFoundError):
        for found in safefs_tree.walk(folder.cache_dir, (folder.name,)):
            if any(not stat.S_ISDIR(st.st_mode) for _, st in found.entries):
                return
        safefs.rmtree(folder.cache_dir, (folder.name,), missing_ok=True)


def _is_dir(folder: RepoFolder, rel: tuple[str, ...]) -> bool:
    try:
        os.close(safefs.open_dir(folder.cache_dir, (folder.name, *rel)))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _names(folder: RepoFolder, rel: tuple[str, ...]) -> list[str]:
    try:
        with safefs.dir_fd(folder.cache_dir, (folder.name, *rel)) as fd:
            return os.listdir(fd)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _tree(folder: RepoFolder, rel: tuple[str, ...]) -> frozenset[str] | None:
    """Every non-folder entry below ``folder/rel``, ``/``-separated relative to it; None when there is no folder."""
    out = set()
    try:
        for found in safefs_tree.walk(folder.cache_dir, (folder.name, *rel)):
            prefix = "/".join(found.parts[len(rel) + 1:])
            out.update(f"{prefix}/{n}" if prefix else n for n, st in found.entries if not stat.S_ISDIR(st.st_mode))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return frozenset(out)
