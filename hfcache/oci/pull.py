"""``hfcache pull``: an OCI image made by ``hfcache push`` merged into a cache, every digest checked first.

The manifest is read (by digest, or by tag and then checked against the registry's ``Docker-Content-Digest``), then
the config (its digest). Each layer then streams once, straight into :func:`hfcache.move.importer.import_members` (the
same refusals as ``hfcache import``): compressed bytes -> sha256 (must equal the descriptor's digest; never more
bytes than its size) -> gunzip -> sha256 (must equal the config's ``diff_id``) -> tar entries, which the importer
stages under ``<cache>/.locks/``. The importer checks and publishes only after the last entry of the last layer,
and a layer whose digest does not match raises at its end, before that: a tampered layer changes nothing in the
target. Nothing goes to ``TMPDIR``; the disk needed is the uncompressed image, on the cache's filesystem, refused up
front (and while streaming) when it exceeds the free space there or ``max_size``. The compressed bytes count too
(declared sizes up front, received bytes while streaming): gzip members that inflate to nothing are bytes read.

Manifests and configs are read under the metadata deadline, layers under the throughput floor
(:mod:`hfcache.pace`, enforced in :mod:`hfcache.oci.registry`); registry text reaches messages only through
:func:`hfcache.oci.registry.registry_text`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import CacheError, EndpointUnreachable, HubError, IntegrityError, UsageError
from .image import ANNOTATION_PREFIX, DIGEST, LAYER_GZIP, MANIFEST_TYPE, Layer
from .credentials import Credentials
from .registry import (BlobBody, TransferSink, check, connect, network_errors, parse_reference, read_body,
                       registry_text, stream_errors, url)

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
_ACCEPT = ", ".join((MANIFEST_TYPE, DOCKER_MANIFEST, INDEX_TYPE, DOCKER_LIST))
#: Most layers a pulled image may list: push writes one per repo (``--layers repo``) or one (``single``), and Docker's
#: overlay2 storage refuses images of more than 127 layers anyway; each layer is a request, so this bounds a pull's
#: requests (and, with the metadata deadline and the throughput floor, its time) however a registry answers.
MAX_LAYERS = 1000
_MAX_JSON = 4 * 1024 * 1024  # a manifest or config larger than this is not one of ours (or not one at all)
_CHUNK = 1024 * 1024
_ALTERED = "the registry content was altered or is corrupt; nothing was imported"


@dataclass(frozen=True)
class PullReport:
    """The outcome of :func:`pull`.

    Attributes:
        reference (str); digest (str): the manifest's ``sha256:<hex>``; layers (tuple[Layer, ...]).
        bytes_downloaded (int): compressed bytes received.
        bytes_unpacked (int): uncompressed layer bytes read (the tar streams).
        imported: the :class:`hfcache.move.importer.ImportReport` of the merge into the target cache.
    """

    reference: str
    digest: str
    layers: tuple[Layer, ...]
    bytes_downloaded: int
    bytes_unpacked: int
    imported: object


class _Budget:
    """The bytes a pull may unpack, and download: ``max_size`` (exit 2) and the free space on the cache's
    filesystem when the pull started (exit 5). Every layer's tar stream counts (``used``), and an entry is refused
    before it is staged; the compressed bytes count on their own (``wire``: a gzip layer is never smaller than its
    tar, except for a stream of empty gzip members, which inflates to nothing and would otherwise be read forever)."""

    def __init__(self, max_size: int | None, free: int, where: Path) -> None:
        self.max_size, self.free, self.where, self.used, self.wire = max_size, free, where, 0, 0

    def check(self, more: int, what: str, *, wire: bool = False) -> None:
        total, verb = (self.wire + more, "downloads") if wire else (self.used + more, "unpacks to")
        if self.max_size is not None and total > self.max_size:
            raise UsageError(f"refused {what}: the image {verb} more than --max-size ({self.max_size} bytes); "
                             "nothing was imported", hint="raise --max-size if you trust this image")
        if total > self.free:
            raise CacheError(f"refused {what}: the image {verb} more than the {self.free} bytes free on "
                             f"{self.where}'s filesystem; nothing was imported",
                             hint="free disk space or pull into another --cache-dir")

    def take(self, n: int, what: str, *, wire: bool = False) -> None:
        self.check(n, what, wire=wire)
        if wire:
            self.wire += n
        else:
            self.used += n


class _VerifiedStream(io.RawIOBase):
    """Reads ``source``, hashing every byte; refuses more than ``limit`` bytes (a blob larger than declared) and
    more than the ``budget``. Errors of ``source`` become hfcache errors naming the layer: ``network`` errors
    (urllib3's, sockets') exit 3 as unreachable, ``corrupt`` ones (gzip's, zlib's) exit 3 as altered content."""

    def __init__(self, source, what: str, *, limit: int | None = None, sink: TransferSink | None = None,
                 budget: _Budget | None = None, wire: bool = False, network: tuple = (), corrupt: tuple = ()) -> None:
        self._source, self._what, self._limit, self._sink, self._budget = source, what, limit, sink, budget
        self._wire, self._network, self._corrupt = wire, network, corrupt
        self.sha256, self.size = hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._source.read(len(buffer))
        except self._network as exc:
            raise EndpointUnreachable(f"layer {self._what}: the download failed ({type(exc).__name__})",
                                      hint="check the registry and try again; nothing was imported") from None
        except self._corrupt as exc:
            raise IntegrityError(f"refused layer {self._what}: not a readable tar+gzip ({type(exc).__name__})",
                                 hint=_ALTERED) from None
        n = len(data)
        buffer[:n] = data
        self.size += n
        if self._limit is not None and self.size > self._limit:
            raise IntegrityError(f"refused layer {self._what}: larger than the {self._limit} bytes its manifest "
                                 "declares", hint=_ALTERED)
        if self._budget is not None:
            self._budget.take(n, f"layer {self._what}", wire=self._wire)
        self.sha256.update(data)
        if self._sink is not None and n:
            self._sink.advance(n)
        return n

    def digest(self) -> str:
        return f"sha256:{self.sha256.hexdigest()}"


class _Entry(io.RawIOBase):
    """An entry's content as the importer reads it; a tar that breaks mid-entry is the layer's fault (exit 3)."""

    def __init__(self, stream: BinaryIO, what: str) -> None:
        self._stream, self._what = stream, what

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except (tarfile.TarError, EOFError) as exc:
            raise IntegrityError(f"refused layer {self._what}: its tar ends inside an entry ({exc})",
                                 hint=_ALTERED) from None


def _get_json(client, container, address: str, what: str, accept: str,
              expected_digest: str | None) -> tuple[dict, bytes, str | None]:
    """GET a manifest or config (at most ``_MAX_JSON`` bytes) checked against ``expected_digest``.

    Returns:
        (document, body, media type of the answer).
    """
    response = client.do_request(address, "GET", headers={"Accept": accept}, stream=True)
    with response:
        if response.status_code == 404:
            raise HubError(f"{what}: not found in {container.registry}/{container.api_prefix}",
                           hint="check the name and the tag or digest (`skopeo list-tags docker://REGISTRY/NAME`)")
        check(response, what, 200)
        body = read_body(response, _MAX_JSON + 1, container.registry)
        answered = response.headers.get("Docker-Content-Digest")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip() or None
    if len(body) > _MAX_JSON:
        raise UsageError(f"{what}: larger than {_MAX_JSON} bytes; not an hfcache image",
                         hint="pull images written by `hfcache push`")
    expected = expected_digest or (answered if answered and DIGEST.fullmatch(answered) else None)
    if expected and _sha256(body) != expected:
        raise IntegrityError(f"{what}: content does not match its digest {expected}", hint=_ALTERED)
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise UsageError(f"{what}: not JSON", hint="pull images written by `hfcache push`") from None
    if not isinstance(document, dict):
        raise UsageError(f"{what}: not a JSON object", hint="pull images written by `hfcache push`")
    return document, body, media_type


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _refuse_index(manifest: dict, media_type: str | None, reference: str) -> None:
    kind = manifest.get("mediaType") or media_type
    if kind in (INDEX_TYPE, DOCKER_LIST) or "manifests" in manifest:
        raise UsageError(f"{reference} is a multi-platform image index, not an image hfcache push wrote",
                         hint="pull one platform's manifest by digest: REGISTRY/NAME@sha256:...")
    if kind not in (MANIFEST_TYPE, DOCKER_MANIFEST, None):
        raise UsageError(f"{reference} is not an image manifest ({registry_text(kind, 80)})",
                         hint="hfcache pull reads the single-platform images hfcache push writes")


def _layers_of(manifest: dict, config: dict, reference: str) -> list[tuple[dict, str]]:
    """The manifest's layer descriptors with their diff_ids, validated (digests, sizes, media types)."""
    hint = "hfcache pull reads the images hfcache push writes"
    layers = manifest.get("layers")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config.get("rootfs"), dict) else None
    if not isinstance(layers, list) or not layers or not isinstance(diff_ids, list) or len(diff_ids) != len(layers):
        raise UsageError(f"{reference}: the manifest's layers and the config's rootfs.diff_ids do not match", hint=hint)
    if len(layers) > MAX_LAYERS:
        raise UsageError(f"{reference}: {len(layers)} layers, more than the {MAX_LAYERS} hfcache pulls", hint=hint)
    out, seen = [], set()
    for layer, diff_id in zip(layers, diff_ids):
        if not isinstance(layer, dict) or not DIGEST.fullmatch(str(layer.get("digest"))) \
                or type(layer.get("size")) is not int or layer["size"] < 0 or not DIGEST.fullmatch(str(diff_id)):
            raise UsageError(f"{reference}: a layer descriptor is malformed (digest, size or diff_id)", hint=hint)
        if layer.get("mediaType") not in (LAYER_GZIP, DOCKER_LAYER_GZIP, LAYER_TAR):
            raise UsageError(f"{reference}: layer {layer['digest']} has media type "
                             f"{registry_text(repr(layer.get('mediaType')), 80)}",
                             hint="hfcache pull reads tar and tar+gzip layers (not zstd)")
        if layer["digest"] in seen:  # push writes each layer once: a repeat only costs requests and time
            raise UsageError(f"{reference}: layer {layer['digest']} is listed twice", hint=hint)
        seen.add(layer["digest"])
        out.append((layer, diff_id))
    return out


