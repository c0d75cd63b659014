"""check_targets: which tokenizers ``check`` loads (from a lock or a cache, narrowed by ``REPO_ID[@REVISION]``
specs), and what the cache holds for each: the snapshot it loads from, the parts of its repo folder this user cannot
read, the custom code (``auto_map``) its load runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..cache import safefs
from ..cache.fsops import scan_tree
from ..cache.layout import RepoFolder
from ..cache.scan import RepoInfo, scan_cache, scan_repo
from ..errors import CacheError, UsageError
from ..names import is_commit
from ..records import parse_specs
from ..warming.custom_code import MAX_PARSE_BYTES, auto_map_refs
from ..warming.lockfile import Lockfile
from ..warming.selection import AUTO_MAP_FILES, tokenizer_paths


@dataclass(frozen=True)
class CheckTarget:
    """A tokenizer to load: ``repo_id`` as the application passes it, at ``revision`` (a ref, or a 40-hex commit for
    a revision warmed by commit); ``chat_templates`` the template files the repo has (from a lock);
    ``trust_remote_code`` whether ``auto_map`` makes the load run custom code (:func:`.check.check_tokenizers`)."""

    repo_id: str
    revision: str = "main"
    repo_type: str = "model"
    chat_templates: tuple[str, ...] = ()
    trust_remote_code: bool = False

    @property
    def spec(self) -> str:
        return f"{self.repo_id}@{self.revision}"


def targets_from_lock(lock: Lockfile) -> list[CheckTarget]:
    """Every locked repo whose selection holds tokenizer files, by the id and revision the manifest uses; and every
    kernel repo (check lists it as skipped)."""
    targets = []
    for repo in lock.repos:
        paths = [f.path for f in repo.files]
        if repo.request.repo_type == "kernel":
            targets.append(CheckTarget(repo.request.repo_id, repo.request.revision, "kernel"))
        elif tokenizer_paths(paths) - {"config.json"}:
            templates = tuple(p for p in paths if p.startswith("additional_chat_templates/")
                              or p in ("chat_template.jinja", "chat_template.json"))
            targets.append(CheckTarget(repo.request.repo_id, repo.request.revision, repo.request.repo_type,
                                       templates))
    return targets


def cached_revisions(repo: RepoInfo) -> list[tuple[str, str]]:
    """``(revision, commit)`` of every snapshot of a repo: one per ref, and the commit itself for a snapshot no ref
    points to (``warm REPO_ID@<commit>`` writes no ref: the application loads it by commit)."""
    found = [(ref, commit.strip()) for ref, commit in sorted(repo.refs.items())]
    referenced = {commit for _, commit in found}
    found += [(r.commit_hash, r.commit_hash) for r in repo.revisions if r.commit_hash not in referenced]
    return found


def select_targets(targets: list[CheckTarget], specs: Iterable[str]) -> list[CheckTarget]:
    """The targets (e.g. a lock's) that ``REPO_ID[@REVISION]`` specs name, all without a spec. UsageError: a
    malformed spec, or one naming no target."""
    wanted = parse_specs(specs)
    if not wanted:
        return targets
    chosen = [t for t in targets if t.repo_id in wanted and (not wanted[t.repo_id] or t.revision in wanted[t.repo_id])]
    for repo_id, revisions in wanted.items():
        for revision in revisions or {None}:
            if not any(t.repo_id == repo_id and revision in (None, t.revision) for t in chosen):
                raise UsageError(f"{repo_id}{'@' + revision if revision else ''}: no such tokenizer in the lock",
                                 hint="name a repo_id (and revision) of the lock")
    return chosen


def targets_from_cache(cache_dir: Path, specs: Iterable[str] = ()) -> list[CheckTarget]:
    """The tokenizers of a cache to check: every model repo revision (by ref, or by commit when no ref points to it)
    whose snapshot holds tokenizer files; with ``specs`` (``REPO_ID[@REVISION]``), only those repos, at the
    revisions given (else all). Kernel repos are targets of type ``kernel``; datasets are left out. A spec the cache
    lacks is still a target, so that its failed load says what is missing. UsageError: a malformed spec.
    """
    wanted = parse_specs(specs)
    targets: list[CheckTarget] = []
    for repo in scan_cache(cache_dir, set(wanted) or None).repos:
        asked = wanted.get(repo.repo_id)
        if repo.repo_type == "kernel":  # no tokenizer: listed, so that naming one is a note, not a failure
            revisions = sorted(asked or {r for r, _ in cached_revisions(repo)} or {"main"})
            targets += [CheckTarget(repo.repo_id, revision, "kernel") for revision in revisions]
        elif repo.repo_type != "model":
            continue
        elif repo.unsafe:
            targets.append(CheckTarget(repo.repo_id, "main"))  # reported as unsafe, never loaded
        elif asked:  # exactly the revisions named, loadable or not
            targets += [CheckTarget(repo.repo_id, revision) for revision in sorted(asked)]
        else:  # a repo this user cannot fully read is checked anyway: what it holds is unknown, the load tells
            holding = {r.commit_hash for r in repo.revisions
                       if tokenizer_paths(f.path for f in r.files) - {"config.json"}}
            found = [CheckTarget(repo.repo_id, revision) for revision, commit in cached_revisions(repo)
                     if repo.unreadable or commit in holding]
            targets += found or ([CheckTarget(repo.repo_id, "main")] if repo.unreadable else [])
    listed = {t.repo_id for t in targets}
    for repo_id, asked in sorted(wanted.items()):
        if repo_id not in listed:
            targets += [CheckTarget(repo_id, revision) for revision in sorted(asked or {"main"})]
    return targets


def snapshot_of(cache_dir: Path, target: CheckTarget) -> Path | None:
    """The cached snapshot folder a target loads from (its ref's commit, or the revision itself when it is a
    commit), or None when the cache cannot resolve it."""
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type)
    try:
        ref = folder.read_ref(target.revision)  # O_NOFOLLOW: a planted ref link is never read through
        commit = ref.decode().strip() if ref is not None else target.revision
    except (OSError, UnicodeDecodeError, CacheError):
        return None
    snapshot = folder.root / "snapshots" / commit
    try:
        safefs.check_existing(cache_dir, (folder.name, "snapshots", commit))  # never through a planted link
    except (OSError, CacheError):
        return None
    # os.path.isdir, not Path.is_dir: Python 3.11's raises PermissionError on an unreadable snapshots/
    return snapshot if is_commit(commit) and os.path.isdir(snapshot) else None


def unreadable_parts(cache_dir: Path, target: CheckTarget) -> tuple[str, ...]:
    """The parts of ``target``'s repo folder an offline load by repo id reads (``refs/``, ``snapshots/``, ``blobs/``,
    ``.no_exist/`` and every folder below them) that this user cannot list or enter, relative to the cache
    (``models--org--name/refs/``): such a repo fails the check whatever the probe (a load by commit) would say."""
    folder = RepoFolder(cache_dir, target.repo_id, target.repo_type).root
    if not os.path.lexists(folder):
        return ()
    denied = list(scan_repo(folder, target.repo_id, target.repo_type).unreadable)
    if "" not in denied:
        denied += _unreadable_below(folder, ".no_exist")
    return tuple(f"{folder.name}/{part}" for part in sorted(set(denied)))


def _unreadable_below(folder: Path, part: str) -> list[str]:
    """Folders under ``folder/part`` this user cannot list or enter, relative to ``folder`` (``.no_exist/abc/``), in a
    bounded walk (a member can plant a 1,000-level chain)."""
    denied: list[str] = []
    if not os.path.lexists(folder / part):
        return denied
    for _path, rel, dirs, _others in scan_tree(str(folder / part), onerror=lambda _exc, rel: denied.append(
            f"{part}/{rel}")):
        for entry in [e for e in dirs if not os.access(e.path, os.R_OK | os.X_OK)]:
            denied.append(f"{part}/{rel}{entry.name}/")
            dirs.remove(entry)
    return denied


def custom_code_refs(cache_dir: Path, target: CheckTarget) -> tuple[str, ...]:
    """The ``auto_map`` class references a tokenizer load of ``target`` runs, read from its cached configs (warm's
    rule: ``custom_code.auto_map_refs``); empty when it runs none or the cache cannot tell. Raises
    custom_code.RepoDataError: a cached config is nested too deeply to parse (the load fails on it too)."""
    snapshot = snapshot_of(cache_dir, target)
    refs: list[str] = []
    for name in AUTO_MAP_FILES if snapshot is not None else ():
        try:
            data = safefs.read_snapshot_file(snapshot, name, MAX_PARSE_BYTES)  # regular files only, no FIFO hang
        except (OSError, CacheError):
            continue
        if data is None:
            continue
        refs += [r for r in auto_map_refs(name, data) if r not in refs]
    return tuple(refs)
