"""import: merge an exported cache (a directory, a tar, or a tar on stdin) into a cache, verified first.

Every entry is checked before anything becomes visible: names must stay inside the HF cache layout (no absolute
paths, no ``..``, no devices or fifos), snapshot links must point into the same repo's ``blobs/``, every blob must
hash to its name, every real snapshot file must match a blob or the ``trees/`` listing of its commit, refs must be
commits and markers empty. Content is staged under ``<cache>/.locks/`` (a folder huggingface_hub's scanner ignores,
on the cache's filesystem so publishing is a rename); when anything is refused the staging is removed and the
target cache is left exactly as it was. Publishing follows warm's order per repo, under warm's repo lock: blobs,
links, markers and listings, refs last. What the target already has is never overwritten: an entry it holds with
other content, a ref it has at another commit (unless ``move_refs``), a file where the source has a folder refuse the
whole import before anything is written (:mod:`hfcache.move.import_conflicts`). Bounded: content is hashed while it
streams and never staged past its declared size, sparse members are refused, free space is checked before each entry
is written, and refs, markers, ``trees/`` listings, tar headers and the entry count have caps (``MAX_*``).

Library gap: huggingface_hub has no import; extracting a tar into a cache by hand trusts every byte and path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import stat
import sys
import tarfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..cache.layout import RepoFolder, atomic_output, cache_error, ensure_cache_root, symlinks_supported
from ..errors import CacheError, CheckFailed, IntegrityError, UsageError
from ..cache import safefs
from .import_conflicts import check_target
from ..cache.locking import DEFAULT_LOCK_TIMEOUT, LockWait, via_dir_fd
from ..records import valid_repo_id
from ..cache.sharing import cache_policy, make_dirs, share_file
from ..cache.scan import parse_folder_name
from ..integrity.verify import algorithm_of

_SECTIONS = {"blobs", "snapshots", "refs", ".no_exist", "trees"}
_CHUNK = 1024 * 1024

#: Bounds on what import reads (README, "Moving caches"). A ref holds a 40-hex commit; a ``.no_exist`` marker is
#: empty; the ``trees/`` listing of a repo with 100,000 files is about 15 MiB.
MAX_REF_BYTES = 1024
MAX_TREE_BYTES = 32 * 1024 * 1024
#: One PAX extended header or GNU long name (tarfile reads it whole into memory).
MAX_HEADER_BYTES = 1024 * 1024
#: Names a filesystem can hold (Linux NAME_MAX and PATH_MAX), checked before anything is published: a name
#: component, a ref's name (written through ``.<name>.<8 hex>.tmp``), the absolute path of an entry in the target,
#: and the folder depth (a snapshot link climbs one ``../`` per level, and a link target is bounded too).
MAX_NAME_BYTES = 255
MAX_REF_NAME_BYTES = MAX_NAME_BYTES - 15
MAX_PATH_BYTES = 4095
MAX_DEPTH = 256
#: Entries in one import (tarfile keeps every member's header in memory while it streams).
MAX_ENTRIES = 1_000_000
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)


@dataclass(frozen=True)
class ImportReport:
    """The outcome of :func:`import_cache`.

    Attributes:
        cache_dir (str): the target cache.
        repos (tuple[str, ...]): repo folders merged.
        files (int): snapshot entries merged (entries the target already had with the same content included).
        blobs_new (int): blob entries added; blobs_existing (int): blob entries the target already had (left
            untouched). An entry is a file in one repo's ``blobs/``: the same content in two repos is two entries
            (hardlinked), so their sum can exceed ``blob_contents``.
        blob_contents (int): distinct contents among those entries (what ``verify`` counts as distinct blobs when
            they are hardlinked).
        bytes_new (int): bytes added.
        moved (tuple[str, ...]): refs the target had at another commit and that now point where the source's do
            (only with ``move_refs``; without it such a ref refuses the import).
    """

    cache_dir: str
    repos: tuple[str, ...]
    files: int
    blobs_new: int
    blobs_existing: int
    blob_contents: int
    bytes_new: int
    moved: tuple[str, ...]


@dataclass
class Member:
    name: str
    kind: str  # file | dir | symlink | hardlink | special | sparse
    size: int = 0
    linkname: str = ""


class BoundedTarInfo(tarfile.TarInfo):
    """Library gap: tarfile reads a PAX extended header or a GNU long name whole into memory, whatever size it
    declares (``TarInfo._proc_pax``/``_proc_gnulong``, Python 3.8-3.13), so a small compressed tar could make it
    allocate gigabytes. Such a header is refused before it is read."""

    def _proc_member(self, tar):
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise UsageError(f"refused a tar header of {self.size} bytes (more than {MAX_HEADER_BYTES})")
        return super()._proc_member(tar)

    # Library gap: a PAX header with GNU.sparse.* keys makes tarfile parse a sparse map inside ``_proc_pax``, before
    # the member is returned (so before ``issparse()`` can refuse it): format 1.0 (``_proc_gnusparse_10``) reads its
    # map from the member's data, line by line and whole, whatever its length (a 12 MB map: 72 s and 348 MB), and
    # malformed maps raise ValueError. A cache has no sparse file: each format is refused before its map is parsed.
    # The three hooks keep their names in Python 3.8-3.13; their other arguments changed (3.12: raw headers), so
    # they are taken as they come.
    def _refuse_sparse(self, next, args: tuple) -> None:
        headers = args[0] if args and isinstance(args[0], dict) else {}
        name = headers.get("GNU.sparse.name") or headers.get("path") or next.name
        raise UsageError(f"refused entry {_shown(str(name))!r}: a sparse file (a cache has none)")

    def _proc_gnusparse_00(self, next, *args):
        self._refuse_sparse(next, args)

    def _proc_gnusparse_01(self, next, *args):
        self._refuse_sparse(next, args)

    def _proc_gnusparse_10(self, next, *args):
        self._refuse_sparse(next, args)


def _next(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
    """``tar.next()``, with tarfile's ValueError/OverflowError on malformed numbers (a sparse map, a base-256 field)
    turned into the ReadError that callers already answer as "not a readable tar" (library gap: tarfile lets them
    escape as they are)."""
    try:
        return tar.next()
    except (ValueError, OverflowError) as exc:
        raise tarfile.ReadError(f"malformed header: {exc}") from None


def tar_members(stream: BinaryIO, mode: str = "r|*") -> Iterator[tuple[Member, BinaryIO | None]]:
    """The entries of a tar read as a stream (``mode`` ``r|*``: compressed or not; ``r|``: plain), with the file
    content as a stream of the tar (valid until the next entry).

    Raises:
        tarfile.TarError: not a tar, truncated, or a malformed header (ValueError/OverflowError included).
        UsageError: a header past :data:`MAX_HEADER_BYTES`, or a sparse member (refused before its map is read).
    """
    try:  # opening reads the first header
        tar = tarfile.open(fileobj=stream, mode=mode, tarinfo=BoundedTarInfo)
    except (ValueError, OverflowError) as exc:
        raise tarfile.ReadError(f"malformed header: {exc}") from None
    with tar:
        while (info := _next(tar)) is not None:
            if info.isdir():
                yield Member(info.name, "dir"), None
            elif info.issym():
                yield Member(info.name, "symlink", linkname=info.linkname), None
            elif info.islnk():
                yield Member(info.name, "hardlink", linkname=info.linkname), None
            elif info.issparse():  # its declared size is mostly holes: 10 KiB of tar can expand to any size
                yield Member(info.name, "sparse", size=info.size), None
            elif info.isfile():
                yield Member(info.name, "file", size=info.size), tar.extractfile(info)
            else:
                yield Member(info.name, "special"), None


def _members_of_dir(root: Path) -> Iterator[tuple[Member, BinaryIO | None]]:
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                yield Member(rel, "dir"), None
            elif stat.S_ISLNK(st.st_mode):
                yield Member(rel, "symlink", linkname=os.readlink(path)), None
            elif stat.S_ISREG(st.st_mode):
                # O_NOFOLLOW: a file swapped for a symlink (to /dev/zero, to a secret) after the lstat is not read;
                # O_NONBLOCK: nor does one swapped for a fifo block the open
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise UsageError(f"refused entry {rel!r}: changed while it was read")
                with os.fdopen(fd, "rb") as f:
                    yield Member(rel, "file", size=os.fstat(fd).st_size), f
            else:
                yield Member(rel, "special"), None


def _shown(name: str) -> str:
    """A name shortened for a one-line message."""
    return name if len(name) <= 100 else f"{name[:60]}...{name[-30:]}"


def _clean_name(name: str) -> list[str]:
    """Split a member name into parts, refusing absolute paths, ``..`` and other escapes."""
    if name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if (not name or name.startswith("/") or "\\" in name or "\0" in name
            or any(p in ("", ".", "..") for p in name.split("/"))):
        raise UsageError(f"refused entry {name!r}: absolute or escaping path")
    parts = name.split("/")
    if len(parts) > MAX_DEPTH or any(len(os.fsencode(p)) > MAX_NAME_BYTES for p in parts):
        raise UsageError(f"refused entry {_shown(name)!r}: more than {MAX_DEPTH} levels or a name longer than "
                         f"{MAX_NAME_BYTES} bytes (no filesystem holds it); nothing was imported")
    return parts


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem (``statvfs``: ``f_bavail * f_frsize``)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class _Staging:
    """Content read from the source, hashed and parked under ``<cache>/.locks/`` until publishing."""

    def __init__(self, cache_dir: Path) -> None:
        locks = cache_dir / ".locks"
        if os.path.islink(locks) or (os.path.lexists(locks) and not locks.is_dir()):
            raise CacheError(f"{locks} is a symlink or not a folder; nothing is staged through it",
                             hint="remove it (huggingface_hub recreates .locks)")
        self.cache_dir = cache_dir
        self.name = f"hfcache-import-{uuid.uuid4().hex[:12]}"
        make_dirs(locks, cache_dir, cache_policy(cache_dir))  # .locks/ is shared in a group-shared cache
        safefs.check_existing(cache_dir, (".locks",))
        with safefs.dir_fd(cache_dir, (".locks",)) as locks_fd:
            os.mkdir(self.name, 0o700, dir_fd=locks_fd)  # relative to the checked .locks: no link followed
        self._fd = safefs.open_dir(cache_dir, (".locks", self.name))
        # Every staged file is written and renamed through the descriptor of the staging folder (see
        # hfcache.cache.locking.via_dir_fd): a .locks swapped for a link while the source streams is not followed.
        self.dir = via_dir_fd(locks / self.name / "x", self._fd).parent
        self.files: dict[str, tuple[Path, int, str, str]] = {}  # member -> (staged, size, sha256, git-sha1)

    def add(self, name: str, stream: BinaryIO, size: int) -> tuple[Path, int, str, str]:
        """Stage ``size`` bytes of ``stream``, hashing them on the way; never more than ``size``.

        Raises:
            CacheError: ``size`` bytes do not fit on the cache's filesystem (checked before writing).
            UsageError: the stream holds more or fewer bytes than ``size`` (a file that changed while read).
        """
        free = free_bytes(self.dir)
        if size > free:
            raise CacheError(f"refused entry {name!r}: its {size} bytes do not fit in the {free} bytes free on the "
                             "cache's filesystem (nothing was imported)", hint="free disk space or import elsewhere")
        path = self.dir / uuid.uuid4().hex
        sha256, sha1 = hashlib.sha256(), hashlib.sha1()  # noqa: S324 - git object id
        sha1.update(b"blob %d\0" % size)
        left = size
        with open(path, "wb") as out:
            while left and (chunk := stream.read(min(_CHUNK, left))):
                sha256.update(chunk)
                sha1.update(chunk)
                out.write(chunk)
                left -= len(chunk)
            if left or stream.read(1):
                raise UsageError(f"refused entry {name!r}: its content is not the {size} bytes it declares")
        record = (path, size, sha256.hexdigest(), sha1.hexdigest())
        self.files[name] = record
        return record

    def remove(self) -> None:
        """Remove the staging folder, walking from the cache root without following links."""
        with contextlib.suppress(OSError, CacheError):
            safefs.rmtree(self.cache_dir, (".locks", self.name))
        with contextlib.suppress(OSError):
            os.close(self._fd)


def import_cache(src: str, cache_dir: Path, move_refs: bool = False, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 on_lock_wait: Callable[[LockWait], None] | None = None) -> ImportReport:
    """Merge the cache at ``src`` (a directory, a tar file, or ``-`` for a tar on stdin) into ``cache_dir``.

    Args:
        src: the source (str path or ``-``).
        cache_dir: the target cache.
        move_refs: a ref the target has at another commit moves to the source's commit (reported); without it that
            refuses the import.
        lock_timeout: seconds to wait at most for each repo's lock (another warm, prune or import of that repo).
        on_lock_wait: told which lock it waits for, and who holds it, when a wait lasts a few seconds.

    Raises:
        LockTimeout: a repo's lock stayed held for ``lock_timeout`` seconds (exit 5); nothing is written then.
        UsageError: ``src`` does not exist, holds an entry that is refused (the message names it), or goes past a
            bound (``MAX_*``); nothing is written then.
        IntegrityError: a blob or file does not match its hash; nothing is written then.
        CheckFailed: the target already holds an entry with other content, a path that is a file on one side and a
            folder on the other, or a ref elsewhere; a ref names a commit neither side has. Nothing is written then.
        CacheError: the target cannot be written, or the content does not fit on its filesystem.
    """
    if src != "-" and not os.path.isdir(src) and not os.path.isfile(src):
        raise UsageError(f"{src}: no such directory or tar file", hint="give an exported directory, a tar or -")

    def members() -> Iterator[tuple[Member, BinaryIO | None]]:
        if src == "-":
            return tar_members(sys.stdin.buffer)
        if os.path.isdir(src):
            return _members_of_dir(Path(src))
        return tar_members(open(src, "rb"))  # noqa: SIM115 - closed by tarfile at the end of the stream

    try:
        return import_members(members, cache_dir, move_refs=move_refs, lock_timeout=lock_timeout,
                              on_lock_wait=on_lock_wait)
    except tarfile.TarError as exc:
        raise UsageError(f"{src}: not a readable tar ({exc})") from None


def import_members(members: Callable[[], Iterable[tuple[Member, BinaryIO | None]]], cache_dir: Path,
                   move_refs: bool = False, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                   on_lock_wait: Callable[[LockWait], None] | None = None) -> ImportReport:
    """Merge the entries ``members()`` yields (each a :class:`Member` and, for a file, a stream of its bytes) into
    ``cache_dir``: read and stage all of them, check, then publish. ``hfcache pull`` gives the entries of its
    layers as they stream; an exception the iterator raises (a digest that does not match) refuses the import.

    Args:
        members: called once, after the staging folder exists; its iterator is consumed to the end before anything
            is checked against or published into the target.
        cache_dir: the target cache; created if missing, and removed again (with the parents this call created) if
            the import fails before anything was published.
        move_refs, lock_timeout, on_lock_wait: as for :func:`import_cache`.

    Returns:
        ImportReport.

    Raises:
        as :func:`import_cache`, plus whatever ``members`` raises (tarfile errors pass through unchanged).
    """
    created = _missing_ancestors(cache_dir)
    staging = None
    published = False
    try:
        ensure_cache_root(cache_dir)
        staging = _Staging(cache_dir)
        plan = _Reader(staging).read(members())
        _check(plan, staging, cache_dir)
        for repo in plan.values():
            _resolve_files(repo, staging)
        _check_shape(plan)
        with contextlib.ExitStack() as locks:
            folders = {name: RepoFolder(cache_dir, *parse_folder_name(name), lock_timeout=lock_timeout,
                                        on_lock_wait=on_lock_wait) for name in sorted(plan)}
            for folder in folders.values():
                locks.enter_context(folder.repo_lock())
            checked = _check_target(plan, folders, move_refs)
            published = True
            return _publish(plan, staging, cache_dir, folders, checked)
    except (UsageError, IntegrityError) as exc:
        if exc.hint is None:  # every refusal of an entry says what happened to the target, and what to do
            exc.hint = "nothing was imported; the source is corrupt or was crafted, check where it came from"
        raise
    except OSError as exc:
        raise cache_error(exc, f"import into {cache_dir}") from exc
    finally:
        if staging is not None:
            staging.remove()
        locks_dir = cache_dir / ".locks"
        with contextlib.suppress(OSError):
            if locks_dir.is_dir() and not locks_dir.is_symlink() and not any(locks_dir.iterdir()):
                locks_dir.rmdir()
        if not published:
            _remove_created(cache_dir, created)


def _missing_ancestors(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first (what creating ``path`` would add)."""
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    return missing


