"""``hfcache pull``: an image or ModelPack artifact made by ``hfcache push`` merged into a cache, every digest
checked before anything is published (docs/oci.md "Pull: what is checked").

Each tar layer streams once into :func:`hfcache.move.importer.import_members`: compressed bytes -> sha256 -> gunzip
-> sha256 (the ``diff_id``) -> tar entries; a layer that does not match raises at its end, before the importer
publishes. ModelPack: :mod:`.pull_modelpack`; skips: :mod:`.pull_record`; ``verify_key``: :mod:`.pull_signed`.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError, UsageError
from ..names import is_oci_digest, parse_folder_name
from . import peer
from .base_image import BASE_LAYERS
from .credentials import Credentials
from .image import ANNOTATION_PREFIX, Layer
from .peer import registry_text
from .pull_stream import (
    _ALTERED,
    _CHUNK,
    MAX_LAYERS,
    Budget,
    Entry,
    VerifiedStream,
    check_layer_count,
    free_space,
    get_json,
    held_locally,
)
from .registry import BlobBody, TransferSink, check, connect, network_errors, parse_reference, stream_errors, url

_ACCEPT = ", ".join((peer.MANIFEST_TYPE, peer.DOCKER_MANIFEST, peer.INDEX_TYPE, peer.DOCKER_LIST))
__all__ = ["MAX_LAYERS", "PREFIX", "PullReport", "pull"]  # MAX_LAYERS: both formats' bound, from .pull_stream
#: The manifest annotation ``hfcache push --prefix DIR`` writes: the cache sits under ``DIR/`` in the image.
PREFIX = f"{ANNOTATION_PREFIX}.prefix"


@dataclass(frozen=True)
class PullReport:
    """The outcome of :func:`pull`: ``bytes_downloaded`` (compressed) and ``bytes_unpacked`` (the tar streams read);
    ``imported``, the :class:`hfcache.move.importer.ImportReport` of the merge; ``skipped``, the digests of layers the
    target held; ``signed_by``, the key fingerprint (``--verify-key``); ``record_saved``: the tar layers imported were
    recorded for the next pull's skips."""

    reference: str
    digest: str
    layers: tuple[Layer, ...]
    bytes_downloaded: int
    bytes_unpacked: int
    imported: object
    format: str = "image"
    skipped: tuple[str, ...] = ()
    signed_by: str | None = None
    record_saved: bool = False


def _refuse_index(manifest: dict, media_type: str | None, reference: str) -> None:
    kind = manifest.get("mediaType") or media_type
    if kind in (peer.INDEX_TYPE, peer.DOCKER_LIST) or "manifests" in manifest:
        raise UsageError(f"{reference} is a multi-platform image index, not an image hfcache push wrote",
                         hint="pull one platform's manifest by digest: REGISTRY/NAME@sha256:...")
    if kind not in (peer.MANIFEST_TYPE, peer.DOCKER_MANIFEST, None):
        raise UsageError(f"{reference} is not an image manifest ({registry_text(kind, 80)})",
                         hint="hfcache pull reads the single-platform images hfcache push writes")
    from .base_image import artifact_kind

    artifact = artifact_kind(manifest)
    if artifact.startswith("a signature"):
        raise UsageError(f"{reference} is a signature (an OCI referrer), not an image; pull the image it signs",
                         hint="pull the image by its tag or digest; --verify-key checks its signatures")
    if artifact and not artifact.startswith("a ModelPack"):
        raise UsageError(f"{reference} is {artifact}, not an image or a ModelPack artifact",
                         hint="hfcache pull reads the images and ModelPack artifacts hfcache push writes")