def _layer_members(client, container, layer: dict, diff_id: str, sink: TransferSink | None, budget: _Budget,
                   received: list[Layer]) -> Iterator:
    """The tar entries of one layer as the importer takes them; at the layer's end, its digest, size and diff_id
    are checked (IntegrityError, before the importer publishes anything), and the layer is appended to ``received``.
    Every error is an hfcache error here: a requests error (an OSError) reaching the importer would read as a cache
    error.
    """
    from ..move.import_source import tar_members

    digest = layer["digest"]
    with network_errors(container.registry, client.prefix == "http"):
        response = client.do_request(url(client, container, "blobs", digest), "GET", stream=True)
    with response:
        check(response, f"layer {digest}", 200)
        repos = _annotated_repos(layer)
        if sink is not None:
            sink.begin(",".join(repos)[:60] or digest[7:19], layer["size"])
        compressed = _VerifiedStream(BlobBody(response, container.registry, f"layer {digest}"), digest,
                                     limit=layer["size"], sink=sink, budget=budget, wire=True, network=stream_errors())
        raw = io.BufferedReader(compressed, _CHUNK)
        unpacked = gzip.GzipFile(fileobj=raw, mode="rb") if layer["mediaType"] != LAYER_TAR else raw
        tar_stream = _VerifiedStream(unpacked, digest, budget=budget, corrupt=(OSError, EOFError, zlib.error))
        try:
            for member, stream in tar_members(io.BufferedReader(tar_stream, _CHUNK), mode="r|"):
                if member.kind == "file":
                    budget.check(member.size, f"entry {member.name[:100]!r}")
                yield member, (_Entry(stream, digest) if stream is not None else None)
            while tar_stream.read(_CHUNK):  # the tar's end padding: the diff_id covers every byte
                pass
            while raw.read(_CHUNK):  # gzip trailers or concatenated members after the tar
                pass
        except (tarfile.TarError, EOFError) as exc:
            raise IntegrityError(f"refused layer {digest}: not a readable tar ({exc})", hint=_ALTERED) from None
    _verify_layer(layer, diff_id, compressed, tar_stream)
    received.append(Layer(digest, layer["size"], diff_id, repos, compressed.size))


