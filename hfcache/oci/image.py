"""oci: a cache as an OCI image in a registry (push; pull, verified, is :mod:`hfcache.oci.pull`).

The image's root filesystem *is* a Hugging Face hub cache (``models--ORG--NAME/...`` at ``/``), so a runtime can
mount it read-only (Kubernetes ``image`` volumes, ``podman --mount type=image``) at ``/opt/hf-cache`` and
``HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1`` is all an application needs.

Image format (OCI image-spec v1.1, image-manifest.md, config.md, layer.md):

- manifest ``application/vnd.oci.image.manifest.v1+json``, serialised canonically (sorted keys, no spaces), so the
  same layers always give the same manifest digest;
- config ``application/vnd.oci.image.config.v1+json`` with ``os``/``architecture`` and ``rootfs.diff_ids`` (sha256
  of each *uncompressed* layer), no ``created`` time;
- layers ``application/vnd.oci.image.layer.v1.tar+gzip`` made of :func:`hfcache.move.export.write_tar` (sorted entries,
  mtime 0, uid/gid 0, every blob hashed on the way) through gzip with a fixed header (mtime 0, no file name) and a
  fixed level: the same cache gives byte-identical layers whatever the mtimes (for the same zlib).
- layer split: ``repo`` (default) makes one self-contained layer per repo folder (a blob shared by two repos is
  stored in both), so updating one repo re-pushes and re-pulls one layer; ``single`` makes one layer (each blob
  once). Figures: benchmarks/bench_oci.py.

Registry access (references, requests, uploads) is :mod:`hfcache.oci.registry`, on oras-py, with the credentials
of :mod:`hfcache.oci.credentials`; pull is :mod:`hfcache.oci.pull`. Push writes the layers to ``TMPDIR`` first (the
compressed image: a blob's digest must be known before the registry is asked whether it has it), then uploads what
the registry lacks.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import platform
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import CacheError, HubError, UsageError
from ..move.export import Entry, ExportPlan, plan_export, write_tar
from .base_image import BaseImage, base_annotations, mount_base, read_base
from .credentials import Credentials, auth_files
from .registry import (DIGEST, RegistryAuthError, TransferSink, check, connect, network_errors, parse_reference,
                       registry_text, url)
from .modelpack import (artifact_documents, attach_bundles, check_prefix, model_files, send_bytes, send_file, sign,
                        signed_snapshots)
from .upload import upload
from ..cache.scan import parse_folder_name

__all__ = ["ANNOTATION_PREFIX", "CONFIG_TYPE", "DIGEST", "LAYER_GZIP", "MANIFEST_TYPE", "Credentials", "Layer",
           "PushReport", "RegistryAuthError", "TransferSink", "architecture", "auth_files", "image_documents",
           "parse_reference", "push", "split_plan", "write_layer"]

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
GZIP_LEVEL = 6
SPLITS = ("repo", "single")
FORMATS = ("image", "modelpack")
ANNOTATION_PREFIX = "io.hfcache"
_ARCH = re.compile(r"[a-z0-9_]{1,32}")


@dataclass(frozen=True)
class Layer:
    """One layer of a pushed or pulled image.

    Attributes:
        digest (str): ``sha256:<hex>`` of the compressed blob (the registry's name for it).
        size (int): bytes of the compressed blob.
        diff_id (str): ``sha256:<hex>`` of the uncompressed tar.
        repos (tuple[str, ...]): repo folders it holds (from its ``io.hfcache.repos`` annotation on pull).
        transferred (int): bytes sent or received for it (0 when the registry already had it).
    """

    digest: str
    size: int
    diff_id: str
    repos: tuple[str, ...]
    transferred: int


@dataclass(frozen=True)
class PushReport:
    """The outcome of :func:`push`.

    Attributes:
        reference (str): ``registry/name:tag`` pushed; digest (str): the manifest's ``sha256:<hex>``.
        layers (tuple[Layer, ...]); split (str): ``repo`` or ``single``.
        repos (tuple[str, ...]): ``repo_id@commit`` in the image, sorted.
        bytes_total (int): compressed bytes of all blobs; bytes_uploaded (int): bytes actually sent.
        format (str): ``image`` or ``modelpack``; prefix (str): the folder the cache is under (``""``: the root).
        signature (str): the ``sha256:<hex>`` of the first signature referrer attached (``--sign-key``), else ``""``;
        signatures (tuple[str, ...]): every one attached, one per snapshot (in the order of the repo folders).
    """

    reference: str
    digest: str
    layers: tuple[Layer, ...]
    split: str
    repos: tuple[str, ...]
    bytes_total: int
    bytes_uploaded: int
    format: str = "image"
    prefix: str = ""
    signature: str = ""
    signatures: tuple[str, ...] = ()


# --- layers --------------------------------------------------------------------------------------------------------


def split_plan(plan: ExportPlan, split: str) -> list[ExportPlan]:
    """Cut an export plan into layer plans: one per repo folder (``repo``) or the whole plan (``single``).

    Each layer is self-contained (a hardlink to content in another layer becomes a copy of that content), so any
    layer extracts and imports on its own. Every layer carries ``CACHEDIR.TAG``.

    Raises:
        UsageError: unknown ``split``.
    """
    if split not in SPLITS:
        raise UsageError(f"unknown layer split {split!r}", hint=f"use one of {', '.join(SPLITS)}")
    if split == "single" or len(plan.repos) <= 1:
        return [plan]
    by_name = {e.name: e for e in plan.entries}
    layers = []
    for folder in plan.repos:
        entries, seen, unique = [], {}, 0
        for e in plan.entries:
            if e.name == "CACHEDIR.TAG":
                entries.append(e)
                continue
            if e.name != folder and not e.name.startswith(folder + "/"):
                continue
            if e.kind == "hardlink" and not e.target.startswith(folder + "/"):
                source = by_name[e.target]
                if source.name in seen:  # already copied into this layer: link to that copy
                    e = Entry(e.name, "hardlink", target=seen[source.name])
                else:
                    seen[source.name] = e.name
                    e = Entry(e.name, "file", source=source.source, etag=source.etag, size=source.size)
            unique += e.size if e.kind == "file" else 0
            entries.append(e)
        layers.append(ExportPlan(entries=tuple(entries), repos=(folder,), unique_bytes=unique))
    return layers


class _HashingWriter(io.RawIOBase):
    def __init__(self, out: BinaryIO) -> None:
        self._out, self.sha256, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self._out.write(data)


def write_layer(plan: ExportPlan, out: BinaryIO, prefix: str = "") -> tuple[str, int, str]:
    """Write ``plan`` as a reproducible tar+gzip layer to ``out`` (every entry under ``prefix/`` when given).

    Returns:
        (digest, size, diff_id): ``sha256:<hex>`` of the gzip bytes, their count, ``sha256:<hex>`` of the tar.

    Raises:
        CacheError: a blob's content does not match its name (see :func:`hfcache.move.export.write_tar`).
    """
    sink = _HashingWriter(out)
    # Fixed gzip header: mtime 0 and no FNAME (filename=""), and a fixed level: reproducible bytes.
    with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=sink, mtime=0) as gz:
        diff_id = write_tar(plan, gz, prefix=prefix or "")
    return f"sha256:{sink.sha256.hexdigest()}", sink.size, f"sha256:{diff_id}"


def _commits_of(plan: ExportPlan) -> list[str]:
    """``repo_id@commit`` for every snapshot in the plan, sorted (folder names of the cache layout)."""
    found = set()
    for e in plan.entries:
        parts = e.name.split("/")
        if e.kind == "dir" and len(parts) == 3 and parts[1] == "snapshots":
            parsed = parse_folder_name(parts[0])
            found.add(f"{parsed[0] if parsed else parts[0]}@{parts[2]}")
    return sorted(found)


def _canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def architecture() -> str:
    """The OCI/Go name of this machine's architecture (``amd64``, ``arm64``, ...); the content itself is portable."""
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(machine, machine)


def image_documents(layers: Sequence[tuple[Layer, ExportPlan]], annotations: dict[str, str],
                    arch: str, base: BaseImage | None = None) -> tuple[bytes, bytes]:
    """The config and manifest bytes (canonical JSON) of an image made of ``layers``.

    Args:
        layers: each pushed layer with the plan it was written from.
        annotations: manifest annotations (also the config's ``Labels``, which ``podman inspect`` shows).
        arch: the config's ``architecture``.
        base: a base image whose layers come first (its Env/Entrypoint/Cmd/WorkingDir/User kept), or None.

    Returns:
        (config_bytes, manifest_bytes).
    """
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {**(base.config if base else {}), "Labels": annotations},
        "rootfs": {"type": "layers", "diff_ids": [*(base.diff_ids if base else ()),
                                                  *(layer.diff_id for layer, _ in layers)]},
    }
    if base is not None and base.variant:
        config["variant"] = base.variant
    config_bytes = _canonical(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": _sha256(config_bytes), "size": len(config_bytes)},
        "layers": [*(base.layers if base else ())] + [{"mediaType": LAYER_GZIP, "digest": layer.digest,
                                                        "size": layer.size,
                    "annotations": {f"{ANNOTATION_PREFIX}.repos": ",".join(layer.repos),
                                    f"{ANNOTATION_PREFIX}.commits": ",".join(_commits_of(plan))}}
                   for layer, plan in layers],
        "annotations": annotations,
    }
    return config_bytes, _canonical(manifest)


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def push(reference: str, cache_dir: Path, specs: Sequence[str] = (), lock_path: str | os.PathLike[str] | None = None,
         split: str | None = None, plain_http: bool = False, credentials: Credentials | None = None,
         timeout: float = 60.0, sink: TransferSink | None = None, arch: str | None = None, *,
         format: str = "image", prefix: str | None = None, sign_key: Path | None = None,
         base: str | None = None, sign_key_password: bytes | None = None) -> PushReport:
    """Push the cache (or the given repos, or what a lock pins) to ``reference`` as an OCI image, or one repo at one
    commit as a CNCF ModelPack artifact (:mod:`hfcache.oci.modelpack`).

    Args:
        reference: ``REGISTRY/NAME:TAG`` (a tag, not a digest).
        cache_dir: the source cache.
        specs: ``REPO_ID[@REVISION]`` to push; with neither specs nor lock, the whole cache.
        lock_path: push exactly what this lock pins; its sha256 is recorded in the ``io.hfcache.lock.sha256``
            annotation (never its path).
        split: ``repo`` (one layer per repo folder, the default) or ``single`` (image format only: given with
            ``format="modelpack"`` it is refused, as ``arch`` is, rather than silently ignored).
        plain_http: talk HTTP instead of HTTPS.
        credentials: username/password; None reads the auth files (:func:`auth_files`).
        timeout: seconds to wait for a connection or any byte of an answer (metadata answers also end within
            ``HFCACHE_METADATA_DEADLINE`` seconds; uploads keep ``HFCACHE_MIN_RATE``, see :mod:`hfcache.pace`).
        sink: receives upload progress.
        arch: the config's architecture (default: this machine's, :func:`architecture`); the content is portable,
            but the config, hence the digest, records it (image format).
        format: ``image`` (the cache as the image's root filesystem) or ``modelpack`` (one raw layer per file).
        prefix: a relative folder (``models``) every path of the image or artifact is under; recorded in the
            ``io.hfcache.prefix`` annotation (pull strips it).
        sign_key: a PEM EC private key: each snapshot's files signed (model-signing v1.0), each bundle attached as a
            referrer of the manifest (:mod:`hfcache.oci.referrers`). sign_key_password: its password [default:
            ``HFCACHE_SIGN_KEY_PASSWORD``]; never printed or stored.
        base: a base image on the same registry (``REGISTRY/NAME:TAG`` or ``@sha256:...``) whose layers go first,
            e.g. one with a shell for KServe's Modelcar (image format; :mod:`hfcache.oci.base_image`).

    Returns:
        PushReport.

    Raises:
        UsageError: bad reference, ``arch``, ``format`` or ``prefix``, both ``specs`` and ``lock_path``, a repo not in
            the cache, a bad lock, several snapshots for ``modelpack``, an unusable key or password.
        CacheError: a cache blob does not match its name or cannot be read, or TMPDIR is full (nothing is pushed).
        RegistryAuthError, EndpointUnreachable, HubError: the registry refused or could not be reached (exit 3).
    """
    from ..warming.lockfile import read_lock

    container = _push_target(reference, specs, lock_path, arch)
    split = _format_options(format, split, arch, base)
    prefix = check_prefix(prefix)
    plan = plan_export(cache_dir, specs, lock=read_lock(lock_path) if lock_path else None)
    if not plan.repos:
        raise UsageError(f"nothing to push: {cache_dir} holds no repo", hint="warm it first (hfcache warm)")
    lock = Path(lock_path) if lock_path else None
    signing = _signing(sign_key, sign_key_password)
    if format == "modelpack":
        return _push_modelpack(reference, container, Path(cache_dir), plan, lock, prefix, signing,
                               (plain_http, credentials, timeout, sink))
    return _push_image(reference, container, Path(cache_dir), plan, (split, lock, prefix, signing, base, arch),
                       (plain_http, credentials, timeout, sink))