def _remove_lock_files(locks: Path) -> None:
    """Remove the empty ``*.lock`` files and then empty folders under ``locks`` (the repo locks taken by an import
    into a cache root it created); anything else (another import's staging) stays, and so does its folder."""
    if os.path.islink(locks) or not locks.is_dir():
        return
    for dirpath, _dirs, names in os.walk(locks, topdown=False):
        for name in names:
            path = os.path.join(dirpath, name)
            if name.endswith(".lock") and os.lstat(path).st_size == 0:
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def _remove_created(cache_dir: Path, created: list[Path]) -> None:
    """Undo the creation of a cache root that received nothing: its ``CACHEDIR.TAG``, then the empty folders.

    Only folders this import created, and only when empty (a concurrent writer's content is never removed).
    """
    if not created:
        return
    with contextlib.suppress(OSError):
        if {entry.name for entry in os.scandir(cache_dir)} <= {"CACHEDIR.TAG", ".locks"}:
            _remove_lock_files(cache_dir / ".locks")
            (cache_dir / "CACHEDIR.TAG").unlink(missing_ok=True)
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            return


@dataclass
class _RepoPlan:
    blobs: dict[str, str]  # etag -> member name
    links: dict[tuple[str, str], str]  # (commit, path) -> etag
    files: dict[tuple[str, str], str]  # (commit, path) -> member name (real files, or hardlinks resolved)
    refs: dict[str, str]
    markers: set[tuple[str, str]]
    trees: dict[str, tuple[Path, dict[str, tuple[str, str, int]]]]  # <commit>.json -> (staged, path -> listing)


