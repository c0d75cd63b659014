"""Making a warmed repo visible (:func:`publish`, in huggingface_hub's order, the ref last), and refusing beforehand
what could only be published halfway (:func:`check_publishable`); :func:`copy_blob` for a legacy id's folder."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ..cache import safefs
from ..cache.layout import RepoFolder
from ..cache.published import write_record
from ..cache.safefs import UnsafeLayout
from ..cache.shared_store import STORE_DIR
from ..hub.files import RemoteFile, RepoRevision
from ..records import WarmRequest


def check_publishable(folder: RepoFolder, repo: RepoRevision, files: Sequence[RemoteFile]) -> None:
    """Raise UnsafeLayout (exit 5) for what could only be published halfway: a repo folder with a planted link, a
    snapshot where a path's folder is a file or link (or the path a folder)."""
    folder.ensure_safe()
    snapshot = (folder.name, "snapshots", safefs.check_commit(repo.commit_hash))
    for f in files:
        folder.pointer_path(repo.commit_hash, f.path)  # refuses a path whose parts are not names (UnsafeName)
        parts = f.path.split("/")
        for i in range(len(parts) - 1):
            try:
                safefs.check_existing(folder.cache_dir, (*snapshot, *parts[:i + 1]))
            except UnsafeLayout:
                raise UnsafeLayout(f"{folder.name}: snapshots/{repo.commit_hash[:12]}/{'/'.join(parts[:i + 1])} is "
                                   f"a file or link where {f.path} needs a folder: nothing published",
                                   hint="remove that snapshot (hfcache prune or rm -r) and rerun") from None
        if _is_real_dir(folder.cache_dir, (*snapshot, *parts)):
            raise UnsafeLayout(f"{folder.name}: snapshots/{repo.commit_hash[:12]}/{f.path} is a folder: nothing "
                               "published", hint="remove that snapshot and rerun")


def _is_real_dir(cache_dir: Path, rel: tuple[str, ...]) -> bool:
    """Whether ``cache_dir/rel`` is a directory (not a link), through its parent's descriptor."""
    try:
        with safefs.dir_fd(cache_dir, rel[:-1]) as fd:
            return stat.S_ISDIR(os.stat(rel[-1], dir_fd=fd, follow_symlinks=False).st_mode)
    except (FileNotFoundError, UnsafeLayout):
        return False


def copy_blob(source: RepoFolder, dest: RepoFolder, file: RemoteFile) -> None:
    """Give a legacy-id folder the canonical folder's blob: a hardlink, so the bytes are stored once."""
    with dest.blob_lock(file.etag):
        dest.discard_incomplete(file.etag)  # an earlier attempt's leftovers: the blob comes from the canonical folder
        if dest.blob_ok(file.etag, file.size):
            return
        if not dest.adopt_blob(_blob_source(source, file.etag), file.etag):
            # No hardlinks on this filesystem: store a second copy rather than fail.
            incomplete, out = dest.open_incomplete(file.etag)
            try:
                src_fd = safefs.open_blob(source.cache_dir, source.name, file.etag)
                with out, os.fdopen(src_fd, "rb") as src:
                    if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                        raise UnsafeLayout(f"{source.name}/blobs/{file.etag} is not a regular file: left alone")
                    _copy_hashed(src, out, file, f"{source.name}/blobs/{file.etag}")
                dest.publish_blob(incomplete, file.etag)
            finally:
                incomplete.unlink(missing_ok=True)


def _copy_hashed(src, out, file: RemoteFile, shown: str) -> None:
    """Copy ``file.size`` bytes from ``src`` to ``out``, hashed (UnsafeLayout: another size or content)."""
    hasher, seen = file.hasher(), 0
    while chunk := src.read(min(_CHUNK, file.size + 1 - seen)):
        seen += len(chunk)
        if seen > file.size:
            break
        hasher.update(chunk)
        out.write(chunk)
    if seen != file.size or not hasher.matches():
        raise UnsafeLayout(f"{shown}: content does not match its blob name: not copied",
                           hint="run `hfcache verify --repair`, then rerun")


_CHUNK = 1024 * 1024


def _blob_source(folder: RepoFolder, etag: str) -> Path:
    """What to hardlink for ``folder``'s blob: the blob, or the shared Xet store's payload it links to."""
    if (xet_hash := safefs.store_link_of(folder.cache_dir, folder.name, etag)) is None:
        return folder.blob_path(etag)
    return folder.cache_dir / STORE_DIR / xet_hash[:2] / xet_hash

def publish(folder: RepoFolder, repo: RepoRevision, files: list[RemoteFile], absent: Sequence[str], *,
            request: WarmRequest, cache_dir: Path, symlinks: bool, endpoint: str | None = None) -> list[str]:
    """Make the repo visible: links, markers, the record of what was published (:mod:`hfcache.cache.published`,
    ``endpoint``: who served it; None keeps the record's), the ref last. Returns notes: another folder's ref moved."""
    for f in files:
        folder.link(repo.commit_hash, f.path, f.etag, symlinks=symlinks)
    for name in absent:
        folder.mark_absent(repo.commit_hash, name)
    write_record(cache_dir, folder.name, repo.commit_hash, ((f.path, f.size, f.hash) for f in files), absent,
                 endpoint=endpoint)
    notes = []
    revision = request.revision
    if folder.repo_id != request.repo_id and revision != repo.commit_hash:
        before = folder.read_ref(revision)
        if before is not None and before != repo.commit_hash.encode():
            notes.append(f"moved refs/{revision} of {folder.repo_id} (not requested; the canonical id of "
                         f"{request.repo_id}) from {before.decode('utf-8', 'replace')[:12]} to "
                         f"{repo.commit_hash[:12]}")
    folder.write_ref(revision, repo.commit_hash)
    folder.touch_snapshot(repo.commit_hash)
    return notes
