"""``hfcache push``: a cache as an OCI image whose root filesystem *is* the hub cache (OCI image-spec v1.1), or one
snapshot as a ModelPack artifact (:mod:`.modelpack`). Canonical JSON (:func:`hfcache.oci.peer.canonical`), no time
in the config and gzip with a fixed header: the same cache gives the same digest. Layers are written to ``TMPDIR``
first (a blob's digest must be known to ask the registry whether it has it), then uploaded (:mod:`.upload`).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import platform
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

from ..cache.content import DigestWriter
from ..errors import CacheError, HubError, UsageError
from ..move.export import Entry, ExportPlan, plan_export, write_tar
from . import modelpack
from .base_image import BaseImage, base_annotations, mount_base, read_base
from .credentials import Credentials
from .peer import CONFIG_TYPE, LAYER_GZIP, MANIFEST_TYPE, canonical, digest_of
from .registry import TransferSink, check, connect, network_errors, parse_reference, registry_text, url
from .upload import upload, upload_bytes

__all__ = ["CONFIG_TYPE", "LAYER_GZIP", "MANIFEST_TYPE", "Credentials", "Layer", "PushReport", "TransferSink",
           "architecture", "image_documents", "parse_reference", "push", "split_plan", "write_layer"]

GZIP_LEVEL = 6
SPLITS = ("repo", "single")
FORMATS = ("image", "modelpack")
ANNOTATION_PREFIX = "io.hfcache"
_ARCH = re.compile(r"[a-z0-9_]{1,32}")
#: Where push reads an encrypted --sign-key's password: its --password-stdin is the registry's.
_PASSWORD_HINT = ("push reads an encrypted --sign-key's password from the environment variable "
                  "HFCACHE_SIGN_KEY_PASSWORD (its --password-stdin is the registry password)")


@dataclass(frozen=True)
class Layer:
    """One layer of a pushed or pulled image: ``digest`` (``sha256:<hex>``) and ``size`` of the compressed blob,
    ``diff_id`` (``sha256:<hex>`` of the uncompressed tar), ``repos`` (the repo folders it holds; on pull from its
    ``io.hfcache.repos`` annotation), ``transferred`` (bytes sent or received for it; 0 when not needed)."""

    digest: str
    size: int
    diff_id: str
    repos: tuple[str, ...]
    transferred: int


@dataclass(frozen=True)
class PushReport:
    """The outcome of :func:`push`: ``reference`` (``registry/name:tag``), ``split`` (``repo``, ``single``,
    ModelPack's ``file``), ``repos`` (``repo_id@commit``, sorted), ``bytes_total`` (all blobs, compressed) and
    ``bytes_uploaded``, ``signature`` (the first of ``signatures``, one referrer digest per snapshot, or ``""``)."""

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


def split_plan(plan: ExportPlan, split: str) -> list[ExportPlan]:
    """Cut an export plan into self-contained layer plans (a hardlink across layers becomes a copy): one per repo
    folder (``repo``) or the whole plan (``single``). UsageError: another ``split``."""
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


def write_layer(plan: ExportPlan, out: BinaryIO, prefix: str = "") -> tuple[str, int, str]:
    """Write ``plan`` as a reproducible tar+gzip layer to ``out`` (every entry under ``prefix/`` when given); return
    (``sha256:<hex>`` of the gzip bytes, their count, ``sha256:<hex>`` of the tar). Raises as ``write_tar``."""
    sink = DigestWriter(out)
    with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=sink, mtime=0) as gz:
        diff_id = write_tar(plan, gz, prefix=prefix or "")
    return sink.digest, sink.size, f"sha256:{diff_id}"


def _commits_of(plan: ExportPlan) -> list[str]:
    return sorted(f"{modelpack.repo_id_of(folder)}@{commit}" for folder, commit in modelpack.snapshots_of(plan))


def architecture() -> str:
    """The OCI/Go name of this machine's architecture (``amd64``, ``arm64``, ...)."""
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(machine, machine)


def image_documents(layers: Sequence[tuple[Layer, ExportPlan]], annotations: dict[str, str],
                    arch: str, base: BaseImage | None = None) -> tuple[bytes, bytes]:
    """(config bytes, manifest bytes), canonical JSON, of an image of ``layers`` (each with the plan it was written
    from): ``annotations`` on the manifest and as the config's ``Labels`` (``podman inspect`` shows them), ``arch``
    the config's architecture; ``base``'s layers first and its Env/Entrypoint/Cmd/WorkingDir/User kept."""
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {**(base.config if base else {}), "Labels": annotations},
        "rootfs": {"type": "layers", "diff_ids": [*(base.diff_ids if base else ()),
                                                  *(layer.diff_id for layer, _ in layers)]},
    }
    if base is not None and base.variant:
        config["variant"] = base.variant
    config_bytes = canonical(config)
    ours = [{"mediaType": LAYER_GZIP, "digest": layer.digest, "size": layer.size,
             "annotations": {f"{ANNOTATION_PREFIX}.repos": ",".join(layer.repos),
                             f"{ANNOTATION_PREFIX}.commits": ",".join(_commits_of(plan))}} for layer, plan in layers]
    return config_bytes, canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": digest_of(config_bytes), "size": len(config_bytes)},
        "layers": [*(base.layers if base else ()), *ours],
        "annotations": annotations,
    })