def _layers_of(manifest: dict, config: dict, reference: str) -> list[tuple[dict, str]]:
    """The manifest's layer descriptors with their diff_ids, validated (digests, sizes, media types)."""
    hint = "hfcache pull reads the images hfcache push writes"
    layers = manifest.get("layers")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config.get("rootfs"), dict) else None
    if not isinstance(layers, list) or not layers or not isinstance(diff_ids, list) or len(diff_ids) != len(layers):
        raise UsageError(f"{reference}: the manifest's layers and the config's rootfs.diff_ids do not match", hint=hint)
    check_layer_count(len(layers), reference, hint)
    base = _base_count(manifest, layers, reference)
    out, seen = [], set()
    for layer, diff_id in zip(layers[base:], diff_ids[base:], strict=True):
        if not isinstance(layer, dict) or not is_oci_digest(layer.get("digest")) \
                or not peer.size_ok(layer.get("size")) or not is_oci_digest(diff_id):
            raise UsageError(f"{reference}: a layer descriptor is malformed (digest, size or diff_id)", hint=hint)
        if layer.get("mediaType") not in (peer.LAYER_GZIP, peer.DOCKER_LAYER_GZIP, peer.LAYER_TAR):
            raise UsageError(f"{reference}: layer {layer['digest']} has media type "
                             f"{registry_text(repr(layer.get('mediaType')), 80)}",
                             hint="hfcache pull reads tar and tar+gzip layers (not zstd)")
        if layer["digest"] in seen:  # push writes each layer once: a repeat only costs requests and time
            raise UsageError(f"{reference}: layer {layer['digest']} is listed twice", hint=hint)
        seen.add(layer["digest"])
        out.append((layer, diff_id))
    return out


def _base_count(manifest: dict, layers: list, reference: str) -> int:
    """How many of the manifest's first layers are the ``push --base`` image's (:data:`BASE_LAYERS`), skipped
    without a request. UsageError (exit 2): the annotation does not name the manifest's first layers."""
    annotations = manifest.get("annotations") if isinstance(manifest.get("annotations"), dict) else {}
    named = annotations.get(BASE_LAYERS)
    if named is None:
        return 0
    digests = named.split(",") if isinstance(named, str) and named else []
    first = [layer.get("digest") if isinstance(layer, dict) else None for layer in layers[:len(digests)]]
    if not digests or len(digests) >= len(layers) or first != digests:
        raise UsageError(f"{reference}: its {BASE_LAYERS} annotation does not name the manifest's first layers",
                         hint="hfcache pull reads the images hfcache push --base writes")
    return len(digests)


def _prefix_of(manifest: dict, reference: str) -> str | None:
    """The manifest's ``io.hfcache.prefix`` (e.g. ``models``), or None; UsageError (exit 2): not a prefix."""
    annotations = manifest.get("annotations") if isinstance(manifest.get("annotations"), dict) else {}
    prefix = annotations.get(PREFIX)
    if prefix is None:
        return None
    from .modelpack import prefix_problem

    why = prefix_problem(prefix) if isinstance(prefix, str) and prefix.isprintable() and len(prefix) <= 600 else \
        "not a short printable text"
    if why or prefix.endswith("/"):
        raise UsageError(f"{reference}: its {PREFIX} annotation {registry_text(repr(prefix), 80)} is not a relative "
                         f"folder such as models ({registry_text(why or 'ends with /', 120)})",
                         hint="hfcache pull reads the images hfcache push --prefix DIR writes")
    return prefix


def _verify_layer(layer: dict, diff_id: str, compressed: VerifiedStream, tar_stream: VerifiedStream) -> None:
    digest = layer["digest"]
    if compressed.size != layer["size"]:
        raise IntegrityError(f"refused layer {digest}: the registry sent {compressed.size} bytes, its manifest "
                             f"declares {layer['size']}", hint=_ALTERED)
    if compressed.digest() != digest:
        raise IntegrityError(f"refused layer {digest}: its content hashes to {compressed.digest()}", hint=_ALTERED)
    if tar_stream.digest() != diff_id:
        raise IntegrityError(f"refused layer {digest}: its uncompressed content does not match diff_id {diff_id}",
                             hint="the image config and the layer disagree; nothing was imported")


