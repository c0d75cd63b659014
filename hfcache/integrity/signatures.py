"""signatures: OpenSSF model-signing v1.0 bundles over a snapshot's ``{path: sha256}``, never a folder walk.

A bundle is what ``model_signing sign key`` (``model-signing`` 1.1.1) writes: a Sigstore bundle v0.3 around a DSSE
envelope whose in-toto statement lists every file with its sha256, signed with an EC key (offline); it verifies with
``model_signing verify key --allow_symlinks SNAPSHOT_DIR``. A check covers every file present whatever its name
(docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

from ..bounds import TooDeep, loads_json
from ..errors import CheckFailed, UsageError
from ..names import is_sha256

#: The in-toto predicate type of model-signing v1.0.
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
#: A bundle larger than this is refused unread (a statement of 1,000,000 files is ~150 MB; 64 MiB holds ~400,000).
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
#: What ``model_signing`` leaves out of a model by default (``hashing.Config`` ``ignore_git_paths=True``).
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
#: The environment variable an encrypted signing key's password is read from (never printed, never stored).
PASSWORD_ENV = "HFCACHE_SIGN_KEY_PASSWORD"
#: The hint for an encrypted key without its password (``hfcache sign``).
SIGN_PASSWORD_HINT = f"--password-stdin reads the password from standard input, else {PASSWORD_ENV} holds it"
_KEY_LIMIT = 1024 * 1024
_CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing signs with
_WRONG_KEY = "check that --verify-key is the public half of the signing key"


class SignatureMismatch(CheckFailed):
    """A bundle does not prove the files (exit 1). ``reason``: ``files`` (``unsigned``: present, not in the bundle;
    ``changed``: another sha256; ``missing``: in the bundle, not present), ``unsigned`` (no signature attached),
    else ``signature`` (bad signature, wrong key, not a model-signing bundle)."""

    def __init__(self, message: str, *, reason: str, unsigned: tuple[str, ...] = (), changed: tuple[str, ...] = (),
                 missing: tuple[str, ...] = (), hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason, self.unsigned, self.changed, self.missing = reason, unsigned, changed, missing


class NotABundle(SignatureMismatch):
    """The bytes are not a model-signing v1.0 bundle hfcache reads (not JSON, no DSSE envelope, another predicate):
    nothing was checked; ``why`` (str) says what is wrong. Exit 1 (a bundle file the user names: exit 2, ``sign``)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"the signature bundle is not a model-signing bundle: {why}", reason="signature",
                         hint="give a bundle written by `hfcache sign`, `push --sign-key` or `model_signing sign`")
        self.why = why


@dataclass(frozen=True)
class SignatureCheck:
    """A bundle that verified: its ``model_name`` (informative: model_signing does not check it), the files it
    ``signed`` (sorted; all present with these digests, nothing else), the ``key_fingerprint`` (sha256 hex of the
    public key's PEM, as the bundle's key hint) and the ``root_digest`` (over the file digests in path order)."""

    model_name: str
    signed: tuple[str, ...]
    key_fingerprint: str
    root_digest: str


def _upstream() -> SimpleNamespace:
    """model_signing's signing and checking, imported on first use (the extra ``sign``): ``.sign(files, model_name,
    key) -> bytes``, ``.parse(document) -> signature`` (pydantic errors for a malformed bundle), ``.verify(signature,
    key) -> manifest`` (InvalidSignature, ValueError, KeyError). UsageError: model-signing is not installed (exit 2).

    Its public API hashes a folder itself and reads keys and bundles from files; its private API is used here, and
    nowhere else, for a manifest from known digests (``manifest._FileSerialization``: sigstore/model-transparency#568),
    keys and bundles from memory (#559, PR #581), and to silence an old bundle's warning ``verify`` prints to stdout.
    """
    try:
        from model_signing import manifest
        from model_signing._hashing import hashing
        from model_signing._signing import sign_ec_key, sign_sigstore_pb, signing
        from sigstore_models.bundle import v1 as bundle_pb
    except ImportError as exc:
        raise UsageError(f"signing needs the model-signing library ({exc.name or exc} is not installed)",
                         hint="pip install 'hfcache[sign]'") from None

    def keyed(cls, attribute: str, key):
        made = object.__new__(cls)
        setattr(made, attribute, key)
        return made

    def sign(files: Mapping[str, str], model_name: str, key) -> bytes:
        items = [manifest.FileManifestItem(path=PurePosixPath(p), digest=hashing.Digest("sha256", bytes.fromhex(d)))
                 for p, d in sorted(files.items())]
        serialization = manifest._FileSerialization("sha256", True, sorted(GIT_PATHS))  # private: #568
        payload = signing.Payload(manifest.Manifest(model_name, items, serialization))
        return keyed(sign_ec_key.Signer, "_private_key", key).sign(payload).bundle.to_json().encode()

    def verify(signature, key):
        with contextlib.redirect_stdout(io.StringIO()):
            return keyed(sign_ec_key.Verifier, "_public_key", key).verify(signature)

    return SimpleNamespace(sign=sign, verify=verify,
                           parse=lambda document: sign_sigstore_pb.Signature(bundle_pb.Bundle.from_dict(document)))


