"""signatures: OpenSSF model-signing v1.0 bundles over a snapshot's files, from the digests hfcache already holds.

A bundle is what ``model_signing sign key`` (sigstore/model-transparency, ``model-signing`` 1.1.1) writes: a Sigstore
bundle (``application/vnd.dev.sigstore.bundle.v0.3+json``) around a DSSE envelope whose in-toto statement
(``predicateType https://model_signing/signature/v1.0``) lists every file of the model with its sha256, signed with
an EC key (P-256, P-384 or P-521; fully offline). hfcache builds that statement from ``{path: sha256}`` (the Hugging
Face LFS etag is the sha256 of the file; the small regular files are hashed), never by walking a folder, and checks
a bundle against such a mapping: the same manifest ``model_signing verify key --allow_symlinks SNAPSHOT_DIR``
computes for ``<cache>/models--ORG--NAME/snapshots/<commit>`` (its symlinks into ``../../blobs`` need
``--allow_symlinks``).

Paths model_signing ignores by default (``.git/``, ``.gitattributes``, ``.github/``, ``.gitignore``: its
``ignore_git_paths``, what ``model_signing verify`` leaves out unless ``--no-ignore-git-paths``) never enter a bundle
hfcache makes, so its bundles verify with the model_signing CLI's defaults; a snapshot holding such a file cannot be
signed whole, and :func:`sign_files` refuses it. A check covers every file present, whatever its name: one the bundle
does not list (a git path, or one below the bundle's own ``serialization.ignore_paths``) is unsigned, so a signed
pull never publishes a file no signature covers (docs/security.md).

``model_signing`` is the optional extra ``sign`` and is imported only when a bundle is made or checked; without it
the error is one line naming ``pip install 'hfcache[sign]'`` (exit 2).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..bounds import TooDeep, loads_json
from ..errors import CheckFailed, UsageError

#: The media type of a model-signing bundle (a Sigstore bundle v0.3), as an OCI artifact type.
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
#: The in-toto predicate type of model-signing v1.0.
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
#: A bundle larger than this is refused unread (a statement of 1,000,000 files is ~150 MB; 64 MiB holds ~400,000).
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
#: What ``model_signing`` leaves out of a model by default (``hashing.Config`` ``ignore_git_paths=True``).
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_INSTALL_HINT = "pip install 'hfcache[sign]'"


class SignatureMismatch(CheckFailed):
    """A bundle does not prove the files (exit 1): a bad signature, the wrong key, or files that differ.

    Attributes:
        unsigned (tuple[str, ...]): files present but not in the bundle.
        changed (tuple[str, ...]): files whose sha256 differs from the bundle's.
        missing (tuple[str, ...]): files in the bundle but not present.
        reason (str): ``files`` for a file difference, ``unsigned`` when no signature is attached
            (:func:`verify_any`), else ``signature`` (bad signature, wrong key, not a model-signing bundle).
    """

    def __init__(self, message: str, *, reason: str, unsigned: tuple[str, ...] = (), changed: tuple[str, ...] = (),
                 missing: tuple[str, ...] = (), hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason, self.unsigned, self.changed, self.missing = reason, unsigned, changed, missing


class NotABundle(SignatureMismatch):
    """The bytes are not a model-signing v1.0 bundle hfcache reads (not JSON, no DSSE envelope, another predicate):
    nothing was checked. ``reason`` is ``signature``; ``why`` (str) says what is wrong. A bundle file the user
    names makes this a usage error (exit 2, :func:`hfcache.integrity.sign.check_signature`); a registry's referrer
    stays exit 1."""

    def __init__(self, why: str) -> None:
        super().__init__(f"the signature bundle is not a model-signing bundle: {why}", reason="signature",
                         hint="give a bundle written by `hfcache sign`, `push --sign-key` or `model_signing sign`")
        self.why = why


@dataclass(frozen=True)
class SignatureCheck:
    """A bundle that verified.

    Attributes:
        model_name (str): the statement's subject name (informative only: model_signing does not check it).
        signed (tuple[str, ...]): the files the bundle signs, sorted (all present with these digests, and nothing
            else present).
        key_fingerprint (str): sha256 hex of the public key's PEM (SubjectPublicKeyInfo), as the bundle's key hint.
        root_digest (str): the statement subject's sha256 (over the file digests in path order).
    """

    model_name: str
    signed: tuple[str, ...]
    key_fingerprint: str
    root_digest: str


def _library():
    """The model_signing modules hfcache uses, imported on first use (the optional extra ``sign``)."""
    try:
        from model_signing import manifest
        from model_signing._hashing import hashing as digests
        from model_signing._signing import sign_ec_key, sign_sigstore_pb, signing
    except ImportError as exc:
        raise UsageError(f"signing needs the model-signing library ({exc.name or exc} is not installed)",
                         hint=_INSTALL_HINT) from None
    return manifest, digests, sign_ec_key, sign_sigstore_pb, signing


def read_user_file(path: Path, what: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a file the user named (a key, a bundle): opened ``O_NONBLOCK`` (a FIFO never
    blocks), a regular file only.

    Raises:
        UsageError: unreadable, not a regular file, or larger than ``limit`` (exit 2, naming it)."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} {path} is larger than {limit} bytes: refused")
    return data


_KEY_LIMIT = 1024 * 1024
#: The environment variable an encrypted signing key's password is read from (never printed, never stored).
PASSWORD_ENV = "HFCACHE_SIGN_KEY_PASSWORD"
#: The hint for an encrypted key without its password (``hfcache sign``).
SIGN_PASSWORD_HINT = f"--password-stdin reads the password from standard input, else {PASSWORD_ENV} holds it"


def env_password() -> bytes | None:
    """The signing key's password from :data:`PASSWORD_ENV` (UTF-8), or None when it is unset or empty."""
    import os

    value = os.environ.get(PASSWORD_ENV)
    return value.encode() if value else None


