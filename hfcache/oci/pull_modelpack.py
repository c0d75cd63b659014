"""``hfcache pull`` of a CNCF ModelPack artifact (modelpack/model-spec ``docs/spec.md``): raw layers, one per file of
one snapshot, mapped onto the hub cache layout through import's name rules and fed to import's reader like the
entries of a tar (what is read and refused: docs/oci.md "ModelPack artifacts").
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..cache import safefs
from ..cache.content import algorithm_of
from ..errors import CacheError, IntegrityError, UsageError
from ..move.import_plan import MAX_REF_BYTES, clean_name, repo_folder_ok
from ..move.import_source import Member, shown_name
from ..names import is_commit, is_oci_digest
from .image import ANNOTATION_PREFIX, Layer
from .peer import MODEL_CONFIG, MODEL_MANIFEST, digest_of, json_kind, size_ok
from .pull_stream import _ALTERED, _CHUNK, Budget, VerifiedStream, check_layer_count, held_locally
from .registry import BlobBody, TransferSink, check, network_errors, registry_text, stream_errors, url

#: The spec's raw layer media types (docs/spec.md "Layers"); tar, tar+gzip and tar+zstd layers are refused.
RAW_TYPES = frozenset(f"application/vnd.cncf.model.{kind}.v1.raw"
                      for kind in ("weight", "weight.config", "doc", "code", "dataset"))
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"
ETAG = f"{ANNOTATION_PREFIX}.etag"
_HINT = "hfcache pull reads the ModelPack artifacts `hfcache push --format modelpack` writes"
_FOREIGN_HINT = ("hfcache maps ModelPack artifacts `hfcache push --format modelpack` wrote (file paths in the hub "
                 "cache); extract others with modctl, `kit unpack` or a ModelPack client")


def is_modelpack(manifest: dict, config_descriptor: dict) -> bool:
    return manifest.get("artifactType") == MODEL_MANIFEST or config_descriptor.get("mediaType") == MODEL_CONFIG


@dataclass(frozen=True)
class RawFile:
    """One raw layer mapped onto the cache: ``section`` is ``snapshots`` (``rel`` = (commit, *path)) or ``refs``
    (``rel`` = the ref name's parts); ``etag`` is the blob name (snapshots only)."""

    digest: str
    size: int
    folder: str
    section: str
    rel: tuple[str, ...]
    etag: str = ""

    @property
    def name(self) -> str:
        return "/".join((self.folder, self.section, *self.rel))


@dataclass
class ModelPlan:
    """What an artifact holds: one repo folder at one commit, its files grouped by content, its refs."""

    folder: str
    commit: str
    contents: dict[str, list[RawFile]] = field(default_factory=dict)  # etag -> the files showing it
    refs: list[RawFile] = field(default_factory=list)

    def files(self) -> dict[str, str]:
        """{path in the snapshot: sha256 hex}."""
        return {"/".join(f.rel[1:]): f.digest.split(":", 1)[1] for group in self.contents.values() for f in group}


def _foreign(reference: str, digest: str, shown: str, why: str) -> UsageError:
    return UsageError(f"{reference}: a ModelPack artifact hfcache cannot map onto a Hugging Face cache: layer "
                      f"{digest[:19]} has file path {shown!r} ({why})", hint=_FOREIGN_HINT)


def _descriptors(manifest: dict, config: dict, reference: str) -> list[dict]:
    """The manifest's raw layer descriptors, validated (digests, sizes, media types, ``modelfs.diffIds``)."""
    layers = manifest.get("layers")
    modelfs = config.get("modelfs") if isinstance(config.get("modelfs"), dict) else {}
    diff_ids = modelfs.get("diffIds")
    if not isinstance(layers, list) or not layers or not isinstance(diff_ids, list) or len(diff_ids) != len(layers):
        raise UsageError(f"{reference}: the manifest's layers and the config's modelfs.diffIds do not match",
                         hint=_HINT)
    check_layer_count(len(layers), reference, _HINT)  # one request per file: the same bound as an image's layers
    for layer, diff_id in zip(layers, diff_ids, strict=True):
        if not isinstance(layer, dict) or not is_oci_digest(layer.get("digest")) or not size_ok(layer.get("size")):
            raise UsageError(f"{reference}: a layer descriptor is malformed (digest or size)", hint=_HINT)
        if not isinstance(layer.get("mediaType"), str) or layer["mediaType"] not in RAW_TYPES:
            raise UsageError(f"{reference}: layer {layer['digest'][:19]} has media type "
                             f"{registry_text(repr(layer.get('mediaType')), 80)}",
                             hint="hfcache pull reads raw ModelPack layers (one file each), not tar layers")
        if diff_id != layer["digest"]:  # a raw layer is its own uncompressed content
            raise UsageError(f"{reference}: layer {layer['digest'][:19]}: modelfs.diffIds names another digest",
                             hint=_HINT)
    return layers


def _raw_file(layer: dict, reference: str, prefix: str | None) -> RawFile:
    """Map one layer's ``org.cncf.model.filepath`` onto the cache layout with import's name rules."""
    digest, size = layer["digest"], layer["size"]
    annotations = layer.get("annotations", {})
    if not isinstance(annotations, dict):
        raise _foreign(reference, digest, "", f"its annotations are {json_kind(annotations)}, not an object")
    path = annotations[FILEPATH] if FILEPATH in annotations else annotations.get(TITLE)
    if not isinstance(path, str) or not path:
        raise _foreign(reference, digest, "", f"no {FILEPATH} annotation" if path is None else
                       f"its {FILEPATH} annotation is {json_kind(path)}, not a path")
    shown = registry_text(shown_name(path), 120)
    head, _, rest = path.partition("/")
    if prefix is None and head == "models" and repo_folder_ok(rest.split("/")[0]):
        prefix = "models"  # KServe's layout (push --prefix models) without the annotation: never a repo folder
    if prefix is not None:
        if not path.startswith(f"{prefix}/"):
            raise UsageError(f"{reference}: layer {digest[:19]}: file path {shown!r} is outside the artifact's "
                             f"prefix {prefix!r}", hint=_HINT)
        path = path[len(prefix) + 1:]
    try:
        parts = clean_name(path)
    except UsageError as exc:
        raise UsageError(f"{reference}: layer {digest[:19]}: {exc}", hint=_HINT) from None
    if not repo_folder_ok(parts[0]) or len(parts) < 3 or parts[1] not in ("snapshots", "refs"):
        raise _foreign(reference, digest, shown, "not <repo folder>/snapshots/<commit>/<path> or .../refs/<name>, "
                                                 "e.g. models--ORG--NAME/snapshots/<40 hex>/config.json")
    if parts[1] == "refs":
        if size > MAX_REF_BYTES:
            raise UsageError(f"{reference}: layer {digest[:19]}: a ref of {size} bytes (at most {MAX_REF_BYTES})",
                             hint=_HINT)
        return RawFile(digest, size, parts[0], "refs", tuple(parts[2:]))
    if len(parts) < 4 or not is_commit(parts[2]):
        raise _foreign(reference, digest, shown, "no 40-hex commit after snapshots/")
    etag = annotations.get(ETAG)
    if not isinstance(etag, str) or algorithm_of(etag) is None:
        raise _foreign(reference, digest, shown, f"no {ETAG} annotation naming its blob (40 or 64 hex; "
                                                 f"it is {json_kind(etag)})")
    if algorithm_of(etag) == "sha256" and etag != digest.split(":", 1)[1]:
        raise IntegrityError(f"refused layer {digest}: its {ETAG} {etag[:12]}... names another content than its "
                             "digest", hint=_ALTERED)
    return RawFile(digest, size, parts[0], "snapshots", tuple(parts[2:]), etag)


def plan_artifact(manifest: dict, config: dict, reference: str, prefix: str | None) -> ModelPlan:
    """The artifact's files mapped onto one repo folder at one commit. Raises UsageError: malformed, of another
    tool, not one repo at one commit (exit 2); IntegrityError: an etag or a shared blob that is not the digest's."""
    files = [_raw_file(layer, reference, prefix) for layer in _descriptors(manifest, config, reference)]
    snapshots = {(f.folder, f.rel[0]) for f in files if f.section == "snapshots"}
    if len(snapshots) != 1 or len({f.folder for f in files}) != 1:
        raise UsageError(f"{reference}: a ModelPack artifact holds one model at one commit; this one names "
                         f"{len(snapshots)} snapshots", hint=_HINT)
    folder, commit = snapshots.pop()
    descriptor = config.get("descriptor", {})
    if not isinstance(descriptor, dict):
        raise UsageError(f"{reference}: the config's descriptor is {json_kind(descriptor)}, not an object", hint=_HINT)
    version = descriptor.get("version")
    if version is not None and not isinstance(version, str):
        raise UsageError(f"{reference}: the config's descriptor.version is {json_kind(version)}, not a text",
                         hint=_HINT)
    if is_commit(version) and version != commit:
        raise UsageError(f"{reference}: the config's descriptor.version {version[:12]} is not the layers' commit "
                         f"{commit[:12]}", hint=_HINT)
    plan, seen = ModelPlan(folder, commit), set()
    for f in files:
        if f.name in seen:
            raise UsageError(f"{reference}: file path {registry_text(shown_name(f.name), 120)!r} is listed twice",
                             hint=_HINT)
        seen.add(f.name)
        if f.section == "refs":
            plan.refs.append(f)
            continue
        group = plan.contents.setdefault(f.etag, [])
        if group and (group[0].digest, group[0].size) != (f.digest, f.size):
            # Only a group's first layer is fetched: a later one's other digest would be signed but never read.
            raise IntegrityError(f"{reference}: layers {registry_text(shown_name(group[0].name), 120)!r} and "
                                 f"{registry_text(shown_name(f.name), 120)!r} name the same blob {f.etag[:12]} with "
                                 "other digests or sizes",
                                 hint="the artifact is altered or crafted; pull it from its source again")
        group.append(f)
    return plan


def _same_ref(cache_dir: Path, ref: RawFile) -> bytes | None:
    """The target's ref when it holds exactly the ref layer's bytes (not downloaded then); None when it does not,
    or anything odd is there (read from the root without following a link; import judges it)."""
    try:
        data = safefs.read_small(cache_dir, (ref.folder, "refs", *ref.rel), MAX_REF_BYTES + 1)
    except (OSError, CacheError):
        return None
    return data if digest_of(data) == ref.digest else None


class ArtifactSource:
    """The entries of one ModelPack artifact (:func:`plan_artifact`'s ``plan``) for
    :func:`hfcache.move.importer.import_members`; a content the target ``cache_dir`` holds is not fetched."""

    def __init__(self, client, container, plan: ModelPlan, cache_dir: Path, sink: TransferSink | None,
                 budget: Budget) -> None:
        self.client, self.container, self.plan, self.sink, self.budget = client, container, plan, sink, budget
        self.cache_dir = cache_dir
        self.held = {etag for etag, group in plan.contents.items()
                     if held_locally(cache_dir, plan.folder, etag, group[0].size, group[0].digest)}
        self.received: list[Layer] = []
        self.skipped: list[str] = []
        self.refs: dict[str, str] = {}  # ref entry name -> the commit its bytes name (:meth:`claims`)
        to_fetch = [g[0].size for e, g in plan.contents.items() if e not in self.held] + [r.size for r in plan.refs]
        budget.check(sum(to_fetch), f"artifact {container.api_prefix}")

    def held_counts(self) -> tuple[set[str], int, set[tuple[str, str]]]:
        """(repo folders, 0, (folder, etag) blobs) the target held (not downloaded)."""
        return ({self.plan.folder} if self.held else set()), 0, {(self.plan.folder, etag) for etag in self.held}

    def signed_files(self) -> dict[str, dict[str, str]]:
        return {f"{self.plan.folder}/{self.plan.commit}": self.plan.files()}

    def claims(self) -> dict[str, str]:
        """Ref entry name -> the commit its bytes name ("" for none), once :meth:`members` ran."""
        return dict(self.refs)

    def members(self) -> Iterator[tuple[Member, object]]:
        """Blobs (fetched unless held), their snapshot links, then the refs; every layer checked at its end."""
        from .pull_signed import ref_commit

        folder = self.plan.folder
        for etag, group in sorted(self.plan.contents.items()):
            if etag in self.held:
                self.skipped += [f.digest for f in group]
                self.received += [Layer(f.digest, f.size, f.digest, (folder,), 0) for f in group]
            else:
                yield from self._fetched(f"{folder}/blobs/{etag}", group[0], etag)
                self.received += [Layer(f.digest, f.size, f.digest, (folder,), 0) for f in group[1:]]
            for f in group:
                parts = f.name.split("/")
                yield Member(f.name, "symlink", linkname="../" * (len(parts) - 2) + f"blobs/{etag}"), None
        for ref in self.plan.refs:
            held = _same_ref(self.cache_dir, ref)
            if held is not None:
                self.skipped.append(ref.digest)
                self.received.append(Layer(ref.digest, ref.size, ref.digest, (folder,), 0))
                self.refs[ref.name] = ref_commit(held)
            else:
                body = yield from self._fetched(ref.name, ref, "")
                self.refs[ref.name] = ref_commit(bytes(body.head))

    def _fetched(self, name: str, f: RawFile, etag: str):
        """Yield one layer as the importer's entry (a generator; its value: the layer's checked stream)."""
        digest = f.digest
        with network_errors(self.container.registry, self.client.prefix == "http"):
            response = self.client.do_request(url(self.client, self.container, "blobs", digest), "GET", stream=True)
        with response:
            check(response, f"layer {digest}", 200)
            if self.sink is not None:
                self.sink.begin(registry_text("/".join(f.rel[1:] or f.rel)[-60:], 60), f.size)
            body = VerifiedStream(BlobBody(response, self.container.registry, f"layer {digest}"), digest, limit=f.size,
                                  sink=self.sink, budget=self.budget, network=stream_errors(), exact=True, etag=etag)
            yield Member(name, "file", size=f.size), io.BufferedReader(body, _CHUNK)
            while body.read(_CHUNK):  # the importer read the declared size; more is refused by the limit
                pass
        if body.digest() != digest:
            raise IntegrityError(f"refused layer {digest}: its content hashes to {body.digest()}", hint=_ALTERED)
        if body.git is not None and body.git.hexdigest() != etag:
            raise IntegrityError(f"refused layer {digest}: its bytes are not the git blob {etag} its {ETAG} names",
                                 hint=_ALTERED)
        self.received.append(Layer(digest, f.size, digest, (self.plan.folder,), body.size))
        return body
