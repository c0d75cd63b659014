"""verify: check a cache's integrity offline, from what the cache itself (or a lock) already says.

Library gap: huggingface_hub trusts a truncated or rewritten blob forever, and ``hf cache verify`` asks the network
for hashes the cache already holds (DESIGN §1, §3). Every blob is named by its hash (``blobs/<sha256>`` for LFS files,
``blobs/<git blob sha1>`` for others), so hashing it offline proves it; a lock or a ``trees/<commit>.json`` listing
adds the expected size and hash of every snapshot path, so missing or swapped files are found too.

No network and no huggingface_hub import here: ``verify`` makes zero HTTP requests. Hashing runs in parallel threads
(hashlib releases the GIL on updates over 2047 bytes), largest blobs first, each thread reading 4 MiB at a time into
one buffer it reuses (``readinto``: constant memory, no allocation per read). ``fast=True`` skips blobs unchanged since
a recorded run hashed them (:mod:`hfcache.integrity.verify_record`); the default hashes every blob.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from .. import pools
from ..cache import safefs
from . import verify_record
from ..cache.layout import repo_folder_name
from ..warming.lockfile import Lockfile
from ..cache.published import read_record
from ..records import folder_ids
from ..records import parse_specs
from ..cache.scan import SPECIAL_FILE, RepoInfo, scan_cache

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 4 * 1024 * 1024  # bytes per read: large reads amortise the syscall and the GIL hand-over per update
_BATCH_BYTES = 32 * 1024 * 1024  # blobs hashed per task: one hand-over to the reporting thread per ~32 MiB
_buffers = threading.local()  # one reusable read buffer per hashing thread

#: Problem kinds that are integrity errors (exit 1); the others are reported as notes.
ERROR_KINDS = frozenset({
    "blob_mismatch", "blob_size", "blob_not_file", "link_broken", "link_absolute", "link_outside",
    "ref_malformed", "ref_dangling", "file_missing", "file_mismatch", "revision_missing", "unreadable", "unsafe_layout",
})


@dataclass(frozen=True, order=True)
class Problem:
    """One finding, sortable into a stable report order (repo, revision, path, kind).

    Attributes:
        repo_id (str): the repo (as its folder names it).
        revision (str): commit hash, ``refs/<name>`` for ref problems, or ``""`` for blob-level findings.
        path (str): repo path, or ``blobs/<etag>`` for a blob.
        kind (str): machine-readable kind, e.g. ``blob_mismatch``, ``link_broken``, ``ref_malformed``,
            ``file_missing``, ``file_unlisted``, ``incomplete``, ``no_symlinks``, ``unverified``.
        detail (str): one line for people.
        folder (str): the repo folder name.
        linked_from (tuple[str, ...]): for a blob finding, the snapshot entries that use the blob, each
            ``REPO_ID@REVISION:PATH`` (the revision is a ref pointing to the snapshot, else its commit hash).
    """

    repo_id: str
    revision: str
    path: str
    kind: str
    detail: str
    folder: str = ""
    linked_from: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.kind in ERROR_KINDS


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify_cache`.

    Attributes:
        cache_dir (str): the cache verified.
        repos (tuple[str, ...]): repo ids checked, sorted.
        blobs_hashed (int): distinct contents hashed.
        bytes_hashed (int): their total size.
        seconds (float): wall time.
        problems (tuple[Problem, ...]): every finding, errors and notes, sorted.
        blobs_skipped (int): with ``fast``: blobs not hashed because the record shows them unchanged since they last
            hashed right (0 otherwise).
    """

    cache_dir: str
    repos: tuple[str, ...]
    blobs_hashed: int
    bytes_hashed: int
    seconds: float
    problems: tuple[Problem, ...]
    blobs_skipped: int = 0

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.is_error)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


