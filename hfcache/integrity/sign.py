"""sign: ``hfcache sign`` (a model-signing bundle per cached snapshot, written outside the cache) and ``hfcache verify
--signature`` (a bundle checked against a cached snapshot), on :mod:`.signatures` and :mod:`.signed_snapshot`.

A bundle file, ``<repo folder>@<commit>.sig.json`` by default, is written into a folder outside the cache (a group
member could plant links below the cache root) through that folder's descriptor: a private ``O_EXCL`` temp file, then
``linkat`` to the name (which fails if anything is there), or with ``force`` a rename over a regular file. What is not
a regular file there (a link, device node, FIFO, socket) is never replaced (``-o /dev/null`` once replaced it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..cache.fsops import create_at, open_dir_at, temp_name
from ..errors import CacheError, UsageError
from ..warming.lockfile import Lockfile
from .signatures import (
    MAX_BUNDLE_BYTES,
    NotABundle,
    SignatureCheck,
    SignatureMismatch,
    foreign_model,
    read_user_file,
    sign_files,
    verify_files,
)
from .signed_snapshot import NameMismatch, snapshot_digests


@dataclass(frozen=True)
class SignedSnapshot:
    """One bundle ``hfcache sign`` wrote: the snapshot (``repo_id``, ``commit``), the bundle file ``path``, the
    ``files`` signed and those ``hashed``; ``data``: the bundle when ``path`` is ``-`` (stdout), else ``b""``."""

    repo_id: str
    commit: str
    path: str
    files: int
    hashed: int
    data: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class SignatureVerdict:
    """A bundle that verified against a cached snapshot (``verify --signature``): ``repo_id``, ``commit``, the
    ``snapshot`` folder, the ``check`` (SignatureCheck) and the files ``hashed`` for it."""

    repo_id: str
    commit: str
    snapshot: str
    check: SignatureCheck
    hashed: int


def _kind(mode: int) -> str:
    kinds = {stat.S_IFLNK: "symlink", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
             stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket"}
    return kinds.get(stat.S_IFMT(mode), "special file")


def output_error(exc: OSError, shown: str) -> UsageError | CacheError:
    """The error of an OSError on ``--output``, naming ``shown``: exit 2 for a path that does not exist or is not a
    folder, else exit 5 (read-only, permission, full disk...)."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return UsageError(f"--output {shown}: {why}",
                          hint="give an existing folder, a folder to create in one (ending with '/'), or '-'")
    return CacheError(f"cannot write {shown}: {why}", hint="give --output a folder you can write")


def _destination(output: str | os.PathLike[str] | None, count: int, cache_dir: Path) -> tuple[Path, str | None]:
    """(the folder to write into, the file name when ``output`` names a file): a folder when it is one (or a link to
    one) or ends with ``/``; else a file (one snapshot) that is absent or a regular file. UsageError otherwise, or
    for a folder inside the cache; CacheError: the path cannot be examined."""
    text = os.fspath(output) if output is not None else os.getcwd()
    try:
        st = os.lstat(text)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise output_error(exc, text) from None
    if st is not None and (stat.S_ISDIR(st.st_mode) or (stat.S_ISLNK(st.st_mode) and os.path.isdir(text))):
        folder, name = Path(text), None
    elif text.endswith("/"):
        if st is not None:
            raise UsageError(f"--output {text}: not a folder", hint="give a folder, or the bundle file's path")
        folder, name = Path(text), None
    elif st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"--output {text} is a {_kind(st.st_mode)}, not a regular file: refused (it is never "
                         "replaced)", hint="give a new file name, a folder, or '-' for standard output")
    elif count != 1:
        raise UsageError(f"--output {text}: {count} snapshots are signed, one bundle each: give a folder",
                         hint="an existing folder, or a path ending with '/'")
    else:
        folder, name = Path(text).parent, Path(text).name
    real, top = os.path.realpath(folder), os.path.realpath(cache_dir)
    if real == top or real.startswith(top.rstrip("/") + "/"):
        raise UsageError(f"{folder} is inside the cache {cache_dir}: bundles are not written there",
                         hint="give --output a folder outside the cache (the current folder is the default)")
    return folder, name