def _annotated_repos(layer: dict) -> tuple[str, ...]:
    """The repo folders a layer's ``io.hfcache.repos`` annotation names (the registry's text: shown in progress and
    output, so only names that are repo folders of the cache layout are kept)."""
    from ..cache.scan import parse_folder_name

    annotations = layer.get("annotations") if isinstance(layer.get("annotations"), dict) else {}
    names = str(annotations.get(f"{ANNOTATION_PREFIX}.repos", "")).split(",")
    return tuple(name for name in names[:1000] if name and name.isprintable() and parse_folder_name(name))


def _verify_layer(layer: dict, diff_id: str, compressed: _VerifiedStream, tar_stream: _VerifiedStream) -> None:
    digest = layer["digest"]
    if compressed.size != layer["size"]:
        raise IntegrityError(f"refused layer {digest}: the registry sent {compressed.size} bytes, its manifest "
                             f"declares {layer['size']}", hint=_ALTERED)
    if compressed.digest() != digest:
        raise IntegrityError(f"refused layer {digest}: its content hashes to {compressed.digest()}", hint=_ALTERED)
    if tar_stream.digest() != diff_id:
        raise IntegrityError(f"refused layer {digest}: its uncompressed content does not match diff_id {diff_id}",
                             hint="the image config and the layer disagree; nothing was imported")