class HashProgress(Protocol):
    def start(self, total_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


@dataclass(frozen=True)
class Expected:
    """What a snapshot path should hold: ``etag`` (sha256 or git sha1 hex) and ``size`` in bytes."""

    etag: str
    size: int


def content_hash(path: str, algorithm: str, on_bytes=None) -> tuple[str, int]:
    """Hash a file without following a final symlink; return (hex digest, bytes read).

    Args:
        path: the file.
        algorithm: ``sha256`` or ``git-sha1`` (``sha1(b"blob <size>\\0" + content)``, git's object id).
        on_bytes: called with the size of every chunk read (progress).

    Raises:
        OSError: unreadable, or a symlink (``O_NOFOLLOW``): nothing outside the cache is ever read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO never blocks
    try:
        # O_NOATIME: hashing is not a use; on relatime mounts it would make every blob look just used to
        # ls/prune. Only the file's owner (or root) may ask for it.
        fd = os.open(path, flags | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        fd = os.open(path, flags)
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would never end (or never start)
            raise OSError(errno.EINVAL, "not a regular file", path)
        size = st.st_size
        h = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()  # noqa: S324 - git object id
        if algorithm != "sha256":
            h.update(b"blob %d\0" % size)
        read = 0
        while n := f.readinto(buffer):
            h.update(view[:n])
            read += n
            if on_bytes:
                on_bytes(n)
    return h.hexdigest(), read


def algorithm_of(etag: str) -> str | None:
    """``sha256`` for a 64-hex etag, ``git-sha1`` for a 40-hex one, None for any other blob name."""
    if _SHA256.fullmatch(etag):
        return "sha256"
    if _SHA1.fullmatch(etag):
        return "git-sha1"
    return None


#: A ``trees/<commit>.json`` larger than this is not read (the listing of a 100,000-file repo is ~20 MiB).
MAX_TREE_LISTING_BYTES = 64 * 1024 * 1024


def read_tree_listing(cache_dir: str, folder: str, commit: str) -> dict[str, Expected] | None:
    """Read ``trees/<commit>.json`` (huggingface_hub ``_tree_cache.py`` format 1) as path -> Expected, or None.

    Read without following a link and at most :data:`MAX_TREE_LISTING_BYTES` (None when larger)."""
    try:
        raw = safefs.read_small(cache_dir, (folder, "trees", f"{commit}.json"), MAX_TREE_LISTING_BYTES + 1)
        if len(raw) > MAX_TREE_LISTING_BYTES:
            return None
        data = json.loads(raw)
        if data.get("format_version") != 1:
            return None
        out = {}
        for path, info in data["files"].items():
            etag = info.get("lfs_sha256") or info["blob_id"]
            out[path] = Expected(etag=etag, size=int(info.get("lfs_size") or info["size"]))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError):  # not ours
        # (RecursionError: nested too deep; OverflowError: a size of 1e999, int(inf))
        return None


def _expected_of(cache_dir: str, repo: RepoInfo, commit: str, expectations) -> tuple[
        dict[str, Expected] | None, str, tuple[str, ...]]:
    """(path -> Expected, where it comes from, names marked absent) for one revision: the lock's when given, else
    what hfcache warm recorded publishing (:mod:`hfcache.cache.published`), else a ``trees/`` listing."""
    expected = expectations.get((repo.repo_type, repo.repo_id, commit))
    if expected is not None:
        return expected, "lock", ()
    record = read_record(cache_dir, repo.folder, commit)
    if record is not None:
        files = {p: Expected(digest.split(":", 1)[1], size) for p, (size, digest) in record.files.items()}
        return files, "warm record", record.absent
    return read_tree_listing(cache_dir, repo.folder, commit), "trees/ listing", ()


def _lost_markers(cache_dir: str, repo: RepoInfo, rev, absent: tuple[str, ...]) -> list[Problem]:
    """Names warm marked absent whose ``.no_exist`` marker is gone, with no file in its place: transformers then
    asks the network for them (and a tokenizer without ``config.json`` fails to load offline, DESIGN §3)."""
    present = {f.path for f in rev.files}
    found = []
    for name in absent:
        if name in present:
            continue
        marker = os.path.join(cache_dir, repo.folder, ".no_exist", rev.commit_hash, *name.split("/"))
        if not os.path.lexists(marker):
            found.append(Problem(repo.repo_id, rev.commit_hash, name, "file_missing",
                                 "neither the file nor its .no_exist marker (warm marked it absent)", repo.folder))
    return found


def _lock_expectations(lock: Lockfile | None) -> dict[tuple[str, str, str], dict[str, Expected]]:
    """(repo_type, repo_id, commit) -> path -> Expected, for both the requested and the canonical id."""
    out: dict[tuple[str, str, str], dict[str, Expected]] = {}
    for repo in lock.repos if lock else ():
        files = {f.path: Expected(f.etag, f.size) for f in repo.files}
        for repo_id in folder_ids(repo.request.repo_id, repo.canonical_id):
            out[(repo.request.repo_type, repo_id, repo.commit_hash)] = files
    return out


def _structure_problems(repo: RepoInfo) -> list[Problem]:
    """What the metadata scan already shows: refs, links, blob entries, leftovers, storage form."""
    found = []
    add = found.append
    for text in repo.unsafe:
        add(Problem(repo.repo_id, "", text.split(":", 1)[0], "unsafe_layout", text, repo.folder))
    snapshots = {r.commit_hash for r in repo.revisions}
    for name, value in sorted(repo.refs.items()):
        if not _SHA1.fullmatch(value):
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
            ``fast`` run in which they hashed right, and record this run's (:mod:`hfcache.integrity.verify_record`: what this
            cannot catch). Default False: every blob is hashed and nothing is written.

    Returns:
        VerifyReport; ``ok`` is False when any integrity error (not a note) exists.

    Raises:
        UsageError: a malformed ``REPO_ID@REVISION``.
    """
    started = time.monotonic()
    specs = parse_specs(repo_ids or ())
    wanted = set(specs) or None
    info = scan_cache(cache_dir, wanted)
    expectations = _lock_expectations(lock)
    problems: list[Problem] = []
    # Distinct contents to hash: (path to open, algorithm, expected etag) keyed by inode, with who refers to it.
    jobs: dict[tuple[int, int], tuple[str, str, str, int]] = {}
    stamps: dict[tuple[int, int], tuple[int, int, int, str]] = {}  # blobs' stat stamps (verify_record), for fast
    owners: dict[tuple[int, int], list[tuple[RepoInfo, str, str]]] = {}

    for repo in info.repos:
        if repo.unreadable:
            # Part of the repo cannot be read by this user: what it holds cannot be verified (exit 1).
            problems.extend(Problem(repo.repo_id, "", part or f"{repo.folder}/", "unreadable", detail.split(": ", 1)[1],
                                    repo.folder) for part, detail in zip(repo.unreadable, repo.problems))
            continue
        used: set[str] | None = None
        if specs.get(repo.repo_id):
            repo, missing = _only_revisions(repo, specs[repo.repo_id])
            problems.extend(missing)
            used = {f.etag for rev in repo.revisions for f in rev.files if f.etag}
        problems.extend(_structure_problems(repo))
        if repo.unsafe:
            continue  # nothing below a planted link is read
        blobs_dir = os.path.join(info.cache_dir, repo.folder, "blobs")
        for entry in _blob_entries(blobs_dir):
            if used is not None and entry.name not in used:
                continue
            algorithm = algorithm_of(entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed since the listing (a concurrent prune)
                continue
            if algorithm is None:
                problems.append(Problem(repo.repo_id, "", f"blobs/{entry.name}", "unverified",
                                        "blob name is not a sha256 or git sha1: cannot be checked", repo.folder))
                continue
            key = (st.st_dev, st.st_ino)
            jobs.setdefault(key, (entry.path, algorithm, entry.name, st.st_size))
            stamps.setdefault(key, verify_record.stamp(st, entry.name))
            owners.setdefault(key, []).append((repo, "", f"blobs/{entry.name}"))
        for rev in repo.revisions:
            expected, source, absent = _expected_of(info.cache_dir, repo, rev.commit_hash, expectations)
            problems.extend(_check_expected(repo, rev, expected, source, jobs, owners, info.cache_dir))
            if absent:
                problems.extend(_lost_markers(info.cache_dir, repo, rev, absent))

    problems.extend(_named_repos_missing(specs, info.repos))
    if lock is not None:
        problems.extend(lock_repos_missing(lock, info.cache_dir, wanted))
    recorded = verify_record.load(info.cache_dir) if fast else {}
    skipped = {key for key, st in stamps.items() if recorded.get(key) == st and key in jobs}
    # Largest first: two threads then finish together instead of one hashing the last big blob alone.
    todo = sorted((key for key in jobs if key not in skipped), key=lambda key: -jobs[key][3])
    total = sum(jobs[key][3] for key in todo)
    if progress:
        progress.start(total)
    lock_ = threading.Lock()
    failed: set[tuple[int, int]] = set()

    def run(key: tuple[int, int]) -> tuple[tuple[int, int], str | None, int]:
        path, algorithm, etag, size = jobs[key]
        try:
            digest, read = content_hash(path, algorithm, progress.advance if progress else None)
        except FileNotFoundError:
            return key, None, 0  # removed since the scan (a concurrent prune): nothing left to be wrong
        except OSError as exc:
            return key, f"cannot be read: {exc.strerror}", 0
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
            path, algorithm, etag, size = jobs[key]
            for repo, revision, where in owners[key]:
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
    if fast:
        _record(info.cache_dir, recorded, stamps, failed, everything=not specs)
    problems.sort()
    return VerifyReport(
        cache_dir=info.cache_dir,
        repos=tuple(sorted(r.repo_id for r in info.repos)),
        blobs_hashed=len(todo),
        bytes_hashed=hashed_bytes,
        seconds=time.monotonic() - started,
        problems=tuple(problems),
        blobs_skipped=len(skipped),
    )


def _batches(todo: list[tuple[int, int]], jobs: dict[tuple[int, int], tuple[str, str, str, int]],
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
                    and stat.S_ISREG(e.stat(follow_symlinks=False).st_mode)]
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # the scan reports an unreadable blobs/
        return []


def _check_expected(repo: RepoInfo, rev, expected: dict[str, Expected] | None, source: str, jobs, owners,
                    cache_dir: str) -> list[Problem]:
    """Compare a snapshot with its expected listing (lock or trees/); queue real files for hashing."""
    found = []
    present = {f.path: f for f in rev.files}
    for f in rev.files:
        want = expected.get(f.path) if expected else None
        if f.form == "link" and want is not None and (f.etag != want.etag or f.size != want.size):
            found.append(Problem(repo.repo_id, rev.commit_hash, f.path, "file_mismatch",
                                 f"links to blob {f.etag[:16]}… ({f.size} bytes), the {source} expects "
                                 f"{want.etag[:16]}… ({want.size} bytes)", repo.folder))
        elif f.form == "file":
            if want is None and f.inode in jobs:
                continue  # a hardlink of a blob (hfcache's form without symlinks): verified by the blob's name
            if want is None:
                found.append(Problem(repo.repo_id, rev.commit_hash, f.path, "unverified",
                                     "real file with no expected hash (no lock or trees/ listing names it)",
                                     repo.folder))
                continue
            path = os.path.join(cache_dir, repo.folder, "snapshots", rev.commit_hash, *f.path.split("/"))
            if f.size != want.size:
                found.append(Problem(repo.repo_id, rev.commit_hash, f.path, "file_mismatch",
                                     f"{f.size} bytes, the {source} expects {want.size}", repo.folder))
                continue
            algorithm = algorithm_of(want.etag)
            if algorithm and f.inode is not None:
                jobs.setdefault(f.inode, (path, algorithm, want.etag, f.size))
                owners.setdefault(f.inode, []).append((repo, rev.commit_hash, f.path))
    for path in sorted(set(expected or ()) - set(present)):
        if source in ("lock", "warm record"):
            found.append(Problem(repo.repo_id, rev.commit_hash, path, "file_missing",
                                 f"listed in the {source} but not in the snapshot", repo.folder))
    if expected is not None and source == "lock":
        for path in sorted(set(present) - set(expected)):
            found.append(Problem(repo.repo_id, rev.commit_hash, path, "file_unlisted",
                                 "present but not listed in the lock", repo.folder))
    return found


def lock_repos_missing(lock: Lockfile, cache_dir: str | os.PathLike[str], wanted: set[str] | None) -> list[Problem]:
    """Locked repos whose snapshot is entirely absent from the cache (verify reports them as missing files)."""
    found = []
    for repo in lock.repos:
        for repo_id in sorted(folder_ids(repo.request.repo_id, repo.canonical_id)):
            if wanted is not None and repo_id not in wanted:
                continue
            folder = Path(cache_dir) / repo_folder_name(repo_id, repo.request.repo_type)
            if not os.path.isdir(folder / "snapshots" / repo.commit_hash):  # no PermissionError (Path.is_dir has)
                for f in repo.files:
                    found.append(Problem(repo_id, repo.commit_hash, f.path, "file_missing",
                                         "listed in the lock but its snapshot is not in the cache", folder.name))
    return found
