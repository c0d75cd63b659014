"""verify: check a cache's integrity offline, from what the cache itself (or a lock) already says.

Library gap: huggingface_hub trusts a truncated or rewritten blob forever, and ``hf cache verify`` asks the network
for hashes the cache already holds (docs/cache-layout.md, 'Traps the libraries leave'). Every blob is named by its
hash (``blobs/<sha256>`` for LFS files, ``blobs/<git blob sha1>`` for others), so hashing it offline proves it
(:mod:`.hashing`); a lock or a ``trees/<commit>.json`` listing adds the expected size and hash of every snapshot path
(:mod:`.expectations`), so missing or swapped files are found too. The findings: :mod:`.verify_report`.

No network and no huggingface_hub import here: ``verify`` makes zero HTTP requests. Hashing runs in parallel threads
(hashlib releases the GIL on updates over 2047 bytes), largest blobs first, each thread reading 4 MiB at a time into
one buffer it reuses (``readinto``: constant memory, no allocation per read). ``fast=True`` skips blobs unchanged since
a recorded run hashed them (:mod:`hfcache.integrity.verify_record`); the default hashes every blob.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace

from .. import pools
from ..cache import safefs
from ..cache.root import repo_folder_name
from ..cache.store_blobs import store_blob_stat
from ..errors import CacheError
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, scan_cache
from ..records import parse_specs
from ..warming.lockfile import Lockfile
from . import verify_record
from .expectations import Expected, check_expected, expected_of, lock_expectations, lock_repos_missing, lost_markers
from .hashing import HashProgress, algorithm_of, fd_hash
from .verify_report import Problem, VerifyReport

_BATCH_BYTES = 32 * 1024 * 1024  # blobs hashed per task: one hand-over to the reporting thread per ~32 MiB

#: A blob or real file to hash, keyed by (device, inode): (what to open: (cache root, repo folder, etag) for a blob,
#: opened with safefs.open_blob, or (cache root, repo folder, commit, repo path) for a real snapshot file, opened with
#: safefs.open_repo_file: both walk from the cache root through descriptors, never by a path rebuilt after the scan;
#: algorithm, expected etag, size).
_Opener = tuple[str, str, str] | tuple[str, str, str, str]
_Jobs = dict[tuple[int, int], tuple[_Opener, str, str, int]]
#: Who refers to each content: (repo, revision or "" for the blob itself, repo path or ``blobs/<etag>``).
_Owners = dict[tuple[int, int], list[tuple[RepoInfo, str, str]]]
#: Blobs' stat stamps (verify_record), for fast.
_Stamps = dict[tuple[int, int], tuple[int, int, int, str]]


def _structure_problems(repo: RepoInfo) -> list[Problem]:
    """What the metadata scan already shows: refs, links, blob entries, leftovers, storage form."""
    found = []
    add = found.append
    for text in repo.unsafe:
        add(Problem(repo.repo_id, "", text.split(":", 1)[0], "unsafe_layout", text, repo.folder))
    snapshots = {r.commit_hash for r in repo.revisions}
    for name, value in sorted(repo.refs.items()):
        if algorithm_of(value) != "git-sha1":
            add(Problem(repo.repo_id, f"refs/{name}", "", "ref_malformed",
                        f"refs/{name} holds {value!r}, not 40 hex characters", repo.folder))
        elif value not in snapshots:
            add(Problem(repo.repo_id, f"refs/{name}", "", "ref_dangling",
                        f"refs/{name} points to {value[:12]}, which has no snapshot", repo.folder))
    for problem in repo.problems:
        if problem.startswith("blobs/"):
            name = problem.split(":", 1)[0]
            add(Problem(repo.repo_id, "", name, "blob_not_file", problem, repo.folder))
        elif problem.startswith("snapshots/"):
            add(Problem(repo.repo_id, "", problem.split(":", 1)[0], "unsafe_layout", problem, repo.folder))
    for name in repo.incomplete:
        add(Problem(repo.repo_id, "", f"blobs/{name}", "incomplete", "leftover partial download", repo.folder))
    for rev in repo.revisions:
        for text in rev.problems:
            if text.endswith(SPECIAL_FILE):
                add(Problem(repo.repo_id, rev.commit_hash, text.split(": ", 1)[0], "unsafe_layout",
                            f"snapshot entry is {SPECIAL_FILE}: loads would block on it", repo.folder))
            elif text.endswith(TOO_DEEP):
                add(Problem(repo.repo_id, rev.commit_hash, text.split(": ", 1)[0], "unsafe_layout",
                            f"snapshot {TOO_DEEP}", repo.folder))
        real_files = 0
        for f in rev.files:
            if f.form == "file":
                real_files += 1
            elif f.form != "link":
                kind = {"broken": "link_broken", "absolute": "link_absolute", "outside": "link_outside"}[f.form]
                text = {"link_broken": "snapshot link to a missing blob",
                        "link_absolute": "snapshot link is absolute (breaks when the cache moves)",
                        "link_outside": "snapshot link points outside the repo's blobs"}[kind]
                add(Problem(repo.repo_id, rev.commit_hash, f.path, kind, text, repo.folder))
        if real_files:
            add(Problem(repo.repo_id, rev.commit_hash, "", "no_symlinks",
                        f"{real_files} file(s) stored as real files (cache written without symlinks)", repo.folder))
    return found


def verify_cache(
    cache_dir: str | os.PathLike[str],
    repo_ids: Iterable[str] | None = None,
    lock: Lockfile | None = None,
    max_workers: int | None = None,
    progress: HashProgress | None = None,
    fast: bool = False,
) -> VerifyReport:
    """Verify a cache offline; report every problem together.

    Args:
        cache_dir: the cache root.
        repo_ids: only these repos (ids as their folders name them), each optionally ``REPO_ID@REVISION`` (a ref or a
            commit, as ``warm`` takes them): then only that revision's snapshot and the blobs it uses; a revision the
            cache lacks is a ``revision_missing`` error. Default: every repo and revision.
        lock: expected files, sizes and hashes per repo and commit; without it, blob names and ``trees/`` listings.
        max_workers: hashing threads (default: the CPU count).
        progress: receives the total byte count, then every chunk hashed.
        fast: skip blobs whose (device, inode, size, mtime, ctime) and name equal those recorded by an earlier
            ``fast`` run in which they hashed right, and record this run's (:mod:`hfcache.integrity.verify_record`:
            what this cannot catch). A record not owned by this euid, writable by group or others, or past its
            bounds is ignored (a ``fast_record_ignored`` note) and every blob is hashed. Default False: every blob
            is hashed and nothing is written.

    Returns:
        VerifyReport; ``ok`` is False when any integrity error (not a note) exists.

    Raises:
        UsageError: a malformed ``REPO_ID@REVISION``.
    """
    started = time.monotonic()
    specs = parse_specs(repo_ids or ())
    wanted = set(specs) or None
    info = scan_cache(cache_dir, wanted)
    expectations = lock_expectations(lock)
    problems: list[Problem] = []
    # Distinct contents to hash, keyed by inode; blobs' stat stamps (verify_record), for fast; who refers to each.
    jobs: _Jobs = {}
    stamps: _Stamps = {}
    owners: _Owners = {}
    for repo in info.repos:
        problems.extend(_repo_problems(info.cache_dir, repo, specs, expectations, jobs, stamps, owners))
    problems.extend(_named_repos_missing(specs, info.repos))
    if lock is not None:
        problems.extend(lock_repos_missing(lock, info.cache_dir, wanted))
    recorded, ignored = verify_record.load(info.cache_dir) if fast else ({}, "")
    if ignored:  # a record this run may not trust (another uid's, group-writable, too deep...): everything is hashed
        problems.append(Problem("", "", "/".join(verify_record.RECORD), "fast_record_ignored",
                                f"the --fast record is {ignored}: ignored, every blob hashed", ""))
    skipped = {key for key, st in stamps.items() if recorded.get(key) == st and key in jobs}
    # Largest first: two threads then finish together instead of one hashing the last big blob alone.
    todo = sorted((key for key in jobs if key not in skipped), key=lambda key: -jobs[key][3])
    mismatches, failed, hashed_bytes = _hash_contents(todo, jobs, owners, max_workers, progress)
    problems.extend(mismatches)
    if fast:
        _record(info.cache_dir, recorded, stamps, failed, everything=not specs)
    problems.sort()
    return VerifyReport(cache_dir=info.cache_dir, repos=tuple(sorted(r.repo_id for r in info.repos)),
                        blobs_hashed=len(todo), bytes_hashed=hashed_bytes, seconds=time.monotonic() - started,
                        problems=tuple(problems), blobs_skipped=len(skipped))


def _repo_problems(cache_dir: str, repo: RepoInfo, specs: dict[str, set[str]],
                   expectations: dict[tuple[str, str, str], dict[str, Expected]], jobs: _Jobs, stamps: _Stamps,
                   owners: _Owners) -> list[Problem]:
    """What one repo's metadata shows wrong; its blobs and real files are queued in ``jobs`` for hashing."""
    problems: list[Problem] = []
    if repo.unreadable:
        # Part of the repo cannot be read by this user: what it holds cannot be verified (exit 1).
        problems.extend(Problem(repo.repo_id, "", part or f"{repo.folder}/", "unreadable", detail.split(": ", 1)[1],
                                repo.folder) for part, detail in zip(repo.unreadable, repo.problems))
        return problems
    used: set[str] | None = None
    if specs.get(repo.repo_id):
        repo, missing = _only_revisions(repo, specs[repo.repo_id])
        problems.extend(missing)
        used = {f.etag for rev in repo.revisions for f in rev.files if f.etag}
    problems.extend(_structure_problems(repo))
    if repo.unsafe:
        return problems  # nothing below a planted link is read
    problems.extend(_queue_blobs(cache_dir, repo, used, jobs, stamps, owners))
    for rev in repo.revisions:
        expected, source, absent = expected_of(cache_dir, repo, rev.commit_hash, expectations, problems)
        problems.extend(check_expected(repo, rev, expected, source, jobs, owners, cache_dir))
        if absent:
            problems.extend(lost_markers(cache_dir, repo, rev, absent))
    return problems


