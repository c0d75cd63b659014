"""referrers: a model-signing bundle attached to a pushed manifest as an OCI referrer (distribution-spec v1.1).

:func:`attach` pushes an artifact manifest whose ``subject`` is the pushed manifest's descriptor, ``artifactType``
``application/vnd.dev.sigstore.bundle.v0.3+json``, the empty config (``application/vnd.oci.empty.v1+json``, ``{}``)
and one layer: the bundle. A registry with the referrers API says so by answering the manifest PUT with an
``OCI-Subject`` header; any other (Debian's ``docker-registry``, distribution 2.8) gets the spec's tag fallback: the
image index at tag ``sha256-<hex of the subject digest>`` lists the referrers' descriptors (``artifactType``, the
referrer's annotations). It is updated read-modify-write: ours is added once; an earlier hfcache referrer of the same
subject for the same model (``io.hfcache.signature.model``) and key (``io.hfcache.signature.key``, the sha256 of the
public key) is dropped from it (an ECDSA signature differs at each re-push: without that, re-pushes pile up and push
the newest past what a reader reads); every other descriptor (other models, other keys, other tools') is kept. The
index is read back after the PUT, and again after pauses, and the write repeated while another client's
concurrent write dropped ours (distribution 2.8 has no conditional PUT); a concurrent push of the same model with
the same key that replaced ours is taken as ours. With the referrers API, those earlier referrers are deleted
(``DELETE`` by digest; a registry that forbids deletes keeps them, and readers take the newest first). Not
guaranteed: a concurrent writer whose PUT lands after those checks can still drop our entry (the referrer manifest
itself stays, pushed by digest).

:func:`bundles` asks ``GET /v2/<name>/referrers/<digest>?artifactType=...`` first, then the tag fallback, and fetches
each bundle by digest: every manifest and blob is bounded in size, checked against its digest, and a referrer whose
own ``subject`` is not the one asked for (an index can list anything) is skipped. The newest (listed last) are read
first.

All requests go through :mod:`hfcache.oci.registry`'s client (credentials bound to the registry's origin, metadata
deadlines, bounded bodies).
"""

from __future__ import annotations

import hashlib
import json
import random
import time

from ..bounds import TooDeep, loads_json
from ..errors import HubError, UsageError
from .peer import registry_text
from .registry import DIGEST, check, read_body, url

BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
_ANY_MANIFEST = ", ".join((INDEX_TYPE, MANIFEST_TYPE, "application/vnd.docker.distribution.manifest.v2+json",
                           "application/vnd.docker.distribution.manifest.list.v2+json"))
#: A manifest or referrers index larger than this is refused (distribution's own manifest limit is 4 MiB).
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: A bundle larger than this is refused (as :data:`hfcache.integrity.signatures.MAX_BUNDLE_BYTES`).
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
#: At most this many referrers are read for one subject (each costs two requests).
MAX_REFERRERS = 100
_WRITE_TRIES = 8
_SETTLE_CHECKS = 2
_TRANSIENT_TRIES = 3
#: The annotations that say which model and which key a referrer's bundle signs (what a re-push replaces).
MODEL_ANNOTATION = "io.hfcache.signature.model"
KEY_ANNOTATION = "io.hfcache.signature.key"
_PREDICATE = {"dev.sigstore.bundle.predicateType": "https://model_signing/signature/v1.0"}


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _where(container) -> str:
    return f"{container.registry}/{container.api_prefix}"


def _upload_bytes(client, container, data: bytes) -> str:
    """Upload ``data`` as a blob unless the registry has it (HEAD); return its digest."""
    digest = _sha256(data)
    head = client.do_request(url(client, container, "blobs", digest), "HEAD")
    if head.status_code == 200:
        return digest
    started = client.do_request(f"{client.prefix}://{container.upload_blob_url()}", "POST",
                                headers={"Content-Length": "0"})
    check(started, f"start upload to {_where(container)}", 202)
    location = client._get_location(started, container)  # noqa: SLF001 - oras: makes a relative Location absolute
    if not location:
        raise HubError(f"registry {container.registry}: no upload location in its answer",
                       hint="the registry does not speak the distribution API's blob upload")
    separator = "&" if "?" in location else "?"
    done = client.do_request(f"{location}{separator}digest={digest}", "PUT", data=data,
                             headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
    check(done, f"upload {digest} to {_where(container)}", 201, 204)
    return digest


def _check_subject(subject: dict) -> dict:
    if not isinstance(subject, dict) or not DIGEST.fullmatch(str(subject.get("digest"))) \
            or not isinstance(subject.get("size"), int) or isinstance(subject.get("size"), bool) \
            or not isinstance(subject.get("mediaType"), str):
        raise UsageError("a referrer's subject must be a descriptor {mediaType, digest: sha256:<hex>, size}")
    return {"mediaType": subject["mediaType"], "digest": subject["digest"], "size": subject["size"]}


def _annotations(model: str, key: str) -> dict[str, str]:
    out = dict(_PREDICATE)
    if model and key:
        out.update({MODEL_ANNOTATION: model, KEY_ANNOTATION: key})
    return out


def referrer_manifest(subject: dict, bundle: bytes, model: str = "", key: str = "") -> bytes:
    """The canonical JSON of the artifact manifest :func:`attach` pushes for ``bundle`` about ``subject`` (with
    ``model`` and ``key`` both given: annotated with them)."""
    return _canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": BUNDLE_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": _sha256(EMPTY), "size": len(EMPTY)},
        "layers": [{"mediaType": BUNDLE_TYPE, "digest": _sha256(bundle), "size": len(bundle)}],
        "subject": _check_subject(subject),
        "annotations": _annotations(model, key),
    })


