"""``hfcache pull --verify-key PUB``: the pulled manifest's model-signing bundles (OCI referrers, :mod:`hfcache.oci.
referrers`) checked against the digests of the staged content (:func:`hfcache.integrity.signatures.verify_files`)
before anything is published.

The bundles are fetched before any layer: an artifact with none is refused at once (exit 1, "unsigned"). After the
last layer was read and its digests checked, but before import publishes, every snapshot the pull brings must be
signed by one of the bundles under the given key: {path in the snapshot: sha256} of the bytes that were staged (a
ModelPack raw layer's digest; for the image format, the sha256 of each file's bytes as its tar entry streamed, or of
the target's own blob, re-hashed and checked against its name, for a link to a blob the target already has). Every
file counts, whatever its name (a ``.git*``/``.github`` path a bundle leaves out is unsigned). Any failure raises
:class:`hfcache.integrity.signatures.SignatureMismatch` (exit 1) naming what is unsigned, changed or missing, or a wrong
key; import then publishes nothing.

What else the artifact makes visible is bound to those snapshots (:func:`check_claims`): every ref it carries (image
tar ``refs/<name>``, ModelPack ref layers) must name a commit whose snapshot a signature covered in this pull, in the
same repo folder, and every ``.no_exist`` marker and ``trees/`` listing must be about one; else the pull is refused
(:class:`hfcache.errors.IntegrityError`, exit 3: the registry served a ref the signer never vouched for), whatever
``--move-refs`` says and whether or not the target has the ref: a signed artifact with ``refs/main`` naming an older
commit the target holds would otherwise move ``main`` to an unsigned revision. A ref's commit is read from the bytes
the importer stages, as the importer reads it (:func:`ref_commit`).
"""

from __future__ import annotations

import hashlib
import posixpath
from pathlib import Path

from ..cache import safefs
from ..errors import CacheError, CheckFailed, IntegrityError
from ..cache.content import algorithm_of, hash_fd