def pull(reference: str, cache_dir: Path, plain_http: bool = False, credentials: Credentials | None = None,
         timeout: float = 60.0, sink: TransferSink | None = None, move_refs: bool = False,
         max_size: int | None = None, lock_timeout: float = 600.0, on_lock_wait=None,
         verify_key: Path | None = None) -> PullReport:
    """Pull the image or ModelPack artifact ``reference`` (``REGISTRY/NAME[:TAG][@sha256:...]``) and merge its
    cache into ``cache_dir`` (created if missing, removed again if the pull fails), every digest checked first;
    layers whose content the target already holds are not downloaded.

    Args:
        plain_http, credentials, timeout (seconds), sink: as for :func:`hfcache.oci.image.push`.
        move_refs: a ref the target has at another commit moves to the image's (else that refuses the pull).
        max_size: refuse an image whose layers unpack to more bytes (None: no bound but free space).
        lock_timeout, on_lock_wait: as for :func:`hfcache.move.importer.import_cache`.
        verify_key: a PEM public key under which the manifest's model-signing bundles must sign every pulled
            snapshot before anything is published (:mod:`.pull_signed`; a bad key file is exit 2 before any request).

    Raises (nothing is written then):
        IntegrityError: a manifest, config or layer does not match its digest, size, diff_id or ``io.hfcache.etag``;
            with ``verify_key``, an entry no signed snapshot accounts for (:func:`.pull_signed.check_claims`).
        UsageError: not an image hfcache reads, over ``max_size``, content ``hfcache import`` refuses.
        CheckFailed: the target holds other content (``import_members``); with ``verify_key``: unsigned or not by
            that key (exit 1).
        RegistryAuthError, EndpointUnreachable, HubError: the registry refused, could not be reached or was too slow.
        CacheError: the target cannot be written or is too full. LockTimeout: a repo's lock stayed held (exit 5).
    """
    from ..move.importer import import_members

    container, cache_dir = parse_reference(reference), Path(cache_dir)
    if verify_key is not None:  # judged before any request: a bad key file is exit 2 at once
        from ..integrity.signatures import public_key_fingerprint
        from .pull_signed import signed_bundles

        fingerprint = public_key_fingerprint(Path(verify_key))
    with network_errors(container.registry, plain_http):
        client = connect(container, plain_http, credentials, timeout)
        manifest, digest, descriptor, config = _documents(client, container, reference)
        prefix = _prefix_of(manifest, reference)
        found = signed_bundles(client, container, digest, reference, fingerprint, Path(verify_key)) \
            if verify_key is not None else None
        budget = Budget(max_size, *free_space(cache_dir))
        source = _source(client, container, (manifest, descriptor, config), reference, prefix, cache_dir, sink,
                         budget, signed=verify_key is not None)
        signed_by: list[str] = []
        imported = import_members(lambda: _checked(source, found, verify_key, signed_by, cache_dir), cache_dir,
                                  move_refs=move_refs, lock_timeout=lock_timeout, on_lock_wait=on_lock_wait,
                                  listings=verify_key is None)  # no signature covers a trees/ listing's entries
    received, imported = source.received, _with_held(imported, source)
    saved = source.after() if isinstance(source, _ImageSource) else False  # after held_counts: it updates the record
    return PullReport(reference=reference, digest=digest, layers=tuple(received),
                      bytes_downloaded=sum(x.transferred for x in received), bytes_unpacked=budget.used,
                      imported=imported, format="image" if isinstance(source, _ImageSource) else "modelpack",
                      skipped=tuple(source.skipped), signed_by=signed_by[0] if signed_by else None, record_saved=saved)


def _source(client, container, documents: tuple[dict, dict, dict], reference: str, prefix: str | None,
            cache_dir: Path, sink: TransferSink | None, budget: Budget, *, signed: bool):
    """The entries' source for the importer: a ModelPack artifact's raw layers or an image's tar layers."""
    from .pull_modelpack import ArtifactSource, is_modelpack, plan_artifact

    manifest, descriptor, config = documents
    if is_modelpack(manifest, descriptor):
        return ArtifactSource(client, container, plan_artifact(manifest, config, reference, prefix), cache_dir, sink,
                              budget)
    return _ImageSource(client, container, _layers_of(manifest, config, reference), prefix, cache_dir, sink, budget,
                        reference, signed=signed)


def _checked(source, found: list[bytes] | None, verify_key: Path | None, signed_by: list[str],
             cache_dir: Path) -> Iterator:
    """The source's entries; then, with ``--verify-key`` (nothing published yet), :func:`.pull_signed.verify_snapshots`,
    whose key fingerprint is appended to ``signed_by``."""
    yield from source.members()
    if found is not None:
        from .pull_signed import verify_snapshots

        signed_by.append(verify_snapshots(found, source.signed_files(), Path(verify_key), cache_dir, source.claims()))


def _documents(client, container, reference: str) -> tuple[dict, str, dict, dict]:
    """(the manifest, by digest or by tag checked against ``Docker-Content-Digest``; its ``sha256:<hex>``; the
    config descriptor; the config)."""
    manifest, body, media_type = get_json(client, container,
                                          url(client, container, "manifests", container.digest or container.tag),
                                          f"manifest {reference}", _ACCEPT, container.digest)
    _refuse_index(manifest, media_type, reference)
    descriptor = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    if not is_oci_digest(descriptor.get("digest")):
        raise UsageError(f"{reference}: the manifest has no valid config descriptor",
                         hint="hfcache pull reads the images hfcache push writes")
    config, _, _ = get_json(client, container, url(client, container, "blobs", descriptor["digest"]),
                            f"config {descriptor['digest']}", "*/*", descriptor["digest"])
    return manifest, peer.digest_of(body), descriptor, config


