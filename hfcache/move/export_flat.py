"""``export DEST REPO@REV --flat``: one revision's files as real files at DEST (``DEST/config.json``, ...), the
folder a path-taking runtime reads (vLLM, TGI ``--model-id /models/x``) without learning the commit.

Each file is read through the export's checked readers (a blob hashed against its name, any other file at its
planned size: :mod:`.export_store`) into a private folder built beside DEST, then renamed into place. Idempotent: a
DEST that already holds exactly these files with these bytes is left as it is (``unchanged``); any other non-empty
DEST is refused (exit 2), never merged into.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..cache.content import BlobHash
from ..cache.fsops import create_at, open_dir_at
from ..errors import CacheError, UsageError
from .destination import open_parent, private_dir, replace_beside
from .export import _CHUNK, Entry, ExportPlan, modes
from .export_store import entry_reader


@dataclass(frozen=True)
class FlatExport:
    """What :func:`write_flat` did: ``dest``, ``repo`` (``REPO_ID@<commit>``), ``files`` (snapshot paths, sorted),
    ``bytes`` (their total), ``unchanged`` (DEST already held exactly them)."""

    dest: str
    repo: str
    files: tuple[str, ...]
    bytes: int
    unchanged: bool


def flat_files(plan: ExportPlan) -> tuple[str, str, dict[str, Entry]]:
    """(repo folder, commit, snapshot path -> the entry holding its bytes) of the one revision in ``plan``.
    UsageError (exit 2): the plan holds more or less than one repo at one commit."""
    snapshots = sorted({tuple(e.name.split("/")[:3]) for e in plan.entries
                        if e.name.count("/") >= 3 and e.name.split("/")[1] == "snapshots"})
    if len(plan.repos) != 1 or len(snapshots) != 1:
        found = ", ".join(f"{s[0]}@{s[2][:12]}" for s in snapshots[:4]) or "none"
        raise UsageError(f"--flat exports one repo at one revision (found {found})",
                         hint="name one REPO_ID@REVISION, e.g. hfcache export /models/x org/name@main --flat")
    folder, _, commit = snapshots[0]
    by_name = {e.name: e for e in plan.entries}
    base = f"{folder}/snapshots/{commit}/"
    files = {}
    for e in plan.entries:
        if not e.name.startswith(base):
            continue
        if e.kind == "symlink":  # ../../blobs/<etag>: the blob entry, or the file it is a hardlink of
            blob = by_name[f"{folder}/blobs/{e.target.rsplit('/', 1)[1]}"]
            files[e.name[len(base):]] = by_name[blob.target] if blob.kind == "hardlink" else blob
        elif e.kind == "file":
            files[e.name[len(base):]] = e
    return folder, commit, files


def write_flat(plan: ExportPlan, dest: Path, repo_id: str, group_writable: bool = False) -> FlatExport:
    """Write the one revision of ``plan`` as real files at ``dest`` (:mod:`this module <.export_flat>`). Raises
    UsageError: not one revision, DEST holds anything else; CacheError: a source file does not match its name or
    changed, DEST cannot be written (nothing is left there)."""
    _, commit, files = flat_files(plan)
    shown = FlatExport(str(dest), f"{repo_id}@{commit}", tuple(sorted(files)), sum(e.size for e in files.values()),
                       unchanged=False)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        if _holds_exactly(dest, files):
            return FlatExport(**{**shown.__dict__, "unchanged": True})
        raise UsageError(f"{dest} exists and holds other files than {repo_id}@{commit[:12]}: nothing written",
                         hint="export into a new or empty folder (or remove this one)")
    dir_mode, file_mode = modes(group_writable)
    pfd = None
    try:
        pfd = open_parent(dest)
        replace_beside(pfd, dest, lambda name: private_dir(pfd, name, lambda sfd: _write(sfd, files, dir_mode,
                                                                                          file_mode)))
    except OSError as exc:
        raise CacheError(f"export to {dest}: {exc.strerror or exc}", hint="check the destination") from exc
    finally:
        if pfd is not None:
            os.close(pfd)
    return shown


def _write(sfd: int, files: dict[str, Entry], dir_mode: int, file_mode: int) -> None:
    """Each file below ``sfd`` (its folders made first), read hash-checked; modes set through descriptors."""
    made: set[str] = set()
    for path in sorted(files):
        parts = path.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder not in made:
                os.mkdir(folder, dir_mode, dir_fd=sfd)
                made.add(folder)
        fd = create_at(sfd, path, file_mode)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out, entry_reader(files[path]) as reader:
                while chunk := reader.read(_CHUNK):
                    out.write(chunk)
            os.fchmod(fd, file_mode)
        finally:
            os.close(fd)
    for folder in made:
        dfd = open_dir_at(sfd, folder)
        try:
            os.fchmod(dfd, dir_mode)
        finally:
            os.close(dfd)
    os.fchmod(sfd, dir_mode)


def _holds_exactly(dest: Path, files: dict[str, Entry]) -> bool:
    """Whether ``dest`` (the user's folder, outside the cache) holds exactly ``files`` as regular files, no link
    among them, with the same bytes: a blob's by its name, another file by its sha256 against the source's."""
    found = set()
    for dirpath, dirnames, names in os.walk(dest):
        if any(os.path.islink(os.path.join(dirpath, n)) for n in (*dirnames, *names)):
            return False
        found.update(os.path.relpath(os.path.join(dirpath, n), dest).replace(os.sep, "/") for n in names)
    if found != set(files):
        return False
    try:
        return all(_same(dest / path, entry) for path, entry in files.items())
    except (OSError, CacheError):
        return False


def _same(path: Path, entry: Entry) -> bool:
    """Whether the regular file ``path`` holds ``entry``'s bytes: its size, then its hash (a blob's name, or the
    source's sha256)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            return False
        if entry.etag:
            blob = BlobHash.for_etag(entry.etag, entry.size)
            while chunk := f.read(_CHUNK):
                blob.update(chunk)
            return blob.hexdigest() == entry.etag
        ours, theirs = hashlib.sha256(), hashlib.sha256()
        while chunk := f.read(_CHUNK):
            ours.update(chunk)
    with entry_reader(entry) as reader:
        while chunk := reader.read(_CHUNK):
            theirs.update(chunk)
    return ours.digest() == theirs.digest()
