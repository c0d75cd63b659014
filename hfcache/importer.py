"""import: merge an exported cache (a directory, a tar, or a tar on stdin) into a cache, verified first.

Every entry is checked before anything becomes visible: names must stay inside the HF cache layout (no absolute
paths, no ``..``, no devices or fifos), snapshot links must point into the same repo's ``blobs/``, every blob must
hash to its name, every real snapshot file must match a blob or the ``trees/`` listing of its commit, refs must be
commits and markers empty. Content is staged under ``<cache>/.locks/`` (a folder huggingface_hub's scanner ignores,
on the cache's filesystem so publishing is a rename); when anything is refused the staging is removed and the
target cache is left exactly as it was. Publishing follows warm's order per repo, under warm's repo lock: blobs,
links, markers and listings, refs last. What the target already has is never overwritten.

Library gap: huggingface_hub has no import; extracting a tar into a cache by hand trusts every byte and path.
"""

from __future__ import annotations

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .cache import RepoFolder, atomic_write, ensure_cache_root, symlinks_supported
from .errors import CacheError, IntegrityError, UsageError
from .scan import parse_folder_name
from .verify import algorithm_of

_SECTIONS = {"blobs", "snapshots", "refs", ".no_exist", "trees"}
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ImportReport:
    """The outcome of :func:`import_cache`.

    Attributes:
        cache_dir (str): the target cache.
        repos (tuple[str, ...]): repo folders merged.
        files (int): snapshot entries merged.
        blobs_new (int): blobs added; blobs_existing (int): blobs the target already had (left untouched).
        bytes_new (int): bytes added.
        kept (tuple[str, ...]): refs the target already had with another commit (kept, not overwritten).
    """

    cache_dir: str
    repos: tuple[str, ...]
    files: int
    blobs_new: int
    blobs_existing: int
    bytes_new: int
    kept: tuple[str, ...]


@dataclass
class _Member:
    name: str
    kind: str  # file | dir | symlink | hardlink
    size: int = 0
    linkname: str = ""


def _members_of_tar(stream: BinaryIO) -> Iterator[tuple[_Member, BinaryIO | None]]:
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        for info in tar:
            if info.isdir():
                yield _Member(info.name, "dir"), None
            elif info.issym():
                yield _Member(info.name, "symlink", linkname=info.linkname), None
            elif info.islnk():
                yield _Member(info.name, "hardlink", linkname=info.linkname), None
            elif info.isfile():
                yield _Member(info.name, "file", size=info.size), tar.extractfile(info)
            else:
                yield _Member(info.name, "special"), None


def _members_of_dir(root: Path) -> Iterator[tuple[_Member, BinaryIO | None]]:
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                yield _Member(rel, "dir"), None
            elif stat.S_ISLNK(st.st_mode):
                yield _Member(rel, "symlink", linkname=os.readlink(path)), None
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    yield _Member(rel, "file", size=st.st_size), f
            else:
                yield _Member(rel, "special"), None


def _clean_name(name: str) -> list[str]:
    """Split a member name into parts, refusing absolute paths, ``..`` and other escapes."""
    if name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if (not name or name.startswith("/") or "\\" in name or "\0" in name
            or any(p in ("", ".", "..") for p in name.split("/"))):
        raise UsageError(f"refused entry {name!r}: absolute or escaping path")
    return name.split("/")