def _push_image(reference: str, container, cache_dir: Path, plan: ExportPlan, choices: tuple,
                connection: tuple) -> PushReport:
    """Push ``plan`` as an image: layers written to TMPDIR, then (connected) the base read, the documents built,
    the base's blobs mounted, the layers the registry lacks uploaded, the manifest PUT, the signature attached."""
    split, lock, prefix, signing, base, arch = choices
    plain_http, credentials, timeout, sink = connection
    bundles = signed_snapshots(cache_dir, plan, signing[0], password=signing[1], password_hint=_PASSWORD_HINT) \
        if signing else []
    annotations = _annotations(plan, split, lock, prefix)
    try:
        workdir = tempfile.TemporaryDirectory(prefix="hfcache-push-")
    except OSError as exc:
        raise _temp_error(exc, Path(tempfile.gettempdir()) / "hfcache-push") from exc
    with workdir as tmp:
        layers = _write_layers(plan, split, Path(tmp), prefix)
        with network_errors(container.registry, plain_http):
            client = connect(container, plain_http, credentials, timeout)
            based = read_base(client, container, base, arch or architecture()) if base else None
            if based is not None:
                annotations.update(base_annotations(container, based))
            config_bytes, manifest_bytes = image_documents([(layer, p) for layer, p, _ in layers], annotations,
                                                           arch or architecture(), based)
            config_path = _write_temp(Path(tmp) / "config.json", config_bytes)
            base_sent = mount_base(client, container, based, Path(tmp)) if based else 0
            pushed, config_sent, response = _upload_image(client, container, reference, layers, config_path,
                                                          config_bytes, manifest_bytes, sink)
            signatures = attach_bundles(client, container, manifest_bytes, bundles)
    digest = _checked_digest(container, manifest_bytes, response)
    return PushReport(reference=f"{container.registry}/{container.api_prefix}:{container.tag}", digest=digest,
                      layers=tuple(pushed), split=split, repos=tuple(_commits_of(plan)),
                      bytes_total=sum(x.size for x in pushed) + len(config_bytes) + len(manifest_bytes)
                      + sum(x["size"] for x in (based.layers if based else ())),
                      bytes_uploaded=sum(x.transferred for x in pushed) + config_sent + len(manifest_bytes) + base_sent,
                      prefix=prefix, signature=(signatures or ("",))[0], signatures=signatures)