def _free_space(cache_dir: Path) -> tuple[int, Path]:
    """Free bytes on the filesystem that holds (or will hold) ``cache_dir``: its nearest existing folder's."""
    from ..move.import_staging import free_bytes

    folder = cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return free_bytes(folder), folder


def pull(reference: str, cache_dir: Path, plain_http: bool = False, credentials: Credentials | None = None,
         timeout: float = 60.0, sink: TransferSink | None = None, move_refs: bool = False,
         max_size: int | None = None, lock_timeout: float = 600.0, on_lock_wait=None) -> PullReport:
    """Pull the image ``reference`` and merge its cache into ``cache_dir``, every digest checked first.

    Args:
        reference: ``REGISTRY/NAME[:TAG][@sha256:...]``.
        cache_dir: the target cache (created if missing; removed again if the pull fails).
        plain_http (bool): HTTP instead of HTTPS; credentials: None reads the auth files when the registry asks;
        timeout (float): seconds to wait for a connection or any byte of an answer (each metadata answer must also end
            within ``HFCACHE_METADATA_DEADLINE`` seconds, each layer keep ``HFCACHE_MIN_RATE``);
        sink: download progress.
        move_refs: a ref the target has at another commit moves to the image's (else that refuses the pull).
        max_size: refuse an image whose layers unpack to more bytes than this (None: no bound but free space).
        lock_timeout, on_lock_wait: as for :func:`hfcache.move.importer.import_cache` (the bounded wait for repo locks).

    Returns:
        PullReport.

    Raises:
        IntegrityError: a manifest, config or layer does not match its digest or size (or a layer its diff_id);
            the message names the digest; nothing is written to the target.
        UsageError: not an image hfcache can read (an index, no such tag), larger than ``max_size`` (compressed or
            unpacked), or content
            ``hfcache import`` refuses (nothing is written).
        CheckFailed: the target holds an entry with other content, or a ref elsewhere (see ``import_members``).
        RegistryAuthError, EndpointUnreachable, HubError: the registry refused or could not be reached, missed the
            metadata deadline or the body floor, or redirected to a host that asks for credentials (never answered).
        CacheError: the target cannot be written, or the image does not fit in its free space.
        LockTimeout: a repo's lock stayed held for ``lock_timeout`` seconds (exit 5); nothing is written then.
    """
    from ..move.importer import import_members

    container = parse_reference(reference)
    with network_errors(container.registry, plain_http):
        client = connect(container, plain_http, credentials, timeout)
        manifest, body, media_type = _get_json(client, container,
                                               url(client, container, "manifests", container.digest or container.tag),
                                               f"manifest {reference}", _ACCEPT, container.digest)
        _refuse_index(manifest, media_type, reference)
        descriptor = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        if not DIGEST.fullmatch(str(descriptor.get("digest"))):
            raise UsageError(f"{reference}: the manifest has no valid config descriptor",
                             hint="hfcache pull reads the images hfcache push writes")
        config, _, _ = _get_json(client, container, url(client, container, "blobs", descriptor["digest"]),
                                 f"config {descriptor['digest']}", "*/*", descriptor["digest"])
        layers = _layers_of(manifest, config, reference)
        free, where = _free_space(Path(cache_dir))
        budget = _Budget(max_size, free, where)
        budget.check(sum(layer["size"] for layer, _ in layers), f"image {reference}", wire=True)
        received: list[Layer] = []

        def members() -> Iterator:
            for layer, diff_id in layers:
                yield from _layer_members(client, container, layer, diff_id, sink, budget, received)

        imported = import_members(members, Path(cache_dir), move_refs=move_refs, lock_timeout=lock_timeout,
                                  on_lock_wait=on_lock_wait)
    return PullReport(reference=reference, digest=_sha256(body), layers=tuple(received),
                      bytes_downloaded=sum(x.transferred for x in received), bytes_unpacked=budget.used,
                      imported=imported)