def attach(client, container, subject: dict, bundle: bytes, *, model: str = "", key: str = "") -> str:
    """Push ``bundle`` as a referrer of ``subject`` in ``container``'s repository; return the referrer's digest.

    Args:
        client, container: :func:`hfcache.oci.registry.connect` and :func:`~hfcache.oci.registry.parse_reference`.
        subject: the pushed manifest's descriptor ``{mediaType, digest, size}``.
        bundle: the model-signing bundle (JSON bytes, at most :data:`MAX_BUNDLE_BYTES`).
        model, key: the model the bundle signs (``ORG/NAME@<commit>``) and the sha256 hex of its public key: both
            given, the referrer is annotated with them and replaces earlier hfcache referrers of ``subject`` with
            the same two (module docstring); else it is only added.

    Returns:
        ``sha256:<hex>`` of the referrer manifest.

    Raises:
        UsageError: a malformed subject, an oversized bundle. RegistryAuthError, HubError, EndpointUnreachable: the
            registry refused, or its fallback tag holds something other than an image index (left alone).
    """
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise UsageError(f"a signature bundle over {MAX_BUNDLE_BYTES // (1024 * 1024)} MiB is not attached")
    subject = _check_subject(subject)
    manifest = referrer_manifest(subject, bundle, model, key)
    digest = _sha256(manifest)
    _upload_bytes(client, container, EMPTY)
    _upload_bytes(client, container, bundle)
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
    """True when ``entry`` (a listed referrer) is another hfcache signature of the model and key of
    ``descriptor``: what attaching ``descriptor`` replaces."""
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
        if _same_signer(entry, probe) and DIGEST.fullmatch(str(entry.get("digest"))):
            client.do_request(url(client, container, "manifests", entry["digest"]), "DELETE").close()


def fallback_tag(subject_digest: str) -> str:
    """The referrers tag schema of distribution-spec v1.1: ``sha256-<hex>``."""
    algorithm, _, hexdigest = subject_digest.partition(":")
    return f"{algorithm}-{hexdigest}"


def _add_to_fallback(client, container, subject_digest: str, descriptor: dict) -> None:
    """Add ``descriptor`` to the fallback index of ``subject_digest`` (read-modify-write), then check it stays.

    Without conditional PUTs (distribution 2.8) a writer whose GET came before our PUT drops our entry with its own
    PUT. So the index is read back after each write, and again twice after a pause (twice the time of one
    read-and-write round, at least 0.1 s, with jitter): a drop seen there is written again, at most
    :data:`_WRITE_TRIES` writes in all."""
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
            time.sleep(pause * (1 + random.random()))  # noqa: S311 - jitter, not a secret
            continue
        if writes == _WRITE_TRIES:
            raise HubError(f"registry {_where(container)}: the referrers tag {tag} kept changing under "
                           f"{_WRITE_TRIES} updates; the signature was pushed but is not listed",
                           hint="push the signature again when the other pushes have finished")
        document = dict(index or {"schemaVersion": 2, "mediaType": INDEX_TYPE})
        document["manifests"] = [*(m for m in entries if not _same_signer(m, descriptor)), descriptor]
        response = _request(client, url(client, container, "manifests", tag), "PUT", data=_canonical(document),
                            headers={"Content-Type": INDEX_TYPE})
        check(response, f"update the referrers tag {tag} of {_where(container)}", 201)
        writes, settled = writes + 1, 0
        pause = max(pause, 2 * (time.monotonic() - began))


