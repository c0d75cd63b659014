"""``hfcache pull --verify-key PUB``: the manifest's model-signing bundles (:mod:`.referrers`) checked against the
staged content before anything is published: every snapshot the pull brings (:func:`verify_snapshots`), then every
ref, marker, listing and blob it carries (:func:`check_claims`); docs/oci.md "Signing".
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from ..bounds import loads_json
from ..cache.content import SHA256, BlobHash
from ..errors import CheckFailed, IntegrityError
from ..move.import_plan import MAX_REF_BYTES, clean_name
from ..names import is_commit, parse_folder_name
from .pull_stream import changed_on_disk, rehashed


def signed_bundles(client, container, digest: str, reference: str, fingerprint: str, public_key: Path) -> list[bytes]:
    """The bundles attached to the manifest ``digest``, fetched before any layer; CheckFailed (exit 1) when there is
    none, or every bundle's ``verificationMaterial.publicKey.hint`` names a key other than ``fingerprint`` (a bundle
    without one leaves it to :func:`verify_snapshots`). Registry errors: :func:`.referrers.bundles`'."""
    from .referrers import bundles

    found = bundles(client, container, digest)
    if not found:
        raise CheckFailed(f"refused {reference}: unsigned (no signature referrer of {digest}); nothing was pulled",
                          hint="sign it with `hfcache push --sign-key KEY` or `hfcache sign`, or pull without "
                               "--verify-key")
    hints = []
    for bundle in found:
        try:
            hint = loads_json(bundle, "a signature bundle")["verificationMaterial"]["publicKey"]["hint"]
        except (ValueError, TypeError, KeyError):
            return found
        if not isinstance(hint, str) or not hint:
            return found
        hints.append(hint)
    if fingerprint not in hints:
        raise CheckFailed(f"refused the pull, nothing was written: {reference}: none of its {len(hints)} "
                          f"signature(s) is by the key {public_key} (fingerprint {fingerprint[:16]}...), checked "
                          "before any layer was downloaded",
                          hint="check that --verify-key is the public half of the signing key")
    return found


def verify_snapshots(found: list[bytes], snapshots: dict[str, dict[str, str]], public_key: Path,
                     cache_dir: Path | None = None, claims: dict[str, str] | None = None) -> str:
    """Check that each snapshot (``<folder>/<commit>`` -> {path: sha256 hex} of the bytes staged) joined by the
    files the target's snapshot of that commit already has (``cache_dir`` None: none; a planted file is named
    unsigned) verifies with one of the bundles under ``public_key``, then :func:`check_claims` with ``claims``;
    return the key fingerprint.

    Raises:
        SignatureMismatch: a snapshot no bundle signs under the key (the first bundle's reason), or none at all.
        IntegrityError: an entry no signed snapshot accounts for (:func:`check_claims`, exit 3). CheckFailed: a blob
            of the target's snapshot is not its name's content (exit 1). CacheError: an unsafe target snapshot (exit 5).
    """
    from ..integrity.signatures import SignatureMismatch, foreign_model, verify_files

    if not snapshots:  # nothing checked is not "verified": an image of refs, markers or blobs alone is refused
        raise SignatureMismatch("refused the pull, nothing was written: --verify-key was given but the artifact "
                                "brings no snapshot files for a signature to cover", reason="unsigned")
    fingerprint, covered = "", {}
    for name, staged in sorted(snapshots.items()):
        folder, _, commit = name.partition("/")
        repo_id = (parse_folder_name(folder) or (folder,))[0]
        files = {**_held_files(cache_dir, folder, commit), **staged} if cache_dir is not None else staged
        covered[name] = set(files)
        first: SignatureMismatch | None = None
        for bundle in found:
            try:
                check = verify_files(bundle, files, public_key, name=f"{repo_id}@{commit}")
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
            if first is None:  # pragma: no cover - signed_bundles never returns an empty list
                raise CheckFailed(f"{name}: no signature bundle")
            first.message = f"refused the pull, nothing was written: {first.message}"
            first.args = (first.message,)
            if first.hint is None:
                first.hint = "the artifact is not what the key's owner signed; check where it came from"
            raise first
    check_claims(claims or {}, covered)
    return fingerprint


_CRAFTED = "the artifact is altered or crafted: pull it from its source again"


def check_claims(claims: dict[str, str], covered: dict[str, set[str]]) -> None:
    """Refuse (IntegrityError, exit 3, naming the entry) what a signed pull would publish beyond its signatures:
    each of ``claims`` (an entry that is no snapshot file -> the commit it names; "" for a blob no snapshot uses)
    must name a commit ``covered`` (``<folder>/<commit>`` -> its signed paths) in its repo folder, and a ``.no_exist``
    marker must not mark a signed path absent. Refs, markers and listings are judged before blobs."""
    folders: dict[str, set[str]] = {}  # <folder>/<commit> -> the folders of its signed paths (made once)
    for name, commit in sorted(claims.items(), key=lambda claim: (claim[0].split("/")[1] == "blobs", claim[0])):
        folder, section, rest = name.split("/", 2)
        key = f"{folder}/{commit}"
        if key not in covered:
            raise IntegrityError(f"refused the pull, nothing was written: {_unsigned(name, section, commit, covered)}",
                                 hint="a signed pull publishes refs, markers, listings and blobs only about the "
                                      "snapshots it verified (a ref rolled back to an unsigned revision, a blob "
                                      f"nothing uses); {_CRAFTED}")
        if section != ".no_exist":
            continue
        if key not in folders:
            folders[key] = {p.rsplit("/", i)[0] for p in covered[key] for i in range(1, p.count("/") + 1)}
        path = rest.partition("/")[2]
        if _clashes(path, covered[key], folders[key]):
            raise IntegrityError(f"refused the pull, nothing was written: {name} marks {path} absent at commit "
                                 f"{commit[:12]}, whose signature covers it",
                                 hint="huggingface_hub reads a .no_exist marker before the file, so it would hide a "
                                      f"signed file; {_CRAFTED}")