#: Where push reads an encrypted --sign-key's password: its --password-stdin is the registry's.
_PASSWORD_HINT = ("push reads an encrypted --sign-key's password from the environment variable "
                  "HFCACHE_SIGN_KEY_PASSWORD (its --password-stdin is the registry password)")


def _signing(sign_key: Path | None, password: bytes | None) -> tuple[Path, bytes | None] | None:
    """(the signing key, its password: given, else ``HFCACHE_SIGN_KEY_PASSWORD``'s), or None without a key."""
    if sign_key is None:
        return None
    from ..integrity.signatures import env_password

    return Path(sign_key), password if password is not None else env_password()


def _checked_digest(container, manifest_bytes: bytes, response) -> str:
    """The manifest's digest, once the registry's answer agrees.

    Raises:
        HubError: the registry stored it under another digest (it rewrote the manifest).
    """
    digest = _sha256(manifest_bytes)
    answered = response.headers.get("Docker-Content-Digest")
    if answered and answered != digest:
        raise HubError(f"registry {container.registry} stored the manifest as {registry_text(answered, 100)}, "
                       f"expected {digest}",
                       hint="the registry rewrote the manifest; pull by the digest it gave, or use another registry")
    return digest


def _push_modelpack(reference: str, container, cache_dir: Path, plan: ExportPlan, lock: Path | None, prefix: str,
                    signing: tuple[Path, bytes | None] | None, connection: tuple) -> PushReport:
    """Push the one snapshot of ``plan`` as a ModelPack artifact: each distinct blob once (HEAD first), streamed
    from the cache; then the config, the manifest and (``signing``: key, password) the signature referrer."""
    plain_http, credentials, timeout, sink = connection
    folder, commit, files = model_files(cache_dir, plan, prefix)
    repo = _commits_of(plan)[0]
    annotations = {"org.opencontainers.image.title": repo.partition("@")[0], f"{ANNOTATION_PREFIX}.repos": repo,
                   f"{ANNOTATION_PREFIX}.format": "modelpack"}
    if prefix:
        annotations[f"{ANNOTATION_PREFIX}.prefix"] = prefix
    if lock is not None:
        annotations[f"{ANNOTATION_PREFIX}.lock.sha256"] = hashlib.sha256(lock.read_bytes()).hexdigest()
    config_bytes, manifest_bytes = artifact_documents(cache_dir, folder, commit, files, annotations)
    bundles = [sign(files, repo, signing[0], password=signing[1], password_hint=_PASSWORD_HINT)] if signing else []
    sent: dict[str, int] = {}
    with network_errors(container.registry, plain_http):
        client = connect(container, plain_http, credentials, timeout)
        layers = []
        for f in files:
            transferred = 0 if f.digest in sent else send_file(client, container, f, sink)
            sent.setdefault(f.digest, transferred)
            layers.append(Layer(f.digest, f.size, f.digest, (folder,), transferred))
        config_sent = send_bytes(client, container, config_bytes, "config")
        response = _put_manifest(client, container, reference, manifest_bytes)
        signatures = attach_bundles(client, container, manifest_bytes, bundles)
    digest = _checked_digest(container, manifest_bytes, response)
    distinct = {f.digest: f.size for f in files}
    return PushReport(reference=f"{container.registry}/{container.api_prefix}:{container.tag}", digest=digest,
                      layers=tuple(layers), split="file", repos=(repo,),
                      bytes_total=sum(distinct.values()) + len(config_bytes) + len(manifest_bytes),
                      bytes_uploaded=sum(sent.values()) + config_sent + len(manifest_bytes), format="modelpack",
                      prefix=prefix, signature=(signatures or ("",))[0], signatures=signatures)