def push(reference: str, cache_dir: Path, specs: Sequence[str] = (), lock_path: str | os.PathLike[str] | None = None,
         split: str | None = None, plain_http: bool = False, credentials: Credentials | None = None,
         timeout: float = 60.0, sink: TransferSink | None = None, arch: str | None = None, *,
         format: str = "image", prefix: str | None = None, sign_key: Path | None = None,
         base: str | None = None, sign_key_password: bytes | None = None) -> PushReport:
    """Push the cache (or the repos ``specs`` name, ``REPO_ID[@REVISION]``, or exactly what the lock ``lock_path``
    pins: its sha256 goes into ``io.hfcache.lock.sha256``, never its path) to ``reference`` (``REGISTRY/NAME:TAG``).

    Args:
        split: ``repo`` (default) or ``single``; ``arch``: the config's architecture (default :func:`architecture`);
            both image format only. plain_http: HTTP instead of HTTPS. credentials: None reads the auth files.
        timeout: seconds to wait for a connection or any byte (and the bounds of :mod:`hfcache.pace`). sink: progress.
        format: ``image`` (the cache as the root filesystem) or ``modelpack`` (one raw layer per file).
        prefix: a relative folder (``models``) every path is under (``io.hfcache.prefix``; pull strips it).
        sign_key: a PEM EC private key each snapshot is signed with, each bundle a referrer of the manifest;
            sign_key_password: its password (default ``HFCACHE_SIGN_KEY_PASSWORD``).
        base: an image on the same registry whose layers go first (image format; :mod:`.base_image`).

    Raises:
        UsageError: bad arguments (:func:`_options`, ``prefix``), a repo not in the cache, a bad lock, several
            snapshots for ``modelpack``, an unusable key or password.
        CacheError: a cache blob does not match its name or cannot be read, or TMPDIR is full (nothing is pushed).
        RegistryAuthError, EndpointUnreachable, HubError: the registry refused or could not be reached (exit 3).
    """
    from ..warming.lockfile import read_lock

    container, split = _options(reference, specs, lock_path, arch, format, split, base)
    prefix = modelpack.check_prefix(prefix)
    lock = read_lock(lock_path) if lock_path else None
    plan = plan_export(cache_dir, specs, lock=lock)
    if not plan.repos:
        raise UsageError(f"nothing to push: {cache_dir} holds no repo", hint="warm it first (hfcache warm)")
    signing = None
    if sign_key is not None:
        from ..integrity.signatures import env_password

        signing = Path(sign_key), sign_key_password if sign_key_password is not None else env_password(), lock
    annotations = _annotations(plan, Path(lock_path) if lock_path else None, prefix)
    connection = (plain_http, credentials, timeout, sink)
    if format == "modelpack":
        return _push_modelpack(reference, container, Path(cache_dir), plan, (prefix, annotations, signing),
                               connection)
    return _push_image(reference, container, Path(cache_dir), plan, (split, prefix, annotations, signing, base, arch),
                       connection)