def _queue_blobs(cache_dir: str, repo: RepoInfo, used: set[str] | None, jobs: _Jobs, stamps: _Stamps,
                 owners: _Owners) -> list[Problem]:
    """Queue the repo's blobs (only those in ``used``, when given) for hashing; a note for each blob whose name
    is not a hash."""
    problems: list[Problem] = []
    blobs_dir = os.path.join(cache_dir, repo.folder, "blobs")
    for entry in _blob_entries(blobs_dir):
        if used is not None and entry.name not in used:
            continue
        algorithm = algorithm_of(entry.name)
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed since the listing (a concurrent prune)
            continue
        opener: _Opener = (cache_dir, repo.folder, entry.name)  # opened from the root: a swapped blobs/ is refused
        if stat.S_ISLNK(st.st_mode):  # a shared-store link: the payload is hashed; other links the scan reported
            st, _problem = store_blob_stat(cache_dir, entry.path, entry.name)
            if st is None:
                continue
        if algorithm is None:
            problems.append(Problem(repo.repo_id, "", f"blobs/{entry.name}", "unverified",
                                    "blob name is not a sha256 or git sha1: cannot be checked", repo.folder))
            continue
        key = (st.st_dev, st.st_ino)
        jobs.setdefault(key, (opener, algorithm, entry.name, st.st_size))
        stamps.setdefault(key, verify_record.stamp(st, entry.name))
        owners.setdefault(key, []).append((repo, "", f"blobs/{entry.name}"))
    return problems