def _put_manifest(client, container, reference: str, manifest_bytes: bytes):
    response = client.do_request(url(client, container, "manifests", container.tag), "PUT",
                                 data=manifest_bytes, headers={"Content-Type": MANIFEST_TYPE})
    check(response, f"push manifest {reference}", 201)
    return response


def _format_options(format: str, split: str | None, arch: str | None, base: str | None) -> str:
    """The layer split to use (``repo`` unless given), once the options agree with ``format``.

    Raises:
        UsageError: an unknown format; ``base``, ``split`` or ``arch`` with ``modelpack`` (one raw layer per file, no
            architecture, never run: refused rather than silently ignored).
    """
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}", hint=f"use one of {', '.join(FORMATS)}")
    if base and format != "image":
        raise UsageError("--base is for --format image (a ModelPack artifact is mounted or extracted, never run)",
                         hint="drop --base, or push --format image")
    if format == "modelpack" and (split is not None or arch is not None):
        given = "--layers" if split is not None else "--arch"
        raise UsageError(f"{given} is for --format image: a ModelPack artifact has one raw layer per file and no "
                         "architecture", hint=f"drop {given}, or push --format image")
    return split or "repo"


def _push_target(reference: str, specs: Sequence[str], lock_path: str | os.PathLike[str] | None, arch: str | None):
    """The parsed ``reference`` to push to, once the arguments of :func:`push` agree.

    Raises:
        UsageError: a bad reference, a digest instead of a tag, a bad ``arch``, both ``specs`` and ``lock_path``.
    """
    container = parse_reference(reference)
    if container.digest:
        raise UsageError(f"{reference}: push needs a tag, not a digest", hint="e.g. REGISTRY/NAME:v1")
    if arch is not None and not _ARCH.fullmatch(arch):
        raise UsageError(f"--arch {arch!r}: expected an OCI architecture name such as amd64 or arm64",
                         hint="the GOARCH values: amd64, arm64, arm, 386, ppc64le, s390x, riscv64")
    if specs and lock_path:
        raise UsageError("give REPO_ID arguments or --lock, not both",
                         hint="--lock pushes exactly what the lock pins; list repos to push those instead")
    return container