class _Staging:
    """Content read from the source, hashed and parked under ``<cache>/.locks/`` until publishing."""

    def __init__(self, cache_dir: Path) -> None:
        self.dir = cache_dir / ".locks" / f"hfcache-import-{uuid.uuid4().hex[:12]}"
        self.dir.mkdir(parents=True)
        self.files: dict[str, tuple[Path, int, str, str]] = {}  # member -> (staged, size, sha256, git-sha1)

    def add(self, name: str, stream: BinaryIO, size: int) -> tuple[Path, int, str, str]:
        path = self.dir / uuid.uuid4().hex
        sha256, sha1 = hashlib.sha256(), hashlib.sha1()  # noqa: S324 - git object id
        sha1.update(b"blob %d\0" % size)
        seen = 0
        with open(path, "wb") as out:
            while chunk := stream.read(_CHUNK):
                sha256.update(chunk)
                sha1.update(chunk)
                out.write(chunk)
                seen += len(chunk)
        record = (path, seen, sha256.hexdigest(), sha1.hexdigest())
        self.files[name] = record
        return record

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def import_cache(src: str, cache_dir: Path) -> ImportReport:
    """Merge the cache at ``src`` (a directory, a tar file, or ``-`` for a tar on stdin) into ``cache_dir``.

    Raises:
        UsageError: ``src`` does not exist, or holds an entry that is refused (the message names it); nothing
            is written then.
        IntegrityError: a blob or file does not match its hash; nothing is written then.
        CacheError: the target cannot be written.
    """
    created = not cache_dir.exists()
    ensure_cache_root(cache_dir)
    staging = _Staging(cache_dir)
    try:
        if src == "-":
            members = _members_of_tar(sys.stdin.buffer)
        elif os.path.isdir(src):
            members = _members_of_dir(Path(src))
        elif os.path.isfile(src):
            members = _members_of_tar(open(src, "rb"))  # noqa: SIM115 - closed by tarfile at the end of the stream
        else:
            raise UsageError(f"{src}: no such directory or tar file")
        plan = _read(members, staging)
        _check(plan, staging, cache_dir)
        return _publish(plan, staging, cache_dir)
    except (UsageError, IntegrityError):
        if created:
            shutil.rmtree(cache_dir, ignore_errors=True)
        raise
    except tarfile.TarError as exc:
        raise UsageError(f"{src}: not a readable tar ({exc})") from None
    except OSError as exc:
        raise CacheError(f"import into {cache_dir}: {exc.strerror or exc}") from exc
    finally:
        staging.remove()
        locks = cache_dir / ".locks"
        if locks.is_dir() and not any(locks.iterdir()):
            locks.rmdir()


@dataclass
class _RepoPlan:
    blobs: dict[str, str]  # etag -> member name
    links: dict[tuple[str, str], str]  # (commit, path) -> etag
    files: dict[tuple[str, str], str]  # (commit, path) -> member name (real files, or hardlinks resolved)
    refs: dict[str, str]
    markers: set[tuple[str, str]]
    trees: dict[str, bytes]


def _read(members, staging: _Staging) -> dict[str, _RepoPlan]:
    repos: dict[str, _RepoPlan] = defaultdict(lambda: _RepoPlan({}, {}, {}, {}, set(), {}))
    aliases: dict[str, str] = {}  # hardlink member -> the member holding the content
    for member, stream in members:
        parts = _clean_name(member.name)
        if member.kind == "special":
            raise UsageError(f"refused entry {member.name!r}: a device, fifo or socket")
        if parts[0] in ("CACHEDIR.TAG", ".locks") or member.kind == "dir":
            if parts[0] not in ("CACHEDIR.TAG", ".locks") and parse_folder_name(parts[0]) is None:
                raise UsageError(f"refused entry {member.name!r}: not part of a Hugging Face cache")
            continue
        if parse_folder_name(parts[0]) is None or len(parts) < 3 or parts[1] not in _SECTIONS:
            raise UsageError(f"refused entry {member.name!r}: not part of a Hugging Face cache layout")
        name = "/".join(parts)
        repo = repos[parts[0]]
        section, rest = parts[1], parts[2:]
        if member.kind == "hardlink":
            target = "/".join(_clean_name(member.linkname))
            if target not in staging.files:
                raise UsageError(f"refused entry {member.name!r}: hardlink to {member.linkname!r}, not an earlier file")
            aliases[name] = target
            content_member = target
        elif member.kind == "file":
            if rest[-1].endswith(".incomplete"):
                continue
            if section in ("blobs", "snapshots", "trees") or member.size <= 4096:
                staging.add(name, stream, member.size)
            content_member = name
        else:
            content_member = ""
        if section == "blobs":
            if len(rest) != 1 or member.kind == "symlink" or algorithm_of(rest[0]) is None:
                raise UsageError(f"refused entry {member.name!r}: a blob must be a file named by its sha256 or "
                                 "git sha1")
            repo.blobs[rest[0]] = content_member
        elif section == "snapshots":
            commit, path = rest[0], "/".join(rest[1:])
            if algorithm_of(commit) != "git-sha1" or not path:
                raise UsageError(f"refused entry {member.name!r}: not snapshots/<commit>/<path>")
            if member.kind == "symlink":
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
                if member.linkname.startswith("/") or posixpath.dirname(resolved) != f"{parts[0]}/blobs":
                    raise UsageError(f"refused entry {member.name!r}: link {member.linkname!r} leaves the repo's "
                                     "blobs/")
                repo.links[(commit, path)] = posixpath.basename(resolved)
            else:
                repo.files[(commit, path)] = content_member
        elif section == "refs":
            record = staging.files.get(content_member)
            value = record[0].read_bytes().decode("utf-8", "replace").strip() if record else ""
            if member.kind == "symlink" or algorithm_of(value) != "git-sha1":
                raise UsageError(f"refused entry {member.name!r}: a ref must hold a 40-hex commit")
            repo.refs["/".join(rest)] = value
        elif section == ".no_exist":
            if member.kind != "file" or member.size != 0 or len(rest) < 2 or algorithm_of(rest[0]) != "git-sha1":
                raise UsageError(f"refused entry {member.name!r}: a .no_exist marker must be an empty file")
            repo.markers.add((rest[0], "/".join(rest[1:])))
        elif section == "trees":
            record = staging.files.get(content_member)
            if member.kind == "symlink" or len(rest) != 1 or not rest[0].endswith(".json") or record is None:
                raise UsageError(f"refused entry {member.name!r}: trees/ holds <commit>.json files")
            try:
                json.loads(record[0].read_bytes())
            except ValueError:
                raise UsageError(f"refused entry {member.name!r}: not JSON") from None
            repo.trees[rest[0]] = record[0].read_bytes()
    return dict(repos)


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
            if etag not in repo.blobs and not folder.blob_path(etag).is_file():
                raise UsageError(f"refused {folder_name}/snapshots/{commit}/{path}: link to a blob that neither the "
                                 "source nor the target cache has")
        for (commit, path), member in sorted(repo.files.items()):
            _, size, sha256, sha1 = staging.files[member]
            if sha256 in repo.blobs or sha1 in repo.blobs:
                continue
            listing = json.loads(repo.trees.get(f"{commit}.json", b"{}") or b"{}").get("files", {})
            entry = listing.get(path) or {}
            if entry and (entry.get("lfs_sha256") == sha256 or entry.get("blob_id") == sha1):
                continue
            raise IntegrityError(f"refused {folder_name}/snapshots/{commit}/{path}: no blob or trees/ listing "
                                 "vouches for its hash" + (" (it does not match the listing)" if entry else ""))


