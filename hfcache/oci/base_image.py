"""``hfcache push --base IMAGE``: the cache's layers on top of a base image with a shell (KServe's Modelcar runs
``sh -c`` in the model image), for the image format.

The base must be on the registry pushed to (its blobs are mounted into the target repository with the distribution
API's cross-repository mount, ``POST /v2/<name>/blobs/uploads/?mount=<digest>&from=<base>``; where the registry
answers 202 instead, the blob is copied through a temporary file, its digest checked): credentials are never sent
to a second registry, and nothing is fetched from a registry the user did not name. Copy a public base there first
(``skopeo copy docker://docker.io/library/busybox@sha256:... docker://REGISTRY/library/busybox@sha256:...``).

The result keeps the base's layers first, then the cache's; its config keeps the base's ``os``, ``architecture``,
``variant`` and ``Env``/``Entrypoint``/``Cmd``/``WorkingDir``/``User``, nothing else (no history, no creation time),
so the digest is reproducible for the same base digest. An index (a multi-platform base) is resolved to the
manifest for ``linux`` and the requested architecture.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..bounds import loads_json
from ..errors import CacheError, HubError, IntegrityError, UsageError
from .peer import json_kind, size_ok
from .registry import BlobBody, check, parse_reference, read_body, registry_text, url

__all__ = ["BASE_LAYERS", "BaseImage", "artifact_kind", "base_annotations", "mount_base", "read_base"]

_MAX_JSON = 4 * 1024 * 1024
_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
#: base layer media types kept, and what they become in the OCI manifest (the same bytes)
_LAYERS = {"application/vnd.oci.image.layer.v1.tar+gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
           "application/vnd.oci.image.layer.v1.tar": "application/vnd.oci.image.layer.v1.tar",
           "application/vnd.oci.image.layer.v1.tar+zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
           "application/vnd.docker.image.rootfs.diff.tar.gzip": "application/vnd.oci.image.layer.v1.tar+gzip"}
_KEPT = ("Env", "Entrypoint", "Cmd", "WorkingDir", "User")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
#: The manifest annotation ``push --base`` writes: the base's layer digests (comma-separated, in order), which are
#: the manifest's first layers; ``pull`` skips them (an OS, not cache content).
BASE_LAYERS = "io.hfcache.base.layers"
_HINT = "give a base image on the registry you push to, by tag or digest (e.g. REGISTRY/library/busybox@sha256:...)"


@dataclass(frozen=True)
class BaseImage:
    """A base image read from the registry.

    Attributes:
        reference (str): as given; digest (str): its manifest's ``sha256:<hex>`` (of the platform manifest).
        repository (str): its name on the registry (``library/busybox``).
        layers (tuple[dict, ...]): its layer descriptors (mediaType made OCI, digest, size).
        diff_ids (tuple[str, ...]); os, architecture, variant (str); config (dict): the kept ``config`` fields.
    """

    reference: str
    digest: str
    repository: str
    layers: tuple[dict, ...]
    diff_ids: tuple[str, ...]
    os: str
    architecture: str
    variant: str
    config: dict


def _get(client, container, kind: str, ref: str, accept: str, what: str) -> tuple[dict, bytes, str]:
    """A manifest or config of the base (at most 4 MiB, JSON read with ``bounds.loads_json``), its digest checked
    when ``ref`` is one. Returns (document, body, media type)."""
    response = client.do_request(url(client, container, kind, ref), "GET", headers={"Accept": accept}, stream=True)
    with response:
        if response.status_code == 404:
            raise UsageError(f"--base {what}: not found on {container.registry}", hint=_HINT)
        check(response, f"--base {what}", 200)
        body = read_body(response, _MAX_JSON + 1, container.registry)
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    if len(body) > _MAX_JSON:
        raise UsageError(f"--base {what}: larger than {_MAX_JSON} bytes", hint=_HINT)
    if _DIGEST.fullmatch(ref) and f"sha256:{hashlib.sha256(body).hexdigest()}" != ref:
        raise IntegrityError(f"--base {what}: content does not match its digest {ref}",
                             hint="the registry's copy is altered; copy the base there again")
    try:
        document = loads_json(body, f"--base {what}")
    except (ValueError, RecursionError):
        raise UsageError(f"--base {what}: not JSON", hint=_HINT) from None
    if not isinstance(document, dict):
        raise UsageError(f"--base {what}: not a JSON object", hint=_HINT)
    declared = document.get("mediaType")
    if declared is not None and not isinstance(declared, str):
        raise UsageError(f"--base {what}: its mediaType is {json_kind(declared)}, not a text", hint=_HINT)
    return document, body, declared or media_type


_MODEL_MANIFEST = "application/vnd.cncf.model.manifest.v1+json"
_MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
_SIGNATURE_PREFIX = "application/vnd.dev.sigstore.bundle"


def artifact_kind(manifest: dict) -> str:
    """What an OCI artifact manifest is, in words (``""`` for a plain image): a ModelPack artifact, a signature (a
    Sigstore bundle referrer) or another artifact, each naming its ``artifactType`` (registry text made inert)."""
    declared = manifest.get("artifactType")
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    kind = declared if isinstance(declared, str) and declared else None
    if kind is None and config.get("mediaType") == _MODEL_CONFIG:
        kind = _MODEL_MANIFEST
    if kind is None:
        return ""
    shown = registry_text(kind, 80)
    if kind == _MODEL_MANIFEST:
        return f"a ModelPack artifact ({shown})"
    if kind.startswith(_SIGNATURE_PREFIX):
        return f"a signature, an OCI referrer ({shown})"
    return f"an OCI artifact ({shown})"


def read_base(client, target, reference: str, arch: str) -> BaseImage:
    """Read the base image ``reference`` (on ``target``'s registry) for ``linux/<arch>``.

    Raises:
        UsageError: on another registry, not found, not an image (an artifact, a foreign layer), no manifest for
            the platform (exit 2). IntegrityError: a document does not match its digest. HubError: the registry
            refused.
    """
    base = parse_reference(reference)
    if base.registry != target.registry:
        raise UsageError(f"--base {reference}: on {base.registry}, not on {target.registry} (pushed to)",
                         hint="copy it there first: skopeo copy docker://BASE docker://" + target.registry + "/...")
    ref = base.digest or base.tag
    accept = ", ".join((_OCI_MANIFEST, _DOCKER_MANIFEST, *_INDEXES))
    manifest, body, media_type = _get(client, base, "manifests", ref, accept, reference)
    if media_type in _INDEXES:
        listed = manifest.get("manifests")
        if not isinstance(listed, list):
            raise UsageError(f"--base {reference}: its index's manifests are {json_kind(listed)}, not a list",
                             hint=_HINT)
        entries = [m for m in listed if isinstance(m, dict) and isinstance(m.get("platform"), dict)
                   and m["platform"].get("os") == "linux" and m["platform"].get("architecture") == arch]
        if not entries or not _DIGEST.fullmatch(str(entries[0].get("digest"))):
            raise UsageError(f"--base {reference}: no linux/{arch} image in its index",
                             hint="give --arch of an architecture the base has, or its platform manifest's digest")
        ref = entries[0]["digest"]
        manifest, body, media_type = _get(client, base, "manifests", ref, accept, f"{reference} ({arch})")
    kind = artifact_kind(manifest)
    if kind:
        raise UsageError(f"--base {reference}: {kind}, not a container image", hint=_HINT)
    if media_type not in (_OCI_MANIFEST, _DOCKER_MANIFEST):
        raise UsageError(f"--base {reference}: not a container image ({registry_text(media_type, 80)})", hint=_HINT)
    layers = []
    listed = manifest.get("layers", [])
    if not isinstance(listed, list):
        raise UsageError(f"--base {reference}: its layers are {json_kind(listed)}, not a list", hint=_HINT)
    for layer in listed:
        kind = layer.get("mediaType") if isinstance(layer, dict) else None
        if not isinstance(kind, str) or kind not in _LAYERS or not _DIGEST.fullmatch(str(layer.get("digest"))) \
                or not size_ok(layer.get("size")):
            shown = registry_text(kind, 80) if isinstance(kind, str) else f"media type {json_kind(kind)}"
            raise UsageError(f"--base {reference}: a layer hfcache does not copy ({shown}, or a malformed digest or "
                             "size)", hint=_HINT)
        layers.append({"mediaType": _LAYERS[kind], "digest": layer["digest"], "size": layer["size"]})
    config = manifest.get("config")
    config_ref = config.get("digest") if isinstance(config, dict) else None
    if not _DIGEST.fullmatch(str(config_ref)):
        raise UsageError(f"--base {reference}: its manifest names no config", hint=_HINT)
    config, _, _ = _get(client, base, "blobs", config_ref, "*/*", f"{reference} config")
    return _base_of(reference, base, f"sha256:{hashlib.sha256(body).hexdigest()}", layers, config, arch)


def _base_of(reference: str, base, digest: str, layers: list[dict], config: dict, arch: str) -> BaseImage:
    """The BaseImage of a read manifest and config.

    Raises:
        UsageError: its config's diff_ids do not match its layers, or it is for another platform.
    """
    rootfs = config.get("rootfs") if isinstance(config.get("rootfs"), dict) else {}
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs.get("diff_ids"), list) else []
    if len(diff_ids) != len(layers) or not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in diff_ids):
        raise UsageError(f"--base {reference}: its config's diff_ids do not match its layers", hint=_HINT)
    if config.get("os") != "linux" or config.get("architecture") != arch:
        raise UsageError(f"--base {reference}: an image for {registry_text(config.get('os'), 20)}/"
                         f"{registry_text(config.get('architecture'), 20)}, not linux/{arch}",
                         hint="pass --arch to match the base, or a base for this architecture")
    inner = config.get("config") if isinstance(config.get("config"), dict) else {}
    kept = {k: inner[k] for k in _KEPT if k in inner and _kept_value(k, inner[k])}
    variant = config.get("variant") if isinstance(config.get("variant"), str) else ""
    return BaseImage(reference, digest, base.api_prefix, tuple(layers), tuple(diff_ids), "linux", arch, variant,
                     kept)


def _kept_value(key: str, value: object) -> bool:
    """Whether a base config's ``key`` holds what image-spec ``config.md`` says: ``WorkingDir`` and ``User`` a text,
    ``Env``, ``Entrypoint`` and ``Cmd`` a list of texts (anything else is dropped, never copied into the image)."""
    if key in ("WorkingDir", "User"):
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def base_annotations(container, based: BaseImage) -> dict[str, str]:
    """The manifest annotations of ``push --base``: the base by digest only (``REGISTRY/NAME@sha256:...``, however it
    was typed: a tag and its digest give the same image digest) and ``io.hfcache.base.layers``, the digests of the
    base's layers (the first ones of the manifest), which ``pull`` skips without downloading: not cache content."""
    return {"org.opencontainers.image.base.name": f"{container.registry}/{based.repository}@{based.digest}",
            "org.opencontainers.image.base.digest": based.digest,
            BASE_LAYERS: ",".join(layer["digest"] for layer in based.layers)}


def mount_base(client, target, base: BaseImage, workdir: Path) -> int:
    """Make each base layer a blob of ``target``'s repository: present (HEAD), mounted from the base's repository,
    or copied (its digest checked). Returns the bytes copied.

    Raises:
        IntegrityError: a copied blob does not match its digest. HubError, RegistryAuthError: the registry refused.
        CacheError: ``workdir`` is full.
    """
    copied = 0
    for layer in base.layers:
        digest = layer["digest"]
        if client.do_request(url(client, target, "blobs", digest), "HEAD").status_code == 200:
            continue
        address = f"{client.prefix}://{target.registry}/v2/{target.api_prefix}/blobs/uploads/"
        started = client.do_request(f"{address}?mount={digest}&from={base.repository}", "POST",
                                    headers={"Content-Length": "0"})
        if started.status_code == 201:
            continue
        check(started, f"mount {digest} from {base.repository}", 202)
        location = client._get_location(started, target)  # oras: makes a relative Location absolute
        if not location:
            raise HubError(f"registry {target.registry}: no upload location in its answer",
                           hint="the registry does not speak the distribution API's blob upload")
        copied += _copy_blob(client, target, base, layer, location, workdir)
    return copied


def _copy_blob(client, target, base: BaseImage, layer: dict, location: str, workdir: Path) -> int:
    """Copy one base blob (a registry without cross-repository mounts) through a temporary file; its size."""
    digest, size = layer["digest"], layer["size"]
    source = parse_reference(f"{target.registry}/{base.repository}@{digest}")
    response = client.do_request(url(client, source, "blobs", digest), "GET", stream=True)
    with response:
        check(response, f"--base blob {digest}", 200)
        body, h, got = BlobBody(response, target.registry, f"base layer {digest}"), hashlib.sha256(), 0
        try:
            with tempfile.NamedTemporaryFile(dir=workdir, prefix="base-", delete=False) as out:
                while chunk := body.read(1024 * 1024):
                    got += len(chunk)
                    if got > size:
                        break
                    h.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            raise CacheError(f"push --base: writing a base layer under {workdir} failed: {exc.strerror or exc}",
                             hint="point TMPDIR at a filesystem with room for the base image") from exc
    if got != size or f"sha256:{h.hexdigest()}" != digest:
        raise IntegrityError(f"--base layer {digest}: content does not match its digest",
                             hint="the registry's copy is altered; copy the base there again")
    separator = "&" if "?" in location else "?"
    with open(out.name, "rb") as f:
        done = client.do_request(f"{location}{separator}digest={digest}", "PUT", data=f,
                                 headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
    check(done, f"copy {digest}", 201, 204)
    return size
