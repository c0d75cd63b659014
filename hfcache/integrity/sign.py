"""sign: ``hfcache sign`` (a model-signing bundle per cached snapshot, written outside the cache) and
``hfcache verify --signature`` (a bundle checked against a cached snapshot), on :mod:`.signatures` and
:mod:`.signed_snapshot`.

A bundle file is named ``<repo folder>@<commit>.sig.json`` (``models--ORG--NAME@<40 hex>.sig.json``: one name per
repo type, id and commit). It is written to a folder outside the cache (a folder below the cache root is refused:
a group member could plant links there), through that folder's descriptor: a private ``O_EXCL`` temp name, then
``linkat`` to the final name (which fails if anything is there), or with ``force`` a ``rename`` over a regular file.
What is not a regular file at the output (a link, device node, FIFO, socket) is never replaced (``-o /dev/null``
once replaced /dev/null with a file); ``-`` returns the bundle for standard output. Every OSError of the output is
one line: exit 2 for a path that does not exist or is not a folder, exit 5 for one that cannot be written.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CacheError, UsageError
from .signatures import (MAX_BUNDLE_BYTES, NotABundle, SignatureCheck, SignatureMismatch, foreign_model,
                         read_user_file, sign_files, verify_files)
from .signed_snapshot import NameMismatch, snapshot_digests


@dataclass(frozen=True)
class SignedSnapshot:
    """One bundle ``hfcache sign`` wrote.

    Attributes:
        repo_id (str), commit (str): the snapshot. path (str): the bundle file written.
        files (int): files signed. hashed (int): files whose bytes were hashed (the others: their LFS blob names).
        data (bytes): the bundle itself when ``path`` is ``-`` (standard output), else ``b""``.
    """

    repo_id: str
    commit: str
    path: str
    files: int
    hashed: int
    data: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class SignatureVerdict:
    """A bundle that verified against a cached snapshot (``verify --signature``).

    Attributes:
        repo_id (str), commit (str): the snapshot; snapshot (str): its folder. check (SignatureCheck): the result.
        hashed (int): files whose bytes were hashed for the check.
    """

    repo_id: str
    commit: str
    snapshot: str
    check: SignatureCheck
    hashed: int


def bundle_name(folder: str, commit: str) -> str:
    """``<repo folder>@<commit>.sig.json``, the default bundle file name."""
    return f"{folder}@{commit}.sig.json"


def _inside(path: Path, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def _kind(mode: int) -> str:
    """What a non-regular, non-folder entry is, for the messages."""
    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def output_error(exc: OSError, shown: str) -> UsageError | CacheError:
    """The one-line error of an OSError on ``--output``: a path that does not exist or is not a folder is exit 2
    (UsageError), anything else (read-only, permission, full disk...) exit 5 (CacheError), both naming ``shown``."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return UsageError(f"--output {shown}: {why}",
                          hint="give an existing folder, a folder to create in one (ending with '/'), or '-'")
    return CacheError(f"cannot write {shown}: {why}", hint="give --output a folder you can write")


def _destination(output: str | os.PathLike[str] | None, count: int, cache_dir: Path) -> tuple[Path, str | None]:
    """(the folder to write into, the file name when ``output`` names a file). ``output`` is a folder when it is an
    existing folder (or a link to one) or ends with ``/`` (created when missing); else a file (exactly one
    snapshot), which must not exist as anything but a regular file (a link, device, FIFO or socket is refused: a
    rename would replace it).

    Raises:
        UsageError: a file for several snapshots, a non-regular file, a path that is not a folder, a folder inside
            the cache. CacheError: the path cannot be examined (permission...)."""
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
    if _inside(folder, cache_dir):
        raise UsageError(f"{folder} is inside the cache {cache_dir}: bundles are not written there",
                         hint="give --output a folder outside the cache (the current folder is the default)")
    return folder, name


