"""Model-signing bundles as OCI referrers of a pushed manifest (distribution-spec v1.1 "Listing Referrers"; what is
written and read, and why: docs/oci.md "On a registry"): :func:`attach` and :func:`bundles`.
"""

from __future__ import annotations

import random
import time

from ..bounds import TooDeep, loads_json
from ..errors import HubError, UsageError
from ..names import is_oci_digest
from .peer import DOCKER_LIST, DOCKER_MANIFEST, INDEX_TYPE, MANIFEST_TYPE, canonical, digest_of, registry_text
from .registry import check, get_bounded, read_body, request, url
from .upload import upload_bytes

BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
_ANY_MANIFEST = ", ".join((INDEX_TYPE, MANIFEST_TYPE, DOCKER_MANIFEST, DOCKER_LIST))
#: A manifest or referrers index larger than this is refused (distribution's own manifest limit is 4 MiB).
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: A bundle larger than this is refused (as :data:`hfcache.integrity.signatures.MAX_BUNDLE_BYTES`).
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
#: At most this many referrers are read for one subject (each costs two requests).
MAX_REFERRERS = 100
#: Reading a subject's signatures (the listing, every referrer manifest and bundle) ends, all together, within this
#: many metadata deadlines (:meth:`hfcache.oci.registry._RegistryMethods.within`): 100 answers each dripped just
#: inside its own deadline held a pull for minutes.
REFERRER_DEADLINES = 3
_WRITE_TRIES = 8
_SETTLE_CHECKS = 2
_TRANSIENT_TRIES = 3
#: The annotations that say which model and which key a referrer's bundle signs (what a re-push replaces).
MODEL_ANNOTATION = "io.hfcache.signature.model"
KEY_ANNOTATION = "io.hfcache.signature.key"
_PREDICATE = {"dev.sigstore.bundle.predicateType": "https://model_signing/signature/v1.0"}


def _where(container) -> str:
    return f"{container.registry}/{container.api_prefix}"


def _check_subject(subject: dict) -> dict:
    if not isinstance(subject, dict) or not is_oci_digest(subject.get("digest")) \
            or not isinstance(subject.get("size"), int) or isinstance(subject.get("size"), bool) \
            or not isinstance(subject.get("mediaType"), str):
        raise UsageError("a referrer's subject must be a descriptor {mediaType, digest: sha256:<hex>, size}")
    return {"mediaType": subject["mediaType"], "digest": subject["digest"], "size": subject["size"]}


def _annotations(model: str, key: str) -> dict[str, str]:
    out = dict(_PREDICATE)
    if model and key:
        out.update({MODEL_ANNOTATION: model, KEY_ANNOTATION: key})
    return out


def attach(client, container, subject: dict, bundle: bytes, *, model: str = "", key: str = "") -> str:
    """Push ``bundle`` (model-signing JSON, at most :data:`MAX_BUNDLE_BYTES`) as a referrer of ``subject`` (the
    pushed manifest's descriptor ``{mediaType, digest, size}``); return the referrer manifest's digest. ``model``
    (``ORG/NAME@<commit>``) and ``key`` (the sha256 hex of its public key) both given, it is annotated with them and
    replaces earlier hfcache referrers of ``subject`` with the same two; without the referrers API (no
    ``OCI-Subject`` answered) it is listed in the fallback tag's index (:func:`_add_to_fallback`).

    Raises:
        UsageError: a malformed subject, an oversized bundle. RegistryAuthError, HubError, EndpointUnreachable: the
            registry refused, or its fallback tag holds something other than an image index (left alone).
    """
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise UsageError(f"a signature bundle over {MAX_BUNDLE_BYTES // (1024 * 1024)} MiB is not attached")
    subject = _check_subject(subject)
    manifest = canonical({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": BUNDLE_TYPE,
                          "config": {"mediaType": EMPTY_TYPE, "digest": digest_of(EMPTY), "size": len(EMPTY)},
                          "layers": [{"mediaType": BUNDLE_TYPE, "digest": digest_of(bundle), "size": len(bundle)}],
                          "subject": subject, "annotations": _annotations(model, key)})
    digest = digest_of(manifest)
    for blob in (EMPTY, bundle):
        upload_bytes(client, container, blob, "signature", what=f"upload {digest_of(blob)} to {_where(container)}")
    response = client.do_request(url(client, container, "manifests", digest), "PUT", data=manifest,
                                 headers={"Content-Type": MANIFEST_TYPE})
    check(response, f"push the signature of {subject['digest']} to {_where(container)}", 201)
    if response.headers.get("OCI-Subject") == subject["digest"]:
        _delete_replaced(client, container, subject["digest"], digest, model, key)
        return digest  # the registry keeps the referrers list itself
    descriptor = {"mediaType": MANIFEST_TYPE, "digest": digest, "size": len(manifest), "artifactType": BUNDLE_TYPE,
                  "annotations": _annotations(model, key)}
    _add_to_fallback(client, container, subject["digest"], descriptor)
    return digest


