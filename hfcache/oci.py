"""oci: a cache as an OCI image in a registry (push), and back into a cache, verified (pull).

The image's root filesystem *is* a Hugging Face hub cache (``models--ORG--NAME/...`` at ``/``), so a runtime can
mount it read-only (Kubernetes ``image`` volumes, ``podman --mount type=image``) at ``/opt/hf-cache`` and
``HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1`` is all an application needs.

Image format (OCI image-spec v1.1, image-manifest.md, config.md, layer.md):

- manifest ``application/vnd.oci.image.manifest.v1+json``, serialised canonically (sorted keys, no spaces), so the
  same layers always give the same manifest digest;
- config ``application/vnd.oci.image.config.v1+json`` with ``os``/``architecture`` and ``rootfs.diff_ids`` (sha256
  of each *uncompressed* layer), no ``created`` time;
- layers ``application/vnd.oci.image.layer.v1.tar+gzip`` made of :func:`hfcache.export.write_tar` (sorted entries,
  mtime 0, uid/gid 0, every blob hashed on the way) through gzip with a fixed header (mtime 0, no file name) and a
  fixed level: the same cache gives byte-identical layers whatever the mtimes (for the same zlib).
- layer split: ``repo`` (default) makes one self-contained layer per repo folder (a blob shared by two repos is
  stored in both), so updating one repo re-pushes and re-pulls one layer; ``single`` makes one layer (each blob
  once). Figures: benchmarks/bench_oci.py.

Registry protocol: the distribution API (distribution-spec v1.1) through ``oras`` (oras-py, the ORAS project's
Python SDK): its reference parsing, its credential lookup (docker config ``auths``, ``credHelpers``/``credsStore``),
its bearer-token flow, and its blob calls. Library gaps worked around in :class:`_Registry` (checked in oras 0.2.43,
``provider.py``/``auth/token.py``): ``do_request`` retries *every* exception five times with sleeps of 3 s to
83 s (a refused password or a closed port takes minutes), has no timeout, and the token backend mistakes a
``Basic`` challenge (the distribution registry with htpasswd) for a token realm; ``put_upload`` reads a whole
blob into memory; ``download_blob`` never checks the digest; ``upload_manifest`` lets requests serialise the JSON
(the bytes, hence the digest, are not ours). So requests, auth retries, uploads, manifests and digest checks are
done here, on oras's session and auth backend. huggingface_hub's HTTP client was the other candidate: it has
neither credential lookup nor the token flow, and its request hook refuses every request under
``HF_HUB_OFFLINE=1`` (a pod in offline mode must still be able to pull from its registry).

Pull streams each layer once: compressed bytes -> sha256 (must equal the descriptor's digest, size bounded by
the descriptor's size) -> gunzip -> sha256 (must equal the config's diff_id) -> tar members copied into one
temporary tar; only when every digest matched is that tar given to :func:`hfcache.importer.import_cache` (the
same refusals as ``hfcache import``, all-or-nothing): a tampered layer changes nothing in the target.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import platform
import re
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .errors import EndpointUnreachable, HubError, IntegrityError, UsageError
from .export import Entry, ExportPlan, plan_export, write_tar
from .scan import parse_folder_name

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
GZIP_LEVEL = 6
SPLITS = ("repo", "single")
ANNOTATION_PREFIX = "io.hfcache"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_JSON = 4 * 1024 * 1024  # a manifest or config larger than this is not one of ours (or not one at all)
_CHUNK = 1024 * 1024


class TransferSink(Protocol):
    """Receives transfer progress (the CLI draws it; the core never prints)."""

    def begin(self, label: str, total: int) -> None:
        """A blob transfer of ``total`` bytes starts."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes of the current blob were transferred."""


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
    """

    reference: str
    digest: str
    layers: tuple[Layer, ...]
    split: str
    repos: tuple[str, ...]
    bytes_total: int
    bytes_uploaded: int


@dataclass(frozen=True)
class PullReport:
    """The outcome of :func:`pull`.

    Attributes:
        reference (str); digest (str): the manifest's ``sha256:<hex>``; layers (tuple[Layer, ...]).
        bytes_downloaded (int): compressed bytes received.
        imported: the :class:`hfcache.importer.ImportReport` of the merge into the target cache.
    """

    reference: str
    digest: str
    layers: tuple[Layer, ...]
    bytes_downloaded: int
    imported: object


@dataclass(frozen=True)
class Credentials:
    """A registry username and password (``--username`` / ``--password-stdin``); never printed or stored."""

    username: str
    password: str = ""

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***)"


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


def write_layer(plan: ExportPlan, out: BinaryIO) -> tuple[str, int, str]:
    """Write ``plan`` as a reproducible tar+gzip layer to ``out``.

    Returns:
        (digest, size, diff_id): ``sha256:<hex>`` of the gzip bytes, their count, ``sha256:<hex>`` of the tar.

    Raises:
        IntegrityError: a blob's content does not match its name (see :func:`hfcache.export.write_tar`).
    """
    sink = _HashingWriter(out)
    # Fixed gzip header: mtime 0 and no FNAME (filename=""), and a fixed level: reproducible bytes.
    with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=sink, mtime=0) as gz:
        diff_id = write_tar(plan, gz)
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
                    arch: str) -> tuple[bytes, bytes]:
    """The config and manifest bytes (canonical JSON) of an image made of ``layers``.

    Args:
        layers: each pushed layer with the plan it was written from.
        annotations: manifest annotations (also the config's ``Labels``, which ``podman inspect`` shows).
        arch: the config's ``architecture``.

    Returns:
        (config_bytes, manifest_bytes).
    """
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Labels": annotations},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer, _ in layers]},
    }
    config_bytes = _canonical(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": _sha256(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_GZIP, "digest": layer.digest, "size": layer.size,
                    "annotations": {f"{ANNOTATION_PREFIX}.repos": ",".join(layer.repos),
                                    f"{ANNOTATION_PREFIX}.commits": ",".join(_commits_of(plan))}}
                   for layer, plan in layers],
        "annotations": annotations,
    }
    return config_bytes, _canonical(manifest)


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


# --- registry access -----------------------------------------------------------------------------------------------


class RegistryAuthError(HubError):
    """The registry refused the request for want of (valid) credentials."""


def auth_files() -> list[str]:
    """Credential files to read, in the order podman/skopeo and docker look (containers-auth.json(5)).

    ``REGISTRY_AUTH_FILE``; ``$XDG_RUNTIME_DIR/containers/auth.json``; ``~/.config/containers/auth.json``;
    ``$DOCKER_CONFIG/config.json``; ``~/.docker/config.json`` (the last one oras adds itself). Existing files only.
    """
    candidates = [os.environ.get("REGISTRY_AUTH_FILE", "")]
    if os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    candidates.append(os.path.expanduser("~/.config/containers/auth.json"))
    if os.environ.get("DOCKER_CONFIG"):
        candidates.append(os.path.join(os.environ["DOCKER_CONFIG"], "config.json"))
    return [c for c in candidates if c and os.path.isfile(c)]


def parse_reference(reference: str):
    """Parse ``[REGISTRY/]NAME[:TAG][@DIGEST]`` with oras (default registry docker.io, tag ``latest``).

    Raises:
        UsageError: not a valid reference.
    """
    import oras.container

    if not reference or any(c.isspace() for c in reference) or "://" in reference:
        raise UsageError(f"{reference!r} is not an image reference", hint="e.g. registry.example.com/hf/cache:v1")
    try:
        container = oras.container.Container(reference)
    except ValueError:
        raise UsageError(f"{reference!r} is not an image reference",
                         hint="e.g. registry.example.com/hf/cache:v1") from None
    if container.digest is not None and not _DIGEST.fullmatch(container.digest):
        raise UsageError(f"{reference!r}: the digest must be sha256:<64 hex>")
    return container


def _registry_class():
    """oras imported on first use: it pulls in requests and jsonschema, which no other command needs."""
    import oras.auth.utils
    import oras.provider

    class _Registry(oras.provider.Registry):
        """oras's Registry with a request method that fails fast, answers Basic and Bearer challenges, times out."""

        def __init__(self, container, plain_http: bool, credentials: Credentials | None, timeout: float) -> None:
            super().__init__(hostname=container.registry, insecure=plain_http, auth_backend="token")
            self._timeout = timeout
            self._authorization: str | None = None
            self.registry_name = container.registry
            if credentials is not None:
                self.auth.set_basic_auth(credentials.username, credentials.password)
            else:
                self.auth.load_configs(container, configs=auth_files())

        def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):
            headers = dict(headers or {})
            response = self._send(method, url, data, headers, json, stream)
            if response.status_code != 401:
                return response
            response.close()
            self._authorization = self._answer(response.headers.get("Www-Authenticate", ""))
            if hasattr(data, "seek"):
                data.seek(0)
            response = self._send(method, url, data, headers, json, stream)
            if response.status_code == 401:
                raise RegistryAuthError(f"registry {self.registry_name} refused the credentials",
                                        hint="check --username/--password-stdin or the auth file")
            return response

        def _send(self, method, url, data, headers, json, stream):
            if self._authorization:
                headers["Authorization"] = self._authorization
            return self.session.request(method, url, data=data, json=json, headers=headers, stream=stream,
                                        verify=self._tls_verify, timeout=self._timeout, allow_redirects=True)

        def _answer(self, challenge: str) -> str:
            scheme = challenge.split(" ", 1)[0].lower()
            basic = getattr(self.auth, "_basic_auth", None)
            if scheme == "basic" and basic:
                return f"Basic {basic}"
            if scheme == "bearer":
                parsed = oras.auth.utils.parse_auth_header(challenge)
                token = self.auth.request_token(parsed) if basic else self.auth.request_anonymous_token(parsed)
                if token:
                    return f"Bearer {token}"
            raise RegistryAuthError(f"registry {self.registry_name} requires authentication"
                                    + (" and refused the credentials" if basic else ""),
                                    hint="give --username and --password-stdin, or log in with "
                                         "`podman login` / `docker login` (REGISTRY_AUTH_FILE, ~/.docker/config.json)")

    return _Registry