def _hash_contents(todo: list[tuple[int, int]], jobs: _Jobs, owners: _Owners, max_workers: int | None,
                   progress: HashProgress | None) -> tuple[list[Problem], set[tuple[int, int]], int]:
    """Hash ``todo`` in parallel threads: (a problem per owner of each content that fails, the keys that failed,
    bytes read)."""
    total = sum(jobs[key][3] for key in todo)
    if progress:
        progress.start(total)
    lock_ = threading.Lock()
    problems: list[Problem] = []
    failed: set[tuple[int, int]] = set()

    def run(key: tuple[int, int]) -> tuple[tuple[int, int], str | None, int]:
        path, algorithm, etag, size = jobs[key]
        try:
            digest, read = _hash_one(path, algorithm, progress.advance if progress else None)
        except FileNotFoundError:
            return key, None, 0  # removed since the scan (a concurrent prune): nothing left to be wrong
        except OSError as exc:
            return key, f"cannot be read: {exc.strerror}", 0
        except CacheError as exc:  # the store link or payload changed since the scan into a refused shape
            return key, f"refused: {exc.message}", 0
        return key, (None if digest == etag else f"content hashes to {digest}"), read

    def run_batch(keys: list[tuple[int, int]]) -> list[tuple[tuple[int, int], str | None, int]]:
        return [run(key) for key in keys]

    hashed_bytes = 0
    with pools.pool(max_workers or os.cpu_count() or 2, "hfcache-hash") as executor:
        # pools.ordered: Ctrl-C is not held up until every file in flight is hashed (a signal on a worker thread).
        # Small blobs go in batches: one future (and one wake-up of this thread) per ~32 MiB, not per file.
        batches = [executor.submit(run_batch, batch) for batch in _batches(todo, jobs)]
        for key, failure, read in (result for results in pools.ordered(batches) for result in results):
            with lock_:
                hashed_bytes += read
            if failure is None:
                continue
            failed.add(key)
            problems.extend(_failure_problems(key, failure, jobs, owners))
    return problems, failed, hashed_bytes


