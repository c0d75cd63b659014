"""signed_snapshot: the ``{path: sha256}`` of one cached snapshot, what a model-signing bundle signs and is checked
against (:mod:`.signatures`), and the rule every signer and checker of a bundle applies first: a file is signed or
checked only when the cache proves it is what was fetched (:func:`judge`).

What a snapshot file should hold is :class:`.expectations.RevisionExpectation`'s, as for ``verify``: a lock's pins
(with ``--lock``: nothing else counts), else warm's record, else the ``trees/`` listing, else a link's blob name. An
LFS file's blob name is its sha256, used unread unless ``rehash``; any other file is hashed, its bytes checked against
what it should hold in the same read.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..cache import safefs
from ..cache.content import SHA256, algorithm_of, hash_fd
from ..cache.scan import SPECIAL_FILE, TOO_DEEP, RepoInfo, RevisionInfo, SnapshotFile, scan_cache
from ..errors import CacheError, CheckFailed
from ..names import is_sha256, parse_folder_name
from ..records import WarmRequest
from ..warming.lockfile import Lockfile
from .expectations import Expected, RevisionExpectation, blob_inodes, expected_of, lock_expectations

#: Why a real file nothing names is refused.
UNPROVEN = ("a real file no lock, warm record or trees/ listing names: nothing proves it is what was fetched")


class NameMismatch(CacheError):
    """A cached file that is not what the cache says was fetched (:func:`judge`, :func:`complete`, or its bytes do not
    hash to the ``name`` it is stored under), never signed. Exit 5, as ``export`` and ``push`` refuse a corrupt
    source; ``snapshot``: ``REPO_ID@COMMIT``; ``path``: the file; ``detail``: what is wrong with it."""

    def __init__(self, message: str, *, snapshot: str, path: str, name: str, detail: str = "",
                 missing: bool = False) -> None:
        super().__init__(message, hint="`hfcache verify` (with the lock: `--lock`) names the damaged files; `hfcache "
                                       "verify --repair` restores them from the endpoint")
        self.snapshot, self.path, self.name, self.missing = snapshot, path, name, missing
        self.detail = detail or f"no longer matches its blob name {name} (changed on disk)"


class Held(NamedTuple):
    """A snapshot file as a signer read it (:func:`prove_held`): ``blob``, a link's blob name (None: a real file),
    its ``size`` and the ``digests`` of its bytes known (algorithm -> hex)."""

    blob: str | None
    size: int
    digests: Mapping[str, str]


@dataclass(frozen=True)
class SnapshotDigests:
    """One snapshot's ``files`` (``/``-separated path -> sha256 hex) as a model-signing manifest sees them, with
    the repo, its commit and folder, the files ``hashed``, the ``snapshot`` folder ``model_signing`` reads, and
    (``proven=False``) the first file the cache does not prove is what was fetched (``unproven``)."""

    repo_id: str
    commit: str
    folder: str
    files: dict[str, str]
    hashed: int
    snapshot: Path
    unproven: NameMismatch | None = None


def resolve_snapshot(cache_dir: Path, spec: str, repo_type: str = "model") -> tuple[RepoInfo, RevisionInfo]:
    """The repo and snapshot ``REPO_ID[@REVISION]`` (a ref or a commit; default ``main``) names in the cache. Raises
    UsageError: a malformed spec; CheckFailed (exit 1): not in the cache; CacheError: a planted link (left alone)."""
    request = WarmRequest.parse(spec, repo_type=repo_type)
    info = scan_cache(cache_dir, {request.repo_id})
    repo = next((r for r in info.repos if r.repo_id == request.repo_id and r.repo_type == request.repo_type), None)
    if repo is None:
        raise CheckFailed(f"{request.repo_id} is not in the cache {cache_dir}", hint="warm it first")
    if repo.unsafe:
        raise CacheError(f"{cache_dir}/{repo.folder}: {', '.join(repo.unsafe)} is a link or not a folder: left alone",
                         hint="remove it, then rerun")
    commit = repo.refs.get(request.revision, request.revision).strip()
    for revision in repo.revisions:
        if revision.commit_hash == commit:
            return repo, revision
    raise CheckFailed(f"{request.repo_id}@{request.revision} is not in the cache {cache_dir}"
                      + ("" if request.revision in repo.refs or len(commit) == 40 else " (no such ref)"),
                      hint="warm it first")


def snapshot_digests(cache_dir: Path, spec: str, *, rehash: bool = False, on_bytes=None,
                     repo_type: str = "model", lock: Lockfile | None = None, proven: bool = False) -> SnapshotDigests:
    """The sha256 of every file of the snapshot ``spec`` (``REPO_ID[@REVISION]``) names, each judged first
    (:func:`judge`); a broken link nothing lists is left out (a bundle then names it missing).

    Args:
        rehash: hash every file's bytes (default: an LFS blob's sha256 name is its digest).
        on_bytes: called with the size of every chunk hashed. repo_type: as :func:`resolve_snapshot`.
        lock: what the snapshot must hold when the lock pins its commit (path, size, hash; nothing else).
        proven: raise the first judgment's NameMismatch at once (a signer); default: keep it in ``unproven`` and
            hash the file as it is named (a caller that signs or checks must raise it).

    Raises:
        UsageError, CheckFailed: as :func:`resolve_snapshot`. NameMismatch (exit 5).
        CacheError (exit 5): an entry links outside its repo folder, is a FIFO/device/folder where a file belongs, a
            folder chain is deeper than 64 levels, warm's record is past its bounds, or an entry cannot be read.
    """
    repo, revision = resolve_snapshot(cache_dir, spec, repo_type)
    commit = revision.commit_hash
    hazards = [text for text in revision.problems if text.endswith((SPECIAL_FILE, TOO_DEEP))]
    if hazards:  # what the scan did not list: a signature over the rest would not be the snapshot's
        raise CacheError(f"{cache_dir}/{repo.folder}/snapshots/{commit}: {hazards[0]}: left alone",
                         hint="remove it, then rerun")
    expected = expected_of(str(cache_dir), repo, commit, lock_expectations(lock))
    inodes = blob_inodes(str(cache_dir), repo.folder) if any(e.form == "file" for e in revision.files) else {}
    files: dict[str, str] = {}
    hashed, unproven = 0, []
    try:
        for entry in revision.files:
            name = _judged(cache_dir, repo.folder, entry, expected, inodes, None if proven else unproven)
            if entry.form == "broken":
                continue
            if not rehash and entry.form == "link" and is_sha256(entry.etag):
                files[entry.path] = entry.etag
                continue
            files[entry.path] = _hash_entry(cache_dir, repo.folder, commit, entry.path, name, on_bytes)
            hashed += 1
        _judged_all(_shown(cache_dir, repo.folder, commit, ""), expected,
                    {e.path for e in revision.files if e.form in ("link", "file")}, None if proven else unproven)
    except NameMismatch as exc:
        exc.snapshot = f"{repo.repo_id}@{commit}"
        raise
    for exc in unproven:
        exc.snapshot = f"{repo.repo_id}@{commit}"
    return SnapshotDigests(repo_id=repo.repo_id, commit=commit, folder=repo.folder, files=files, hashed=hashed,
                           snapshot=Path(cache_dir) / repo.folder / "snapshots" / commit,
                           unproven=unproven[0] if unproven else None)


def _judged(cache_dir: Path, folder: str, entry: SnapshotFile, expected: RevisionExpectation, inodes: dict,
            kept: list[NameMismatch] | None) -> str | None:
    """The name ``entry``'s bytes are checked against: what :func:`_judge_entry` says it must hold, or when that
    fails and ``kept`` is a list (the failure appended there), its blob name (None for a real file)."""
    try:
        want = _judge_entry(cache_dir, folder, entry, expected, inodes)
    except NameMismatch as exc:
        if kept is None:
            raise
        kept.append(exc)
        return entry.etag if entry.form == "link" else None
    return want.etag if want is not None else None


def _judged_all(shown: str, expected: RevisionExpectation, present: set[str], kept: list[NameMismatch] | None) -> None:
    """:func:`complete`, its NameMismatch appended to ``kept`` when it is a list."""
    try:
        complete(shown, expected, present)
    except NameMismatch as exc:
        if kept is None:
            raise
        kept.append(exc)


def _shown(cache_dir, folder: str, commit: str, path: str) -> str:
    return f"{cache_dir}/{folder}/snapshots/{commit}/{path}"


def _refusal(shown: str, path: str, detail: str, name: str = "", missing: bool = False) -> NameMismatch:
    return NameMismatch(f"{shown}: {detail}", snapshot="", path=path, name=name, detail=detail, missing=missing)


def judge(expected: RevisionExpectation, shown: str, path: str, blob: str | None, size: int,
          link: bool) -> Expected:
    """What the snapshot file ``path`` (a ``link`` to the blob ``blob``, else a real file: ``blob`` the blob it is
    a hardlink of, or None; ``size`` bytes; ``shown`` in messages) must hold, checked against what the link and size
    show. NameMismatch: nothing proves it (an unpinned file under a lock, a real file nothing names), or the link or
    size contradicts it."""
    want, source = expected.of(path, blob, size)
    if want is None:
        raise _refusal(shown, path, "present but not pinned by the lock" if source == "lock" else UNPROVEN)
    if link and blob == want.etag and size != want.size:  # the blob edited in place (an LFS one is not read)
        raise NameMismatch(f"{shown}: its content does not match its blob name {blob} ({size} bytes, the {source} "
                           f"expects {want.size}; changed on disk)", snapshot="", path=path, name=blob)
    if link and blob != want.etag or size != want.size:
        raise _refusal(shown, path, (f"links to blob {blob} ({size} bytes)" if link else f"{size} bytes")
                       + f", the {source} expects {want.etag} ({want.size} bytes)", want.etag)
    return want


def complete(shown: str, expected: RevisionExpectation, present: set[str]) -> None:
    """NameMismatch (``missing``) for the first file the lock or warm's record lists that ``present`` lacks
    (``shown``: the snapshot folder, ending with ``/``)."""
    for path in expected.missing(present):
        raise _refusal(shown + path, path, f"listed in the {expected.source} but not in the snapshot", missing=True)


def _judge_entry(cache_dir: Path, folder: str, entry: SnapshotFile, expected: RevisionExpectation,
                 inodes: dict) -> Expected | None:
    """:func:`judge` of one scanned entry (None: a broken link, left to :func:`complete`). CacheError: a link out
    of the repo's ``blobs/`` (``verify``'s ``link_absolute``/``link_outside``), left alone unread."""
    shown = _shown(cache_dir, folder, expected.commit, entry.path)
    if entry.form == "broken":
        return None
    if entry.form not in ("link", "file"):
        raise CacheError(f"{shown}: a snapshot link out of its repo's blobs/: left alone", hint="remove it, then rerun")
    link = entry.form == "link"
    return judge(expected, shown, entry.path, entry.etag if link else inodes.get(entry.inode), entry.size, link)


def prove_held(cache_dir: Path, folder: str, commit: str, held: Mapping[str, Held], lock: Lockfile | None) -> None:
    """The check :func:`snapshot_digests` makes, on the files a signer read another way (``push --sign-key``:
    path -> :class:`Held`): each :func:`judge`-d, a real file's digests compared with what it should hold, and none
    the lock or record lists missing. NameMismatch: the first that fails (exit 5)."""
    repo_id, repo_type = parse_folder_name(folder) or (folder, "model")
    expected = expected_of(str(cache_dir), RepoInfo(repo_id, repo_type, folder), commit, lock_expectations(lock))
    try:
        for path, file in sorted(held.items()):
            shown = _shown(cache_dir, folder, commit, path)
            want = judge(expected, shown, path, file.blob, file.size, file.blob is not None)
            if file.blob is None and file.digests.get(algorithm_of(want.etag) or "") != want.etag:
                raise _refusal(shown, path, f"its content does not match the {want.etag} it should hold (changed "
                                            "on disk)", want.etag)
        complete(_shown(cache_dir, folder, commit, ""), expected, set(held))
    except NameMismatch as exc:
        exc.snapshot = f"{repo_id}@{commit}"
        raise


def _hash_entry(cache_dir: Path, folder: str, commit: str, path: str, name: str | None, on_bytes) -> str:
    """The sha256 of one snapshot file, its bytes checked against ``name`` (what it should hold) in the same read:
    NameMismatch when they miss it; CacheError: unreadable, gone, not a regular file."""
    shown = _shown(cache_dir, folder, commit, path)
    algorithm = algorithm_of(name)
    try:
        fd = safefs.open_repo_file(cache_dir, folder, (commit, *path.split("/")))
    except FileNotFoundError:
        raise CacheError(f"{shown}: gone while it was read", hint="rerun") from None
    except OSError as exc:
        raise CacheError(f"cannot read {shown}: {exc.strerror or exc}") from None
    try:
        digests, _ = hash_fd(fd, tuple(dict.fromkeys((SHA256, algorithm or SHA256))), on_bytes=on_bytes, shown=shown)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise CacheError(f"{shown} is not a regular file (a FIFO, device or folder): left alone",
                             hint="remove it, then rerun") from None
        raise CacheError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if algorithm is not None and digests[algorithm] != name:
        raise NameMismatch(f"{shown}: its content does not match its blob name {name} (changed on disk)",
                           snapshot="", path=path, name=str(name))
    return digests[SHA256]