def _unsigned(name: str, section: str, commit: str, covered: dict[str, set[str]]) -> str:
    folder = name.split("/", 1)[0]
    if section == "blobs":
        return f"{name} is used by no snapshot a signature of this pull covers"
    signed = sorted(c for key in covered for f, _, c in (key.partition("/"),) if f == folder)
    said = f"names commit {commit}" if section == "refs" and commit else \
        "holds no commit" if section == "refs" else f"is about commit {commit}"
    return f"{name} {said}, which no signature of this pull covers (signed: " \
           f"{', '.join(c[:12] for c in signed[:5]) or 'no snapshot of that repo'})"


def _clashes(path: str, signed: set[str], folders: set[str]) -> bool:
    """Whether marking ``path`` absent contradicts the ``signed`` paths (``folders``: theirs)."""
    parts = path.split("/")
    return path in signed or path in folders or any("/".join(parts[:i]) in signed for i in range(1, len(parts)))


def ref_commit(head: bytes) -> str:
    """The commit a ref entry's first bytes name, read as the importer reads a ref, or "" when it is not 40 hex."""
    value = head[:MAX_REF_BYTES].decode("utf-8", "replace").strip()
    return value if is_commit(value) else ""


def _held_files(cache_dir: Path, folder: str, commit: str) -> dict[str, str]:
    """{path: sha256 hex} of the target's snapshot ``<folder>/snapshots/<commit>`` ({} when it has none). Raises
    CheckFailed: one of its files does not match its blob name (exit 1)."""
    from ..integrity.signed_snapshot import NameMismatch, snapshot_digests

    parsed = parse_folder_name(folder)
    if parsed is None or not Path(cache_dir, folder, "snapshots", commit).is_dir():
        return {}
    try:
        return snapshot_digests(Path(cache_dir), f"{parsed[0]}@{commit}", repo_type=parsed[1]).files
    except NameMismatch as exc:
        raise changed_on_disk(f"{folder}/snapshots/{commit}/{exc.path}", f"its blob name {exc.name} says") from None
    except CheckFailed:  # no such snapshot (gone meanwhile): nothing held
        return {}


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
        self.blob_entries: dict[str, tuple[str, str]] = {}  # blob entry name (a file or hardlink) -> (folder, etag)

    def note(self, member, stream: HashingStream | None) -> None:
        """One member (after prefix stripping) and the stream its bytes went through (a file), named and read as the
        importer does (``clean_name``; a hardlinked ref's commit is that of the entry it repeats)."""
        parts = clean_name(member.name)
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
        if parts[1] == "blobs" and len(parts) == 3 and member.kind != "symlink":
            self.blob_entries[name] = (parts[0], parts[2])
        if parts[1] == "refs":
            source = name if member.kind == "file" else "/".join(clean_name(member.linkname))
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
            self.files[key] = name if member.kind == "file" else "/".join(clean_name(member.linkname))

    def bound(self) -> dict[str, str]:
        """:attr:`claims`, with every blob entry no snapshot entry of the artifact uses (a link to it, or a hardlink
        repeating its bytes) mapped to "" (:func:`check_claims`)."""
        linked = {(folder, etag) for (folder, _, _), etag in self.links.items()}
        repeated = set(self.files.values())  # the member names whose bytes a snapshot file repeats
        return {**self.claims, **{name: "" for name, blob in self.blob_entries.items()
                                  if blob not in linked and name not in repeated}}

    def snapshots(self, cache_dir: Path) -> dict[str, dict[str, str]]:
        """``<folder>/<commit>`` -> {path: sha256 hex}; a link to a blob the pull did not bring is the target's blob,
        re-hashed against its name ("" when it cannot be read safely: then unsigned). Raises CheckFailed: that blob
        does not hash to its name (exit 1)."""
        out: dict[str, dict[str, str]] = {}
        for (folder, commit, path), etag in self.links.items():
            digest = self.blobs.get((folder, etag))
            if digest is None:
                try:
                    held = rehashed(cache_dir, folder, etag, f"its blob name {etag} says")
                except OSError:
                    held = None
                digest = held[0][SHA256] if held else ""
            out.setdefault(f"{folder}/{commit}", {})[path] = digest
        for (folder, commit, path), source in self.files.items():
            out.setdefault(f"{folder}/{commit}", {})[path] = self.entries.get(source, "")
        return out


class HashingStream:
    """A tar entry's bytes as the importer reads them, hashed (sha256) on the way, the first ones kept (``head``,
    at most import's ``MAX_REF_BYTES``) to read the commit a ref names."""

    def __init__(self, stream) -> None:
        self._stream, self.sha256, self.head = stream, BlobHash(SHA256), b""

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        if len(self.head) < MAX_REF_BYTES:
            self.head += data[:MAX_REF_BYTES - len(self.head)]
        return data