@contextlib.contextmanager
def _network_errors(registry: str, plain_http: bool) -> Iterator[None]:
    """Turn requests' connection, TLS and timeout errors into one-line hfcache errors (exit 3)."""
    import requests

    try:
        yield
    except requests.exceptions.SSLError as exc:
        raise EndpointUnreachable(f"registry {registry}: TLS failed ({type(exc).__name__})",
                                  hint="for a registry without TLS on a trusted network, pass --plain-http") from None
    except requests.exceptions.Timeout:
        raise EndpointUnreachable(f"registry {registry}: no answer within the timeout") from None
    except requests.exceptions.ConnectionError as exc:
        hint = "check the registry address" + ("" if plain_http else "; a registry without TLS needs --plain-http")
        raise EndpointUnreachable(f"registry {registry} unreachable ({_reason(exc)})", hint=hint) from None
    except requests.exceptions.RequestException as exc:
        raise HubError(f"registry {registry}: {type(exc).__name__}: {exc}") from None


def _reason(exc: Exception) -> str:
    text = str(exc)
    for needle in ("Connection refused", "Name or service not known", "Connection reset", "Remote end closed"):
        if needle in text:
            return needle.lower()
    return type(exc).__name__


def _check(response, what: str, *expected: int) -> None:
    if response.status_code in expected:
        return
    detail = ""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        errors = response.json().get("errors") or []
        detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
    if response.status_code in (401, 403):
        raise RegistryAuthError(f"{what}: access denied (HTTP {response.status_code}) {detail}".rstrip(),
                                hint="give --username and --password-stdin, or log in with podman/docker")
    raise HubError(f"{what}: HTTP {response.status_code} {detail}".rstrip())