def _same_signer(entry: dict, descriptor: dict) -> bool:
    """Whether ``entry`` (a listed referrer) is another hfcache signature of ``descriptor``'s model and key."""
    ours = descriptor.get("annotations") or {}
    theirs = entry.get("annotations")
    if not (ours.get(MODEL_ANNOTATION) and ours.get(KEY_ANNOTATION)) or not isinstance(theirs, dict):
        return False
    return entry.get("artifactType") == BUNDLE_TYPE and entry.get("digest") != descriptor["digest"] \
        and all(theirs.get(name) == ours[name] for name in (MODEL_ANNOTATION, KEY_ANNOTATION))


def _delete_replaced(client, container, subject_digest: str, digest: str, model: str, key: str) -> None:
    """With the referrers API: delete the earlier hfcache referrers of the same model and key (best effort: a
    registry that forbids deletes answers 405 and keeps them; readers take the newest first)."""
    if not (model and key):
        return
    probe = {"digest": digest, "annotations": _annotations(model, key)}
    try:
        listed = _listed(client, container, subject_digest)
    except HubError:  # the signature is attached; a listing that cannot be read leaves the old ones (best effort)
        return
    for entry in listed:
        if _same_signer(entry, probe) and is_oci_digest(entry.get("digest")):
            client.do_request(url(client, container, "manifests", entry["digest"]), "DELETE").close()


def fallback_tag(subject_digest: str) -> str:
    """The referrers tag schema of distribution-spec v1.1: ``sha256-<hex>``."""
    algorithm, _, hexdigest = subject_digest.partition(":")
    return f"{algorithm}-{hexdigest}"


def _add_to_fallback(client, container, subject_digest: str, descriptor: dict) -> None:
    """Add ``descriptor`` to the fallback index of ``subject_digest`` (read-modify-write) and check it stays: without
    conditional PUTs (distribution 2.8) a concurrent writer drops our entry. The index is read back after each write
    and twice more after a jittered pause; a drop seen is written again, at most :data:`_WRITE_TRIES` writes."""
    tag = fallback_tag(subject_digest)
    writes, settled, pause = 0, 0, 0.1
    before: set[str] | None = None  # the same-signer referrers listed before our first write
    while True:
        began = time.monotonic()
        index = _fallback_index(client, container, subject_digest)
        entries = [m for m in (index or {}).get("manifests", []) if isinstance(m, dict)]
        same = {str(m.get("digest")) for m in entries if _same_signer(m, descriptor)}
        if before is None:
            before = same
        ours = any(m.get("digest") == descriptor["digest"] for m in entries)
        if ours or same - before:  # listed, or replaced by a concurrent push of the same model with the same key
            if settled == _SETTLE_CHECKS:
                return
            settled += 1
            time.sleep(pause * (1 + random.random()))  # jitter, not a secret
            continue
        if writes == _WRITE_TRIES:
            raise HubError(f"registry {_where(container)}: the referrers tag {tag} kept changing under "
                           f"{_WRITE_TRIES} updates; the signature was pushed but is not listed",
                           hint="push the signature again when the other pushes have finished")
        document = dict(index or {"schemaVersion": 2, "mediaType": INDEX_TYPE})
        document["manifests"] = [*(m for m in entries if not _same_signer(m, descriptor)), descriptor]
        response = request(client, url(client, container, "manifests", tag), "PUT", _TRANSIENT_TRIES,
                           data=canonical(document), headers={"Content-Type": INDEX_TYPE})
        check(response, f"update the referrers tag {tag} of {_where(container)}", 201)
        writes, settled = writes + 1, 0
        pause = max(pause, 2 * (time.monotonic() - began))


def _get(client, container, kind: str, ref: str, accept: str, limit: int, what: str, tries: int = _TRANSIENT_TRIES):
    """(body or None on a 404, media type) of ``GET /v2/<name>/<kind>/<ref>`` (:func:`.registry.get_bounded`)."""
    body, media_type, _ = get_bounded(client, url(client, container, kind, ref), accept, limit, what, tries)
    if body is not None and len(body) > limit:
        raise HubError(f"{what}: larger than {limit} bytes: refused", hint="this is not a signature hfcache reads")
    return body, media_type


def _json(body: bytes, what: str) -> dict:
    try:
        document = loads_json(body, what)
    except (TooDeep, ValueError, UnicodeDecodeError) as exc:
        raise HubError(f"{what}: not JSON ({registry_text(exc, 120)})", hint="the registry content is corrupt") \
            from None
    if not isinstance(document, dict):
        raise HubError(f"{what}: not a JSON object", hint="the registry content is corrupt")
    return document


