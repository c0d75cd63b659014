"""check_trust: which repos ``check`` may run custom code for, and when running it as root is refused.

Whoever can write the cache chose the code a cached ``auto_map`` names (a group member, a pulled image, an imported
tar), so ``check`` runs it only for the repos the user names (:class:`TrustPolicy`), and as root only from folders no
other user can change (:func:`root_refusal`; else exit 2, without loading).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..bounds import TooDeep
from ..cache.layout import RepoFolder
from ..cache.safefs import UnsafeLayout
from ..cache.safefs_tree import iter_tree
from ..errors import UsageError
from ..records import parse_specs
from ..warming.custom_code import foreign_repos
from ..warming.modules_cache import ENV_NAME
from .check_targets import CheckTarget

#: What a target whose code was not opted in reports (``CheckResult.skipped``); ``check`` is not a pass on it.
NOT_RUN = "needs custom code: not run"

#: Entries looked at per repo folder before running its code as root (a larger repo is refused).
MAX_ENTRIES = 200_000


@dataclass(frozen=True)
class TrustPolicy:
    """The repos whose custom code ``check`` may run: ``everything`` (``--trust-remote-code '*'``), or ``specs``:
    repo id -> the revisions named (empty: every revision of that repo)."""

    everything: bool = False
    specs: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, values: Iterable[str], lock_targets: Iterable[CheckTarget] = ()) -> TrustPolicy:
        """From ``--trust-remote-code`` values (``REPO_ID``, ``REPO_ID@REVISION`` or ``*``) and a lock's targets
        (the user chose them). UsageError: a malformed value (not one repo id, e.g. a comma-separated list)."""
        values = list(values)
        specs = {repo: frozenset(revs) for repo, revs in parse_specs(v for v in values if v != "*").items()}
        for target in lock_targets:
            specs[target.repo_id] = specs.get(target.repo_id, frozenset()) | {target.revision}
        return cls("*" in values, specs)

    def allows(self, target: CheckTarget) -> bool:
        if self.everything:
            return True
        revisions = self.specs.get(target.repo_id)
        return revisions is not None and (not revisions or target.revision in revisions)

    def unmatched(self, targets: Iterable[CheckTarget]) -> list[str]:
        """The named repo ids no target has (a typo would otherwise trust nothing, silently)."""
        ids = {t.repo_id for t in targets}
        return sorted(repo for repo in self.specs if repo not in ids)


def _changeable(st: os.stat_result, euid: int) -> str | None:
    """Why another user can change what ``st`` describes (owned by another uid, writable by group or others and no
    sticky folder), or None."""
    if stat.S_ISLNK(st.st_mode):
        return None  # a link cannot be rewritten; replacing it needs its folder, which is looked at too
    if st.st_uid != euid:
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"writable by {'group' if st.st_mode & 0o020 else 'others'} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _path_and_parents(path: Path, euid: int) -> str | None:
    """The first of ``path`` and the folders above it that another user can change: ``"<path>: <why>"``."""
    for here in (path, *path.parents):
        try:
            why = _changeable(os.lstat(here), euid)
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (yet): what is above it decides who can put it there
        except OSError as exc:
            return f"{here} cannot be looked at ({exc.strerror or exc})"
        if why:
            return f"{here} is {why}"
    return None


def _repo_folder(cache_dir: Path, folder: RepoFolder, euid: int) -> str | None:
    """The first entry of a repo folder (or a file its links resolve to) another user can change."""
    why = _changeable(os.lstat(folder.root), euid)
    if why:
        return f"{folder.root} is {why}"
    for seen, (parts, name, mode) in enumerate(iter_tree(cache_dir, folder.name), 1):
        if seen > MAX_ENTRIES:
            return f"{folder.root} holds more than {MAX_ENTRIES} entries (not all looked at)"
        path = folder.root.joinpath(*parts, name)
        why = _changeable(os.lstat(path), euid)
        if why:
            return f"{path} is {why}"
        if stat.S_ISLNK(mode):
            real = Path(os.path.realpath(path))
            if not real.is_relative_to(folder.root):  # the shared Xet store (<cache>/blobs/), or worse
                why = _path_and_parents(real, euid)
                if why:
                    return why
    return None


def root_refusal(cache_dir: Path, targets: Iterable[tuple[CheckTarget, tuple[str, ...]]]) -> str | None:
    """Why ``check`` running as root must not run these targets' custom code (one line naming the first path
    another user can change and the repo whose code it would feed), or None. Looked at: the cache root and its
    parents (as given and resolved), every entry of the repo folders the code comes from, the files their links
    resolve to, an explicit ``HF_MODULES_CACHE``. ``targets``: (target, its ``auto_map`` refs) per code to run."""
    euid = os.geteuid()
    if euid != 0:
        return None
    for target, refs in targets:
        # The path as given and the folder it resolves to: a cache reached through a link is the link's target's.
        why = _path_and_parents(Path(os.path.abspath(cache_dir)), euid) \
            or _path_and_parents(Path(os.path.realpath(cache_dir)), euid)
        for repo_id in (target.repo_id, *foreign_repos(refs)):
            folder = RepoFolder(cache_dir, repo_id, target.repo_type)
            if why is None and os.path.lexists(folder.root):
                try:
                    why = _repo_folder(cache_dir, folder, euid)
                except (TooDeep, UnsafeLayout, OSError) as exc:
                    why = f"{folder.root} cannot be looked at safely ({exc})"
        explicit = os.environ.get(ENV_NAME)  # transformers copies the code there, then imports it from there
        if why is None and explicit:
            why = _path_and_parents(Path(os.path.realpath(os.path.expanduser(explicit))), euid)
        if why:
            return (f"refusing to run {target.repo_id}'s custom code as root: {why}, so another user could have "
                    "chosen that code")
    return None


def refuse_as_root(reason: str) -> UsageError:
    return UsageError(reason, hint="run `hfcache check` as the cache's owner (not root), or drop --trust-remote-code "
                                   "to report that repo as 'needs custom code: not run'")