def _request(client, address: str, method: str, **kwargs):
    """``client.do_request``, repeated (at most :data:`_TRANSIENT_TRIES` times, 0.2 s, 0.4 s apart) while the
    registry answers 500-504: distribution 2.8 answers 500 to a read of a tag another client is writing."""
    for attempt in range(_TRANSIENT_TRIES):
        response = client.do_request(address, method, **kwargs)
        if response.status_code not in (500, 502, 503, 504) or attempt == _TRANSIENT_TRIES - 1:
            return response
        response.close()
        time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _get(client, container, kind: str, ref: str, accept: str, limit: int, what: str):
    """(status, body bytes or None, media type) of ``GET /v2/<name>/<kind>/<ref>``; 404 gives (404, None, '')."""
    response = _request(client, url(client, container, kind, ref), "GET", headers={"Accept": accept}, stream=True)
    if response.status_code == 404:
        response.close()
        return 404, None, ""
    check(response, what, 200)
    body = read_body(response, limit + 1, container.registry)
    if len(body) > limit:
        raise HubError(f"{what}: larger than {limit} bytes: refused", hint="this is not a signature hfcache reads")
    return 200, body, response.headers.get("Content-Type", "").split(";")[0].strip()


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
    """The image index at the fallback tag of ``subject_digest``, or None when the tag does not exist.

    Raises:
        HubError: the tag holds something else than an image index (left alone)."""
    tag = fallback_tag(subject_digest)
    what = f"the referrers tag {_where(container)}:{tag}"
    # Every manifest type accepted: a registry answers 404 for a type the Accept header leaves out (distribution
    # 2.8 does for OCI manifests), and a tag holding another tool's image must be seen, never overwritten.
    status, body, media_type = _get(client, container, "manifests", tag, _ANY_MANIFEST, MAX_MANIFEST_BYTES, what)
    if status == 404:
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
    """Every model-signing bundle attached to ``subject_digest`` in ``container``'s repository, the newest (listed
    last) first.

    Args:
        client, container: as for :func:`attach`. subject_digest: ``sha256:<hex>`` of the signed manifest.

    Returns:
        The bundles' bytes (each checked against its digest and size, at most :data:`MAX_BUNDLE_BYTES`); an empty
        list when the subject has none. At most :data:`MAX_REFERRERS` are read; referrers of other artifact types,
        and listed manifests whose own ``subject`` is another, are skipped.

    Raises:
        UsageError: a malformed digest. RegistryAuthError, HubError, EndpointUnreachable: the registry refused, a
            listed manifest or bundle is over its bound or does not match its digest.
    """
    if not DIGEST.fullmatch(subject_digest or ""):
        raise UsageError(f"{subject_digest!r} is not a sha256:<hex> digest")
    out: list[bytes] = []
    seen: set[str] = set()
    for entry in reversed(_listed(client, container, subject_digest)):
        digest = entry.get("digest")
        if entry.get("artifactType") != BUNDLE_TYPE or not DIGEST.fullmatch(str(digest)) or digest in seen:
            continue
        seen.add(digest)
        if len(seen) > MAX_REFERRERS:
            break
        bundle = _bundle_of(client, container, digest, subject_digest)
        if bundle is not None:
            out.append(bundle)
    return out


def _verified(body: bytes, digest: str, what: str) -> bytes:
    if _sha256(body) != digest:
        raise HubError(f"{what}: its content does not match its digest", hint="the registry content was altered")
    return body


def _bundle_of(client, container, digest: str, subject_digest: str) -> bytes | None:
    what = f"signature {digest} in {_where(container)}"
    status, body, _ = _get(client, container, "manifests", digest, MANIFEST_TYPE, MAX_MANIFEST_BYTES, what)
    if status == 404:
        return None  # listed but gone (deleted since): not a signature any more
    manifest = _json(_verified(body, digest, what), what)
    subject = manifest.get("subject")
    if not isinstance(subject, dict) or subject.get("digest") != subject_digest:
        return None
    listed = manifest.get("layers")
    if not isinstance(listed, list):  # a number or true here was a TypeError (exit 70): not a bundle referrer
        return None
    layers = [x for x in listed if isinstance(x, dict) and x.get("mediaType") == BUNDLE_TYPE]
    if len(layers) != 1 or not DIGEST.fullmatch(str(layers[0].get("digest"))):
        return None
    size = layers[0].get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_BUNDLE_BYTES:
        raise HubError(f"{what}: its bundle declares {registry_text(size, 40)} bytes (at most {MAX_BUNDLE_BYTES})",
                       hint="this is not a signature hfcache reads; the registry content is altered or crafted")
    status, blob, _ = _get(client, container, "blobs", layers[0]["digest"], "*/*", size, f"{what}: bundle")
    if status == 404:
        raise HubError(f"{what}: its bundle {layers[0]['digest']} is missing", hint="push the signature again")
    return _verified(blob, layers[0]["digest"], f"{what}: bundle")
