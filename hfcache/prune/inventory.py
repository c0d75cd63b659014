"""prune's ledger: per repo folder and per content (inode), what the plan removes and the bytes that frees.

The policy (:mod:`.policy`) and housekeeping (:mod:`.housekeeping`) decide what goes; the ledger records each
removal as :class:`~.model.PlanItem` objects and follows what it implies: the blobs only removed revisions used go
too, and a content's bytes count as freed when the last repo folder holding it lets it go, and only if no hardlink
outside the cache keeps it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from ..cache.scan import RepoInfo, RevisionInfo
from .model import TRASH, PlanItem, RevisionRemoval

__all__ = ["Ledger", "RepoBook"]


class RepoBook:
    """Bookkeeping for one repo folder while the plan is computed. The per-name tables (``build_tables``) are only built
    for folders the plan touches: on a 10,000-repo cache most folders are only counted."""

    __slots__ = ("info", "base", "refs_to", "linked", "detailed", "blobs", "blob_users", "inode_users",
                 "blobs_by_inode", "names", "incomplete", "removed", "deleted_blobs", "removed_incomplete", "trash",
                 "items")

    def __init__(self, info: RepoInfo, base: str, refs_to: dict[str, list[str]], linked: set[str]) -> None:
        self.info = info
        self.base = base
        self.refs_to = refs_to
        self.linked = linked  # etags that snapshot links point to
        self.detailed = False
        self.blobs: dict[str, tuple[tuple[int, int], int]] = {}  # etag -> (inode, size)
        self.blob_users: dict[str, int] = {}  # etag -> remaining revisions linking to it
        self.inode_users: dict[tuple[int, int], int] = {}  # inode -> remaining revisions holding it as a real file
        self.blobs_by_inode: dict[tuple[int, int], list[str]] = {}
        self.names: dict[tuple[int, int], int] = {}  # inode -> names of it in this folder not yet removed
        self.incomplete: list[tuple[str, tuple[int, int], int, float]] = []  # (name, inode, size, mtime)
        self.removed: dict[str, str] = {}  # commit -> reason
        self.deleted_blobs: dict[str, str] = {}  # etag -> reason
        self.removed_incomplete: set[str] = set()
        self.trash = False
        self.items: list[PlanItem] = []


class Ledger:
    """The plan being computed over a scanned cache: one :class:`RepoBook` per repo folder, the items, the bytes.

    Args:
        root (str): the cache root.
        repos (Sequence[RepoInfo]): the scanned repo folders.
        size_on_disk (int): bytes of the cache before (every distinct content once).
        now (float): seconds since the epoch that ages are measured against.
        grace (float): seconds; younger partial downloads and empty folders are left alone.
    """

    def __init__(self, root: str, repos: Sequence[RepoInfo], size_on_disk: int, now: float, grace: float) -> None:
        self.root = root
        self.now = now
        self.grace = grace
        self.bytes_before = size_on_disk
        self.warnings: list[str] = []
        self.sizes: dict[tuple[int, int], int] = {}
        self.holders: dict[tuple[int, int], int] = {}  # repo folders still holding each content
        self.names_total: dict[tuple[int, int], int] = {}  # names of each content in detailed folders
        self.a_path: dict[tuple[int, int], str] = {}
        self.freed = 0
        self.outside_kept = 0
        self.removals: list[RevisionRemoval] = []
        self.repos: list[RepoBook] = [self._repo(info) for info in repos]

    # -- setup

    def _repo(self, info: RepoInfo) -> RepoBook:
        refs_to: dict[str, list[str]] = {}
        for name, value in info.refs.items():
            # A hand-written ref with a trailing newline breaks offline loads but still says which revision the
            # user wants: never treat its revision as detached.
            refs_to.setdefault(value.strip(), []).append(name)
        linked = {f.etag for rev in info.revisions for f in rev.files if f.form == "link"}
        sizes, holders = self.sizes, self.holders
        for inode, size in info.inodes.items():
            sizes[inode] = size
            holders[inode] = holders.get(inode, 0) + 1
        repo = RepoBook(info, f"{self.root}/{info.folder}", refs_to, linked)
        repo.trash = os.path.isdir(f"{repo.base}/{TRASH}")
        # Folders that may hold something to clean up get their per-name tables now; the others only if the policy
        # removes one of their revisions. Real-file snapshots (no symlinks) are matched to blobs by inode.
        if info.incomplete or repo.trash or info.blob_count > len(linked) or not info.revisions or (
                not info.blob_count and any(f.form == "file" for rev in info.revisions for f in rev.files)):
            self.build_tables(repo)
        return repo

    def build_tables(self, repo: RepoBook) -> None:
        """Build the per-name tables of a folder the plan touches."""
        if repo.detailed:
            return
        repo.detailed = True
        info, base = repo.info, repo.base
        blobs, blob_users, inode_users, names = repo.blobs, repo.blob_users, repo.inode_users, repo.names
        a_path, names_total = self.a_path, self.names_total
        for rev in info.revisions:
            seen_etags = set()
            seen_inodes = set()
            for f in rev.files:
                if f.form == "link":
                    blobs[f.etag] = (f.inode, f.size)
                    seen_etags.add(f.etag)
                elif f.form == "file":
                    seen_inodes.add(f.inode)
                    names[f.inode] = names.get(f.inode, 0) + 1
                    a_path.setdefault(f.inode, f"{base}/snapshots/{rev.commit_hash}/{f.path}")
            for etag in seen_etags:
                blob_users[etag] = blob_users.get(etag, 0) + 1
            for inode in seen_inodes:
                inode_users[inode] = inode_users.get(inode, 0) + 1
        if info.blob_count > len(repo.linked):
            # Some blobs are not linked from any snapshot (orphans, or real-file snapshots): list them.
            try:
                with os.scandir(f"{base}/blobs") as it:
                    for e in it:
                        if e.name.endswith(".incomplete"):
                            continue
                        st = e.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            blobs[e.name] = ((st.st_dev, st.st_ino), st.st_size)
            except OSError:
                pass
        for etag, (inode, size) in blobs.items():
            names[inode] = names.get(inode, 0) + 1
            a_path.setdefault(inode, f"{base}/blobs/{etag}")
            repo.blobs_by_inode.setdefault(inode, []).append(etag)
        for name in info.incomplete:
            try:
                st = os.lstat(f"{base}/blobs/{name}")
            except OSError:
                continue
            inode = (st.st_dev, st.st_ino)
            names[inode] = names.get(inode, 0) + 1
            a_path.setdefault(inode, f"{base}/blobs/{name}")
            repo.incomplete.append((name, inode, st.st_size, st.st_mtime))
        for inode, count in names.items():
            names_total[inode] = names_total.get(inode, 0) + count

    def release(self, repo: RepoBook, inode: tuple[int, int] | None) -> int:
        """One name of ``inode`` in ``repo`` is removed; return the bytes freed (when it was the last name)."""
        if inode is None or not repo.names.get(inode):
            return 0
        repo.names[inode] -= 1
        if repo.names[inode] > 0:
            return 0
        self.holders[inode] -= 1
        if self.holders[inode] > 0:
            return 0
        try:
            outside = os.lstat(self.a_path[inode]).st_nlink > self.names_total[inode]
        except OSError:
            outside = False
        if outside:  # hardlinked outside the cache (an export, a copy-free image layer): the bytes stay
            self.outside_kept += self.sizes[inode]
            return 0
        return self.sizes[inode]

    # -- recording removals

    def item(self, repo: RepoBook, kind: str, path: str, revision: str | None, reason: str, detail: str,
              bytes_freed: int = 0) -> None:
        """Record one path of ``repo`` to remove (``path`` relative to the cache root)."""
        info = repo.info
        repo.items.append(PlanItem(kind, info.repo_id, info.repo_type, info.folder, path, revision, reason, detail,
                                   bytes_freed))

    def lock_path(self, folder: str, etag: str) -> str:
        """The download lock of blob ``etag`` in ``folder``: ``<root>/.locks/<folder>/<etag>.lock``."""
        return f"{self.root}/.locks/{folder}/{etag}.lock"

    def delete_blob(self, repo: RepoBook, etag: str, reason: str, detail: str) -> None:
        """Remove blob ``etag`` of ``repo``, counting the bytes freed."""
        inode, size = repo.blobs[etag]
        repo.deleted_blobs[etag] = reason
        freed = self.release(repo, inode)
        self.freed += freed
        self.item(repo, "blob", f"{repo.info.folder}/blobs/{etag}", None, reason, detail, freed)

    def remove_revision(self, repo: RepoBook, rev: RevisionInfo, reason: str, detail: str) -> None:
        """Remove a revision: its refs, snapshot, ``.no_exist`` markers, ``trees/`` listing and the blobs no
        remaining revision uses."""
        self.build_tables(repo)
        commit = rev.commit_hash
        folder = repo.info.folder
        repo.removed[commit] = reason
        freed_before = self.freed
        refs = tuple(sorted(repo.refs_to.get(commit, ())))
        for name in refs:
            self.item(repo, "ref", f"{folder}/refs/{name}", commit, reason, detail)
        snapshot_freed = 0
        real_inodes = set()
        etags = set()
        for f in rev.files:
            if f.form == "file":
                snapshot_freed += self.release(repo, f.inode)
                real_inodes.add(f.inode)
            elif f.form == "link":
                etags.add(f.etag)
        self.freed += snapshot_freed
        self.item(repo, "snapshot", f"{folder}/snapshots/{commit}", commit, reason, detail, snapshot_freed)
        if os.path.lexists(f"{repo.base}/.no_exist/{commit}"):
            self.item(repo, "no_exist", f"{folder}/.no_exist/{commit}", commit, reason, detail)
        if os.path.lexists(f"{repo.base}/trees/{commit}.json"):
            self.item(repo, "tree", f"{folder}/trees/{commit}.json", commit, reason, detail)
        released = []
        for etag in etags:
            repo.blob_users[etag] -= 1
            if repo.blob_users[etag] == 0:
                released.append(etag)
        for inode in real_inodes:
            repo.inode_users[inode] -= 1
            if repo.inode_users[inode] == 0:
                released.extend(repo.blobs_by_inode.get(inode, ()))
        for etag in sorted(set(released)):
            if etag in repo.deleted_blobs or etag not in repo.blobs:
                continue
            if repo.blob_users.get(etag) or repo.inode_users.get(repo.blobs[etag][0]):
                continue
            self.delete_blob(repo, etag, "unused", "used only by removed revisions")
        self.removals.append(RevisionRemoval(
            repo_id=repo.info.repo_id, repo_type=repo.info.repo_type, folder=folder, commit_hash=commit, refs=refs,
            last_used=rev.last_used, size_on_disk=rev.size_on_disk, reason=reason, detail=detail,
            bytes_freed=self.freed - freed_before))