def _parse_listing(data: bytes, name: str) -> dict[str, tuple[str, str, int]]:
    """A ``trees/<commit>.json`` (huggingface_hub ``_tree_cache.py`` format 1) as path -> (blob_id, lfs_sha256, size).

    Raises:
        UsageError: not JSON, nested too deep, or not that format.
    """
    try:
        files = json.loads(data)["files"]
        return {str(path): (str(e.get("blob_id", "")), str(e.get("lfs_sha256") or ""),
                            int(e.get("lfs_size") or e.get("size") or 0)) for path, e in files.items()}
    except RecursionError:
        raise UsageError(f"refused entry {name!r}: JSON nested too deep") from None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):  # OverflowError: a size of 1e999
        raise UsageError(f"refused entry {name!r}: not a trees/ listing (JSON with a \"files\" object)") from None


def _repo_folder_ok(name: str) -> bool:
    """Whether ``name`` is a repo folder (``models--ORG--NAME``) of a valid repo id: huggingface_hub's own rule
    (:func:`hfcache.records.valid_repo_id`: letters, digits, ``-``, ``_``, ``.``; no spaces or control characters)."""
    parsed = parse_folder_name(name)
    return parsed is not None and valid_repo_id(parsed[0])


class _Reader:
    """Reads the source's entries into one :class:`_RepoPlan` per repo folder, staging their content."""

    def __init__(self, staging: _Staging) -> None:
        self.staging = staging
        self.repos: dict[str, _RepoPlan] = defaultdict(lambda: _RepoPlan({}, {}, {}, {}, set(), {}))
        self.entries = 0

    def read(self, members) -> dict[str, _RepoPlan]:
        for member, stream in members:
            self.entries += 1
            if self.entries > MAX_ENTRIES:
                raise UsageError(f"refused the source: more than {MAX_ENTRIES} entries")
            self.entry(member, stream)
        return dict(self.repos)

    def entry(self, member: Member, stream: BinaryIO | None) -> None:
        parts = _clean_name(member.name)
        self.fits(member.name, parts)
        if member.kind in ("special", "sparse"):
            what = "a device, fifo or socket" if member.kind == "special" else "a sparse file (a cache has none)"
            raise UsageError(f"refused entry {member.name!r}: {what}")
        if parts[0] in ("CACHEDIR.TAG", ".locks") or member.kind == "dir":
            if parts[0] not in ("CACHEDIR.TAG", ".locks") and not _repo_folder_ok(parts[0]):
                raise UsageError(f"refused entry {member.name!r}: not part of a Hugging Face cache")
            return
        if not _repo_folder_ok(parts[0]) or len(parts) < 3 or parts[1] not in _SECTIONS:
            raise UsageError(f"refused entry {member.name!r}: not part of a Hugging Face cache layout")
        if member.kind == "file" and parts[-1].endswith(".incomplete"):
            return
        content = self.content(member, stream, parts)
        handler = {"blobs": self.blob, "snapshots": self.snapshot, "refs": self.ref, ".no_exist": self.marker,
                   "trees": self.tree}[parts[1]]
        handler(self.repos[parts[0]], member, parts, content)

    def fits(self, name: str, parts: list[str]) -> None:
        """Refuse a name the target's filesystem cannot take (see ``MAX_PATH_BYTES``) before anything is written."""
        if len(os.fsencode(os.path.join(self.staging.cache_dir, *parts))) > MAX_PATH_BYTES:
            raise UsageError(f"refused entry {_shown(name)!r}: its path in the target would be longer than "
                             f"{MAX_PATH_BYTES} bytes; nothing was imported")
        if len(parts) > 2 and parts[1] == "refs" and len(os.fsencode(parts[-1])) > MAX_REF_NAME_BYTES:
            raise UsageError(f"refused entry {_shown(name)!r}: a ref name longer than {MAX_REF_NAME_BYTES} bytes")

    def content(self, member: Member, stream: BinaryIO | None, parts: list[str]) -> str:
        """The staged member holding this entry's content ("" for a symlink), staged now for a file."""
        name = "/".join(parts)
        if member.kind == "hardlink":
            target = "/".join(_clean_name(member.linkname))
            if target not in self.staging.files:
                raise UsageError(f"refused entry {member.name!r}: hardlink to {member.linkname!r}, not an earlier file")
            return target
        if member.kind != "file":
            return ""
        limit = {"refs": MAX_REF_BYTES, ".no_exist": 0, "trees": MAX_TREE_BYTES}.get(parts[1])
        if limit is not None and member.size > limit:
            raise UsageError(f"refused entry {member.name!r}: {member.size} bytes, more than the {limit} a "
                             f"{parts[1]} entry may hold")
        self.staging.add(name, stream, member.size)
        return name

    def blob(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        if len(parts) != 3 or member.kind == "symlink" or algorithm_of(parts[2]) is None:
            raise UsageError(f"refused entry {member.name!r}: a blob must be a file named by its sha256 or git sha1")
        repo.blobs[parts[2]] = content

    def snapshot(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        commit, path = parts[2], "/".join(parts[3:])
        if algorithm_of(commit) != "git-sha1" or not path:
            raise UsageError(f"refused entry {member.name!r}: not snapshots/<commit>/<path>")
        if member.kind == "symlink":
            name = "/".join(parts)
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            if member.linkname.startswith("/") or posixpath.dirname(resolved) != f"{parts[0]}/blobs":
                raise UsageError(f"refused entry {member.name!r}: link {member.linkname!r} leaves the repo's blobs/")
            repo.links[(commit, path)] = posixpath.basename(resolved)
        else:
            repo.files[(commit, path)] = content

    def ref(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        record = self.staging.files.get(content)
        value = record[0].read_bytes()[:MAX_REF_BYTES].decode("utf-8", "replace").strip() if record else ""
        if member.kind == "symlink" or algorithm_of(value) != "git-sha1":
            raise UsageError(f"refused entry {member.name!r}: a ref must hold a 40-hex commit")
        repo.refs["/".join(parts[2:])] = value

    def marker(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        if member.kind != "file" or member.size != 0 or len(parts) < 4 or algorithm_of(parts[2]) != "git-sha1":
            raise UsageError(f"refused entry {member.name!r}: a .no_exist marker must be an empty file")
        repo.markers.add((parts[2], "/".join(parts[3:])))

    def tree(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        record = self.staging.files.get(content)
        if member.kind == "symlink" or len(parts) != 3 or not parts[2].endswith(".json") or record is None \
                or algorithm_of(parts[2].removesuffix(".json")) != "git-sha1" or record[1] > MAX_TREE_BYTES:
            raise UsageError(f"refused entry {member.name!r}: trees/ holds <commit>.json files of at most "
                             f"{MAX_TREE_BYTES} bytes")
        repo.trees[parts[2]] = (record[0], _parse_listing(record[0].read_bytes(), member.name))


def _check(plan: dict[str, _RepoPlan], staging: _Staging, cache_dir: Path) -> None:
    """Refuse corrupt blobs, links to blobs nobody has, and real files whose hash nothing vouches for."""
    for folder_name, repo in sorted(plan.items()):
        folder = RepoFolder(cache_dir, *parse_folder_name(folder_name))
        folder.ensure_safe()  # a target repo folder with a planted link: refused before any repo is published
        for etag, member in sorted(repo.blobs.items()):
            _, size, sha256, sha1 = staging.files[member]
            if (sha256 if algorithm_of(etag) == "sha256" else sha1) != etag:
                raise IntegrityError(f"refused {folder_name}/blobs/{etag}: content does not match the blob name",
                                     hint="the source cache is corrupt; run `hfcache verify` on it")
        for (commit, path), etag in sorted(repo.links.items()):
            if etag not in repo.blobs and not _regular_file(folder.blob_path(etag)):
                raise UsageError(f"refused {folder_name}/snapshots/{commit}/{path}: link to a blob that neither the "
                                 "source nor the target cache has")
        for (commit, path), member in sorted(repo.files.items()):
            _, size, sha256, sha1 = staging.files[member]
            if sha256 in repo.blobs or sha1 in repo.blobs:
                continue
            blob_id, lfs, _ = _listing(repo, commit).get(path) or ("", "", 0)
            if lfs == sha256 or blob_id == sha1:
                continue
            raise IntegrityError(f"refused {folder_name}/snapshots/{commit}/{path}: no blob or trees/ listing "
                                 "vouches for its hash" + (" (it does not match the listing)" if blob_id else ""))


def _regular_file(path: Path) -> bool:
    """A regular file, not a symlink to one (the target's blob a link would use must be inside the cache)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _listing(repo: _RepoPlan, commit: str) -> dict[str, tuple[str, str, int]]:
    return repo.trees.get(f"{commit}.json", (None, {}))[1]


def _resolve_files(repo: _RepoPlan, staging: _Staging) -> None:
    """Real snapshot files become blobs named by the hash that vouched for them, and links to those blobs."""
    for (commit, path), member in repo.files.items():
        _, _, sha256, sha1 = staging.files[member]
        lfs = (_listing(repo, commit).get(path) or ("", "", 0))[1]
        etag = sha256 if (sha256 in repo.blobs or lfs == sha256) else sha1
        repo.blobs.setdefault(etag, member)
        repo.links[(commit, path)] = etag
    repo.files.clear()


def _file_and_folder(names: set[str]) -> str | None:
    """A name of ``names`` that is also a folder of another (``a`` and ``a/b``), or None."""
    for name in sorted(names):
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                return "/".join(parts[:i])
    return None


def _check_shape(plan: dict[str, _RepoPlan]) -> None:
    """Refuse a source that contradicts itself: a path that is a file and a folder, a file that is also marked
    absent, a snapshot entry its own ``trees/`` listing does not list with that blob.

    Raises:
        UsageError: naming the entry.
    """
    for folder_name, repo in sorted(plan.items()):
        for section, keys in (("snapshots", set(repo.links)), (".no_exist", repo.markers)):
            for commit in sorted({c for c, _ in keys}):
                clash = _file_and_folder({p for c, p in keys if c == commit})
                if clash:
                    raise UsageError(f"refused {folder_name}/{section}/{commit}/{clash}: a file and a folder at once")
        clash = _file_and_folder(set(repo.refs))
        if clash:
            raise UsageError(f"refused {folder_name}/refs/{clash}: a file and a folder at once")
        for commit, path in sorted(set(repo.links) & repo.markers):
            raise UsageError(f"refused {folder_name}/.no_exist/{commit}/{path}: the source also has that file")
        for (commit, path), etag in sorted(repo.links.items()):
            listing = _listing(repo, commit)
            if listing and etag not in (listing.get(path) or ("", "", 0))[:2]:
                raise UsageError(f"refused {folder_name}/snapshots/{commit}/{path}: its own trees/ listing of that "
                                 "commit says otherwise")


def _check_target(plan: dict[str, _RepoPlan], folders: dict[str, RepoFolder], move_refs: bool) -> dict:
    """Compare with the target (under the repo locks); refuse the whole import on any conflict.

    Returns:
        folder name -> (present snapshot entries, refs that move).

    Raises:
        CheckFailed: naming the conflicting entries (at most five, and how many).
    """
    conflicts: list[str] = []
    checked = {}
    for name, repo in sorted(plan.items()):
        found, present, moved = check_target(folders[name], repo, move_refs)
        conflicts += found
        checked[name] = (present, moved)
    if conflicts:
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        raise CheckFailed(f"refused the import, nothing was changed: {'; '.join(conflicts[:5])}{more}",
                          hint="what the target holds is never replaced by an import")
    return checked


def _publish(plan: dict[str, _RepoPlan], staging: _Staging, cache_dir: Path, folders: dict[str, RepoFolder],
             checked: dict) -> ImportReport:
    """Publish each repo in warm's order (blobs, links, markers, listings, refs last); the repo locks are held."""
    symlinks = symlinks_supported(cache_dir)
    published: dict[str, Path] = {}  # etag -> a published blob, to hardlink instead of copying again
    counts = {"new": 0, "existing": 0, "bytes": 0}
    contents: set[str] = set()
    files = 0
    moved: list[str] = []
    for folder_name, repo in sorted(plan.items()):
        folder = folders[folder_name]
        present, moves = checked[folder_name]
        folder.make_dir(folder.root / "snapshots")
        _publish_blobs(folder, repo, staging, published, counts)
        contents.update(repo.blobs)
        for (commit, path), etag in sorted(repo.links.items()):
            if (commit, path) not in present:
                folder.link(commit, path, etag, symlinks=symlinks)
            files += 1
        for commit, path in sorted(repo.markers):
            folder.mark_absent(commit, path)
        for tree, (staged, _) in sorted(repo.trees.items()):
            target = folder.root / "trees" / tree
            if not os.path.lexists(target):
                folder.make_dir(target.parent)
                with open(staged, "rb") as src, atomic_output(target, folder.policy) as out:
                    shutil.copyfileobj(src, out, _CHUNK)
        for ref, commit in sorted(repo.refs.items()):
            folder.write_ref(ref, commit)
        moved += moves
    return ImportReport(cache_dir=str(cache_dir), repos=tuple(sorted(plan)), files=files, blobs_new=counts["new"],
                        blobs_existing=counts["existing"], blob_contents=len(contents), bytes_new=counts["bytes"],
                        moved=tuple(moved))


def _publish_blobs(folder: RepoFolder, repo: _RepoPlan, staging: _Staging, published: dict[str, Path],
                   counts: dict[str, int]) -> None:
    for etag, member in sorted(repo.blobs.items()):
        staged, size, _, _ = staging.files[member]
        if folder.blob_ok(etag, size):
            counts["existing"] += 1
            continue
        folder.make_dir(folder.blob_path(etag).parent)
        if etag in published and folder.adopt_blob(published[etag], etag):
            pass
        elif staged.exists():
            share_file(staged, folder.policy)
            os.replace(staged, folder.blob_path(etag))
            counts["bytes"] += size
        else:
            shutil.copyfile(published[etag], folder.blob_path(etag))
            share_file(folder.blob_path(etag), folder.policy)
        published[etag] = folder.blob_path(etag)
        counts["new"] += 1
