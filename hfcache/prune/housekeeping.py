"""prune's housekeeping: what goes whatever the policy says, and what follows its removals; docs/prune.md."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..cache.locking import try_lock
from .inventory import Ledger, RepoBook
from .plan import TRASH, GraceKept


def housekeeping(ledger: Ledger, repo: RepoBook) -> None:
    """Plan the removal of ``repo``'s orphan blobs, stale partial downloads and an interrupted prune's trash."""
    folder = repo.info.folder
    for etag in sorted(repo.blobs):
        inode = repo.blobs[etag][0]
        if not repo.blob_users.get(etag) and not repo.inode_users.get(inode):
            ledger.delete_blob(repo, etag, "orphan", "no snapshot uses it")
    for name, inode, _size, mtime in repo.incomplete:
        young = mtime >= ledger.now - ledger.grace
        if young or lock_held(ledger.lock_path(folder, etag_of(name))):
            ledger.kept.append(GraceKept(repo.info.repo_id, repo.info.repo_type, "incomplete",
                                         f"{folder}/blobs/{name}", None, mtime,
                                         f"partial download written {age(ledger.now - mtime)} ago: kept for the "
                                         f"{age(ledger.grace)} grace (a download may be running)" if young
                                         else "its download lock is held: a download is running"))
        else:
            freed = ledger.release(repo, inode)
            ledger.freed += freed
            ledger.item(repo, "incomplete", f"{folder}/blobs/{name}", None, "stale_incomplete",
                        f"partial download untouched for {age(ledger.now - mtime)}, no live download lock", freed)
            repo.removed_incomplete.add(name)
    if repo.trash:
        ledger.item(repo, "trash", f"{folder}/{TRASH}", None, "interrupted", "left by an interrupted prune")


def lock_items(ledger: Ledger, repo: RepoBook) -> None:
    """The ``.locks`` files of blobs (and partial downloads) the plan removes, unless something of that etag
    stays in the folder."""
    folder = repo.info.folder
    gone = dict(repo.deleted_blobs)
    for name, *_ in repo.incomplete:
        if name in repo.removed_incomplete:
            gone.setdefault(etag_of(name), "stale_incomplete")
    if not gone:
        return
    staying = {etag for etag in repo.blobs if etag not in repo.deleted_blobs}
    staying |= {etag_of(name) for name, *_ in repo.incomplete if name not in repo.removed_incomplete}
    for etag in sorted(gone):
        if etag not in staying and os.path.isfile(ledger.lock_path(folder, etag)):
            ledger.item(repo, "lock", f".locks/{folder}/{etag}.lock", None, gone[etag],
                        "lock file of a removed blob" if gone[etag] != "stale_incomplete"
                        else "lock file of a removed partial download")


def empty_folder(ledger: Ledger, repo: RepoBook) -> int:
    """Plan the removal of a repo folder the plan leaves empty (or that was empty, for longer than ``grace``)."""
    info = repo.info
    if len(repo.removed) < len(info.revisions):
        return 0
    if any(commit not in repo.removed for commit in repo.refs_to):
        return 0  # a ref to a missing snapshot, or malformed: verify reports it; prune does not guess
    if any(etag not in repo.deleted_blobs for etag in repo.blobs):
        return 0
    if any(name not in repo.removed_incomplete for name, *_ in repo.incomplete):
        return 0  # a live or recent download
    if any(p.startswith("blobs/") for p in info.problems):
        return 0  # something in blobs/ that is not a regular file: not ours to delete
    if not info.revisions and not info.refs and not repo.blobs and not repo.incomplete and not repo.trash \
            and _has_entries(repo.base):
        # Empty before this plan (and not left so by an interrupted prune, which leaves its trash folder there
        # until the very end): a download may just have created it, so only take it when untouched for a while.
        newest = 0.0
        for sub in ("", "/blobs", "/snapshots", "/refs"):
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(repo.base + sub).st_mtime)
        if newest > ledger.now - ledger.grace:
            return 0
    ledger.item(repo, "repo_folder", info.folder, None, "empty", "no revision, ref or blob left")
    return 1


def _has_entries(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except OSError:
        return False


def etag_of(incomplete_name: str) -> str:
    """``<etag>.<random>.incomplete`` (huggingface_hub >= 1.x and hfcache), ``<etag>.incomplete`` (older
    huggingface_hub) or ``.<etag>.<random>.incomplete`` (hfcache's hardlink temp) -> ``<etag>``."""
    return incomplete_name.lstrip(".").split(".", 1)[0]


def age(seconds: float) -> str:
    """``seconds`` in its largest whole unit: ``3d``, ``2h``, ``5m``, ``40s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def lock_held(path: str) -> bool:
    """Whether a live process holds the download lock at ``path`` (huggingface_hub's ``WeakFileLock``, hfcache's
    ``file_lock``); a missing one, or an empty one without flock (a leftover), is held by nobody."""
    with try_lock(Path(path)) as why:
        return bool(why)
