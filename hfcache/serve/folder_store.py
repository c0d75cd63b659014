"""A folder of plain repo folders as a store of repos (``hfcache serve --repos``; the layout: docs/serve.md; an
org-less repo is ``<root>/<name>/`` holding files directly; legacy ids: ``<root>/legacy_ids.json``), scanned on every
request. Each repo has one branch, ``main``, its commit derived from the content (an old one: ``RevisionNotFound``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from ..cache.content import sha1_hex
from ..cache.fsops import walk_tree
from ..names import PLURALS
from ..records import REPO_TYPES
from .vocabulary import DEFAULT_BRANCH, REPO_NAME_RE, HashMemo, RepoFile, RepoSnapshot, StoreMiss, open_beneath

__all__ = ["FolderStore"]

#: The top folder of each repo type other than models (which sit at the top).
_TYPE_FOLDERS = {t: PLURALS[t] for t in REPO_TYPES if t != "model"}


class FolderStore:
    """The plain repo folders of ``root`` (str | Path); ``legacy_ids`` (Mapping[str, str]): legacy id -> canonical
    id (model repos)."""

    def __init__(self, root: str | Path, legacy_ids: Mapping[str, str]):
        self.root = Path(root).resolve()
        self.legacy_ids = dict(legacy_ids)
        self._memo = HashMemo()

    def canonical_id(self, repo_type: str, repo_id: str) -> str:
        return self.legacy_ids.get(repo_id, repo_id) if repo_type == "model" else repo_id

    def snapshot(self, repo_type: str, repo_id: str, revision: str) -> RepoSnapshot:
        """The repo (legacy ids resolved) at ``main`` or its current commit. Raises StoreMiss: no such repo, or another
        revision (the current commit as ``X-Repo-Commit``)."""
        repo_id = self.canonical_id(repo_type, repo_id)
        repo_dir = self._repo_dir(repo_type, repo_id)
        found = sorted(self._scan(repo_dir).items()) if repo_dir is not None else ()
        files = {path: self._memo.describe(path, real) for path, real in found}
        if not files:
            raise StoreMiss("RepoNotFound", "Repository not found")
        commit = sha1_hex("".join(f"{path}\0{f.blob_id}\n" for path, f in files.items()).encode())
        if revision not in (DEFAULT_BRANCH, commit):
            raise StoreMiss("RevisionNotFound", "Invalid rev id", repo_id=repo_id, commit=commit)
        return RepoSnapshot(repo_type=repo_type, repo_id=repo_id, commit=commit, files=files, listing=frozenset(files))

    def open(self, repo_file: RepoFile, snapshot: RepoSnapshot | None = None, *, head: bool = False) -> BinaryIO:
        """Open the file, re-checking containment (a link may have been swapped since the scan), from the root
        following no link. Raises FileNotFoundError: gone, now outside ``root``, a link, not a regular file."""
        real = repo_file.local_path.resolve()
        try:
            if not real.is_relative_to(self.root):
                raise OSError("outside the served folder")
            return open_beneath(self.root, real.relative_to(self.root).parts)
        except OSError as exc:
            raise FileNotFoundError(str(repo_file.local_path)) from exc

    def _repo_dir(self, repo_type: str, repo_id: str) -> Path | None:
        parts = repo_id.split("/")
        if len(parts) > 2 or not all(REPO_NAME_RE.match(p) for p in parts):
            return None
        if repo_type == "model" and parts[0] in _TYPE_FOLDERS.values():
            return None  # <root>/datasets and <root>/kernels hold those types' repos, never an org of models
        base = self.root / _TYPE_FOLDERS[repo_type] if repo_type in _TYPE_FOLDERS else self.root
        top, repo_dir = base / parts[0], base.joinpath(*parts)
        # A top folder holding files directly is an org-less repo; one holding only folders is an org.
        if (len(parts) == 1) != _has_direct_files(top):
            return None
        if not repo_dir.is_dir() or not repo_dir.resolve().is_relative_to(self.root):
            return None
        return repo_dir

    def _scan(self, repo_dir: Path) -> dict[str, Path]:
        """Repo path -> resolved file, skipping hidden entries and anything resolving outside root."""
        found: dict[str, Path] = {}
        # Links to folders are not entered (they could loop or leave root); symlinked files are checked below.
        for dirpath, dirnames, filenames in walk_tree(repo_dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                full = Path(dirpath, name)
                real = full.resolve()
                if real.is_relative_to(self.root) and real.is_file():
                    found[full.relative_to(repo_dir).as_posix()] = real
        return found


def _has_direct_files(folder: Path) -> bool:
    try:
        return any(e.is_file() and not e.name.startswith(".") for e in os.scandir(folder))
    except OSError:  # missing or not a folder
        return False