def _push_image(reference: str, container, cache_dir: Path, plan: ExportPlan, choices: tuple,
                connection: tuple) -> PushReport:
    split, prefix, annotations, signing, base, arch = choices
    plain_http, credentials, timeout, sink = connection
    bundles = modelpack.signed_snapshots(cache_dir, plan, signing[0], password=signing[1],
                                         password_hint=_PASSWORD_HINT, lock=signing[2]) if signing else []
    annotations.update({"org.opencontainers.image.title": "Hugging Face hub cache",
                        "org.opencontainers.image.description": _description(prefix),
                        f"{ANNOTATION_PREFIX}.layer-split": split})
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
            base_sent = mount_base(client, container, based, Path(tmp)) if based else 0
            pushed = [Layer(layer.digest, layer.size, layer.diff_id, layer.repos,
                            upload(client, container, layer.digest, layer.size, partial(open, path, "rb"),
                                   shown=str(path), sink=sink, label=",".join(layer.repos)))
                      for layer, _, path in layers]
            config_sent = upload_bytes(client, container, config_bytes, "config")
            digest, signatures = _publish(client, container, reference, manifest_bytes, bundles)
    base_bytes = sum(x["size"] for x in (based.layers if based else ()))
    return PushReport(reference=_pushed(container), digest=digest, layers=tuple(pushed), split=split,
                      repos=tuple(_commits_of(plan)),
                      bytes_total=sum(x.size for x in pushed) + len(config_bytes) + len(manifest_bytes) + base_bytes,
                      bytes_uploaded=sum(x.transferred for x in pushed) + config_sent + len(manifest_bytes) + base_sent,
                      prefix=prefix, signature=(signatures or ("",))[0], signatures=signatures)


def _push_modelpack(reference: str, container, cache_dir: Path, plan: ExportPlan, choices: tuple,
                    connection: tuple) -> PushReport:
    prefix, annotations, signing = choices
    plain_http, credentials, timeout, sink = connection
    folder, commit, files = modelpack.model_files(cache_dir, plan, prefix)
    repo = _commits_of(plan)[0]
    annotations.update({"org.opencontainers.image.title": repo.partition("@")[0],
                        f"{ANNOTATION_PREFIX}.format": "modelpack"})
    config_bytes, manifest_bytes = modelpack.artifact_documents(cache_dir, folder, commit, files, annotations)
    bundles = [modelpack.sign(files, repo, signing[0], password=signing[1], password_hint=_PASSWORD_HINT,
                              proof=(cache_dir, folder, signing[2]))] if signing else []
    sent: dict[str, int] = {}
    with network_errors(container.registry, plain_http):
        client = connect(container, plain_http, credentials, timeout)
        layers = []
        for f in files:
            transferred = 0 if f.digest in sent else modelpack.send_file(client, container, f, sink)
            sent.setdefault(f.digest, transferred)
            layers.append(Layer(f.digest, f.size, f.digest, (folder,), transferred))
        config_sent = upload_bytes(client, container, config_bytes, "config")
        digest, signatures = _publish(client, container, reference, manifest_bytes, bundles)
    distinct = {f.digest: f.size for f in files}
    return PushReport(reference=_pushed(container), digest=digest, layers=tuple(layers), split="file", repos=(repo,),
                      bytes_total=sum(distinct.values()) + len(config_bytes) + len(manifest_bytes),
                      bytes_uploaded=sum(sent.values()) + config_sent + len(manifest_bytes), format="modelpack",
                      prefix=prefix, signature=(signatures or ("",))[0], signatures=signatures)


def _pushed(container) -> str:
    return f"{container.registry}/{container.api_prefix}:{container.tag}"


