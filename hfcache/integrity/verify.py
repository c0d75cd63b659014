"""verify: check a cache's integrity offline, from what the cache itself (or a lock) already says.

Library gap: huggingface_hub trusts a truncated or rewritten blob forever, and ``hf cache verify`` asks the network
for hashes the cache already holds (docs/cache-layout.md, 'Traps the libraries leave'). Every blob is named by its
hash, so hashing it proves it; a lock, warm's record or a ``trees/`` listing adds each snapshot path's size and hash
(:mod:`.expectations`). No network and no huggingface_hub import.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Protocol

from .. import pools
from ..cache import safefs
from ..cache.content import GIT_SHA1, algorithm_of, hash_fd
from ..cache.fsops import LINK_ERRNOS, open_noatime, open_read_at
from ..cache.root import repo_folder_name
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, scan_cache
from ..cache.store_blobs import store_blob_stat
from ..errors import CacheError
from ..records import parse_specs
from ..warming.lockfile import Lockfile
from . import verify_record
from .expectations import Expected, check_expected, expected_of, lock_expectations, lock_repos_missing, lost_markers
from .verify_report import Problem, VerifyReport

_BATCH_BYTES = 32 * 1024 * 1024  # blobs hashed per task: one hand-over to the reporting thread per ~32 MiB

#: A content to hash, keyed by (device, inode): (what to open, from the cache root through descriptors: (root, repo
#: folder, etag) for a blob, (root, repo folder, commit, repo path) for a real snapshot file; algorithm, etag, size).
_Opener = tuple[str, str, str] | tuple[str, str, str, str]
_Jobs = dict[tuple[int, int], tuple[_Opener, str, str, int]]
#: Who refers to each content: (repo, revision or "" for the blob itself, repo path or ``blobs/<etag>``).
_Owners = dict[tuple[int, int], list[tuple[RepoInfo, str, str]]]
_LINK_KINDS = {"broken": ("link_broken", "snapshot link to a missing blob"),
               "absolute": ("link_absolute", "snapshot link is absolute (breaks when the cache moves)"),
               "outside": ("link_outside", "snapshot link points outside the repo's blobs")}


class HashProgress(Protocol):
    """What :func:`verify_cache` reports hashing to: the total bytes, then each chunk's size."""

    def start(self, total_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


def _structure_problems(repo: RepoInfo) -> list[Problem]:
    """What the metadata scan already shows: refs, links, blob entries, leftovers, storage form."""
    found = []

    def add(revision: str, path: str, kind: str, detail: str) -> None:
        found.append(Problem(repo.repo_id, revision, path, kind, detail, repo.folder))

    for text in repo.unsafe:
        add("", text.split(":", 1)[0], "unsafe_layout", text)
    snapshots = {r.commit_hash for r in repo.revisions}
    for name, value in sorted(repo.refs.items()):
        if algorithm_of(value) != GIT_SHA1:
            add(f"refs/{name}", "", "ref_malformed", f"refs/{name} holds {value!r}, not 40 hex characters")
        elif value not in snapshots:
            add(f"refs/{name}", "", "ref_dangling", f"refs/{name} points to {value[:12]}, which has no snapshot")
    for problem in repo.problems:
        if problem.startswith(("blobs/", "snapshots/")):
            kind = "blob_not_file" if problem.startswith("blobs/") else "unsafe_layout"
            add("", problem.split(":", 1)[0], kind, problem)
    for name in repo.incomplete:
        add("", f"blobs/{name}", "incomplete", "leftover partial download")
    for rev in repo.revisions:
        for text in rev.problems:
            if text.endswith(SPECIAL_FILE):
                add(rev.commit_hash, text.split(": ", 1)[0], "unsafe_layout",
                    f"snapshot entry is {SPECIAL_FILE}: loads would block on it")
            elif text.endswith(TOO_DEEP):
                add(rev.commit_hash, text.split(": ", 1)[0], "unsafe_layout", f"snapshot {TOO_DEEP}")
        for f in rev.files:
            if f.form in _LINK_KINDS:
                add(rev.commit_hash, f.path, *_LINK_KINDS[f.form])
        real_files = sum(f.form == "file" for f in rev.files)
        if real_files:
            add(rev.commit_hash, "", "no_symlinks",
                f"{real_files} file(s) stored as real files (cache written without symlinks)")
    return found


def verify_cache(cache_dir: str | os.PathLike[str], repo_ids: Iterable[str] | None = None,
                 lock: Lockfile | None = None, max_workers: int | None = None,
                 progress: HashProgress | None = None, fast: bool = False) -> VerifyReport:
    """Verify a cache offline; report every problem together.

    Args:
        cache_dir: the cache root.
        repo_ids: only these repos, each optionally ``REPO_ID@REVISION`` (a ref or a commit): then only that
            snapshot and the blobs it uses; a revision the cache lacks is ``revision_missing``. Default: everything.
        lock: expected files, sizes and hashes per repo and commit; without it, warm's records and ``trees/``.
        max_workers: hashing threads (default: the CPU count). progress: told the total bytes, then each chunk's.
        fast: skip blobs unchanged since an earlier ``fast`` run hashed them right, and record this run's
            (:mod:`.verify_record`; a record it may not trust: a ``fast_record_ignored`` note). Default: hash all.

    Returns a VerifyReport (``ok`` False when any integrity error, not a note, exists). UsageError: a malformed
    ``REPO_ID@REVISION``.
    """
    started = time.monotonic()
    specs = parse_specs(repo_ids or ())
    info = scan_cache(cache_dir, set(specs) or None)
    expectations = lock_expectations(lock)
    problems: list[Problem] = []
    jobs: _Jobs = {}
    stamps: verify_record.Stamps = {}
    owners: _Owners = {}
    for repo in info.repos:
        problems += _repo_problems(info.cache_dir, repo, specs, expectations, jobs, stamps, owners)
    problems += _named_repos_missing(specs, info.repos)
    if lock is not None:
        problems += lock_repos_missing(lock, info.cache_dir, set(specs) or None)
    recorded, ignored = verify_record.load(info.cache_dir) if fast else ({}, "")
    if ignored:
        problems.append(Problem("", "", "/".join(verify_record.RECORD), "fast_record_ignored",
                                f"the --fast record is {ignored}: ignored, every blob hashed", ""))
    skipped = {key for key, st in stamps.items() if recorded.get(key) == st and key in jobs}
    # Largest first: two threads then finish together instead of one hashing the last big blob alone.
    todo = sorted((key for key in jobs if key not in skipped), key=lambda key: -jobs[key][3])
    mismatches, failed, hashed_bytes = _hash_contents(todo, jobs, owners, max_workers, progress)
    problems += mismatches
    if fast:  # a run over the whole cache replaces the record; one over some repos keeps the others' entries
        keep = {key: st for key, st in recorded.items() if key not in stamps} if specs else {}
        keep.update((key, st) for key, st in stamps.items() if key not in failed)
        verify_record.save(info.cache_dir, keep)
    return VerifyReport(cache_dir=info.cache_dir, repos=tuple(sorted(r.repo_id for r in info.repos)),
                        blobs_hashed=len(todo), bytes_hashed=hashed_bytes, seconds=time.monotonic() - started,
                        problems=tuple(sorted(problems)), blobs_skipped=len(skipped))


def _repo_problems(cache_dir: str, repo: RepoInfo, specs: dict[str, set[str]],
                   expectations: dict[tuple[str, str, str], dict[str, Expected]], jobs: _Jobs,
                   stamps: verify_record.Stamps, owners: _Owners) -> list[Problem]:
    """What one repo's metadata shows wrong; its blobs and real files are queued in ``jobs`` for hashing."""
    if repo.unreadable:  # what a part this user cannot read holds cannot be verified (exit 1)
        return [Problem(repo.repo_id, "", part or f"{repo.folder}/", "unreadable", detail.split(": ", 1)[1],
                        repo.folder) for part, detail in zip(repo.unreadable, repo.problems, strict=False)]
    problems: list[Problem] = []
    used: set[str] | None = None
    if specs.get(repo.repo_id):
        repo, missing = _only_revisions(repo, specs[repo.repo_id])
        problems += missing
        used = {f.etag for rev in repo.revisions for f in rev.files if f.etag}
    problems += _structure_problems(repo)
    if repo.unsafe:
        return problems  # nothing below a planted link is read
    problems += _queue_blobs(cache_dir, repo, used, jobs, stamps, owners)
    for rev in repo.revisions:
        expected = expected_of(cache_dir, repo, rev.commit_hash, expectations, problems)
        problems += check_expected(repo, rev, expected, jobs, owners, cache_dir)
        if expected.absent:
            problems += lost_markers(cache_dir, repo, rev, expected.absent)
    return problems


def _queue_blobs(cache_dir: str, repo: RepoInfo, used: set[str] | None, jobs: _Jobs, stamps: verify_record.Stamps,
                 owners: _Owners) -> list[Problem]:
    """Queue the repo's blobs (those in ``used`` when given) for hashing; a note for each whose name is no hash."""
    problems: list[Problem] = []
    for entry in _blob_entries(os.path.join(cache_dir, repo.folder, "blobs")):
        if used is not None and entry.name not in used:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed since the listing (a concurrent prune)
            continue
        if stat.S_ISLNK(st.st_mode):  # a shared-store link: the payload is hashed; other links the scan reported
            st, _problem = store_blob_stat(cache_dir, entry.path, entry.name)
            if st is None:
                continue
        algorithm = algorithm_of(entry.name)
        if algorithm is None:
            problems.append(Problem(repo.repo_id, "", f"blobs/{entry.name}", "unverified",
                                    "blob name is not a sha256 or git sha1: cannot be checked", repo.folder))
            continue
        key = (st.st_dev, st.st_ino)
        jobs.setdefault(key, ((cache_dir, repo.folder, entry.name), algorithm, entry.name, st.st_size))
        stamps.setdefault(key, verify_record.stamp(st, entry.name))
        owners.setdefault(key, []).append((repo, "", f"blobs/{entry.name}"))
    return problems


def _hash_contents(todo: list[tuple[int, int]], jobs: _Jobs, owners: _Owners, max_workers: int | None,
                   progress: HashProgress | None) -> tuple[list[Problem], set[tuple[int, int]], int]:
    """Hash ``todo`` in parallel threads, largest first: (a problem per owner of each content that fails, the keys
    that failed, bytes read)."""
    if progress:
        progress.start(sum(jobs[key][3] for key in todo))
    on_bytes = progress.advance if progress else None

    def run(key: tuple[int, int], blob_dirs: dict[str, int]) -> tuple[tuple[int, int], str | None, int]:
        opener, algorithm, etag, _size = jobs[key]
        try:
            digests, read = hash_fd(_open(opener, blob_dirs), (algorithm,), on_bytes=on_bytes)
        except FileNotFoundError:
            return key, None, 0  # removed since the scan (a concurrent prune): nothing left to be wrong
        except OSError as exc:
            return key, f"cannot be read: {exc.strerror}", 0
        except CacheError as exc:  # the store link or payload changed since the scan into a refused shape
            return key, f"refused: {exc.message}", 0
        return key, (None if digests[algorithm] == etag else f"content hashes to {digests[algorithm]}"), read

    def run_batch(keys: list[tuple[int, int]]) -> list[tuple[tuple[int, int], str | None, int]]:
        blob_dirs: dict[str, int] = {}  # repo folder -> its blobs/ opened once for the batch (see _open)
        try:
            return [run(key, blob_dirs) for key in keys]
        finally:
            for fd in blob_dirs.values():
                os.close(fd)

    problems: list[Problem] = []
    failed: set[tuple[int, int]] = set()
    hashed_bytes = 0
    with pools.pool(max_workers or os.cpu_count() or 2, "hfcache-hash") as executor:
        # pools.ordered: Ctrl-C is not held up until every file in flight is hashed (a signal on a worker thread).
        # Small blobs go in batches: one future (and one wake-up of this thread) per ~32 MiB, not per file.
        batches = [executor.submit(run_batch, batch) for batch in _batches(todo, jobs)]
        for key, failure, read in (result for results in pools.ordered(batches) for result in results):
            hashed_bytes += read
            if failure is not None:
                failed.add(key)
                problems += _failure_problems(key, failure, jobs, owners)
    return problems, failed, hashed_bytes


def _open(opener: _Opener, blob_dirs: dict[str, int]) -> int:
    """A job's file, opened from the cache root with no link followed on the way, ``O_NOATIME`` where allowed: a repo
    blob (:func:`hfcache.cache.safefs.open_blob`) or a real snapshot file (``safefs.open_repo_file``). A blob is
    opened relative to its ``blobs/`` folder, opened once per batch and kept in ``blob_dirs`` (the walk from the root
    was four opens a blob: a sixth of a 256 KiB blob's hashing); a link there (a shared-store blob) takes
    ``open_blob``'s full path. Raises OSError, or CacheError (UnsafeLayout) for a layout refused since the scan."""
    if len(opener) == 3:
        root, folder, etag = opener
        if (blobs := blob_dirs.get(folder)) is None:
            blobs = blob_dirs[folder] = safefs.open_dir(root, (folder, "blobs"))
        try:
            return open_noatime(lambda flags: open_read_at(blobs, etag, flags))
        except OSError as exc:
            if exc.errno not in LINK_ERRNOS:
                raise
        return open_noatime(lambda flags: safefs.open_blob(root, folder, etag, flags))
    root, folder, commit, rel = opener
    return open_noatime(lambda flags: safefs.open_repo_file(root, folder, (commit, *rel.split("/")), flags))


def _failure_problems(key: tuple[int, int], failure: str, jobs: _Jobs, owners: _Owners) -> list[Problem]:
    """A problem for each owner of a content that cannot be read or does not hash to its expected etag."""
    problems: list[Problem] = []
    _opener, algorithm, etag, size = jobs[key]
    for repo, revision, where in owners[key]:
        if failure.startswith("refused"):
            kind, detail, users = "blob_not_file", failure, ()
        elif failure.startswith("cannot be read"):
            kind, detail, users = "unreadable", f"{failure}: ask the cache's owner to make it group-readable", ()
        else:
            users = _linked_from(repo, etag, key) if not revision else ()
            shown = f"; used by {', '.join(users[:5])}" + (f" and {len(users) - 5} more" if len(users) > 5
                                                             else "") if users else ""
            kind = "file_mismatch" if revision else "blob_mismatch"
            detail = f"{failure}, not its expected {algorithm} {etag[:16]}… ({size} bytes on disk){shown}"
        problems.append(Problem(repo.repo_id, revision, where, kind, detail, repo.folder, users))
    return problems


def _batches(todo: list[tuple[int, int]], jobs: _Jobs, size: int = _BATCH_BYTES) -> Iterator[list[tuple[int, int]]]:
    """``todo`` cut in order into runs of about ``size`` bytes (a large blob alone, many small ones together)."""
    batch: list[tuple[int, int]] = []
    total = 0
    for key in todo:
        batch.append(key)
        total += jobs[key][3]
        if total >= size or len(batch) >= 256:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def _linked_from(repo: RepoInfo, etag: str, inode: tuple[int, int]) -> tuple[str, ...]:
    """The snapshot entries of ``repo`` using the blob ``etag`` (a link to it, or a hardlink of it: same inode), as
    ``REPO_ID@REVISION:PATH``, the revision being the snapshot's first ref, else its commit hash."""
    return tuple(f"{repo.repo_id}@{rev.refs[0] if rev.refs else rev.commit_hash}:{f.path}"
                 for rev in repo.revisions for f in rev.files if f.etag == etag or f.inode == inode)


def _named_repos_missing(specs: dict[str, set[str]], repos: Iterable[RepoInfo]) -> list[Problem]:
    present = {r.repo_id for r in repos}
    return [Problem(repo_id, name, "", "revision_missing",
                    f"{repo_id}@{name} is not in the cache" if name else f"{repo_id} is not in the cache",
                    repo_folder_name(repo_id))
            for repo_id in sorted(set(specs) - present) for name in sorted(specs[repo_id]) or [""]]


def _only_revisions(repo: RepoInfo, revisions: set[str]) -> tuple[RepoInfo, list[Problem]]:
    """``repo`` narrowed to the snapshots that ``revisions`` (refs or commits) name, and the refs naming them; plus a
    ``revision_missing`` problem for each revision the cache does not hold."""
    commits = {name: repo.refs.get(name, name).strip() for name in revisions}
    present = {r.commit_hash for r in repo.revisions}
    missing = [Problem(repo.repo_id, name, "", "revision_missing",
                       f"{repo.repo_id}@{name} is not in the cache" + (" (no such ref or snapshot)"
                                                                        if name not in repo.refs else
                                                                        f" (refs/{name} points to no snapshot)"),
                       repo.folder)
               for name, commit in sorted(commits.items()) if commit not in present]
    kept = set(commits.values())
    narrowed = replace(repo, revisions=tuple(r for r in repo.revisions if r.commit_hash in kept),
                       refs={n: v for n, v in repo.refs.items() if n in revisions or v.strip() in kept})
    return narrowed, missing


def _blob_entries(blobs_dir: str) -> list[os.DirEntry]:
    try:
        with os.scandir(blobs_dir) as it:
            return [e for e in it if not e.name.endswith(".incomplete")
                    and (stat.S_ISREG(e.stat(follow_symlinks=False).st_mode) or e.is_symlink())]
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # the scan reports an unreadable blobs/
        return []
