"""``hfcache pull --verify-key PUB``: the pulled manifest's model-signing bundles (OCI referrers, :mod:`hfcache.oci.
referrers`) checked against the digests of the staged content (:func:`hfcache.integrity.signatures.verify_files`)
before anything is published.

The bundles are fetched before any layer: an artifact with none is refused at once (exit 1, "unsigned"). After the
last layer was read and its digests checked, but before import publishes, every snapshot the pull brings must be
signed by one of the bundles under the given key: {path in the snapshot: sha256} of the bytes that were staged (a
ModelPack raw layer's digest; for the image format, the sha256 of each file's bytes as its tar entry streamed, or of
the target's own blob, re-hashed, for a link to a blob the target already has). Any failure raises
:class:`hfcache.integrity.signatures.SignatureMismatch` (exit 1) naming what is unsigned, changed or missing, or a wrong
key; import then publishes nothing.
"""

from __future__ import annotations

import hashlib
import posixpath
from pathlib import Path

from ..cache import safefs
from ..errors import CacheError, CheckFailed
from ..integrity.hashing import fd_hash


def fetch_bundles(client, container, digest: str, reference: str) -> list[bytes]:
    """The signature bundles attached to ``digest``; an unsigned manifest is refused.

    Raises:
        CheckFailed: no bundle (exit 1); the registry's errors as :func:`hfcache.oci.referrers.bundles` raises them.
    """
    from .referrers import bundles

    found = bundles(client, container, digest)
    if not found:
        raise CheckFailed(f"refused {reference}: unsigned (no signature referrer of {digest}); nothing was pulled",
                          hint="sign it with `hfcache push --sign-key KEY` or `hfcache sign`, or pull without "
                               "--verify-key")
    return found


def check_key(public_key: Path) -> str:
    """The fingerprint of ``--verify-key`` (sha256 hex of its PEM SubjectPublicKeyInfo), checked before anything is
    fetched: a missing file, a FIFO (opened non-blocking: never waits), a private key or an RSA key is refused at
    once.

    Raises:
        UsageError: naming the key file (exit 2).
    """
    from ..integrity.signatures import public_key_fingerprint

    return public_key_fingerprint(Path(public_key))


def check_key_hints(found: list[bytes], fingerprint: str, public_key: Path, reference: str) -> None:
    """Refuse before any layer when every bundle names its key (model-signing's
    ``verificationMaterial.publicKey.hint``: the sha256 of the signer's PEM public key) and none is ``public_key``'s.
    A bundle without a readable hint (an older one, or not a bundle) leaves the decision to the full check after the
    download. Bundles are registry input: read with ``bounds.loads_json``.

    Raises:
        CheckFailed: no bundle is signed by that key (exit 1; nothing was pulled).
    """
    from ..bounds import loads_json

    hints = []
    for bundle in found:
        try:
            document = loads_json(bundle, "a signature bundle")
            hint = document["verificationMaterial"]["publicKey"]["hint"]
        except (ValueError, TypeError, KeyError):
            return
        if not isinstance(hint, str) or not hint:
            return
        hints.append(hint)
    if hints and fingerprint not in hints:
        raise CheckFailed(f"refused the pull, nothing was written: {reference}: none of its {len(hints)} "
                          f"signature(s) is by the key {public_key} (fingerprint {fingerprint[:16]}...), checked "
                          "before any layer was downloaded",
                          hint="check that --verify-key is the public half of the signing key")


def verify_snapshots(found: list[bytes], snapshots: dict[str, dict[str, str]], public_key: Path,
                     cache_dir: Path | None = None) -> str:
    """Check that each snapshot (``<folder>/<commit>`` -> {path: sha256 hex}) verifies with one of the bundles.

    The signature must cover what the snapshot holds after the pull: the files the target's snapshot of that commit
    already has (:func:`hfcache.integrity.signed_snapshot.snapshot_digests`, opened through the safe opens) join the
    staged ones, so a file planted there that the artifact does not carry is named unsigned (the staged digest wins
    for a path both have: import refuses one whose content differs).

    Args:
        found: the bundles; snapshots: the staged files; public_key: the PEM key; cache_dir: the target (None: the
            staged files only).

    Returns:
        The key fingerprint the bundles verified with ("" when there was nothing to check).

    Raises:
        SignatureMismatch: a snapshot no bundle signs under ``public_key`` (the first bundle's reason is named).
        CacheError: the target's snapshot holds a FIFO, a device or a link leaving its repo (exit 5).
    """
    from ..cache.scan import parse_folder_name
    from ..integrity.signatures import SignatureMismatch, foreign_model, verify_files

    if not snapshots:  # nothing checked is not "verified": an image of refs, markers or blobs alone is refused
        raise SignatureMismatch("refused the pull, nothing was written: --verify-key was given but the artifact "
                                "brings no snapshot files for a signature to cover", reason="unsigned")
    fingerprint = ""
    for name, staged in sorted(snapshots.items()):
        folder, _, commit = name.partition("/")
        shown = f"{(parse_folder_name(folder) or (folder,))[0]}@{commit}"
        files = {**_held_files(cache_dir, folder, commit), **staged} if cache_dir is not None else staged
        first: SignatureMismatch | None = None
        repo_id = shown.rpartition("@")[0]
        for bundle in found:
            try:
                check = verify_files(bundle, files, public_key, name=shown)
            except SignatureMismatch as exc:
                first = first or exc
                continue
            foreign = foreign_model(check, repo_id, commit)  # another model's bundle with the same files
            if foreign is not None:
                first = first or foreign
                continue
            fingerprint = check.key_fingerprint
            break
        else:
            if first is None:  # pragma: no cover - fetch_bundles never returns an empty list
                raise CheckFailed(f"{name}: no signature bundle")
            first.message = f"refused the pull, nothing was written: {first.message}"
            first.args = (first.message,)
            if first.hint is None:
                first.hint = "the artifact is not what the key's owner signed; check where it came from"
            raise first
    return fingerprint