def _hash_one(opener: _Opener, algorithm: str, on_bytes) -> tuple[str, int]:
    """(digest, bytes read) of a job's file: a repo blob opened with :func:`hfcache.cache.safefs.open_blob` (a
    regular file, or the library's link shape into a marked store, nothing else followed), or a real snapshot file
    opened with :func:`hfcache.cache.safefs.open_repo_file`; both from the cache root with ``O_NOFOLLOW`` on every
    component, so a folder a cache member swapped for a link after the scan is refused, not read through.
    Raises OSError, or CacheError (UnsafeLayout) for a layout refused since the scan."""
    if len(opener) == 3:
        root, folder, etag = opener

        def open_(flags: int) -> int:
            return safefs.open_blob(root, folder, etag, flags)
        shown = f"{root}/{folder}/blobs/{etag}"
    else:
        root, folder, commit, rel = opener

        def open_(flags: int) -> int:
            return safefs.open_repo_file(root, folder, (commit, *rel.split("/")), flags | os.O_NONBLOCK)
        shown = f"{root}/{folder}/snapshots/{commit}/{rel}"
    try:  # O_NOATIME: hashing is not a use (only the owner may ask for it)
        fd = open_(os.O_RDONLY | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        fd = open_(os.O_RDONLY)
    return fd_hash(fd, algorithm, on_bytes, shown)


def _failure_problems(key: tuple[int, int], failure: str, jobs: _Jobs, owners: _Owners) -> list[Problem]:
    """A problem for each owner of a content that cannot be read or does not hash to its expected etag."""
    problems: list[Problem] = []
    path, algorithm, etag, size = jobs[key]
    for repo, revision, where in owners[key]:
        if failure.startswith("refused"):
            problems.append(Problem(repo.repo_id, revision, where, "blob_not_file", failure, repo.folder))
            continue
        if failure.startswith("cannot be read"):
            problems.append(Problem(repo.repo_id, revision, where, "unreadable",
                                    f"{failure}: ask the cache's owner to make it group-readable",
                                    repo.folder))
            continue
        users = _linked_from(repo, etag, key) if not revision else ()
        shown = f"; used by {', '.join(users[:5])}" + (f" and {len(users) - 5} more" if len(users) > 5
                                                         else "") if users else ""
        problems.append(Problem(repo.repo_id, revision, where, "blob_mismatch" if not revision
                                else "file_mismatch", f"{failure}, not its expected {algorithm} {etag[:16]}…"
                                f" ({size} bytes on disk){shown}", repo.folder, users))
    return problems


def _batches(todo: list[tuple[int, int]], jobs: _Jobs,
             size: int = _BATCH_BYTES) -> Iterator[list[tuple[int, int]]]:
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
    users = []
    for rev in repo.revisions:
        revision = rev.refs[0] if rev.refs else rev.commit_hash
        users += [f"{repo.repo_id}@{revision}:{f.path}" for f in rev.files if f.etag == etag or f.inode == inode]
    return tuple(users)


def _record(cache_dir: str, recorded, stamps, failed: set[tuple[int, int]], everything: bool) -> None:
    """Record the blobs that hashed right (or were skipped as unchanged) for the next ``--fast`` run. A run over the
    whole cache replaces the record; one over some repos keeps the others' entries."""
    keep = {} if everything else {key: st for key, st in recorded.items() if key not in stamps}
    keep.update((key, st) for key, st in stamps.items() if key not in failed)
    verify_record.save(cache_dir, keep)


def _named_repos_missing(specs: dict[str, set[str]], repos: Iterable[RepoInfo]) -> list[Problem]:
    """A ``revision_missing`` problem for each repo named on the command line that has no folder in the cache."""
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
