"""An upstream commit's listing as the pull-through mirror keeps it: a snapshot the store serves, and the cache's
``trees/<commit>.json`` (huggingface_hub ``_tree_cache.py`` format 1), read back after a restart (untrusted)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..cache import safefs
from ..cache.atomic import atomic_write_at
from ..cache.content import git_blob_sha1, lfs_pointer
from ..cache.layout import RepoFolder
from ..errors import CacheError
from ..hub.files import RemoteFile, RepoRevision
from ..names import check_commit, is_commit, is_sha256
from ..records import UnsafePath, valid_size, validate_repo_path
from .vocabulary import RepoFile, RepoSnapshot

logger = logging.getLogger("hfcache.serve.pullthrough")  # the mirror's log


def snapshot_view(root: Path, revision: RepoRevision) -> RepoSnapshot:
    """The upstream listing as a snapshot whose files live (once fetched) in the canonical folder's blobs."""
    folder = RepoFolder(root, revision.canonical_id, revision.repo_type)
    files = {}
    for f in revision.files:
        if f.lfs_sha256:
            pointer = lfs_pointer(f.lfs_sha256, f.size)
            files[f.path] = RepoFile(f.path, folder.blob_path(f.lfs_sha256), f.size,
                                     f.blob_id or git_blob_sha1(pointer), f.lfs_sha256, True, len(pointer))
        else:
            files[f.path] = RepoFile(f.path, folder.blob_path(f.blob_id), f.size, f.blob_id, None, False, 0)
    return RepoSnapshot(repo_type=revision.repo_type, repo_id=revision.canonical_id, commit=revision.commit_hash,
                        files=dict(sorted(files.items())), listing=frozenset(files))


def revision_from_listing(cached: RepoSnapshot, entries: dict[str, dict] | None) -> RepoRevision | None:
    """The commit's files from a ``trees/<commit>.json`` listing, or None if it is missing or malformed (the
    cache is untrusted: a bad path, size or hash disqualifies the whole listing)."""
    files = []
    for path, entry in (entries or {}).items():
        try:
            validate_repo_path(path)
            size, blob_id, sha256 = entry["size"], entry["blob_id"], entry.get("lfs_sha256")
        except (UnsafePath, KeyError, TypeError):
            return None
        if not valid_size(size) or not is_commit(blob_id):  # a bool, float or 2**64 size too: ignored whole
            return None
        if sha256 is not None and not (isinstance(sha256, str) and is_sha256(sha256)):
            return None
        files.append(RemoteFile(path=path, size=size, blob_id=blob_id, lfs_sha256=sha256))
    if not files:
        return None
    return RepoRevision(repo_id=cached.repo_id, canonical_id=cached.repo_id, repo_type=cached.repo_type,
                        revision=cached.commit, commit_hash=cached.commit,
                        files=tuple(sorted(files, key=lambda f: f.path)))


def write_listing(folder: RepoFolder, revision: RepoRevision) -> None:
    """Write ``trees/<commit>.json``, the whole repo's listing (what the commit lacks is known after a restart), under
    warm's repo lock and only while the snapshot exists (a concurrent prune removes both)."""
    files = {}
    for f in revision.files:
        entry = {"size": f.size, "blob_id": f.blob_id or git_blob_sha1(lfs_pointer(f.lfs_sha256 or "", f.size))}
        if f.lfs_sha256:
            entry.update(lfs_sha256=f.lfs_sha256, lfs_size=f.size)
        files[f.path] = entry
    data = json.dumps({"format_version": 1, "files": dict(sorted(files.items()))}, indent=1).encode()
    commit = check_commit(revision.commit_hash)
    try:
        with folder.repo_lock():
            try:  # walked without following a link
                os.close(safefs.open_dir(folder.cache_dir, (folder.name, "snapshots", commit)))
            except FileNotFoundError:
                return
            # Through the trees/ descriptor the walk opened: a member swapping trees/ for a link is never written
            # through, and the temporary file and the rename stay in that folder.
            dfd = folder.open_dir(folder.root / "trees")
            try:
                atomic_write_at(dfd, f"{commit}.json", data, folder.policy)
            finally:
                os.close(dfd)
    except (OSError, CacheError) as exc:  # CacheError: a planted link (UnsafeLayout), a lock timeout: nothing written
        logger.warning("cannot write the listing of %s@%s: %s", folder.repo_id, commit, exc)


def has_listing(folder: RepoFolder, commit: str) -> bool:
    """Whether ``trees/<commit>.json`` exists as anything (a planted link reads as present: never written through),
    looked up without following a link."""
    try:
        dfd = safefs.open_dir(folder.cache_dir, (folder.name, "trees"))
    except FileNotFoundError:
        return False
    except (OSError, CacheError):  # a planted link (UnsafeLayout) or unreadable: never written through
        return True
    try:
        os.stat(f"{check_commit(commit)}.json", dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    finally:
        os.close(dfd)
    return True