def _held_files(cache_dir: Path, folder: str, commit: str) -> dict[str, str]:
    """{path: sha256 hex} of the target's snapshot ``<folder>/snapshots/<commit>`` ({} when it has none)."""
    from ..cache.scan import parse_folder_name
    from ..integrity.signed_snapshot import snapshot_digests

    parsed = parse_folder_name(folder)
    if parsed is None or not Path(cache_dir, folder, "snapshots", commit).is_dir():
        return {}
    try:
        return snapshot_digests(Path(cache_dir), f"{parsed[0]}@{commit}", repo_type=parsed[1]).files
    except CheckFailed:  # no such snapshot (gone meanwhile): nothing held
        return {}


class TarFiles:
    """What the image format's tar entries show, for the signature check: blob hashes, snapshot links and files."""

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, str], str] = {}  # (folder, etag) -> sha256 of the bytes streamed
        self.entries: dict[str, str] = {}  # member name -> sha256 (real files)
        self.links: dict[tuple[str, str, str], str] = {}  # (folder, commit, path) -> etag
        self.files: dict[tuple[str, str, str], str] = {}  # (folder, commit, path) -> member name of its bytes

    def note(self, member, sha256: str | None) -> None:
        """One member (after prefix stripping); ``sha256`` of its bytes for a file.

        Names are split exactly as the importer splits them (``move/import_plan._clean_name``: a leading ``./``
        dropped): entries named ``./models--.../snapshots/...`` were published but never seen here, so a pull of
        such an image "verified" with nothing checked."""
        from ..move.import_plan import _clean_name

        parts = _clean_name(member.name)
        name = "/".join(parts)
        if len(parts) < 3:
            return
        if member.kind == "file" and sha256 is not None:
            self.entries[name] = sha256
            if parts[1] == "blobs" and len(parts) == 3:
                self.blobs[(parts[0], parts[2])] = sha256
        if parts[1] != "snapshots" or len(parts) < 4:
            return
        key = (parts[0], parts[2], "/".join(parts[3:]))
        if member.kind == "symlink":
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            self.links[key] = posixpath.basename(resolved)
        elif member.kind in ("file", "hardlink"):
            self.files[key] = name if member.kind == "file" else "/".join(_clean_name(member.linkname))

    def snapshots(self, cache_dir: Path) -> dict[str, dict[str, str]]:
        """``<folder>/<commit>`` -> {path: sha256 hex}; a link to a blob the pull did not bring is re-hashed from the
        target (through :func:`hfcache.cache.safefs.open_blob`)."""
        out: dict[str, dict[str, str]] = {}
        for (folder, commit, path), etag in self.links.items():
            digest = self.blobs.get((folder, etag)) or _local_sha256(cache_dir, folder, etag)
            out.setdefault(f"{folder}/{commit}", {})[path] = digest
        for (folder, commit, path), source in self.files.items():
            out.setdefault(f"{folder}/{commit}", {})[path] = self.entries.get(source, "")
        return out


def _local_sha256(cache_dir: Path, folder: str, etag: str) -> str:
    """The sha256 of the target's ``<folder>/blobs/<etag>`` ("" when it cannot be read safely: then unsigned)."""
    try:
        return fd_hash(safefs.open_blob(cache_dir, folder, etag), "sha256", shown=f"{folder}/blobs/{etag}")[0]
    except (OSError, CacheError):
        return ""


class HashingStream:
    """A tar entry's bytes as the importer reads them, hashed (sha256) on the way."""

    def __init__(self, stream) -> None:
        self._stream, self.sha256 = stream, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        return data
