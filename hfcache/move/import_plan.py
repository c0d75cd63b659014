"""import's plan: what the source holds per repo folder (:class:`_RepoPlan`), read by :class:`_Reader`, which
refuses any entry outside the HF cache layout or past a cap (``MAX_*``) and stages every file's content.
"""

from __future__ import annotations

import os
import posixpath
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..bounds import TooDeep, loads_json
from ..cache.scan import parse_folder_name
from ..errors import UsageError
from ..names import is_commit, is_etag
from ..records import valid_repo_id
from .import_source import MAX_DEPTH, Member, shown_name
from .import_staging import _Staging

_SECTIONS = {"blobs", "snapshots", "refs", ".no_exist", "trees"}

#: Bounds on what import reads (docs/transfer.md, "Bounds"): a ref holds a commit; a ``trees/`` listing of 100,000
#: files is about 15 MiB.
MAX_REF_BYTES = 1024
MAX_TREE_BYTES = 32 * 1024 * 1024
#: Names a filesystem holds (Linux NAME_MAX, PATH_MAX): a component, a ref name (written as ``.<name>.<8 hex>.tmp``),
#: an entry's absolute path in the target, the depth (a snapshot link climbs one ``../`` per level).
MAX_NAME_BYTES = 255
MAX_REF_NAME_BYTES = MAX_NAME_BYTES - 15
MAX_PATH_BYTES = 4095
#: Entries in one import (tarfile keeps every member's header in memory while it streams).
MAX_ENTRIES = 1_000_000


def clean_name(name: str) -> list[str]:
    """Split a member name into parts, refusing absolute paths, ``..`` and other escapes."""
    name = name.removeprefix("./").rstrip("/")
    if (not name or name.startswith("/") or "\\" in name or "\0" in name
            or any(p in ("", ".", "..") for p in name.split("/"))):
        raise UsageError(f"refused entry {name!r}: absolute or escaping path")
    parts = name.split("/")
    if len(parts) > MAX_DEPTH or any(len(os.fsencode(p)) > MAX_NAME_BYTES for p in parts):
        raise UsageError(f"refused entry {shown_name(name)!r}: more than {MAX_DEPTH} levels or a name longer than "
                         f"{MAX_NAME_BYTES} bytes (no filesystem holds it); nothing was imported")
    return parts


@dataclass
class _RepoPlan:
    blobs: dict[str, str]  # etag -> member name
    links: dict[tuple[str, str], str]  # (commit, path) -> etag
    files: dict[tuple[str, str], str]  # (commit, path) -> member name (real files, or hardlinks resolved)
    refs: dict[str, str]
    markers: set[tuple[str, str]]
    trees: dict[str, tuple[Path, dict[str, tuple[str, str, int]]]]  # <commit>.json -> (staged, path -> listing)


def _parse_listing(data: bytes, name: str) -> dict[str, tuple[str, str, int]]:
    """A ``trees/<commit>.json`` (huggingface_hub ``_tree_cache.py`` format 1) as path -> (blob_id, lfs, size)."""
    try:
        files = loads_json(data, name)["files"]  # bounded nesting (bounds.MAX_JSON_DEPTH): TooDeep, never 70
        return {str(path): (str(e.get("blob_id", "")), str(e.get("lfs_sha256") or ""),
                            int(e.get("lfs_size") or e.get("size") or 0)) for path, e in files.items()}
    except (RecursionError, TooDeep):
        raise UsageError(f"refused entry {name!r}: JSON nested too deep") from None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):  # OverflowError: a size of 1e999
        raise UsageError(f"refused entry {name!r}: not a trees/ listing (JSON with a \"files\" object)") from None


def repo_folder_ok(name: str) -> bool:
    """Whether ``name`` is a repo folder (``models--ORG--NAME``) of a valid repo id (huggingface_hub's rule)."""
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
        parts = clean_name(member.name)
        self.fits(member.name, parts)
        if member.kind in ("special", "sparse"):
            what = "a device, fifo or socket" if member.kind == "special" else "a sparse file (a cache has none)"
            raise UsageError(f"refused entry {member.name!r}: {what}")
        if parts[0] in ("CACHEDIR.TAG", ".locks") or member.kind == "dir":
            if parts[0] not in ("CACHEDIR.TAG", ".locks") and not repo_folder_ok(parts[0]):
                raise UsageError(f"refused entry {member.name!r}: not part of a Hugging Face cache")
            return
        if not repo_folder_ok(parts[0]) or len(parts) < 3 or parts[1] not in _SECTIONS:
            raise UsageError(f"refused entry {member.name!r}: not part of a Hugging Face cache layout")
        if member.kind == "file" and parts[-1].endswith(".incomplete"):
            return
        content = self.content(member, stream, parts)
        handler = {"blobs": self.blob, "snapshots": self.snapshot, "refs": self.ref, ".no_exist": self.marker,
                   "trees": self.tree}[parts[1]]
        handler(self.repos[parts[0]], member, parts, content)

    def fits(self, name: str, parts: list[str]) -> None:
        """Refuse a name the target's filesystem cannot take (``MAX_PATH_BYTES``, ``MAX_REF_NAME_BYTES``)."""
        if len(os.fsencode(os.path.join(self.staging.cache_dir, *parts))) > MAX_PATH_BYTES:
            raise UsageError(f"refused entry {shown_name(name)!r}: its path in the target would be longer than "
                             f"{MAX_PATH_BYTES} bytes; nothing was imported")
        if len(parts) > 2 and parts[1] == "refs" and len(os.fsencode(parts[-1])) > MAX_REF_NAME_BYTES:
            raise UsageError(f"refused entry {shown_name(name)!r}: a ref name longer than {MAX_REF_NAME_BYTES} bytes")

    def content(self, member: Member, stream: BinaryIO | None, parts: list[str]) -> str:
        """The staged member holding this entry's content ("" for a symlink), staged now for a file."""
        name = "/".join(parts)
        if member.kind == "hardlink":
            target = "/".join(clean_name(member.linkname))
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
        if len(parts) != 3 or member.kind == "symlink" or not is_etag(parts[2]):
            raise UsageError(f"refused entry {member.name!r}: a blob must be a file named by its sha256 or git sha1")
        repo.blobs[parts[2]] = content

    def snapshot(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        commit, path = parts[2], "/".join(parts[3:])
        if not is_commit(commit) or not path:
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
        if member.kind == "symlink" or not is_commit(value):
            raise UsageError(f"refused entry {member.name!r}: a ref must hold a 40-hex commit")
        repo.refs["/".join(parts[2:])] = value

    def marker(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        if member.kind != "file" or member.size != 0 or len(parts) < 4 or not is_commit(parts[2]):
            raise UsageError(f"refused entry {member.name!r}: a .no_exist marker must be an empty file")
        repo.markers.add((parts[2], "/".join(parts[3:])))

    def tree(self, repo: _RepoPlan, member: Member, parts: list[str], content: str) -> None:
        record = self.staging.files.get(content)
        if member.kind == "symlink" or len(parts) != 3 or not parts[2].endswith(".json") or record is None \
                or not is_commit(parts[2].removesuffix(".json")) or record[1] > MAX_TREE_BYTES:
            raise UsageError(f"refused entry {member.name!r}: trees/ holds <commit>.json files of at most "
                             f"{MAX_TREE_BYTES} bytes")
        repo.trees[parts[2]] = (record[0], _parse_listing(record[0].read_bytes(), member.name))
