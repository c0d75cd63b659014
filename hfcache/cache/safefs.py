"""Filesystem primitives that never leave the cache root, whatever links someone planted in it.

A cache's folders and links are untrusted input (docs/security.md). Every operation here walks from the cache root
one component at a time (:mod:`.fsops`) and acts relative to the last folder's descriptor: a symlinked or
non-directory component below the root raises :class:`UnsafeLayout`. The root itself may be a symlink (``~/.cache``
on another disk). Names that build paths are checked where they are used (:mod:`hfcache.names`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from ..names import UnsafeName, check_commit, check_etag, check_folder_name, check_ref_name  # noqa: F401 - the layer's checks
from .fsops import LINK_ERRNOS, UnsafeLayout, open_dir_at, remove_tree_at
from .shared_store import StoreProblem, open_payload, xet_hash_of_link

#: The parts of a repo folder huggingface_hub writes; each must be a real directory when present.
REPO_PARTS = ("blobs", "refs", "snapshots", ".no_exist", "trees")
_PART_SET = frozenset(REPO_PARTS)
_LEFT_ALONE = "remove it, then rerun"


def _parts(rel: str | Sequence[str]) -> list[str]:
    parts = rel.split("/") if isinstance(rel, str) else list(rel)
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise UnsafeName(f"refusing path component {part!r} in {'/'.join(parts)!r}")
    return parts


def _unsafe(root: str | os.PathLike[str], parts: Sequence[str], upto: int) -> UnsafeLayout:
    rel = "/".join(parts[: upto + 1])
    what = "a symlink" if os.path.islink(os.path.join(root, rel)) else "not a directory"
    return UnsafeLayout(f"{Path(root)}/{rel} is {what}: left alone (nothing outside the cache is read or written)",
                        hint="remove it or replace it with a real directory, then rerun")


def _descend(root: str | os.PathLike[str], rel: str | Sequence[str], *, create: bool = False,
             on_create: Callable[[int], None] | None = None, missing_ok: bool = False) -> int | None:
    """The walk of :func:`open_dir`; with ``missing_ok``, None at the first missing component."""
    parts = _parts(rel) if rel else []
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                try:
                    nfd = open_dir_at(fd, part)
                except FileNotFoundError:
                    if missing_ok:
                        os.close(fd)
                        return None
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                        made = True
                    except FileExistsError:
                        made = False
                    nfd = open_dir_at(fd, part)
                    if made and on_create is not None:
                        on_create(nfd)
            except OSError as exc:
                if exc.errno in LINK_ERRNOS:
                    raise _unsafe(root, parts, i) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(root: str | os.PathLike[str], rel: str | Sequence[str] = (), *, create: bool = False,
             on_create: Callable[[int], None] | None = None) -> int:
    """Open the directory ``root/rel`` (``/``-separated, or components) without following a symlink below the cache
    root ``root``; its fd (caller closes). ``create``: make missing directories (0o777 minus the umask), each one's fd
    handed to ``on_create`` (to share it, :mod:`.sharing`).
    Raises UnsafeLayout: a component is a symlink or not a directory. UnsafeName: a component is empty, ``.``, ``..``.
    FileNotFoundError: a component is missing and ``create`` is False."""
    return _descend(root, rel, create=create, on_create=on_create)  # type: ignore[return-value]


@contextmanager
def dir_fd(root: str | os.PathLike[str], rel: str | Sequence[str] = (), *, create: bool = False) -> Iterator[int]:
    """:func:`open_dir` as a context manager that closes the fd."""
    fd = open_dir(root, rel, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def check_existing(root: str | os.PathLike[str], rel: str | Sequence[str]) -> None:
    """UnsafeLayout unless each component of ``root/rel`` up to the first missing one is a real directory."""
    fd = _descend(root, rel, missing_ok=True)
    if fd is not None:
        os.close(fd)


def _split(rel: str | Sequence[str]) -> tuple[list[str], str]:
    parts = _parts(rel)
    return parts[:-1], parts[-1]


def unlink(root: str | os.PathLike[str], rel: str | Sequence[str], *, missing_ok: bool = False) -> bool:
    """Remove the non-directory ``root/rel`` (a link itself, never its target); False when it was missing (with
    ``missing_ok``). UnsafeLayout for a symlinked parent."""
    return _remove(root, rel, missing_ok, tree=False)


def rmtree(root: str | os.PathLike[str], rel: str | Sequence[str], *, missing_ok: bool = True) -> bool:
    """Remove the directory ``root/rel`` and its contents (:func:`.fsops.remove_tree_at`), or the non-directory
    there; False when it was missing (with ``missing_ok``). UnsafeLayout for a symlinked parent, OSError."""
    return _remove(root, rel, missing_ok, tree=True)


def _remove(root: str | os.PathLike[str], rel: str | Sequence[str], missing_ok: bool, tree: bool) -> bool:
    parent, name = _split(rel)
    try:
        with dir_fd(root, parent) as fd:
            if tree and stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                remove_tree_at(fd, name)
            else:
                os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def rmdir(root: str | os.PathLike[str], rel: str | Sequence[str]) -> None:
    """Remove the empty directory ``root/rel`` (OSError ENOTEMPTY when it is not empty)."""
    parent, name = _split(rel)
    with dir_fd(root, parent) as fd:
        os.rmdir(name, dir_fd=fd)


def rename(root: str | os.PathLike[str], src: str | Sequence[str], dst: str | Sequence[str]) -> None:
    """``os.replace`` of ``root/src`` to ``root/dst``, both parents opened without following links."""
    sparent, sname = _split(src)
    dparent, dname = _split(dst)
    with dir_fd(root, sparent) as sfd, dir_fd(root, dparent) as dfd:
        os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)


def open_file(root: str | os.PathLike[str], rel: str | Sequence[str], flags: int = os.O_RDONLY,
              mode: int = 0o666) -> int:
    """``os.open`` of ``root/rel`` with ``O_NOFOLLOW`` on the file and every directory above it; returns the fd."""
    parent, name = _split(rel)
    with dir_fd(root, parent) as fd:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)


def open_unfollowed(root: str | os.PathLike[str], rel: str | Sequence[str], shown: str, note: str = "") -> int:
    """:func:`open_file` read-only with ``O_NONBLOCK`` (a FIFO never blocks the open); a link there is refused as
    UnsafeLayout ("``shown`` is a symlink or sits under one: left alone``note``"). The caller checks ``S_ISREG``."""
    try:
        return open_file(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in LINK_ERRNOS:
            raise UnsafeLayout(f"{shown} is a symlink or sits under one: left alone{note}", hint=_LEFT_ALONE) from None
        raise


def read_small(root: str | os.PathLike[str], rel: str | Sequence[str], limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``root/rel`` (:func:`open_unfollowed`, :func:`read_regular_fd`:
    UnsafeLayout, FileNotFoundError as there)."""
    shown = f"{root}/{'/'.join(_parts(rel))}"
    return read_regular_fd(open_unfollowed(root, rel, shown), shown, limit)  # type: ignore[return-value]