def _upload_image(client, container, reference: str, layers: list[tuple[Layer, ExportPlan, Path]], config_path: Path,
                  config_bytes: bytes, manifest_bytes: bytes, sink: TransferSink | None):
    """Upload the layers the registry lacks, then the config, then PUT the manifest under the tag.

    Returns:
        (the layers with the bytes sent for each, the config's bytes sent, the manifest PUT's response).
    """
    pushed = [Layer(layer.digest, layer.size, layer.diff_id, layer.repos,
                    upload(client, container, layer.digest, path, layer.size, sink, ",".join(layer.repos)))
              for layer, _, path in layers]
    config_sent = upload(client, container, _sha256(config_bytes), config_path, len(config_bytes), None, "config")
    return pushed, config_sent, _put_manifest(client, container, reference, manifest_bytes)


def _annotations(plan: ExportPlan, split: str, lock_path: Path | None, prefix: str = "") -> dict[str, str]:
    """The manifest's annotations: what the image is and which commits it holds; no path, no time, no token."""
    where = f"/{prefix}" if prefix else "the image root"
    annotations = {
        "org.opencontainers.image.title": "Hugging Face hub cache",
        "org.opencontainers.image.description": f"A Hugging Face hub cache at {where}: mount it at "
                                                "/opt/hf-cache, set HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1"
                                                + (f" (a volume: subPath {prefix})" if prefix else ""),
        f"{ANNOTATION_PREFIX}.repos": ",".join(_commits_of(plan)),
        f"{ANNOTATION_PREFIX}.layer-split": split,
    }
    if prefix:
        annotations[f"{ANNOTATION_PREFIX}.prefix"] = prefix
    if lock_path is not None:
        annotations[f"{ANNOTATION_PREFIX}.lock.sha256"] = hashlib.sha256(lock_path.read_bytes()).hexdigest()
    return annotations