def ignored_path(path: str, extra: tuple[str, ...] = ()) -> bool:
    """True when ``path`` (``/``-separated, relative) is one model_signing leaves out of a bundle: a git path
    (:data:`GIT_PATHS`) or below one of ``extra`` (a bundle's ``serialization.ignore_paths``). hfcache never leaves
    such a file out of a check: this only explains why a bundle does not list it."""
    pure = PurePosixPath(path)
    return any(pure == PurePosixPath(p) or pure.is_relative_to(p) for p in (*GIT_PATHS, *extra) if p not in ("", "."))


def _checked_files(files: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for path, digest in files.items():
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/") \
                or "\\" in path or "\0" in path:
            raise UsageError(f"cannot sign {path!r}: not a relative path in the snapshot")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise UsageError(f"cannot sign {path}: {digest!r} is not a sha256 hex digest")
        out[path] = digest
    return out


def _load_private_key(private_key: Path, password: bytes | None, hint: str = SIGN_PASSWORD_HINT):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = read_user_file(Path(private_key), "the signing key", _KEY_LIMIT)
    try:
        key = serialization.load_pem_private_key(data, password)
    except TypeError:  # encrypted without a password, or a password for a key that has none
        raise UsageError(f"{private_key}: " + ("the key is encrypted: give its password" if password is None
                                               else "the key is not encrypted: give no password"),
                         hint=hint) from None
    except ValueError:
        raise UsageError(f"{private_key}: not a PEM private key, or the wrong password") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in ("secp256r1", "secp384r1",
                                                                                 "secp521r1"):
        raise UsageError(f"{private_key}: not an EC P-256/P-384/P-521 private key (what model-signing signs with)",
                         hint="openssl ecparam -name prime256v1 -genkey -noout -out key.pem")
    return key


def sign_files(files: Mapping[str, str], model_name: str, private_key: Path, *,
               password: bytes | None = None, password_hint: str = SIGN_PASSWORD_HINT) -> bytes:
    """A model-signing v1.0 bundle (UTF-8 JSON bytes) over ``files``, signed with an EC private key.

    Args:
        files: relative ``/``-separated path in the snapshot -> sha256 hex of the file's content (an LFS etag, or
            the sha256 of a regular file); none may be a git path (:data:`GIT_PATHS`).
        model_name: the statement's subject name (e.g. ``ORG/NAME@<commit>``; informative).
        private_key: a PEM EC private key (P-256 recommended).
        password: the key's password, if it is encrypted. password_hint: the hint of the error for an encrypted key
            without one (where the caller reads a password from).

    Returns:
        The bundle, verifiable by ``model_signing verify key --signature B --public_key P --allow_symlinks
        SNAPSHOT_DIR`` and by :func:`verify_files`.

    Raises:
        UsageError: model-signing not installed, an unreadable/unsupported key or wrong password, a path that is
            not relative, a digest that is not sha256 hex, or nothing to sign.
        CheckFailed: a git path among ``files`` (exit 1, naming it): model_signing leaves such paths out of a
            bundle (and its CLI out of a check), so a bundle could not cover the snapshot whole.
    """
    manifest, digests, sign_ec_key, _pb, signing = _library()
    kept = _checked_files(files)
    git = sorted(p for p in kept if ignored_path(p))
    if git:
        raise CheckFailed(f"cannot sign {_printable(model_name, 120)}: {_named(git)} "
                          f"{'is a git path' if len(git) == 1 else 'are git paths'} ({', '.join(GIT_PATHS)}), which "
                          "model-signing leaves out of every bundle: no signature would cover "
                          f"{'it' if len(git) == 1 else 'them'}",
                          hint="remove it from the snapshot folder (no model load reads it), then sign again: a "
                               "signed pull and `verify --signature` refuse a file the bundle does not list")
    if not kept:
        raise UsageError(f"{model_name}: no file to sign")
    key = _load_private_key(private_key, password, password_hint)
    items = [manifest.FileManifestItem(path=PurePosixPath(p), digest=digests.Digest("sha256", bytes.fromhex(d)))
             for p, d in sorted(kept.items())]
    # Library gap: model_signing 1.1.1 builds a manifest only by hashing a folder (hashing.Config.hash); the
    # serialization description it records for `sign key --allow_symlinks` is the private _FileSerialization.
    serialization = manifest._FileSerialization("sha256", True, sorted(GIT_PATHS))  # noqa: SLF001
    payload = signing.Payload(manifest.Manifest(model_name, items, serialization))
    # Library gap: sign_ec_key.Signer takes a key path only; the key was read and checked above.
    signer = object.__new__(sign_ec_key.Signer)
    signer._private_key = key  # noqa: SLF001
    return signer.sign(payload).bundle.to_json().encode()


def _bundle_document(bundle: bytes) -> dict:
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise UsageError(f"the signature bundle is over {MAX_BUNDLE_BYTES // (1024 * 1024)} MiB: refused")
    try:
        document = loads_json(bundle, "the signature bundle")
    except (TooDeep, ValueError, UnicodeDecodeError) as exc:
        raise _not_a_bundle(f"not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("verificationMaterial"), dict) \
            or not isinstance(document.get("dsseEnvelope"), dict):
        raise _not_a_bundle("no verificationMaterial or dsseEnvelope")
    try:
        statement = loads_json(base64.b64decode(document["dsseEnvelope"].get("payload") or "", validate=True),
                               "the signed statement")
    except (TooDeep, ValueError, UnicodeDecodeError, binascii.Error, TypeError) as exc:
        raise _not_a_bundle(f"its payload is not a JSON statement ({exc})") from None
    if not isinstance(statement, dict) or statement.get("predicateType") != PREDICATE_TYPE:
        said = statement.get("predicateType") if isinstance(statement, dict) else None
        raise _not_a_bundle(f"not a model-signing v1.0 statement (predicateType {_printable(repr(said), 80)})")
    serialization = (statement.get("predicate") or {}).get("serialization") if isinstance(
        statement.get("predicate"), dict) else None
    if not isinstance(serialization, dict) or serialization.get("method") != "files" \
            or serialization.get("hash_type") != "sha256":
        raise _not_a_bundle("hfcache checks bundles of per-file sha256 digests (serialization method 'files', "
                            "hash_type 'sha256') only")
    # As sign_sigstore_pb.Signature.read adjusts a file's dict (library gap: it reads a path, not bytes).
    material = document["verificationMaterial"]
    material.setdefault("tlogEntries", [])
    if isinstance(material.get("publicKey"), dict):
        material["publicKey"].setdefault("hint", None)
        for k in ("rawBytes", "keyDetails"):
            material["publicKey"].pop(k, None)
    return document


def _not_a_bundle(why: str) -> NotABundle:
    return NotABundle(why)


def bundle_identity(bundle: bytes) -> tuple[str, str]:
    """(the model name its statement signs, its key hint: the sha256 hex of the public key's PEM) of a bundle
    :func:`sign_files` made; ``("", "")`` for anything else (nothing is verified here: for labels only).

    Raises:
        Nothing: a bundle that is not one gives ``("", "")``."""
    try:
        document = _bundle_document(bundle)
        statement = loads_json(base64.b64decode(document["dsseEnvelope"]["payload"], validate=True), "the statement")
        name = statement["subject"][0]["name"]
        hint = document["verificationMaterial"]["publicKey"]["hint"]
    except (SignatureMismatch, UsageError, ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return "", ""
    if not isinstance(name, str) or not isinstance(hint, str) or not _SHA256.fullmatch(hint):
        return "", ""
    return _printable(name), hint


def public_key_fingerprint(public_key: Path) -> str:
    """sha256 hex of the PEM SubjectPublicKeyInfo of ``public_key`` (what a bundle's key hint holds).

    Raises:
        UsageError: unreadable, or not a PEM EC public key of a curve model-signing supports."""
    return hashlib.sha256(_public_pem(public_key)[1]).hexdigest()


def _public_pem(public_key: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = read_user_file(Path(public_key), "the verify key", _KEY_LIMIT)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise UsageError(f"{public_key}: not a PEM public key",
                         hint="openssl ec -in key.pem -pubout -out key.pub") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in ("secp256r1", "secp384r1",
                                                                                "secp521r1"):
        raise UsageError(f"{public_key}: not an EC P-256/P-384/P-521 public key (what model-signing verifies)")
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, pem


def _signed_manifest(document: dict, public_key: Path, name: str | None = None):
    """The manifest the bundle signs, after its signature verified with ``public_key``."""
    _manifest, _digests, sign_ec_key, sign_sigstore_pb, _signing = _library()
    from sigstore_models.bundle import v1 as bundle_pb

    key, _pem = _public_pem(public_key)
    try:
        signature = sign_sigstore_pb.Signature(bundle_pb.Bundle.from_dict(document))
    except Exception as exc:  # noqa: BLE001 - pydantic/protobuf validation errors of a hostile bundle
        raise _not_a_bundle(f"malformed ({type(exc).__name__})") from None  # as bundle structure: exit 2
    verifier = object.__new__(sign_ec_key.Verifier)  # library gap: it takes a key path; the key was checked above
    verifier._public_key = key  # noqa: SLF001
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):  # library gap: an old bundle's warning is print()ed to stdout
            return verifier.verify(signature)
    except Exception as exc:  # noqa: BLE001 - InvalidSignature, ValueError (key hint), KeyError of a bad statement
        from cryptography.exceptions import InvalidSignature

        if isinstance(exc, InvalidSignature) or "Key mismatch" in str(exc):
            why = "the signature does not verify with this key (wrong key, or the bundle was altered)"
        else:
            why = f"the signed statement is malformed ({type(exc).__name__})"
        raise SignatureMismatch(f"{name + ': ' if name else ''}{why}: {public_key}", reason="signature",
                                hint="check that --verify-key is the public half of the signing key") from None


def verify_files(bundle: bytes, files: Mapping[str, str], public_key: Path, *,
                 name: str | None = None) -> SignatureCheck:
    """Check a model-signing bundle's signature with ``public_key``, then its file list against ``files``.

    Args:
        bundle: the bundle's bytes (at most :data:`MAX_BUNDLE_BYTES`; JSON read with ``bounds.loads_json``).
        files: relative ``/``-separated path -> sha256 hex of what is present (the snapshot's files).
        public_key: a PEM EC public key.
        name: what the messages call the files (e.g. ``ORG/NAME@<commit>``) [default: the bundle's model name].

    Returns:
        SignatureCheck when the signature verifies and every file is signed with its digest (a git path or a path
        below the bundle's ``ignore_paths`` too: none is left out of the check).

    Raises:
        SignatureMismatch: a bad signature or the wrong key (``reason`` ``signature``); or files unsigned (present,
            not in the bundle), changed (digest differs) or missing (in the bundle, not present), all named in the
            one-line message (``reason`` ``files``).
        UsageError: model-signing not installed, an unreadable or unsupported key, a bundle over the size bound.
    """
    document = _bundle_document(bundle)
    signed = _signed_manifest(document, public_key, name)
    descriptors = list(signed.resource_descriptors())  # in the order the statement's root digest runs over
    expected = {d.identifier: d.digest.digest_hex for d in descriptors}
    present = _checked_files(files)  # every file, whatever its name: what the bundle leaves out is unsigned
    unsigned = tuple(sorted(set(present) - set(expected)))
    missing = tuple(sorted(set(expected) - set(present)))
    changed = tuple(sorted(p for p in set(expected) & set(present) if expected[p] != present[p]))
    if unsigned or missing or changed:
        ignore_paths = signed.serialization_type.get("ignore_paths")
        extra = tuple(str(p) for p in ignore_paths) if isinstance(ignore_paths, (list, tuple)) else ()
        raise _differ(name, str(signed.model_name), unsigned, changed, missing,
                      left_out=tuple(p for p in unsigned if ignored_path(p, extra)))
    root = hashlib.sha256(b"".join(d.digest.digest_value for d in descriptors)).hexdigest()
    return SignatureCheck(model_name=signed.model_name, signed=tuple(sorted(expected)),
                          key_fingerprint=public_key_fingerprint(public_key), root_digest=root)


def foreign_model(check: SignatureCheck, repo_id: str, commit: str) -> SignatureMismatch | None:
    """The refusal of a bundle whose model name is another model's, or None when it names this one.

    A signature vouches for the model it names: hfcache signs ``REPO_ID@COMMIT`` (:func:`sign_files` from
    ``hfcache sign``), the model_signing CLI names the folder it signs (a snapshot folder: the commit). A bundle signed
    for another model that carries the same files used to verify for any repo at any commit. Used by ``verify
    --signature`` (:func:`hfcache.integrity.sign.check_signature`) and ``pull --verify-key``
    (:mod:`hfcache.oci.pull_signed`).

    Args:
        check: what :func:`verify_files` returned. repo_id, commit: the snapshot checked.

    Returns:
        SignatureMismatch (``reason`` ``signature``, exit 1) naming both models, or None.
    """
    shown = f"{repo_id}@{commit}"
    if str(check.model_name) in (shown, repo_id, commit):
        return None
    return SignatureMismatch(f"the bundle signs {_printable(str(check.model_name), 120)}, not {shown}",
                             reason="signature",
                             hint="a signature vouches for the model it names: sign this repo and commit")


def _named(paths) -> str:
    """At most five paths, printable, and how many more."""
    paths = list(paths)
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return ", ".join(_printable(p, 120) for p in paths[:5]) + more


def _differ(name: str | None, model_name: str, unsigned: tuple[str, ...], changed: tuple[str, ...],
            missing: tuple[str, ...], left_out: tuple[str, ...] = ()) -> SignatureMismatch:
    """The exit-1 error of files that differ from a verified bundle's; it names the model the bundle signs when
    that is not ``name`` (the snapshot checked against another repo's or revision's bundle), and says why a file of
    ``left_out`` (unsigned, a path model_signing leaves out of bundles) is not covered."""
    parts = [f"{label} {', '.join(names)}" for label, names in (("changed:", changed), ("unsigned:", unsigned),
                                                                 ("missing:", missing)) if names]
    shown = _printable(model_name)
    other = bool(name) and shown != name
    why = (f" ({_named(left_out)}: model-signing leaves git paths and a bundle's ignore_paths out of a bundle, so "
           "no signature covers them)") if left_out else ""
    message = (f"{name or shown}: the files differ from the signed ones"
               + (f" (the bundle signs {shown}, not {name})" if other else "") + ": " + "; ".join(parts) + why)
    hint = (f"this bundle is for {shown}: check the snapshot against that model's bundle" if other else
            "the snapshot is not what was signed: `hfcache verify` finds damaged files; re-warm it, or sign it again")
    return SignatureMismatch(message, reason="files", unsigned=unsigned, changed=changed, missing=missing, hint=hint)


def _printable(text: str, limit: int = 200) -> str:
    """``text`` (a name a bundle supplies) with control characters replaced, at most ``limit`` characters."""
    cleaned = "".join(c if c.isprintable() else "?" for c in text)
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "..."


def verify_any(bundles: Sequence[bytes], files: Mapping[str, str], public_key: Path, *,
               name: str | None = None) -> SignatureCheck:
    """The check of the first of ``bundles`` (e.g. every referrer of a pushed manifest) that verifies with
    ``public_key`` against ``files``, as :func:`verify_files`.

    Raises:
        SignatureMismatch: no bundle at all (``reason`` ``unsigned``: "no signature is attached"); a bundle signed
            with this key whose files differ (that one's error, naming the files); else none verifies with this key
            (``reason`` ``signature``).
        UsageError: model-signing not installed, an unreadable or unsupported key.
    """
    shown = name or "the files"
    if not bundles:
        raise SignatureMismatch(f"{shown}: no signature is attached", reason="unsigned",
                                hint="sign it (hfcache sign, push --sign-key) or pull without --verify-key")
    differing = None
    for bundle in bundles:
        try:
            return verify_files(bundle, files, public_key, name=name)
        except SignatureMismatch as exc:
            if exc.reason == "files" and differing is None:
                differing = exc
    if differing is not None:
        raise differing
    raise SignatureMismatch(f"{shown}: none of the {len(bundles)} signature(s) verifies with {public_key}",
                            reason="signature", hint="check that --verify-key is the public half of the signing key")