def _open_folder(folder: Path) -> int:
    """A descriptor of ``folder``, created (with its missing parents, 0755) when it does not exist.

    Raises:
        UsageError, CacheError: as :func:`output_error`."""
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(folder, flags)
    except FileNotFoundError:
        if str(folder.parent) == str(folder):
            raise UsageError(f"--output {folder}: no such folder") from None
    except OSError as exc:
        raise output_error(exc, str(folder)) from None
    parent = _open_folder(folder.parent)
    try:
        try:
            os.mkdir(folder.name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        return os.open(folder.name, flags | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        raise output_error(exc, str(folder)) from None
    finally:
        os.close(parent)


def _check_target(folder_fd: int, name: str, shown: str, force: bool) -> None:
    """Refuse to replace ``name`` in ``folder_fd`` unless it is absent, or a regular file and ``force``.

    Raises:
        UsageError: it is a link, device, FIFO, socket or folder, or a regular file without ``force`` (exit 2).
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


def write_bundle(folder_fd: int, name: str, data: bytes, shown: str, *, force: bool = True) -> None:
    """Write ``data`` as ``name`` in the folder ``folder_fd``: a private temp file (``O_EXCL``, 0644), fsync, then
    published: hard-linked to ``name`` when it does not exist (``linkat`` fails if anything appeared there), or,
    with ``force``, renamed over it after checking it is a regular file (a reader sees the old bundle or the new
    one). Whatever is not a regular file at ``name`` (a link, device, FIFO, socket) is never replaced.

    Raises:
        UsageError: ``name`` exists and is not a regular file, or is one and ``force`` is not set (exit 2).
        CacheError: the folder cannot be written (exit 5, naming ``shown``)."""
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    _check_target(folder_fd, name, shown, force)
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o644, dir_fd=folder_fd)
    except OSError as exc:
        raise output_error(exc, shown) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _publish(folder_fd, temp, name, shown, force)
    except OSError as exc:
        raise output_error(exc, shown) from None
    finally:
        try:
            os.unlink(temp, dir_fd=folder_fd)
        except OSError:
            pass


def _publish(folder_fd: int, temp: str, name: str, shown: str, force: bool) -> None:
    try:
        os.link(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
        return
    except FileExistsError:
        if not force:
            raise UsageError(f"{shown} exists: --force replaces it", hint="or give --output another path") from None
    except OSError as exc:  # a filesystem without hard links (vfat, some FUSE): rename, after one more check
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
    # Replacing (or no hard links): narrowed, not closed: a writer of the folder can swap the name between this
    # check and the rename (the folder is the user's own choice, outside the cache).
    _check_target(folder_fd, name, shown, True)
    os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)


def sign_snapshots(cache_dir: Path, targets: Sequence[tuple[str, str]], key: Path,
                   output: str | os.PathLike[str] | None = None, *, password: bytes | None = None,
                   rehash: bool = False, on_bytes=None, force: bool = False) -> tuple[SignedSnapshot, ...]:
    """Sign each snapshot ``targets`` names, one bundle each, written after all of them signed.

    Args:
        cache_dir: the cache root. targets: ``(REPO_ID[@REVISION], repo_type)`` pairs (a ref or a commit).
        key: a PEM EC private key. output: a folder (existing, a link to one, or a path ending with ``/``: created),
            for one snapshot a file (new, or a regular file with ``force``), or ``-``: the bundle is returned in
            ``SignedSnapshot.data``, nothing written (one snapshot) [default: the current folder]; never inside the
            cache.
        password: the key's password. rehash: hash every file (default: an LFS blob's name is its sha256).
        on_bytes: called with the size of every chunk hashed. force: replace existing bundle files (regular files
            only; a link, device, FIFO or socket is never replaced).

    Returns:
        One SignedSnapshot per snapshot, in order (a snapshot named twice is signed once).

    Raises:
        UsageError: a malformed spec, a bad key or password, model-signing missing, an output inside the cache, a
            file (or ``-``) for several snapshots, an output that is not a regular file or folder, one that exists
            without ``force``, an output path that does not exist (exit 2). CheckFailed: a repo or revision not in
            the cache; a git path in a snapshot (:func:`hfcache.integrity.signatures.sign_files`). NameMismatch: a
            file hashed does not match its blob name (exit 5, naming it; nothing written). CacheError: an unsafe
            entry, or the output cannot be written (read-only, permission, full: exit 5).
    """
    made: dict[tuple[str, str], tuple[str, bytes, int, int]] = {}
    for spec, repo_type in targets:
        try:
            digests = snapshot_digests(cache_dir, spec, rehash=rehash, on_bytes=on_bytes, repo_type=repo_type)
        except NameMismatch as exc:  # what plain `verify` and `push --sign-key` refuse is never signed
            exc.message = f"{exc.message}: nothing was signed"
            exc.args = (exc.message,)
            raise
        if (digests.folder, digests.commit) in made:
            continue
        bundle = sign_files(digests.files, f"{digests.repo_id}@{digests.commit}", key, password=password)
        made[(digests.folder, digests.commit)] = (digests.repo_id, bundle, len(digests.files), digests.hashed)
    if output is not None and os.fspath(output) == "-":
        if len(made) != 1:
            raise UsageError(f"--output -: {len(made)} snapshots are signed, one bundle each: give a folder",
                             hint="standard output takes the bundle of one snapshot")
        ((_, commit), (repo_id, bundle, files, hashed)), = made.items()
        return (SignedSnapshot(repo_id, commit, "-", files, hashed, bundle),)
    folder, name = _destination(output, len(made), cache_dir)
    names = {key_: name or bundle_name(*key_) for key_ in made}
    fd = _open_folder(folder)
    written = []
    try:
        for key_, file_name in names.items():  # every name checked before the first is written
            _check_target(fd, file_name, str(folder / file_name), force)
        for (repo_folder, commit), (repo_id, bundle, files, hashed) in made.items():
            file_name = names[(repo_folder, commit)]
            write_bundle(fd, file_name, bundle, str(folder / file_name), force=force)
            written.append(SignedSnapshot(repo_id, commit, str(folder / file_name), files, hashed))
    finally:
        os.close(fd)
    return tuple(written)


def check_signature(cache_dir: Path, spec: str, signature: Path, public_key: Path, *, rehash: bool = False,
                    on_bytes=None) -> SignatureVerdict:
    """Check the bundle file ``signature`` with ``public_key`` against the cached snapshot ``spec`` names.

    Args:
        cache_dir: the cache root. spec: ``REPO_ID[@REVISION]``. signature: the bundle file (at most 64 MiB).
        public_key: a PEM EC public key. rehash: hash every file (default: LFS blob names are their sha256).
        on_bytes: called with the size of every chunk hashed.

    Returns:
        SignatureVerdict.

    Raises:
        SignatureMismatch: bad signature, wrong key, or files unsigned / changed / missing (exit 1, all named, with
            the model the bundle signs when it is another); or every file matches but the bundle names another model
            (:func:`hfcache.integrity.signatures.foreign_model`); or a file hashed does not match its blob name
            (``changed``: nothing vouches for those bytes, whatever the bundle says).
        CheckFailed: the repo or revision is not in the cache. UsageError: an unreadable bundle or key, a file that
            is not a model-signing bundle (not JSON, ``{}``, ``[]``, another predicate: exit 2, naming it).
        CacheError: an unsafe entry in the snapshot.
    """
    bundle = read_user_file(Path(signature), "the signature", MAX_BUNDLE_BYTES)
    try:
        digests = snapshot_digests(cache_dir, spec, rehash=rehash, on_bytes=on_bytes)
    except NameMismatch as exc:  # verify's finding (exit 1), as plain `hfcache verify` reports it
        raise SignatureMismatch(f"{exc.snapshot}: changed: {exc.path} no longer matches its blob name {exc.name} "
                                "(changed on disk): not verified", reason="files", changed=(exc.path,),
                                hint=exc.hint) from None
    try:
        check = verify_files(bundle, digests.files, public_key, name=f"{digests.repo_id}@{digests.commit}")
    except NotABundle as exc:  # a file the user named that is no bundle at all: unreadable, exit 2 (docs/verify.md)
        raise UsageError(f"the signature {signature} is not a model-signing bundle: {exc.why}", hint=exc.hint) \
            from None
    foreign = foreign_model(check, digests.repo_id, digests.commit)
    if foreign is not None:
        raise foreign
    return SignatureVerdict(digests.repo_id, digests.commit, str(digests.snapshot), check, digests.hashed)