def _publish(client, container, reference: str, manifest_bytes: bytes,
             bundles: Sequence[bytes]) -> tuple[str, tuple[str, ...]]:
    """PUT the manifest under the tag and attach the signature ``bundles``: (the manifest's digest, the referrers').
    HubError: the registry stored the manifest under another digest (it rewrote it)."""
    response = client.do_request(url(client, container, "manifests", container.tag), "PUT",
                                 data=manifest_bytes, headers={"Content-Type": MANIFEST_TYPE})
    check(response, f"push manifest {reference}", 201)
    signatures = modelpack.attach_bundles(client, container, manifest_bytes, bundles)
    digest = digest_of(manifest_bytes)
    answered = response.headers.get("Docker-Content-Digest")
    if answered and answered != digest:
        raise HubError(f"registry {container.registry} stored the manifest as {registry_text(answered, 100)}, "
                       f"expected {digest}",
                       hint="the registry rewrote the manifest; pull by the digest it gave, or use another registry")
    return digest, signatures


def _options(reference: str, specs: Sequence[str], lock_path, arch: str | None, format: str, split: str | None,
             base: str | None) -> tuple:
    """(the parsed ``reference``, the layer split: ``repo`` unless given), once :func:`push`'s arguments agree.
    Raises UsageError: a bad reference, a digest instead of a tag, a bad ``arch``, both ``specs`` and ``lock_path``,
    an unknown format; ``base``, ``split`` or ``arch`` with ``modelpack`` (refused rather than ignored)."""
    container = parse_reference(reference)
    if container.digest:
        raise UsageError(f"{reference}: push needs a tag, not a digest", hint="e.g. REGISTRY/NAME:v1")
    if arch is not None and not _ARCH.fullmatch(arch):
        raise UsageError(f"--arch {arch!r}: expected an OCI architecture name such as amd64 or arm64",
                         hint="the GOARCH values: amd64, arm64, arm, 386, ppc64le, s390x, riscv64")
    if specs and lock_path:
        raise UsageError("give REPO_ID arguments or --lock, not both",
                         hint="--lock pushes exactly what the lock pins; list repos to push those instead")
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}", hint=f"use one of {', '.join(FORMATS)}")
    if base and format != "image":
        raise UsageError("--base is for --format image (a ModelPack artifact is mounted or extracted, never run)",
                         hint="drop --base, or push --format image")
    if format == "modelpack" and (split is not None or arch is not None):
        given = "--layers" if split is not None else "--arch"
        raise UsageError(f"{given} is for --format image: a ModelPack artifact has one raw layer per file and no "
                         "architecture", hint=f"drop {given}, or push --format image")
    return container, split or "repo"


def _annotations(plan: ExportPlan, lock_path: Path | None, prefix: str) -> dict[str, str]:
    """The manifest annotations both formats write: the commits, the prefix, the lock's sha256 (no path, no time,
    no token)."""
    annotations = {f"{ANNOTATION_PREFIX}.repos": ",".join(_commits_of(plan))}
    if prefix:
        annotations[f"{ANNOTATION_PREFIX}.prefix"] = prefix
    if lock_path is not None:
        annotations[f"{ANNOTATION_PREFIX}.lock.sha256"] = hashlib.sha256(lock_path.read_bytes()).hexdigest()
    return annotations


def _description(prefix: str) -> str:
    return (f"A Hugging Face hub cache at {f'/{prefix}' if prefix else 'the image root'}: mount it at /opt/hf-cache, "
            "set HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1" + (f" (a volume: subPath {prefix})" if prefix else ""))


def _temp_error(exc: OSError, folder: Path) -> CacheError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheError(f"push: no space left in {folder.parent} (TMPDIR) for the compressed layers",
                          hint="free space there or point TMPDIR at a filesystem with room for the compressed image")
    return CacheError(f"push: writing the layers under {folder.parent} (TMPDIR) failed: {exc.strerror or exc}",
                      hint="point TMPDIR at a writable folder")


def _write_layers(plan: ExportPlan, split: str, folder: Path, prefix: str = "") -> list[tuple[Layer, ExportPlan, Path]]:
    """(layer, its plan, its file) of each layer of ``plan`` written into ``folder``, in image order. CacheError: a
    source blob does not match its name or cannot be read, or ``folder`` is full."""
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
