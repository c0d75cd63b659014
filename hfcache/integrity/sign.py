"""sign: ``hfcache sign`` (a model-signing bundle per cached snapshot, written outside the cache) and
``hfcache verify --signature`` (a bundle checked against a cached snapshot), on :mod:`.signatures` and
:mod:`.signed_snapshot`.

A bundle file is named ``<repo folder>@<commit>.sig.json`` (``models--ORG--NAME@<40 hex>.sig.json``: one name per
repo type, id and commit). It is written to a folder outside the cache (a folder below the cache root is refused:
a group member could plant links there), through that folder's descriptor: a private ``O_EXCL`` temp name, then
``rename`` over the final name.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError, UsageError
from .signatures import MAX_BUNDLE_BYTES, SignatureCheck, read_user_file, sign_files, verify_files
from .signed_snapshot import snapshot_digests


@dataclass(frozen=True)
class SignedSnapshot:
    """One bundle ``hfcache sign`` wrote.

    Attributes:
        repo_id (str), commit (str): the snapshot. path (str): the bundle file written.
        files (int): files signed. hashed (int): files whose bytes were hashed (the others: their LFS blob names).
    """

    repo_id: str
    commit: str
    path: str
    files: int
    hashed: int


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


def _destination(output: str | os.PathLike[str] | None, count: int, cache_dir: Path) -> tuple[Path, str | None]:
    """(the folder to write into, the file name when ``output`` names a file). A folder is ``output`` when it is an
    existing folder or ends with ``/``; else ``output`` is a file (exactly one snapshot)."""
    if output is None:
        folder, name = Path.cwd(), None
    elif os.path.isdir(output) or os.fspath(output).endswith("/"):
        folder, name = Path(output), None
    else:
        if count != 1:
            raise UsageError(f"--output {output}: {count} snapshots are signed, one bundle each: give a folder",
                             hint="an existing folder, or a path ending with '/'")
        folder, name = Path(output).parent, Path(output).name
    if _inside(folder, cache_dir):
        raise UsageError(f"{folder} is inside the cache {cache_dir}: bundles are not written there",
                         hint="give --output a folder outside the cache (the current folder is the default)")
    return folder, name


def _open_folder(folder: Path) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(folder, flags)
    except FileNotFoundError:
        parent = _open_folder(folder.parent) if str(folder.parent) != str(folder) else None
        if parent is None:
            raise CacheError(f"cannot create {folder}") from None
        try:
            os.mkdir(folder.name, 0o755, dir_fd=parent)
            return os.open(folder.name, flags | os.O_NOFOLLOW, dir_fd=parent)
        except FileExistsError:
            return os.open(folder.name, flags, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:
        raise CacheError(f"cannot write into {folder}: {exc.strerror or exc}") from None


def write_bundle(folder_fd: int, name: str, data: bytes, shown: str) -> None:
    """Write ``data`` as ``name`` in the folder ``folder_fd``: a private temp file (``O_EXCL``, 0644), fsync, then a
    rename over ``name`` (a reader sees the old bundle or the new one).

    Raises:
        CacheError: the folder cannot be written (exit 5, naming ``shown``)."""
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o644, dir_fd=folder_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=folder_fd)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise CacheError(f"cannot write {shown}: {exc.strerror or exc}") from None


def sign_snapshots(cache_dir: Path, targets: Sequence[tuple[str, str]], key: Path,
                   output: str | os.PathLike[str] | None = None, *, password: bytes | None = None,
                   rehash: bool = False, on_bytes=None) -> tuple[SignedSnapshot, ...]:
    """Sign each snapshot ``targets`` names, one bundle each, written after all of them signed.

    Args:
        cache_dir: the cache root. targets: ``(REPO_ID[@REVISION], repo_type)`` pairs (a ref or a commit).
        key: a PEM EC private key. output: a folder (existing, or a path ending with ``/``) or, for one snapshot,
            a file [default: the current folder]; never inside the cache.
        password: the key's password. rehash: hash every file (default: an LFS blob's name is its sha256).
        on_bytes: called with the size of every chunk hashed.

    Returns:
        One SignedSnapshot per snapshot, in order (a snapshot named twice is signed once).

    Raises:
        UsageError: a malformed spec, a bad key or password, model-signing missing, an output inside the cache or a
            file for several snapshots. CheckFailed: a repo or revision not in the cache. CacheError: an unsafe
            entry, or the output cannot be written.
    """
    made: dict[tuple[str, str], tuple[str, bytes, int, int]] = {}
    for spec, repo_type in targets:
        digests = snapshot_digests(cache_dir, spec, rehash=rehash, on_bytes=on_bytes, repo_type=repo_type)
        if (digests.folder, digests.commit) in made:
            continue
        bundle = sign_files(digests.files, f"{digests.repo_id}@{digests.commit}", key, password=password)
        made[(digests.folder, digests.commit)] = (digests.repo_id, bundle, len(digests.files), digests.hashed)
    folder, name = _destination(output, len(made), cache_dir)
    fd = _open_folder(folder)
    written = []
    try:
        for (repo_folder, commit), (repo_id, bundle, files, hashed) in made.items():
            file_name = name or bundle_name(repo_folder, commit)
            write_bundle(fd, file_name, bundle, str(folder / file_name))
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
        SignatureMismatch: bad signature, wrong key, or files unsigned / changed / missing (exit 1, all named).
        CheckFailed: the repo or revision is not in the cache. UsageError: an unreadable bundle or key.
        CacheError: an unsafe entry in the snapshot.
    """
    bundle = read_user_file(Path(signature), "the signature", MAX_BUNDLE_BYTES)
    digests = snapshot_digests(cache_dir, spec, rehash=rehash, on_bytes=on_bytes)
    check = verify_files(bundle, digests.files, public_key, name=f"{digests.repo_id}@{digests.commit}")
    return SignatureVerdict(digests.repo_id, digests.commit, str(digests.snapshot), check, digests.hashed)