def read_user_file(path: Path, what: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a file the user named (a key, a bundle), opened ``O_NONBLOCK`` (a FIFO never
    blocks). Raises UsageError (exit 2, naming it): unreadable, not a regular file, or larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UsageError(f"{what} {path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} {path} is larger than {limit} bytes: refused")
    return data


def env_password() -> bytes | None:
    """The signing key's password from :data:`PASSWORD_ENV` (UTF-8), or None when it is unset or empty."""
    value = os.environ.get(PASSWORD_ENV)
    return value.encode() if value else None


def ignored_path(path: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether ``path`` (``/``-separated, relative) is one model_signing leaves out of a bundle: a git path
    (:data:`GIT_PATHS`) or below one of ``extra`` (a bundle's ``serialization.ignore_paths``). This only explains why
    a bundle does not list a file: hfcache never leaves one out of a check."""
    pure = PurePosixPath(path)
    return any(pure == PurePosixPath(p) or pure.is_relative_to(p) for p in (*GIT_PATHS, *extra) if p not in ("", "."))


def _checked_files(files: Mapping[str, str]) -> dict[str, str]:
    for path, digest in files.items():
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/") \
                or "\\" in path or "\0" in path:
            raise UsageError(f"cannot sign {path!r}: not a relative path in the snapshot")
        if not is_sha256(digest):
            raise UsageError(f"cannot sign {path}: {digest!r} is not a sha256 hex digest")
    return dict(files)


def _load_private_key(private_key: Path, password: bytes | None, hint: str):
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
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in _CURVES:
        raise UsageError(f"{private_key}: not an EC P-256/P-384/P-521 private key (what model-signing signs with)",
                         hint="openssl ecparam -name prime256v1 -genkey -noout -out key.pem")
    return key


def _public_key(public_key: Path):
    """(the key, its PEM SubjectPublicKeyInfo). Raises UsageError: unreadable, or no EC key model-signing takes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = read_user_file(Path(public_key), "the verify key", _KEY_LIMIT)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise UsageError(f"{public_key}: not a PEM public key",
                         hint="openssl ec -in key.pem -pubout -out key.pub") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _CURVES:
        raise UsageError(f"{public_key}: not an EC P-256/P-384/P-521 public key (what model-signing verifies)")
    return key, key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_fingerprint(public_key: Path) -> str:
    """sha256 hex of the PEM SubjectPublicKeyInfo of ``public_key`` (a bundle's key hint); UsageError as
    :func:`_public_key`."""
    return hashlib.sha256(_public_key(public_key)[1]).hexdigest()


def sign_files(files: Mapping[str, str], model_name: str, private_key: Path, *,
               password: bytes | None = None, password_hint: str = SIGN_PASSWORD_HINT) -> bytes:
    """A model-signing v1.0 bundle (UTF-8 JSON bytes) over ``files`` (relative ``/``-separated path -> sha256 hex;
    no git path), naming ``model_name`` (e.g. ``ORG/NAME@<commit>``), signed with the PEM EC ``private_key`` (and
    its ``password``; ``password_hint``: the hint of the error for an encrypted key without one).

    Raises UsageError: model-signing not installed, an unreadable/unsupported key or wrong password, a path that is
    not relative, a digest that is not sha256 hex, or nothing to sign; CheckFailed (exit 1): a git path in ``files``.
    """
    library = _upstream()
    kept = _checked_files(files)
    git = sorted(p for p in kept if ignored_path(p))
    if git:
        one = len(git) == 1
        raise CheckFailed(f"cannot sign {_printable(model_name, 120)}: {_named(git)} "
                          f"{'is a git path' if one else 'are git paths'} ({', '.join(GIT_PATHS)}), which "
                          "model-signing leaves out of every bundle: no signature would cover "
                          f"{'it' if one else 'them'}",
                          hint="remove it from the snapshot folder (no model load reads it), then sign again: a "
                               "signed pull and `verify --signature` refuse a file the bundle does not list")
    if not kept:
        raise UsageError(f"{model_name}: no file to sign")
    return library.sign(kept, model_name, _load_private_key(private_key, password, password_hint))


def _bundle_document(bundle: bytes) -> dict:
    """The bundle's JSON, checked to be a model-signing v1.0 bundle of per-file sha256 digests, its key material
    adjusted as ``sign_sigstore_pb.Signature.read`` adjusts a file's. UsageError: over :data:`MAX_BUNDLE_BYTES`."""
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise UsageError(f"the signature bundle is over {MAX_BUNDLE_BYTES // (1024 * 1024)} MiB: refused")
    try:
        document = loads_json(bundle, "the signature bundle")
    except (TooDeep, ValueError, UnicodeDecodeError) as exc:
        raise NotABundle(f"not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("verificationMaterial"), dict) \
            or not isinstance(document.get("dsseEnvelope"), dict):
        raise NotABundle("no verificationMaterial or dsseEnvelope")
    try:
        statement = _statement(document)
    except (TooDeep, ValueError, UnicodeDecodeError, binascii.Error, TypeError) as exc:
        raise NotABundle(f"its payload is not a JSON statement ({exc})") from None
    if not isinstance(statement, dict) or statement.get("predicateType") != PREDICATE_TYPE:
        said = statement.get("predicateType") if isinstance(statement, dict) else None
        raise NotABundle(f"not a model-signing v1.0 statement (predicateType {_printable(repr(said), 80)})")
    predicate = statement.get("predicate")
    serialization = predicate.get("serialization") if isinstance(predicate, dict) else None
    if not isinstance(serialization, dict) or serialization.get("method") != "files" \
            or serialization.get("hash_type") != "sha256":
        raise NotABundle("hfcache checks bundles of per-file sha256 digests (serialization method 'files', "
                         "hash_type 'sha256') only")
    material = document["verificationMaterial"]
    material.setdefault("tlogEntries", [])
    if isinstance(material.get("publicKey"), dict):
        material["publicKey"].setdefault("hint", None)
        for k in ("rawBytes", "keyDetails"):
            material["publicKey"].pop(k, None)
    return document


def _statement(document: dict):
    return loads_json(base64.b64decode(document["dsseEnvelope"].get("payload") or "", validate=True),
                      "the signed statement")


def bundle_identity(bundle: bytes) -> tuple[str, str]:
    """(the model name its statement signs, its key hint: the sha256 hex of the public key's PEM) of a bundle
    :func:`sign_files` made; ``("", "")`` for anything else, never an error (nothing is verified: labels only)."""
    try:
        document = _bundle_document(bundle)
        name = _statement(document)["subject"][0]["name"]
        hint = document["verificationMaterial"]["publicKey"]["hint"]
    except (SignatureMismatch, UsageError, ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return "", ""
    if not isinstance(name, str) or not is_sha256(hint):
        return "", ""
    return _printable(name), hint


def _signed_manifest(document: dict, public_key: Path, name: str | None = None):
    """The manifest the bundle signs, after its signature verified with ``public_key``."""
    library = _upstream()
    key, _pem = _public_key(public_key)
    try:
        signature = library.parse(document)
    except Exception as exc:  # pydantic/protobuf validation errors of a hostile bundle
        raise NotABundle(f"malformed ({type(exc).__name__})") from None  # as bundle structure: exit 2
    try:
        return library.verify(signature, key)
    except Exception as exc:  # InvalidSignature, ValueError (key hint), KeyError of a bad statement
        from cryptography.exceptions import InvalidSignature

        if isinstance(exc, InvalidSignature) or "Key mismatch" in str(exc):
            why = "the signature does not verify with this key (wrong key, or the bundle was altered)"
        else:
            why = f"the signed statement is malformed ({type(exc).__name__})"
        raise SignatureMismatch(f"{name + ': ' if name else ''}{why}: {public_key}", reason="signature",
                                hint=_WRONG_KEY) from None


def verify_files(bundle: bytes, files: Mapping[str, str], public_key: Path, *,
                 name: str | None = None) -> SignatureCheck:
    """Check a bundle's signature with the PEM EC ``public_key``, then its file list against ``files`` (relative
    path -> sha256 hex of what is present); ``name``: what messages call them [default: the bundle's model name].

    Raises SignatureMismatch: a bad signature or the wrong key (``reason`` ``signature``); or files unsigned,
    changed or missing, all named (``reason`` ``files``). UsageError: model-signing not installed, an unreadable or
    unsupported key, a bundle over the size bound.
    """
    signed = _signed_manifest(_bundle_document(bundle), public_key, name)
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
    """The refusal (exit 1) of a bundle naming another model than ``repo_id``/``commit``, or None: a signature vouches
    for the model it names (hfcache signs ``REPO_ID@COMMIT``, the model_signing CLI names the snapshot folder)."""
    shown = f"{repo_id}@{commit}"
    if str(check.model_name) in (shown, repo_id, commit):
        return None
    return SignatureMismatch(f"the bundle signs {_printable(str(check.model_name), 120)}, not {shown}",
                             reason="signature",
                             hint="a signature vouches for the model it names: sign this repo and commit")


def _named(paths) -> str:
    paths = list(paths)
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return ", ".join(_printable(p, 120) for p in paths[:5]) + more


def _differ(name: str | None, model_name: str, unsigned: tuple[str, ...], changed: tuple[str, ...],
            missing: tuple[str, ...], left_out: tuple[str, ...] = ()) -> SignatureMismatch:
    """The error of files that differ from a verified bundle's, naming the model it signs when not ``name`` and why
    ``left_out`` files (paths model_signing leaves out) are not covered."""
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
    """:func:`verify_files` of the first of ``bundles`` (e.g. a manifest's referrers) that verifies.

    Raises SignatureMismatch: no bundle at all (``reason`` ``unsigned``); a bundle signed with this key whose files
    differ (that one's error); else none verifies with this key (``signature``). UsageError: as :func:`verify_files`.
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
                            reason="signature", hint=_WRONG_KEY)
