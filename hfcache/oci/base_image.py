"""``hfcache push --base IMAGE``: the cache's layers on top of a base image with a shell (KServe's Modelcar runs
``sh -c`` in the model image), image format only (docs/oci.md). The base's blobs are mounted from the same registry,
or copied through a temporary file; its config keeps only the fields :data:`_KEPT` and the platform, so the digest
is reproducible. An index is resolved to the manifest for ``linux`` and the requested architecture.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..bounds import loads_json
from ..cache.content import DigestWriter
from ..errors import CacheError, IntegrityError, UsageError
from ..names import is_oci_digest
from . import peer
from .registry import BlobBody, check, get_bounded, parse_reference, registry_text, url
from .upload import upload

_MAX_JSON = 4 * 1024 * 1024
_MANIFESTS = (peer.MANIFEST_TYPE, peer.DOCKER_MANIFEST)
_INDEXES = (peer.INDEX_TYPE, peer.DOCKER_LIST)
#: base layer media types kept, and what they become in the OCI manifest (the same bytes)
_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
_LAYERS = {**{t: t for t in (peer.LAYER_GZIP, peer.LAYER_TAR, _ZSTD)}, peer.DOCKER_LAYER_GZIP: peer.LAYER_GZIP}
_KEPT = ("Env", "Entrypoint", "Cmd", "WorkingDir", "User")
_SIGNATURE_PREFIX = "application/vnd.dev.sigstore.bundle"
#: The manifest annotation ``push --base`` writes: the base's layer digests (comma-separated, in order), which are
#: the manifest's first layers; ``pull`` skips them (an OS, not cache content).
BASE_LAYERS = "io.hfcache.base.layers"
_HINT = "give a base image on the registry you push to, by tag or digest (e.g. REGISTRY/library/busybox@sha256:...)"


@dataclass(frozen=True)
class BaseImage:
    """A base image read from the registry: ``reference`` as given, ``digest`` of its (platform) manifest,
    ``repository`` (its name there, ``library/busybox``), ``layers`` (descriptors, media types made OCI),
    ``diff_ids``, ``os``, ``architecture``, ``variant``, ``config`` (the kept ``config`` fields)."""

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
    """(document, body, media type) of a manifest or config of the base, its digest checked when ``ref`` is one."""
    body, media_type, _ = get_bounded(client, url(client, container, kind, ref), accept, _MAX_JSON, f"--base {what}")
    if body is None:
        raise UsageError(f"--base {what}: not found on {container.registry}", hint=_HINT)
    if len(body) > _MAX_JSON:
        raise UsageError(f"--base {what}: larger than {_MAX_JSON} bytes", hint=_HINT)
    if is_oci_digest(ref) and peer.digest_of(body) != ref:
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
        raise UsageError(f"--base {what}: its mediaType is {peer.json_kind(declared)}, not a text", hint=_HINT)
    return document, body, declared or media_type


def artifact_kind(manifest: dict) -> str:
    """What an OCI artifact manifest is, in words (``""`` for a plain image): a ModelPack artifact, a signature (a
    Sigstore bundle referrer) or another artifact, each naming its ``artifactType`` (registry text made inert)."""
    declared = manifest.get("artifactType")
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    kind = declared if isinstance(declared, str) and declared else None
    if kind is None and config.get("mediaType") == peer.MODEL_CONFIG:
        kind = peer.MODEL_MANIFEST
    if kind is None:
        return ""
    shown = registry_text(kind, 80)
    if kind == peer.MODEL_MANIFEST:
        return f"a ModelPack artifact ({shown})"
    if kind.startswith(_SIGNATURE_PREFIX):
        return f"a signature, an OCI referrer ({shown})"
    return f"an OCI artifact ({shown})"


def read_base(client, target, reference: str, arch: str) -> BaseImage:
    """Read the base image ``reference`` (on ``target``'s registry) for ``linux/<arch>``. Raises UsageError: on
    another registry, not found, not an image, no manifest for the platform (exit 2); IntegrityError: a document
    does not match its digest; HubError: the registry refused."""
    base = parse_reference(reference)
    if base.registry != target.registry:
        raise UsageError(f"--base {reference}: on {base.registry}, not on {target.registry} (pushed to)",
                         hint="copy it there first: skopeo copy docker://BASE docker://" + target.registry + "/...")
    accept = ", ".join((*_MANIFESTS, *_INDEXES))
    manifest, body, media_type = _get(client, base, "manifests", base.digest or base.tag, accept, reference)
    if media_type in _INDEXES:
        listed = manifest.get("manifests")
        if not isinstance(listed, list):
            raise UsageError(f"--base {reference}: its index's manifests are {peer.json_kind(listed)}, not a list",
                             hint=_HINT)
        entries = [m for m in listed if isinstance(m, dict) and isinstance(m.get("platform"), dict)
                   and m["platform"].get("os") == "linux" and m["platform"].get("architecture") == arch]
        if not entries or not is_oci_digest(entries[0].get("digest")):
            raise UsageError(f"--base {reference}: no linux/{arch} image in its index",
                             hint="give --arch of an architecture the base has, or its platform manifest's digest")
        manifest, body, media_type = _get(client, base, "manifests", entries[0]["digest"], accept,
                                          f"{reference} ({arch})")
    kind = artifact_kind(manifest)
    if kind:
        raise UsageError(f"--base {reference}: {kind}, not a container image", hint=_HINT)
    if media_type not in _MANIFESTS:
        raise UsageError(f"--base {reference}: not a container image ({registry_text(media_type, 80)})", hint=_HINT)
    listed = manifest.get("layers", [])
    if not isinstance(listed, list):
        raise UsageError(f"--base {reference}: its layers are {peer.json_kind(listed)}, not a list", hint=_HINT)
    layers = []
    for layer in listed:
        kind = layer.get("mediaType") if isinstance(layer, dict) else None
        if not isinstance(kind, str) or kind not in _LAYERS or not is_oci_digest(layer.get("digest")) \
                or not peer.size_ok(layer.get("size")):
            shown = registry_text(kind, 80) if isinstance(kind, str) else f"media type {peer.json_kind(kind)}"
            raise UsageError(f"--base {reference}: a layer hfcache does not copy ({shown}, or a malformed digest or "
                             "size)", hint=_HINT)
        layers.append({"mediaType": _LAYERS[kind], "digest": layer["digest"], "size": layer["size"]})
    config = manifest.get("config")
    config_ref = config.get("digest") if isinstance(config, dict) else None
    if not is_oci_digest(config_ref):
        raise UsageError(f"--base {reference}: its manifest names no config", hint=_HINT)
    config, _, _ = _get(client, base, "blobs", config_ref, "*/*", f"{reference} config")
    return _base_of(reference, base, peer.digest_of(body), layers, config, arch)


def _base_of(reference: str, base, digest: str, layers: list[dict], config: dict, arch: str) -> BaseImage:
    """The BaseImage of a read manifest and config. Raises UsageError: its config's diff_ids do not match its
    layers, or it is for another platform."""
    rootfs = config.get("rootfs") if isinstance(config.get("rootfs"), dict) else {}
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs.get("diff_ids"), list) else []
    if len(diff_ids) != len(layers) or not all(is_oci_digest(d) for d in diff_ids):
        raise UsageError(f"--base {reference}: its config's diff_ids do not match its layers", hint=_HINT)
    if config.get("os") != "linux" or config.get("architecture") != arch:
        raise UsageError(f"--base {reference}: an image for {registry_text(config.get('os'), 20)}/"
                         f"{registry_text(config.get('architecture'), 20)}, not linux/{arch}",
                         hint="pass --arch to match the base, or a base for this architecture")
    inner = config.get("config") if isinstance(config.get("config"), dict) else {}
    # image-spec config.md: WorkingDir and User are texts, Env, Entrypoint and Cmd lists of texts; else dropped
    kept = {k: v for k, v in inner.items() if k in _KEPT and (isinstance(v, str) if k in ("WorkingDir", "User")
            else isinstance(v, list) and all(isinstance(i, str) for i in v))}
    variant = config.get("variant") if isinstance(config.get("variant"), str) else ""
    return BaseImage(reference, digest, base.api_prefix, tuple(layers), tuple(diff_ids), "linux", arch, variant,
                     kept)


def base_annotations(container, based: BaseImage) -> dict[str, str]:
    """The manifest annotations of ``push --base``: the base by digest only (``REGISTRY/NAME@sha256:...``: a tag
    and its digest give the same image digest) and :data:`BASE_LAYERS`."""
    return {"org.opencontainers.image.base.name": f"{container.registry}/{based.repository}@{based.digest}",
            "org.opencontainers.image.base.digest": based.digest,
            BASE_LAYERS: ",".join(layer["digest"] for layer in based.layers)}


def mount_base(client, target, base: BaseImage, workdir: Path) -> int:
    """Make each base layer a blob of ``target``'s repository: present (HEAD), mounted from the base's repository,
    or copied through a file in ``workdir`` (its digest checked). Returns the bytes copied. Raises IntegrityError: a
    copied blob does not match its digest; HubError, RegistryAuthError: the registry refused; CacheError: no room."""
    copied = 0
    for layer in base.layers:
        downloaded: list[str] = []

        def opener(layer: dict = layer, downloaded: list[str] = downloaded):  # downloaded once, reread on a resend
            if not downloaded:
                downloaded.append(_download(client, target, base, layer, workdir))
            return open(downloaded[0], "rb")

        copied += upload(client, target, layer["digest"], layer["size"], opener, shown="base layer",
                         mount_from=base.repository, what=f"copy {layer['digest']}")
    return copied


def _download(client, target, base: BaseImage, layer: dict, workdir: Path) -> str:
    """One base blob (a registry without cross-repository mounts) in a temporary file in ``workdir``: its path."""
    digest, size = layer["digest"], layer["size"]
    source = parse_reference(f"{target.registry}/{base.repository}@{digest}")
    response = client.do_request(url(client, source, "blobs", digest), "GET", stream=True)
    with response:
        check(response, f"--base blob {digest}", 200)
        body = BlobBody(response, target.registry, f"base layer {digest}")
        try:
            with tempfile.NamedTemporaryFile(dir=workdir, prefix="base-", delete=False) as out:
                sink = DigestWriter(out)
                while (chunk := body.read(1024 * 1024)) and sink.size + len(chunk) <= size:
                    sink.write(chunk)
        except OSError as exc:
            raise CacheError(f"push --base: writing a base layer under {workdir} failed: {exc.strerror or exc}",
                             hint="point TMPDIR at a filesystem with room for the base image") from exc
    if chunk or sink.size != size or sink.digest != digest:
        raise IntegrityError(f"--base layer {digest}: content does not match its digest",
                             hint="the registry's copy is altered; copy the base there again")
    return out.name