class _ProgressFile(io.RawIOBase):
    """A file read for an upload body, reporting progress (requests streams a file object with Content-Length)."""

    def __init__(self, path: Path, sink: TransferSink | None) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._sink = sink
        self.sent = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(_CHUNK if size is None or size < 0 else size)
        self.sent += len(data)
        if self._sink is not None and data:
            self._sink.advance(len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.sent = 0
        return self._f.seek(offset, whence)

    def close(self) -> None:
        self._f.close()
        super().close()


def _connect(container, plain_http: bool, credentials: Credentials | None, timeout: float):
    return _registry_class()(container, plain_http, credentials, timeout)


def _url(client, container, kind: str, ref: str) -> str:
    return f"{client.prefix}://{container.registry}/v2/{container.api_prefix}/{kind}/{ref}"


def _upload(client, container, digest: str, path: Path, size: int, sink: TransferSink | None, label: str) -> int:
    """Upload one blob unless the registry has it (HEAD); return the bytes sent.

    The monolithic upload of distribution-spec ("POST then PUT"): the body is streamed from the file.
    """
    head = client.do_request(_url(client, container, "blobs", digest), "HEAD")
    if head.status_code == 200:
        return 0
    started = client.do_request(f"{client.prefix}://{container.upload_blob_url()}", "POST",
                                headers={"Content-Length": "0"})
    _check(started, f"start upload to {container.registry}/{container.api_prefix}", 202)
    location = client._get_location(started, container)  # oras: makes a relative Location absolute
    if not location:
        raise HubError(f"registry {container.registry}: no upload location in its answer")
    separator = "&" if "?" in location else "?"
    if sink is not None:
        sink.begin(label, size)
    with _ProgressFile(path, sink) as body:
        done = client.do_request(f"{location}{separator}digest={digest}", "PUT", data=body,
                                 headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        _check(done, f"upload {digest}", 201, 204)
        return body.sent


def push(reference: str, cache_dir: Path, specs: Sequence[str] = (), lock_path: str | os.PathLike[str] | None = None,
         split: str = "repo", plain_http: bool = False, credentials: Credentials | None = None,
         timeout: float = 60.0, sink: TransferSink | None = None, arch: str | None = None) -> PushReport:
    """Push the cache (or the given repos, or what a lock pins) to ``reference`` as an OCI image.

    Args:
        reference: ``REGISTRY/NAME:TAG`` (a tag, not a digest).
        cache_dir: the source cache.
        specs: ``REPO_ID[@REVISION]`` to push; with neither specs nor lock, the whole cache.
        lock_path: push exactly what this lock pins; its sha256 is recorded in the ``io.hfcache.lock.sha256``
            annotation (never its path).
        split: ``repo`` (one layer per repo folder) or ``single``.
        plain_http: talk HTTP instead of HTTPS.
        credentials: username/password; None reads the auth files (:func:`auth_files`).
        timeout: seconds to wait for a connection or any byte of an answer.
        sink: receives upload progress.
        arch: the config's architecture (default: this machine's, :func:`architecture`); the content is portable,
            but the config, hence the digest, records it.

    Returns:
        PushReport.

    Raises:
        UsageError: bad reference, a repo not in the cache, a bad lock.
        IntegrityError: a cache blob does not match its name (nothing is pushed).
        RegistryAuthError, EndpointUnreachable, HubError: the registry refused or could not be reached (exit 3).
    """
    from .lockfile import read_lock

    container = parse_reference(reference)
    if container.digest:
        raise UsageError(f"{reference}: push needs a tag, not a digest", hint="e.g. REGISTRY/NAME:v1")
    if arch is not None and not re.fullmatch(r"[a-z0-9_]{1,32}", arch):
        raise UsageError(f"--arch {arch!r}: expected an OCI architecture name such as amd64 or arm64")
    plan = plan_export(cache_dir, specs, lock=read_lock(lock_path) if lock_path else None)
    if not plan.repos:
        raise UsageError(f"nothing to push: {cache_dir} holds no repo", hint="warm it first (hfcache warm)")
    annotations = _annotations(plan, split, Path(lock_path) if lock_path else None)
    with tempfile.TemporaryDirectory(prefix="hfcache-push-") as tmp:
        layers = _write_layers(plan, split, Path(tmp))
        config_bytes, manifest_bytes = image_documents([(layer, p) for layer, p, _ in layers], annotations,
                                                       arch or architecture())
        config_path = Path(tmp) / "config.json"
        config_path.write_bytes(config_bytes)
        with _network_errors(container.registry, plain_http):
            client = _connect(container, plain_http, credentials, timeout)
            pushed = [Layer(layer.digest, layer.size, layer.diff_id, layer.repos,
                            _upload(client, container, layer.digest, path, layer.size, sink, ",".join(layer.repos)))
                      for layer, _, path in layers]
            config_sent = _upload(client, container, _sha256(config_bytes), config_path, len(config_bytes),
                                  None, "config")
            response = client.do_request(_url(client, container, "manifests", container.tag), "PUT",
                                         data=manifest_bytes, headers={"Content-Type": MANIFEST_TYPE})
            _check(response, f"push manifest {reference}", 201)
    digest = _sha256(manifest_bytes)
    answered = response.headers.get("Docker-Content-Digest")
    if answered and answered != digest:
        raise HubError(f"registry {container.registry} stored the manifest as {answered}, expected {digest}")
    return PushReport(reference=f"{container.registry}/{container.api_prefix}:{container.tag}", digest=digest,
                      layers=tuple(pushed), split=split, repos=tuple(_commits_of(plan)),
                      bytes_total=sum(x.size for x in pushed) + len(config_bytes) + len(manifest_bytes),
                      bytes_uploaded=sum(x.transferred for x in pushed) + config_sent + len(manifest_bytes))


def _annotations(plan: ExportPlan, split: str, lock_path: Path | None) -> dict[str, str]:
    """The manifest's annotations: what the image is and which commits it holds; no path, no time, no token."""
    annotations = {
        "org.opencontainers.image.title": "Hugging Face hub cache",
        "org.opencontainers.image.description": "A Hugging Face hub cache at the image root: mount it at "
                                                "/opt/hf-cache, set HF_HUB_CACHE=/opt/hf-cache HF_HUB_OFFLINE=1",
        f"{ANNOTATION_PREFIX}.repos": ",".join(_commits_of(plan)),
        f"{ANNOTATION_PREFIX}.layer-split": split,
    }
    if lock_path is not None:
        annotations[f"{ANNOTATION_PREFIX}.lock.sha256"] = hashlib.sha256(lock_path.read_bytes()).hexdigest()
    return annotations


def _write_layers(plan: ExportPlan, split: str, folder: Path) -> list[tuple[Layer, ExportPlan, Path]]:
    """Write the layers of ``plan`` into ``folder``: (layer, its plan, its file) in image order."""
    layers = []
    for index, layer_plan in enumerate(split_plan(plan, split)):
        path = folder / f"layer-{index}.tar.gz"
        with open(path, "wb") as out:
            digest, size, diff_id = write_layer(layer_plan, out)
        layers.append((Layer(digest, size, diff_id, layer_plan.repos, 0), layer_plan, path))
    return layers


# --- pull ----------------------------------------------------------------------------------------------------------


class _VerifiedStream(io.RawIOBase):
    """Reads a source, hashing every byte; refuses more than ``limit`` bytes (a blob larger than declared)."""

    def __init__(self, source, limit: int | None, what: str, sink: TransferSink | None = None) -> None:
        self._source, self._limit, self._what, self._sink = source, limit, what, sink
        self.sha256, self.size = hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.size += n
        if self._limit is not None and self.size > self._limit:
            raise IntegrityError(f"refused layer {self._what}: larger than the {self._limit} bytes its manifest "
                                 "declares", hint="the registry content was altered; nothing was imported")
        self.sha256.update(data)
        if self._sink is not None and n:
            self._sink.advance(n)
        return n

    def digest(self) -> str:
        return f"sha256:{self.sha256.hexdigest()}"


def _get_json(client, container, url: str, what: str, accept: str, expected_digest: str | None) -> tuple[dict, bytes]:
    response = client.do_request(url, "GET", headers={"Accept": accept}, stream=True)
    with response:
        if response.status_code == 404:
            raise HubError(f"{what}: not found in {container.registry}/{container.api_prefix}",
                           hint="check the reference (name and tag)")
        _check(response, what, 200)
        body = response.raw.read(_MAX_JSON + 1, decode_content=True)
    if len(body) > _MAX_JSON:
        raise UsageError(f"{what}: larger than {_MAX_JSON} bytes; not an hfcache image")
    if expected_digest and _sha256(body) != expected_digest:
        raise IntegrityError(f"{what}: content does not match its digest {expected_digest}",
                             hint="the registry content was altered; nothing was imported")
    try:
        document = json.loads(body)
    except ValueError:
        raise UsageError(f"{what}: not JSON") from None
    if not isinstance(document, dict):
        raise UsageError(f"{what}: not a JSON object")
    return document, body


def _layers_of(manifest: dict, config: dict, reference: str) -> list[tuple[dict, str]]:
    """The manifest's layer descriptors with their diff_ids, validated (digests, sizes, media types)."""
    layers = manifest.get("layers")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config.get("rootfs"), dict) else None
    if not isinstance(layers, list) or not layers or not isinstance(diff_ids, list) or len(diff_ids) != len(layers):
        raise UsageError(f"{reference}: the manifest's layers and the config's rootfs.diff_ids do not match")
    out = []
    for layer, diff_id in zip(layers, diff_ids):
        if not isinstance(layer, dict) or not _DIGEST.fullmatch(str(layer.get("digest"))) \
                or not isinstance(layer.get("size"), int) or layer["size"] < 0 \
                or not _DIGEST.fullmatch(str(diff_id)):
            raise UsageError(f"{reference}: a layer descriptor is malformed (digest, size or diff_id)")
        if layer.get("mediaType") not in (LAYER_GZIP, DOCKER_LAYER_GZIP, LAYER_TAR):
            raise UsageError(f"{reference}: layer {layer['digest']} has media type {layer.get('mediaType')!r}",
                             hint="hfcache pull reads tar and tar+gzip layers (not zstd)")
        out.append((layer, diff_id))
    return out


def _fetch_layer(client, container, layer: dict, diff_id: str, combined: tarfile.TarFile,
                 sink: TransferSink | None) -> int:
    """Stream one layer into ``combined`` while checking its digest, size and diff_id; return bytes received."""
    from .importer import BoundedTarInfo, check_tar_member

    digest = layer["digest"]
    response = client.do_request(_url(client, container, "blobs", digest), "GET", stream=True)
    with response:
        _check(response, f"layer {digest}", 200)
        if sink is not None:
            label = str((layer.get("annotations") or {}).get(f"{ANNOTATION_PREFIX}.repos", ""))[:60]
            sink.begin(label or digest[7:19], layer["size"])
        compressed = _VerifiedStream(response.raw, layer["size"], digest, sink)
        raw = io.BufferedReader(compressed, _CHUNK)
        try:
            unpacked = gzip.GzipFile(fileobj=raw, mode="rb") if layer["mediaType"] != LAYER_TAR else raw
            tar_stream = _VerifiedStream(unpacked, None, digest)
            # The same bounds as import (sparse members, tar headers, free space), before a byte is copied.
            with tarfile.open(fileobj=io.BufferedReader(tar_stream, _CHUNK), mode="r|",
                              tarinfo=BoundedTarInfo) as tar:
                for info in tar:
                    check_tar_member(info, Path(combined.name).parent)
                    combined.addfile(info, tar.extractfile(info) if info.isfile() else None)
            while tar_stream.read(_CHUNK):  # the tar's end padding: the diff_id covers every byte
                pass
            while raw.read(_CHUNK):  # gzip trailers or concatenated members after the tar
                pass
        except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
            raise IntegrityError(f"refused layer {digest}: not a readable tar+gzip ({type(exc).__name__}); its "
                                 "content does not match its digest or is corrupt",
                                 hint="the registry content was altered; nothing was imported") from None
    if compressed.digest() != digest or compressed.size != layer["size"]:
        raise IntegrityError(f"refused layer {digest}: its content hashes to {compressed.digest()} "
                             f"({compressed.size} bytes)", hint="the registry content was altered; nothing was imported")
    if tar_stream.digest() != diff_id:
        raise IntegrityError(f"refused layer {digest}: its uncompressed content does not match diff_id {diff_id}",
                             hint="the image config and the layer disagree; nothing was imported")
    return compressed.size


def pull(reference: str, cache_dir: Path, plain_http: bool = False, credentials: Credentials | None = None,
         timeout: float = 60.0, sink: TransferSink | None = None, move_refs: bool = False,
         lock_timeout: float = 600.0, on_lock_wait=None) -> PullReport:
    """Pull the image ``reference`` and merge its cache into ``cache_dir``, every digest checked first.

    Args:
        reference: ``REGISTRY/NAME[:TAG][@sha256:...]``.
        cache_dir: the target cache (created if missing).
        plain_http, credentials, timeout, sink: as for :func:`push`.
        move_refs: a ref the target has at another commit moves to the image's (else that refuses the pull).
        lock_timeout, on_lock_wait: as for :func:`hfcache.importer.import_cache` (the bounded wait for repo locks).

    Returns:
        PullReport.

    Raises:
        IntegrityError: a manifest, config or layer does not match its digest (or a layer its diff_id); the
            message names the digest; nothing is written to the target.
        UsageError: not an image hfcache can read, or content ``hfcache import`` refuses (nothing is written).
        CheckFailed: the target holds an entry with other content, or a ref elsewhere (see ``import_cache``).
        RegistryAuthError, EndpointUnreachable, HubError: the registry refused or could not be reached.
        CacheError: the target cannot be written.
    """
    from .importer import import_cache

    container = parse_reference(reference)
    ref = container.digest or container.tag
    with _network_errors(container.registry, plain_http), \
            tempfile.TemporaryDirectory(prefix="hfcache-pull-") as tmp:
        client = _connect(container, plain_http, credentials, timeout)
        manifest, body = _get_json(client, container, _url(client, container, "manifests", ref),
                                   f"manifest {reference}", f"{MANIFEST_TYPE}, {DOCKER_MANIFEST}", container.digest)
        if manifest.get("mediaType") not in (MANIFEST_TYPE, DOCKER_MANIFEST, None) or "manifests" in manifest:
            raise UsageError(f"{reference} is not an image manifest ({manifest.get('mediaType')})",
                             hint="hfcache pull reads the single-platform images hfcache push writes")
        descriptor = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        if not _DIGEST.fullmatch(str(descriptor.get("digest"))):
            raise UsageError(f"{reference}: the manifest has no valid config descriptor")
        config, _ = _get_json(client, container, _url(client, container, "blobs", descriptor["digest"]),
                              f"config {descriptor['digest']}", "*/*", descriptor["digest"])
        received, layers = 0, []
        combined_path = Path(tmp) / "image.tar"
        with tarfile.open(combined_path, mode="w", format=tarfile.PAX_FORMAT) as combined:
            for layer, diff_id in _layers_of(manifest, config, reference):
                got = _fetch_layer(client, container, layer, diff_id, combined, sink)
                received += got
                repos = str((layer.get("annotations") or {}).get(f"{ANNOTATION_PREFIX}.repos", ""))
                layers.append(Layer(layer["digest"], layer["size"], diff_id,
                                    tuple(r for r in repos.split(",") if r), got))
        imported = import_cache(str(combined_path), Path(cache_dir), move_refs=move_refs, lock_timeout=lock_timeout,
                                on_lock_wait=on_lock_wait)
    return PullReport(reference=reference, digest=_sha256(body), layers=tuple(layers), bytes_downloaded=received,
                      imported=imported)
