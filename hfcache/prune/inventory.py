"""prune's ledger: per repo folder and per content (inode), the :class:`~.plan.PlanItem` objects the policy and
housekeeping decide, what they imply (blobs only removed revisions used go too) and the bytes freed (docs/prune.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from ..cache import safefs
from ..cache.scan import RepoInfo, RevisionInfo
from ..cache.shared_store import StoreProblem, payload_stat
from .plan import TRASH, GraceKept, PlanItem, RevisionRemoval
from .store import has_store, list_payloads, payload_path, payload_references

#: The ``folder`` of plan items of the shared store itself (payloads no repo holds).
STORE_FOLDER = "blobs"


class RepoBook:
    """Bookkeeping for one repo folder while the plan is computed; its per-name tables (``build_tables``) only for
    folders the plan touches."""

    __slots__ = ("info", "base", "refs_to", "linked", "detailed", "blobs", "blob_users", "inode_users",
                 "blobs_by_inode", "names", "incomplete", "removed", "deleted_blobs", "removed_incomplete", "trash",
                 "items", "store_links")

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
        self.store_links: dict[str, str] = {}  # etag -> Xet hash, for blobs that are links into the shared store


class Ledger:
    """The plan being computed over the scanned ``repos`` of the cache ``root``: one :class:`RepoBook` per repo
    folder, the items, the bytes (``size_on_disk``: before; ``now``, ``grace``: seconds)."""

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
        self.kept: list[GraceKept] = []  # what only the grace period keeps (plan.GraceKept)
        self.has_store = has_store(root)
        self.store_hashes: dict[tuple[int, int], str] = {}  # payload inode -> Xet hash
        self.link_names: dict[tuple[int, int], int] = {}  # store links to each payload in detailed folders
        self.store_removed: dict[str, list[tuple[RepoBook, str]]] = {}  # Xet hash -> (repo, etag) of removed links
        self.payload_freed: dict[str, int] = {}  # Xet hash -> bytes its sweep frees
        self.payload_releaser: dict[str, RepoBook] = {}  # Xet hash -> the repo whose removal freed it
        self.payloads = list_payloads(root) if self.has_store else {}
        self.store_items: list[PlanItem] = []  # payloads no repo holds (store housekeeping)
        for xet_hash, st in self.payloads.items():
            self.store_hashes[(st.st_dev, st.st_ino)] = xet_hash
            self.sizes.setdefault((st.st_dev, st.st_ino), st.st_size)
        self.repos: list[RepoBook] = [self._repo(info) for info in repos]

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
        if repo.detailed:
            return
        repo.detailed = True
        info, base = repo.info, repo.base
        blobs, blob_users, inode_users, names = repo.blobs, repo.blob_users, repo.inode_users, repo.names
        a_path, names_total = self.a_path, self.names_total
        for rev in info.revisions:
            seen_etags, seen_inodes = set(), set()
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
                        elif stat.S_ISLNK(st.st_mode) and self.has_store and e.name not in blobs:
                            self._orphan_link(repo, e.name)
            except OSError:
                pass
        if self.has_store:
            self._store_links(repo)
        for etag, (inode, _size) in blobs.items():
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

    def _orphan_link(self, repo: RepoBook, etag: str) -> None:
        """A store link in ``blobs/`` that no snapshot uses: a blob of the payload's inode and size."""
        xet_hash = safefs.store_link_of(self.root, repo.info.folder, etag)
        if xet_hash is None:
            return
        try:
            st = payload_stat(self.root, xet_hash)
        except (OSError, StoreProblem):
            return
        inode = (st.st_dev, st.st_ino)
        repo.blobs[etag] = (inode, st.st_size)
        self.sizes.setdefault(inode, st.st_size)
        if inode not in repo.info.inodes:  # scan did not count it for this folder: it holds it now
            self.holders[inode] = self.holders.get(inode, 0) + 1

    def _store_links(self, repo: RepoBook) -> None:
        """Which blobs of ``repo`` are store links (read through the repo's ``blobs`` fd, nothing followed)."""
        folder = repo.info.folder
        for etag, (inode, _size) in repo.blobs.items():
            xet_hash = safefs.store_link_of(self.root, folder, etag)
            if xet_hash is not None:
                repo.store_links[etag] = xet_hash
                self.store_hashes[inode] = xet_hash
                self.link_names[inode] = self.link_names.get(inode, 0) + 1

    def release(self, repo: RepoBook, inode: tuple[int, int] | None) -> int:
        """One name of ``inode`` in ``repo`` is removed; the bytes freed: its size when it was the last name in the
        cache and no hardlink outside the cache keeps it, else 0."""
        if inode is None or not repo.names.get(inode):
            return 0
        repo.names[inode] -= 1
        if repo.names[inode] > 0:
            return 0
        self.holders[inode] -= 1
        if self.holders[inode] > 0:
            return 0
        if inode in self.store_hashes:
            return self._payload_released(repo, inode)
        try:
            outside = os.lstat(self.a_path[inode]).st_nlink > self.names_total[inode]
        except OSError:
            outside = False
        if outside:  # hardlinked outside the cache (an export, a copy-free image layer): the bytes stay
            self.outside_kept += self.sizes[inode]
            return 0
        return self.sizes[inode]

    def _payload_released(self, repo: RepoBook, inode: tuple[int, int]) -> int:
        """``repo``, the last holder of the store payload ``inode``, let it go: when its sweep will free it (its
        ``.refs`` manifest names exactly the links the plan removes), its bytes go to ``freed`` and to its own item
        (:meth:`payload_items`), else a warning may say why it stays. Returns 0."""
        xet_hash, size = self.store_hashes[inode], self.sizes[inode]
        removed = {f"{repo.info.folder}/blobs/{etag}" for repo, etag in self.store_removed.get(xet_hash, ())}
        references, why = payload_references(self.root, xet_hash)
        shown = payload_path(xet_hash)
        if references is None:
            self.warnings.append(f"{shown}: kept in the shared store ({size} bytes): {why}")
            return 0
        if set(references) - removed:
            return 0  # a link the plan keeps (a repo left alone) still uses it
        if removed - set(references):
            self.warnings.append(f"{shown}: kept in the shared store ({size} bytes): its .refs manifest does not "
                                 "name every link to it")
            return 0
        try:
            nlink = payload_stat(self.root, xet_hash).st_nlink
        except (OSError, StoreProblem):
            return 0
        if nlink > 1 + self.names_total.get(inode, 0) - self.link_names.get(inode, 0):
            self.outside_kept += size  # hardlinked outside the cache: the bytes stay
            return 0
        self.payload_freed[xet_hash] = size
        self.payload_releaser[xet_hash] = repo
        self.freed += size
        return 0

    def payload_items(self) -> None:
        """One ``payload`` item per payload the plan frees, on the repo of its last removed link."""
        for xet_hash, freed in sorted(self.payload_freed.items()):
            repo = self.payload_releaser[xet_hash]
            reasons = [repo.deleted_blobs[etag] for r, etag in self.store_removed.get(xet_hash, ()) if r is repo]
            self.item(repo, "payload", payload_path(xet_hash), None, reasons[-1] if reasons else "unused",
                      "shared Xet payload no remaining repo links to", freed)

    def orphan_payloads(self) -> None:
        """Plan the payloads no scanned repo holds whose readable manifest names no link (``hf cache prune``'s
        ``unreferenced_shared_blobs``); their bytes are added to ``bytes_before`` (the scan counted none)."""
        for xet_hash, st in sorted(self.payloads.items()):
            inode = (st.st_dev, st.st_ino)
            if inode in self.holders:
                continue  # a repo holds it (or held it: its removal plans the payload)
            references, why = payload_references(self.root, xet_hash)
            if references is None:
                self.warnings.append(f"{payload_path(xet_hash)}: kept in the shared store ({st.st_size} bytes): "
                                     f"{why}")
                continue
            if references:
                continue  # named by a link in a repo the plan leaves alone
            freed = st.st_size if st.st_nlink == 1 else 0
            self.bytes_before += freed
            self.outside_kept += st.st_size - freed
            self.freed += freed
            self.store_items.append(PlanItem("payload", "", "", STORE_FOLDER, payload_path(xet_hash), None,
                                             "orphan", "shared Xet payload no repo links to", freed))

    def item(self, repo: RepoBook, kind: str, path: str, revision: str | None, reason: str, detail: str,
              bytes_freed: int = 0) -> None:
        info = repo.info
        repo.items.append(PlanItem(kind, info.repo_id, info.repo_type, info.folder, path, revision, reason, detail,
                                   bytes_freed))

    def lock_path(self, folder: str, etag: str) -> str:
        return f"{self.root}/.locks/{folder}/{etag}.lock"

    def delete_blob(self, repo: RepoBook, etag: str, reason: str, detail: str) -> None:
        inode, size = repo.blobs[etag]
        repo.deleted_blobs[etag] = reason
        xet_hash = repo.store_links.get(etag)
        if xet_hash is not None:
            self.store_removed.setdefault(xet_hash, []).append((repo, etag))
        freed = self.release(repo, inode)  # 0 for a store payload: its bytes go on the payload's item
        self.freed += freed
        self.item(repo, "blob", f"{repo.info.folder}/blobs/{etag}", None, reason,
                  detail if xet_hash is None else detail + "; a link into the shared store", freed)

    def remove_revision(self, repo: RepoBook, rev: RevisionInfo, reason: str, detail: str) -> None:
        """Remove a revision: its refs, snapshot, markers, listing and the blobs no remaining revision uses."""
        self.build_tables(repo)
        commit, folder, freed_before = rev.commit_hash, repo.info.folder, self.freed
        repo.removed[commit] = reason
        refs = tuple(sorted(repo.refs_to.get(commit, ())))
        for name in refs:
            self.item(repo, "ref", f"{folder}/refs/{name}", commit, reason, detail)
        snapshot_freed, real_inodes, etags = 0, set(), set()
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