def _publish(plan: dict[str, _RepoPlan], staging: _Staging, cache_dir: Path) -> ImportReport:
    symlinks = symlinks_supported(cache_dir)
    published: dict[str, Path] = {}  # etag -> a published blob, to hardlink instead of copying again
    new = existing = new_bytes = files = 0
    kept: list[str] = []
    for folder_name, repo in sorted(plan.items()):
        folder = RepoFolder(cache_dir, *parse_folder_name(folder_name))
        # Real snapshot files become blobs named by the hash that vouched for them.
        for (commit, path), member in repo.files.items():
            _, _, sha256, sha1 = staging.files[member]
            listing = json.loads(repo.trees.get(f"{commit}.json", b"{}") or b"{}").get("files", {})
            etag = sha256 if (sha256 in repo.blobs or (listing.get(path) or {}).get("lfs_sha256") == sha256) \
                else sha1
            repo.blobs.setdefault(etag, member)
            repo.links[(commit, path)] = etag
        with folder.repo_lock():
            (folder.root / "snapshots").mkdir(parents=True, exist_ok=True)
            for etag, member in sorted(repo.blobs.items()):
                staged, size, _, _ = staging.files[member]
                if folder.blob_ok(etag, size):
                    existing += 1
                    continue
                folder.blob_path(etag).parent.mkdir(parents=True, exist_ok=True)
                if etag in published and folder.adopt_blob(published[etag], etag):
                    pass
                elif staged.exists():
                    os.replace(staged, folder.blob_path(etag))
                    new_bytes += size
                else:
                    shutil.copyfile(published[etag], folder.blob_path(etag))
                published[etag] = folder.blob_path(etag)
                new += 1
            for (commit, path), etag in sorted(repo.links.items()):
                folder.link(commit, path, etag, symlinks=symlinks)
                files += 1
            for commit, path in sorted(repo.markers):
                folder.mark_absent(commit, path)
            for tree, data in sorted(repo.trees.items()):
                target = folder.root / "trees" / tree
                if not target.exists():
                    target.parent.mkdir(exist_ok=True)
                    atomic_write(target, data)
            for ref, commit in sorted(repo.refs.items()):
                current = folder.ref_path(ref)
                if current.exists() and current.read_bytes().strip() != commit.encode():
                    kept.append(f"{folder_name}/refs/{ref}")
                    continue
                folder.write_ref(ref, commit)
    return ImportReport(cache_dir=str(cache_dir), repos=tuple(sorted(plan)), files=files, blobs_new=new,
                        blobs_existing=existing, bytes_new=new_bytes, kept=tuple(kept))