def _with_held(imported, source):
    """The import's report with what the skipped layers hold (``source.held_counts()``) counted as existing; a
    content a skipped and an imported layer share is one distinct blob, as in a first pull."""
    import dataclasses

    repos, files, blobs = source.held_counts()
    counted = source.imported_etags() if isinstance(source, _ImageSource) else set()
    held = {etag for _, etag in blobs}
    return dataclasses.replace(imported, repos=tuple(sorted(set(imported.repos) | repos)),
                               files=imported.files + files, blobs_existing=imported.blobs_existing + len(blobs),
                               blob_contents=imported.blob_contents + len(held - counted))


class _ImageSource:
    """The entries of an image's tar layers for the importer, each layer checked at its end, without the image's
    ``prefix``; a layer the target still holds (:mod:`.pull_record`) is skipped unless ``signed`` (every file is
    then hashed: :class:`hfcache.oci.pull_signed.TarFiles`)."""

    def __init__(self, client, container, layers: list[tuple[dict, str]], prefix: str | None, cache_dir: Path,
                 sink: TransferSink | None, budget: Budget, reference: str, *, signed: bool) -> None:
        from . import pull_record
        from .pull_signed import TarFiles

        self.client, self.container, self.layers, self.cache_dir = client, container, layers, cache_dir
        self.sink, self.budget, self.prefix = sink, budget, prefix
        self.record = pull_record.load(str(cache_dir)) if cache_dir.is_dir() else {}
        self.held = set() if signed else {diff_id for layer, diff_id in layers if pull_record.still_held(
            str(cache_dir), self.record, diff_id, _annotated(layer, "commits"))}
        self.files = TarFiles() if signed else None
        self.names: dict[str, list[str]] = {}  # diff_id -> the record's names of its entries
        self.received: list[Layer] = []
        self.skipped: list[str] = []
        budget.check(sum(layer["size"] for layer, diff_id in layers if diff_id not in self.held),
                     f"image {reference}", wire=True)

    def members(self) -> Iterator:
        for layer, diff_id in self.layers:
            if diff_id in self.held:
                self.skipped.append(layer["digest"])
                self.received.append(Layer(layer["digest"], layer["size"], diff_id, _annotated(layer, "repos"), 0))
            else:
                yield from self._layer(layer, diff_id)

    def _layer(self, layer: dict, diff_id: str) -> Iterator:
        """One layer's tar entries; at its end its digest, size and diff_id are checked (IntegrityError, before the
        importer publishes). Every error is an hfcache error here: a requests error would read as a cache error."""
        from ..move.import_source import tar_members

        digest, client, budget = layer["digest"], self.client, self.budget
        with network_errors(self.container.registry, client.prefix == "http"):
            response = client.do_request(url(client, self.container, "blobs", digest), "GET", stream=True)
        with response:
            check(response, f"layer {digest}", 200)
            repos = _annotated(layer, "repos")
            if self.sink is not None:
                self.sink.begin(",".join(repos)[:60] or digest[7:19], layer["size"])
            compressed = VerifiedStream(BlobBody(response, self.container.registry, f"layer {digest}"), digest,
                                        limit=layer["size"], sink=self.sink, budget=budget, wire=True,
                                        network=stream_errors())
            raw = io.BufferedReader(compressed, _CHUNK)
            unpacked = gzip.GzipFile(fileobj=raw, mode="rb") if layer["mediaType"] != peer.LAYER_TAR else raw
            tar_stream = VerifiedStream(unpacked, digest, budget=budget, corrupt=(OSError, EOFError, zlib.error))
            try:
                for member, stream in tar_members(io.BufferedReader(tar_stream, _CHUNK), mode="r|"):
                    if member.kind == "file":
                        budget.check(member.size, f"entry {member.name[:100]!r}")
                    member, entry = self._entry(diff_id, member, Entry(stream, digest) if stream is not None else None)
                    if member is not None:
                        yield member, entry
                        if self.files is not None:
                            self.files.note(member, entry)
                while tar_stream.read(_CHUNK):  # the tar's end padding: the diff_id covers every byte
                    pass
                while raw.read(_CHUNK):  # gzip trailers or concatenated members after the tar
                    pass
            except (tarfile.TarError, EOFError) as exc:
                raise IntegrityError(f"refused layer {digest}: not a readable tar ({exc})", hint=_ALTERED) from None
        _verify_layer(layer, diff_id, compressed, tar_stream)
        self.received.append(Layer(digest, layer["size"], diff_id, repos, compressed.size))

    def _entry(self, diff_id: str, member, stream):
        """(member renamed, stream) to give the importer, or (None, None) for the prefix's own folders. A blob the
        target already has is re-hashed (import keeps it). Raises UsageError: an entry outside the prefix (exit 2);
        CheckFailed, IntegrityError: of ``held_locally``."""
        from ..cache.content import algorithm_of
        from .pull_record import entry_name
        from .pull_signed import HashingStream

        if self.prefix is not None:
            member.name = self._strip(member.name, member.kind)
            if member.name is None:
                return None, None
            if member.kind == "hardlink":
                member.linkname = self._strip(member.linkname, "file") or member.linkname
        name = entry_name(member.name.removeprefix("./").rstrip("/")) if member.kind != "dir" else None
        if name is not None and not (self.files is not None and name.split("/")[1] == "trees"):  # not published
            self.names.setdefault(diff_id, []).append(name)
            parts = name.split("/")
            if member.kind == "file" and len(parts) == 3 and parts[1] == "blobs" and algorithm_of(parts[2]):
                held_locally(self.cache_dir, parts[0], parts[2], member.size)
        return member, HashingStream(stream) if self.files is not None and stream is not None else stream

    def _strip(self, name: str, kind: str) -> str | None:
        clean = name.removeprefix("./").rstrip("/")
        if kind == "dir" and (clean in ("", ".", self.prefix) or self.prefix.startswith(f"{clean}/")):
            return None  # the prefix's own folders
        if not clean.startswith(f"{self.prefix}/"):
            raise UsageError(f"refused entry {registry_text(clean[:100], 100)!r}: outside the image's prefix "
                             f"{self.prefix!r}; nothing was imported",
                             hint="hfcache push --base marks its base image's layers (io.hfcache.base.layers) and "
                                  "pull skips them; an image with other files outside its prefix is not one hfcache "
                                  "push wrote")
        return clean[len(self.prefix) + 1:]

    def signed_files(self) -> dict[str, dict[str, str]]:
        return self.files.snapshots(self.cache_dir) if self.files is not None else {}

    def claims(self) -> dict[str, str]:
        return self.files.bound() if self.files is not None else {}

    def held_counts(self) -> tuple[set[str], int, set[tuple[str, str]]]:
        """(repo folders, snapshot entries, (folder, etag) blobs) of the layers skipped, from the record."""
        names = [name.split("/") for diff_id in self.held for name in self.record[diff_id]["entries"]]
        return ({p[0] for p in names}, sum(1 for p in names if p[1] == "snapshots"),
                {(p[0], p[2]) for p in names if p[1] == "blobs"})

    def imported_etags(self) -> set[str]:
        """The blob names of the layers this pull imported."""
        return {parts[2] for diff_id, names in self.names.items() if diff_id not in self.held
                for parts in (name.split("/") for name in names) if len(parts) == 3 and parts[1] == "blobs"}

    def after(self) -> bool:
        """Record the layers this pull imported (after publishing), for the next pull's skips."""
        from . import pull_record

        imported = {diff_id: self.names.get(diff_id, []) for _, diff_id in self.layers if diff_id not in self.held}
        return pull_record.save(str(self.cache_dir), self.record, imported)


def _annotated(layer: dict, kind: str) -> tuple[str, ...]:
    """What a layer's ``io.hfcache.<kind>`` annotation names: ``repos``, the repo folders (cache layout names only:
    they are shown); ``commits``, the commits of its ``repo_id@commit,...``."""
    annotations = layer.get("annotations") if isinstance(layer.get("annotations"), dict) else {}
    names = str(annotations.get(f"{ANNOTATION_PREFIX}.{kind}", "")).split(",")
    if kind == "commits":
        return tuple(name.rsplit("@", 1)[-1] for name in names[:10000] if "@" in name)
    return tuple(name for name in names[:1000] if name and name.isprintable() and parse_folder_name(name))