def _open_folder(folder: Path) -> int:
    """A descriptor of ``folder`` (a link to a folder is the user's choice), created with its missing parents (0755,
    opened without following a link); errors as :func:`output_error`."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if str(folder.parent) == str(folder):
            raise UsageError(f"--output {folder}: no such folder") from None
    except OSError as exc:
        raise output_error(exc, str(folder)) from None
    parent = _open_folder(folder.parent)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder.name, 0o755, dir_fd=parent)
        return open_dir_at(parent, folder.name)
    except OSError as exc:
        raise output_error(exc, str(folder)) from None
    finally:
        os.close(parent)


def _check_target(folder_fd: int, name: str, shown: str, force: bool) -> None:
    """Refuse (UsageError) ``name`` in ``folder_fd`` unless it is absent, or a regular file and ``force``;
    CacheError: it cannot be examined."""
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise output_error(exc, shown) from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{shown} is a folder: the bundle is not written over it")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{shown} is a {_kind(st.st_mode)}, not a regular file: refused (it is never replaced)",
                         hint="remove it, or give --output another path")
    if not force:
        raise UsageError(f"{shown} exists: --force replaces it", hint="or give --output another path")


def _write_bundle(folder_fd: int, name: str, data: bytes, shown: str, force: bool) -> None:
    """Write ``data`` as ``name`` in ``folder_fd`` as the module docstring says. UsageError: ``name`` is not a regular
    file, or exists without ``force``; CacheError: the folder cannot be written (exit 5)."""
    temp = temp_name(name)
    _check_target(folder_fd, name, shown, force)
    try:
        fd = create_at(folder_fd, temp, 0o644)
    except OSError as exc:
        raise output_error(exc, shown) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
            return
        except FileExistsError:
            if not force:
                raise UsageError(f"{shown} exists: --force replaces it", hint="or give --output another path") \
                    from None
        except OSError as exc:  # a filesystem without hard links (vfat, some FUSE): rename, after one more check
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise
        # Replacing: narrowed, not closed (a writer of the user's own folder can swap the name before the rename).
        _check_target(folder_fd, name, shown, True)
        os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except OSError as exc:
        raise output_error(exc, shown) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder_fd)


def sign_snapshots(cache_dir: Path, targets: Sequence[tuple[str, str]], key: Path,
                   output: str | os.PathLike[str] | None = None, *, password: bytes | None = None,
                   rehash: bool = False, on_bytes=None, force: bool = False,
                   lock: Lockfile | None = None) -> tuple[SignedSnapshot, ...]:
    """Sign each snapshot ``targets`` names, one bundle each, written after all of them signed; only files the cache
    proves are what was fetched (:func:`.signed_snapshot.judge`: with ``lock``, its pins and nothing else).

    Args:
        cache_dir: the cache root. targets: ``(REPO_ID[@REVISION], repo_type)`` pairs (a ref or a commit).
        key: a PEM EC private key; password: its password. output: a folder (existing, a link to one, or a path
            ending with ``/``: created), for one snapshot a file (new, or a regular file with ``force``), or ``-``
            (one snapshot: the bundle is returned in ``SignedSnapshot.data``) [default: the current folder]; never
            inside the cache. rehash, on_bytes, lock: as :func:`.signed_snapshot.snapshot_digests`.
        force: replace existing bundle files (regular only).

    Returns one SignedSnapshot per snapshot, in order (a snapshot named twice is signed once).

    Raises:
        UsageError: a malformed spec, a bad key or password, model-signing missing, an output inside the cache, a
            file (or ``-``) for several snapshots, an output that is not a regular file or folder, one that exists
            without ``force``, or does not exist (exit 2). CheckFailed: a repo or revision not in the cache; a git
            path in a snapshot. NameMismatch: a file is not what the cache says was fetched (exit 5; nothing
            written). CacheError: an unsafe entry, or the output cannot be written (an OSError: exit 5).
    """
    made: dict[tuple[str, str], SignedSnapshot] = {}
    for spec, repo_type in targets:
        try:
            digests = snapshot_digests(cache_dir, spec, rehash=rehash, on_bytes=on_bytes, repo_type=repo_type,
                                       lock=lock, proven=True)
        except NameMismatch as exc:  # what plain `verify` and `push --sign-key` refuse is never signed
            exc.message = f"{exc.message}: nothing was signed"
            exc.args = (exc.message,)
            raise
        if (digests.folder, digests.commit) not in made:
            bundle = sign_files(digests.files, f"{digests.repo_id}@{digests.commit}", key, password=password)
            made[(digests.folder, digests.commit)] = SignedSnapshot(digests.repo_id, digests.commit, "-",
                                                                    len(digests.files), digests.hashed, bundle)
    if output is not None and os.fspath(output) == "-":
        if len(made) != 1:
            raise UsageError(f"--output -: {len(made)} snapshots are signed, one bundle each: give a folder",
                             hint="standard output takes the bundle of one snapshot")
        return tuple(made.values())
    folder, name = _destination(output, len(made), cache_dir)
    names = {key_: name or f"{key_[0]}@{key_[1]}.sig.json" for key_ in made}
    fd = _open_folder(folder)
    try:
        for file_name in names.values():  # every name checked before the first is written
            _check_target(fd, file_name, str(folder / file_name), force)
        for key_, signed in made.items():
            _write_bundle(fd, names[key_], signed.data, str(folder / names[key_]), force)
    finally:
        os.close(fd)
    return tuple(replace(signed, path=str(folder / names[key_]), data=b"") for key_, signed in made.items())


def check_signature(cache_dir: Path, spec: str, signature: Path, public_key: Path, *, rehash: bool = False,
                    on_bytes=None) -> SignatureVerdict:
    """Check the bundle file ``signature`` (at most 64 MiB) with ``public_key`` against the cached snapshot ``spec``
    (``REPO_ID[@REVISION]``) names; ``rehash`` and ``on_bytes`` as :func:`sign_snapshots`.

    Raises:
        SignatureMismatch (exit 1): as :func:`.signatures.verify_files` and :func:`.signatures.foreign_model`; a
            file the cache does not prove is what was fetched (:func:`.signed_snapshot.judge`: ``changed``; a
            recorded file absent: ``missing``).
        CheckFailed: the repo or revision is not in the cache. UsageError: an unreadable bundle or key, a file that
            is not a model-signing bundle (not JSON, ``{}``, ``[]``, another predicate: exit 2, naming it).
        CacheError: an unsafe entry in the snapshot.
    """
    bundle = read_user_file(Path(signature), "the signature", MAX_BUNDLE_BYTES)
    try:
        digests = snapshot_digests(cache_dir, spec, rehash=rehash, on_bytes=on_bytes)
    except NameMismatch as exc:  # bytes that are not their name: verify's finding (exit 1), as `verify` reports it
        raise _mismatch(exc) from None
    try:
        check = verify_files(bundle, digests.files, public_key, name=f"{digests.repo_id}@{digests.commit}")
    except NotABundle as exc:  # a file the user named that is no bundle at all: unreadable, exit 2 (docs/verify.md)
        raise UsageError(f"the signature {signature} is not a model-signing bundle: {exc.why}", hint=exc.hint) \
            from None
    if digests.unproven is not None:  # signed, but not what the cache says was fetched: as `sign` refuses it
        raise _mismatch(digests.unproven)
    foreign = foreign_model(check, digests.repo_id, digests.commit)
    if foreign is not None:
        raise foreign
    return SignatureVerdict(digests.repo_id, digests.commit, str(digests.snapshot), check, digests.hashed)


def _mismatch(exc: NameMismatch) -> SignatureMismatch:
    """``verify --signature``'s exit 1 for a file the cache does not prove (``changed``, or ``missing``)."""
    kind = "missing" if exc.missing else "changed"
    return SignatureMismatch(f"{exc.snapshot}: {kind}: {exc.path} {exc.detail}: not verified", reason="files",
                             hint=exc.hint, **{kind: (exc.path,)})