def _fallback_index(client, container, subject_digest: str) -> dict | None:
    """The image index at the fallback tag of ``subject_digest``, or None when the tag does not exist. Raises
    HubError: the tag holds something else than an image index (left alone)."""
    tag = fallback_tag(subject_digest)
    what = f"the referrers tag {_where(container)}:{tag}"
    # Every manifest type accepted: a registry answers 404 for a type the Accept header leaves out (distribution
    # 2.8 does for OCI manifests), and a tag holding another tool's image must be seen, never overwritten.
    body, media_type = _get(client, container, "manifests", tag, _ANY_MANIFEST, MAX_MANIFEST_BYTES, what)
    if body is None:
        return None
    index = _json(body, what)
    if index.get("mediaType", media_type) != INDEX_TYPE or not isinstance(index.get("manifests", []), list):
        raise HubError(f"{what} is not an image index ({registry_text(index.get('mediaType') or media_type, 80)}): "
                       "left alone", hint="another tool uses that tag; remove it, or push the signature elsewhere")
    return index


def _listed(client, container, subject_digest: str) -> list[dict]:
    """The referrer descriptors for ``subject_digest``: the referrers API's answer, else the fallback tag's."""
    what = f"the referrers of {subject_digest} in {_where(container)}"
    response = client.do_request(url(client, container, "referrers", subject_digest) + f"?artifactType={BUNDLE_TYPE}",
                                 "GET", headers={"Accept": INDEX_TYPE}, stream=True)
    index = None
    if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(INDEX_TYPE):
        body = read_body(response, MAX_MANIFEST_BYTES + 1, container.registry)
        if len(body) > MAX_MANIFEST_BYTES:
            raise HubError(f"{what}: larger than {MAX_MANIFEST_BYTES} bytes: refused",
                           hint="this is not a referrers list hfcache reads; check the registry")
        index = _json(body, what)
    else:  # 404 (or any answer but an index): no referrers API, as distribution-spec v1.1 says to read it
        response.close()
        index = _fallback_index(client, container, subject_digest) or {}
    entries = index.get("manifests", [])
    return [m for m in entries if isinstance(m, dict)] if isinstance(entries, list) else []


def bundles(client, container, subject_digest: str) -> list[bytes]:
    """The model-signing bundles attached to the manifest ``subject_digest`` in ``container``'s repository, newest
    (listed last) first, each checked against its digest and size; [] for none. At most :data:`MAX_REFERRERS` are
    read, within :data:`REFERRER_DEADLINES`; other artifact types and manifests of another ``subject`` are skipped.

    Raises:
        UsageError: a malformed digest. RegistryAuthError, HubError, EndpointUnreachable: the registry refused, a
            listed manifest or bundle is over its bound or does not match its digest, a deadline passed.
    """
    if not is_oci_digest(subject_digest):
        raise UsageError(f"{subject_digest!r} is not a sha256:<hex> digest")
    out: list[bytes] = []
    seen: set[str] = set()
    with client.within(REFERRER_DEADLINES, f"registry {_where(container)}: the signatures of {subject_digest[:19]}... "
                                           f"(every referrer together, {REFERRER_DEADLINES} metadata deadlines)"):
        for entry in reversed(_listed(client, container, subject_digest)):
            digest = entry.get("digest")
            if entry.get("artifactType") != BUNDLE_TYPE or not is_oci_digest(digest) or digest in seen:
                continue
            seen.add(digest)
            if len(seen) > MAX_REFERRERS:
                break
            bundle = _bundle_of(client, container, digest, subject_digest)
            if bundle is not None:
                out.append(bundle)
    return out


def _verified(body: bytes, digest: str, what: str) -> bytes:
    if digest_of(body) != digest:
        raise HubError(f"{what}: its content does not match its digest", hint="the registry content was altered")
    return body


def _bundle_of(client, container, digest: str, subject_digest: str) -> bytes | None:
    what = f"signature {digest} in {_where(container)}"
    body, _ = _get(client, container, "manifests", digest, MANIFEST_TYPE, MAX_MANIFEST_BYTES, what, 1)
    if body is None:
        return None  # listed but gone (deleted since): not a signature any more
    manifest = _json(_verified(body, digest, what), what)
    subject = manifest.get("subject")
    if not isinstance(subject, dict) or subject.get("digest") != subject_digest:
        return None
    listed = manifest.get("layers")
    if not isinstance(listed, list):  # a number or true here was a TypeError (exit 70): not a bundle referrer
        return None
    layers = [x for x in listed if isinstance(x, dict) and x.get("mediaType") == BUNDLE_TYPE]
    if len(layers) != 1 or not is_oci_digest(layers[0].get("digest")):
        return None
    size = layers[0].get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_BUNDLE_BYTES:
        raise HubError(f"{what}: its bundle declares {registry_text(size, 40)} bytes (at most {MAX_BUNDLE_BYTES})",
                       hint="this is not a signature hfcache reads; the registry content is altered or crafted")
    blob, _ = _get(client, container, "blobs", layers[0]["digest"], "*/*", size, f"{what}: bundle", 1)
    if blob is None:
        raise HubError(f"{what}: its bundle {layers[0]['digest']} is missing", hint="push the signature again")
    return _verified(blob, layers[0]["digest"], f"{what}: bundle")