def read_regular_fd(fd: int, what: str, limit: int, *, whole: bool = False) -> bytes | None:
    """At most ``limit`` bytes from ``fd`` (closed here) when it is a regular file, else UnsafeLayout naming
    ``what``; with ``whole``, None when the file is larger than ``limit``."""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeLayout(f"{what} is not a regular file (a FIFO, device or folder): left alone",
                               hint=_LEFT_ALONE)
        return None if whole and st.st_size > limit else f.read(limit)


def open_repo_file(root: str | os.PathLike[str], folder: str, snapshot_rel: Sequence[str],
                   flags: int = os.O_RDONLY) -> int:
    """Open (fd, caller closes) the file a snapshot entry ``snapshot_rel`` = ``(commit, *path_parts)`` of the repo
    folder ``folder`` stands for: a real file, or a symlink's target resolved inside the repo folder
    (``../../blobs/<etag>``: :func:`open_blob`), no link followed on the way. The caller checks ``S_ISREG``.
    Raises UnsafeLayout: a symlink where a folder belongs, a link outside the repo folder or to another link.
    FileNotFoundError: the entry or its target is missing."""
    rel = ["snapshots", *snapshot_rel]
    with dir_fd(root, (folder, *rel[:-1])) as pfd:
        st = os.stat(rel[-1], dir_fd=pfd, follow_symlinks=False)
        target = os.readlink(rel[-1], dir_fd=pfd) if stat.S_ISLNK(st.st_mode) else None
    parts = rel
    if target is not None:
        joined = os.path.normpath(os.path.join(*rel[:-1], target))
        if os.path.isabs(target) or joined.startswith("..") or joined == ".":
            raise UnsafeLayout(f"{root}/{folder}/{'/'.join(rel)} links outside its repo folder: left alone",
                               hint=_LEFT_ALONE)
        parts = joined.split("/")
    if len(parts) == 2 and parts[0] == "blobs":
        return open_blob(root, folder, parts[1], flags, shown="/".join(rel))
    try:
        return open_file(root, (folder, *parts), flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in LINK_ERRNOS:
            raise _misplaced_link(root, folder, "/".join(rel)) from None
        raise


def _misplaced_link(root: str | os.PathLike[str], folder: str, shown: str) -> UnsafeLayout:
    return UnsafeLayout(f"{root}/{folder}/{shown}: a symlink where a file or folder belongs: left alone",
                        hint=_LEFT_ALONE)


def open_blob(root: str | os.PathLike[str], folder: str, etag: str, flags: int = os.O_RDONLY, *,
              shown: str | None = None) -> int:
    """Open ``<root>/<folder>/blobs/<etag>`` with ``flags | O_NONBLOCK``: a regular file there, or where
    huggingface_hub 2.4 made it a link into the shared Xet store, the payload (:mod:`.shared_store`: exactly the
    library's link shape and marked store). Nothing else is followed; callers check ``S_ISREG``.
    Raises UnsafeLayout (naming ``shown``, default ``blobs/<etag>``): a link of another shape, a store that is not what
    the library writes, a link where a folder belongs. FileNotFoundError: the blob or payload is missing."""
    shown = shown or f"blobs/{etag}"
    try:
        return open_file(root, (folder, "blobs", etag), flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno not in LINK_ERRNOS:
            raise
        xet_hash = store_link_of(root, folder, etag) if exc.errno == errno.ELOOP else None
    if xet_hash is None:
        raise _misplaced_link(root, folder, shown)
    try:
        return open_payload(root, xet_hash, flags)
    except StoreProblem as problem:
        raise UnsafeLayout(f"{root}/{folder}/{shown}: {problem}: left alone", hint=_LEFT_ALONE) from None


def store_link_of(root: str | os.PathLike[str], folder: str, etag: str) -> str | None:
    """The Xet hash ``<folder>/blobs/<etag>`` links to when it is a symlink of the shared store's exact shape
    (``../../blobs/<h[:2]>/<h>``), else None (a regular file, another link, missing). Nothing is followed."""
    try:
        with dir_fd(root, (folder, "blobs")) as fd:
            if not stat.S_ISLNK(os.stat(etag, dir_fd=fd, follow_symlinks=False).st_mode):
                return None
            return xet_hash_of_link(os.readlink(etag, dir_fd=fd))
    except (OSError, UnsafeLayout):
        return None


def read_snapshot_file(snapshot: str | os.PathLike[str], rel: str, limit: int) -> bytes | None:
    """The bytes of ``rel`` in the snapshot folder ``<cache>/<folder>/snapshots/<commit>`` (:func:`open_repo_file`),
    None when larger than ``limit`` (the caller's parse cap). UnsafeLayout, FileNotFoundError as there."""
    snapshot = Path(snapshot)
    fd = open_repo_file(snapshot.parents[2], snapshot.parent.parent.name, (snapshot.name, *_parts(rel)))
    return read_regular_fd(fd, f"{snapshot}/{rel}", limit, whole=True)


def read_repo_file(root: str | os.PathLike[str], folder: str, snapshot_rel: Sequence[str], limit: int) -> bytes:
    """At most ``limit`` bytes of a snapshot entry's regular file (:func:`open_repo_file`); UnsafeLayout for
    anything but a regular file, FileNotFoundError when missing."""
    fd = open_repo_file(root, folder, snapshot_rel)
    return read_regular_fd(fd, f"{root}/{folder}/snapshots/{'/'.join(snapshot_rel)}", limit)  # type: ignore[return-value]


def repo_layout_problems(root: str, folder: str, locks_entries: dict[str, int] | None = None,
                         entries: dict[str, int] | None = None) -> list[str]:
    """What is unsafe about one repo folder's layout, sorted: the folder, its :data:`REPO_PARTS`, ``.locks`` or
    ``.locks/<folder>`` being a symlink or not a directory (``"blobs: a symlink (left alone)"``). ``locks_entries``:
    name -> ``st_mode`` of ``.locks`` as a whole-cache scan listed it (``.locks`` and the folder checked already),
    else None; ``entries``: the repo folder's, when listed."""
    found = []
    if locks_entries is not None:
        lmode = locks_entries.get(folder)
        if lmode is not None and not stat.S_ISDIR(lmode):
            found.append(f".locks/{folder}: {kind_of(lmode)} (left alone)")
    else:
        mode = _lstat_mode(os.path.join(root, folder))
        if mode is not None and not stat.S_ISDIR(mode):
            return [f"{folder}: {kind_of(mode)} (left alone)"]
        for rel in (".locks", f".locks/{folder}"):
            lmode = _lstat_mode(os.path.join(root, rel))
            if lmode is not None and not stat.S_ISDIR(lmode):
                found.append(f"{rel}: {kind_of(lmode)} (left alone)")
                break
            if lmode is None:
                break
        if mode is None:
            return found
    if entries is None:
        entries = list_modes(os.path.join(root, folder), _PART_SET)
    found += [f"{part}: {kind_of(entries[part])} (left alone)" for part in REPO_PARTS
              if part in entries and not stat.S_ISDIR(entries[part])]
    return sorted(found)


def list_modes(path: str, only: frozenset[str] | None = None) -> dict[str, int]:
    """name -> file type bits (from ``d_type``) of the entries of the directory ``path``, of the names in ``only``
    when given. Empty when ``path`` is missing or this user cannot list it."""
    out: dict[str, int] = {}
    with suppress(FileNotFoundError, NotADirectoryError, PermissionError), os.scandir(path) as it:
        for e in it:
            if only is None or e.name in only:
                out[e.name] = stat.S_IFLNK if e.is_symlink() else stat.S_IFDIR if e.is_dir(
                    follow_symlinks=False) else stat.S_IFREG if e.is_file(follow_symlinks=False) else stat.S_IFIFO
    return out


def _lstat_mode(path: str) -> int | None:
    """The mode of ``path`` (not followed), None when missing or this user cannot look (the scan reports that)."""
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def kind_of(mode: int) -> str:
    """``"a symlink"`` or ``"not a directory"``: what stands where a folder belongs."""
    return "a symlink" if stat.S_ISLNK(mode) else "not a directory"