def _temp_error(exc: OSError, folder: Path) -> CacheError:
    """An OSError while writing the image under ``TMPDIR`` (the layers are written there before the upload)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheError(f"push: no space left in {folder.parent} (TMPDIR) for the compressed layers",
                          hint="free space there or point TMPDIR at a filesystem with room for the compressed image")
    return CacheError(f"push: writing the layers under {folder.parent} (TMPDIR) failed: {exc.strerror or exc}",
                      hint="point TMPDIR at a writable folder")


def _write_temp(path: Path, data: bytes) -> Path:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise _temp_error(exc, path.parent) from exc
    return path


def _write_layers(plan: ExportPlan, split: str, folder: Path, prefix: str = "") -> list[tuple[Layer, ExportPlan, Path]]:
    """Write the layers of ``plan`` into ``folder``: (layer, its plan, its file) in image order.

    Raises:
        CacheError: a blob of the source cache does not match its name, cannot be read, or ``folder`` is full.
    """
    layers = []
    for index, layer_plan in enumerate(split_plan(plan, split)):
        path = folder / f"layer-{index}.tar.gz"
        try:
            with open(path, "wb") as out:
                digest, size, diff_id = write_layer(layer_plan, out, prefix)
        except OSError as exc:
            if exc.filename and not str(exc.filename).startswith(str(folder)):
                raise CacheError(f"push: cannot read {exc.filename} ({exc.strerror})",
                                 hint="check the source cache's permissions (hfcache verify)") from exc
            raise _temp_error(exc, folder) from exc
        layers.append((Layer(digest, size, diff_id, layer_plan.repos, 0), layer_plan, path))
    return layers