#: At most this many bytes of an entry are kept to read a ref's commit (import's ``MAX_REF_BYTES``).
_REF_BYTES = 1024


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
                     cache_dir: Path | None = None, claims: dict[str, str] | None = None) -> str:
    """Check that each snapshot (``<folder>/<commit>`` -> {path: sha256 hex}) verifies with one of the bundles.

    The signature must cover what the snapshot holds after the pull: the files the target's snapshot of that commit
    already has (:func:`hfcache.integrity.signed_snapshot.snapshot_digests`, opened through the safe opens) join the
    staged ones, so a file planted there that the artifact does not carry is named unsigned (the staged digest wins
    for a path both have: import refuses one whose content differs).

    Args:
        found: the bundles; snapshots: the staged files; public_key: the PEM key; cache_dir: the target (None: the
            staged files only); claims: what the artifact says about commits, checked after the snapshots
            (:func:`check_claims`).

    Returns:
        The key fingerprint the bundles verified with ("" when there was nothing to check).

    Raises:
        SignatureMismatch: a snapshot no bundle signs under ``public_key`` (the first bundle's reason is named).
        IntegrityError: a ref, marker or listing about a commit no signature covered (exit 3).
        CheckFailed: a blob of the target's snapshot does not hold the content its name says (exit 1).
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
    check_claims(claims or {}, snapshots)
    return fingerprint


def check_claims(claims: dict[str, str], snapshots: dict[str, dict[str, str]]) -> None:
    """Refuse a ref, ``.no_exist`` marker or ``trees/`` listing about a commit whose snapshot no signature of this
    pull covered (in the same repo folder).

    Args:
        claims: entry name (``<folder>/refs/<name>``, ``<folder>/.no_exist/<commit>/...``, ``<folder>/trees/...``)
            -> the commit it names ("" for a ref whose bytes are no commit). snapshots: ``<folder>/<commit>`` -> the
            files that verified.

    Raises:
        IntegrityError: naming the entry, its commit and the signed ones (exit 3; nothing was written).
    """
    for name, commit in sorted(claims.items()):
        folder, section = name.split("/", 2)[:2]
        if f"{folder}/{commit}" in snapshots:
            continue
        signed = sorted(c for key in snapshots for f, _, c in (key.partition("/"),) if f == folder)
        said = f"names commit {commit}" if section == "refs" and commit else \
            "holds no commit" if section == "refs" else f"is about commit {commit}"
        raise IntegrityError(f"refused the pull, nothing was written: {name} {said}, which no signature of this pull "
                             f"covers (signed: {', '.join(c[:12] for c in signed[:5]) or 'no snapshot of that repo'})",
                             hint="a signed pull publishes refs, markers and listings only about the commits it "
                                  "verified; the artifact is altered or crafted (a ref rolled back to an unsigned "
                                  "revision): pull it from its source again")


def ref_commit(head: bytes) -> str:
    """The commit a ref entry's first bytes name, read as the importer reads a ref (UTF-8, stripped), or "" when
    it is not 40 hex (import refuses such a ref)."""
    value = head[:_REF_BYTES].decode("utf-8", "replace").strip()
    return value if algorithm_of(value) == "git-sha1" else ""


def _held_files(cache_dir: Path, folder: str, commit: str) -> dict[str, str]:
    """{path: sha256 hex} of the target's snapshot ``<folder>/snapshots/<commit>`` ({} when it has none).

    Raises:
        CheckFailed: one of its files does not match its blob name (exit 1, as a held blob :func:`_local_sha256`
            finds so)."""
    from ..cache.scan import parse_folder_name
    from ..integrity.signed_snapshot import NameMismatch, snapshot_digests

    parsed = parse_folder_name(folder)
    if parsed is None or not Path(cache_dir, folder, "snapshots", commit).is_dir():
        return {}
    try:
        return snapshot_digests(Path(cache_dir), f"{parsed[0]}@{commit}", repo_type=parsed[1]).files
    except NameMismatch as exc:
        raise _changed_on_disk(f"{folder}/snapshots/{commit}/{exc.path}", exc.name) from None
    except CheckFailed:  # no such snapshot (gone meanwhile): nothing held
        return {}


def _changed_on_disk(shown: str, name: str) -> CheckFailed:
    """The refusal of a target file whose bytes are not its blob name (as ``held_locally`` refuses a held blob)."""
    return CheckFailed(f"refused the pull, nothing was changed: the target's {shown} does not hold the content its "
                       f"blob name {name} says (changed on disk)",
                       hint="run `hfcache verify` on the target and remove that blob, then pull again")


class TarFiles:
    """What the image format's tar entries show, for the signature check: blob hashes, snapshot links and files,
    and the commits its refs, markers and listings name (``claims``, :func:`check_claims`)."""

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, str], str] = {}  # (folder, etag) -> sha256 of the bytes streamed
        self.entries: dict[str, str] = {}  # member name -> sha256 (real files)
        self.links: dict[tuple[str, str, str], str] = {}  # (folder, commit, path) -> etag
        self.files: dict[tuple[str, str, str], str] = {}  # (folder, commit, path) -> member name of its bytes
        self.commits: dict[str, str] = {}  # member name -> the commit its first bytes name (those naming one only)
        self.claims: dict[str, str] = {}  # ref, marker or listing name -> the commit it names

    def note(self, member, stream) -> None:
        """One member (after prefix stripping); ``stream``: the :class:`HashingStream` its bytes went through (a
        file), or None.

        Names are split exactly as the importer splits them (``move/import_plan._clean_name``: a leading ``./``
        dropped): entries named ``./models--.../snapshots/...`` were published but never seen here, so a pull of
        such an image "verified" with nothing checked. A ref's commit is what the importer reads: its own bytes,
        or for a hardlink those of the entry it repeats."""
        from ..move.import_plan import clean_name as _clean_name

        parts = _clean_name(member.name)
        name = "/".join(parts)
        if len(parts) < 3 or member.kind not in ("file", "hardlink", "symlink") \
                or (member.kind == "file" and parts[-1].endswith(".incomplete")):  # what import skips
            return
        sha256 = stream.sha256.hexdigest() if member.kind == "file" and stream is not None else None
        if sha256 is not None:
            self.entries[name] = sha256
            if ref_commit(stream.head):
                self.commits[name] = ref_commit(stream.head)
            if parts[1] == "blobs" and len(parts) == 3:
                self.blobs[(parts[0], parts[2])] = sha256
        if parts[1] == "refs":
            source = name if member.kind == "file" else "/".join(_clean_name(member.linkname))
            self.claims[name] = self.commits.get(source, "") if member.kind != "symlink" else ""
        elif parts[1] == ".no_exist":
            self.claims[name] = parts[2]
        elif parts[1] == "trees":
            self.claims[name] = parts[2].removesuffix(".json")
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
    """The sha256 of the target's ``<folder>/blobs/<etag>``, its bytes checked against ``etag`` in the same read
    ("" when it cannot be read safely: then unsigned).

    Raises:
        CheckFailed: the blob does not hash to its name (a member's edit of a shared cache: exit 1)."""
    shown = f"{folder}/blobs/{etag}"
    algorithm = algorithm_of(etag)
    try:
        digests, _ = hash_fd(safefs.open_blob(cache_dir, folder, etag),
                             tuple(dict.fromkeys(("sha256", algorithm or "sha256"))), shown=shown)
    except (OSError, CacheError):
        return ""
    if algorithm is not None and digests[algorithm] != etag:
        raise _changed_on_disk(shown, etag)
    return digests["sha256"]


class HashingStream:
    """A tar entry's bytes as the importer reads them, hashed (sha256) on the way; its first bytes are kept
    (``head``, at most import's ``MAX_REF_BYTES``) to read the commit a ref names."""

    def __init__(self, stream) -> None:
        self._stream, self.sha256, self.head = stream, hashlib.sha256(), b""

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        if len(self.head) < _REF_BYTES:
            self.head += data[:_REF_BYTES - len(self.head)]
        return data
