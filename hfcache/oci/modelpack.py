"""``hfcache push --format modelpack``: one repo at one commit as a CNCF ModelPack artifact (modelpack/model-spec
``docs/spec.md``, ``docs/annotations.md``, ``docs/config.md``, ``schema/config-schema.json``).

- manifest ``application/vnd.oci.image.manifest.v1+json`` with ``artifactType``
  ``application/vnd.cncf.model.manifest.v1+json``, canonical JSON (sorted keys, no spaces);
- config ``application/vnd.cncf.model.config.v1+json``: exactly the schema's keys (``descriptor`` {name: the repo
  id, version: the commit, sourceURL: ``https://huggingface.co/[TYPE/]ID/tree/COMMIT``}, ``config`` {format,
  precision: what the files and ``config.json`` say}, ``modelfs`` {type: layers, diffIds}); no creation time;
- one RAW layer per file of the snapshot: its bytes as they are (the digest is the sha256 of the file: for an LFS
  file the Hugging Face etag itself), media type by file kind (:func:`media_type_of`); plus one small raw layer per
  ref naming the commit (``refs/<revision>``). ``org.cncf.model.filepath`` and ``org.opencontainers.image.title``
  are the file's path *in a hub cache* (``models--ORG--NAME/snapshots/<commit>/<path>``, under ``--prefix``), so an
  artifact that CRI-O mounts or a ModelPack client extracts is a symlink-free cache huggingface_hub loads offline;
- fixed file metadata (mode 0644, uid/gid 0, mtime 1970-01-01T00:00:00Z, typeflag ``0``): the same cache gives the
  same manifest digest.

The layers are streamed from the cache itself (no temporary copy): each blob is opened through
``safefs.open_blob`` (nothing followed but the shared Xet store's own link shape), every other file through
folders opened from the cache root without following links, and hashed while it is sent; a file whose bytes do not
match its name is refused (exit 5). A blob the registry already has (HEAD) is not sent, and a digest that occurs
twice (one file at two paths) is sent once.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from ..bounds import loads_json
from ..cache import safefs
from ..cache.published import read_record
from ..cache.content import BlobHash
from ..cache.scan import parse_folder_name
from ..errors import CacheError, HubError, UsageError
from ..move.export import Entry, ExportPlan
from ..move.export_store import open_blob_source, open_plain_source
from ..pace import Throughput, min_rate
from .registry import TransferSink, check, url

__all__ = ["ARTIFACT_TYPE", "CONFIG_TYPE", "ModelFile", "PREFIX_ANNOTATION", "artifact_documents", "attach_bundles",
           "check_prefix", "media_type_of", "model_files", "send_blob", "send_bytes", "send_file", "sign",
           "prefix_problem", "signed_snapshots", "snapshot_digests"]

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
PREFIX_ANNOTATION = "io.hfcache.prefix"
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".onnx", ".msgpack", ".ckpt", ".tflite")
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MAX_CONFIG_JSON = 4 * 1024 * 1024
_CHUNK = 1024 * 1024
#: The fixed file metadata of every layer (modelpack-spec annotations.md ``org.cncf.model.file.metadata+json``):
#: fields as a tar header has them, mode 0644, owner root, the epoch (RFC 3339), typeflag '0' (48): reproducible.
_METADATA = {"mode": 0o644, "uid": 0, "gid": 0, "mtime": "1970-01-01T00:00:00Z", "typeflag": 48}


@dataclass(frozen=True)
class ModelFile:
    """One raw layer of the artifact.

    Attributes:
        path (str): its path in the artifact (``[PREFIX/]models--ORG--NAME/snapshots/<commit>/<file>``).
        digest (str): ``sha256:<hex>`` of its bytes; size (int): bytes.
        etag (str): the blob name the cache uses for it (sha256 for LFS files, git sha1 for regular files), or the
            commit for a ref; kind (str): ``file`` or ``ref``.
        media_type (str): the ModelPack layer media type.
        entry (Entry | None): where its bytes are in the source cache (None for a ref: ``data`` is its content).
        data (bytes): the content of a ref; rel (str): the file's path in the snapshot (``""`` for a ref).
    """

    path: str
    digest: str
    size: int
    etag: str
    kind: str
    media_type: str
    entry: Entry | None = None
    data: bytes = b""
    rel: str = ""


def check_prefix(prefix: str | None) -> str:
    """``prefix`` as a ``/``-separated relative folder (``models``; ``""`` for none).

    Raises:
        UsageError: an empty prefix, an absolute path, more than 8 folders, ``.`` or ``..``, a part starting with
            ``-`` or holding other characters than letters, digits, ``.``, ``_``, ``-`` (exit 2; the message says
            which).
    """
    if prefix is None:
        return ""
    why = prefix_problem(prefix)
    if why:
        raise UsageError(f"--prefix {prefix!r}: {why}",
                         hint="a relative folder such as models (KServe's Modelcar and oci+native:// with subPath: "
                              "models read models/)")
    return prefix.rstrip("/")


def prefix_problem(prefix: str) -> str:
    """Why ``prefix`` is not a folder push writes under (``""`` when it is one); pull judges a prefix annotation
    with it too. A trailing ``/`` is allowed."""
    if prefix.startswith("/"):
        return "must be relative, not absolute"
    parts = prefix.rstrip("/").split("/")
    if parts == [""]:
        return "must not be empty (drop --prefix for the image root)"
    if len(parts) > 8:
        return f"{len(parts)} folders deep: at most 8 folders"
    for part in parts:
        if part in ("", ".", ".."):
            return "must not hold '.', '..' or an empty folder name ('//')"
        if part.startswith("-"):
            return f"folder {part[:64]!r} must not start with -"
        if len(part) > 64:
            return "each folder name is at most 64 characters"
        if not _PREFIX.fullmatch(part):
            return f"folder {part[:64]!r}: only letters, digits, '.', '_' and '-' (starting with a letter or digit)"
    return ""


def media_type_of(name: str) -> str:
    """The ModelPack raw layer media type of the file ``name`` (a snapshot path).

    Weights (``*.safetensors``, ``*.bin``, ``*.gguf``, ``*.pt``, ``*.h5``, ``*.onnx``, ``*.msgpack``, ...) are
    ``weight``; docs (``*.md``, ``LICENSE*``) ``doc``; ``*.py`` ``code``; everything else (``config.json``,
    tokenizer files, vocabularies, unknown kinds) ``weight.config``: what a loader reads beside the weights.
    """
    base = PurePosixPath(name).name
    lower = base.lower()
    if lower.endswith(_WEIGHTS):
        return WEIGHT
    if lower.endswith(".py"):
        return CODE
    if lower.endswith((".md", ".rst")) or lower.startswith(("license", "licence", "notice", "copying")):
        return DOC
    return WEIGHT_CONFIG


def _one_commit(plan: ExportPlan) -> tuple[str, str]:
    """(repo folder, commit) of the single snapshot in ``plan``.

    Raises:
        UsageError: more than one repo or revision (a ModelPack artifact holds one model).
    """
    snapshots = sorted({tuple(e.name.split("/")[::2][:2]) for e in plan.entries
                        if e.kind == "dir" and len(e.name.split("/")) == 3 and e.name.split("/")[1] == "snapshots"})
    if len(plan.repos) != 1 or len(snapshots) != 1:
        found = ", ".join(f"{f}@{c[:12]}" for f, c in snapshots[:4]) or ", ".join(plan.repos[:4])
        raise UsageError(f"a ModelPack artifact holds one model: push each repo to its own tag (found {found})",
                         hint="name one REPO_ID@REVISION, or use --format image for several repos")
    return snapshots[0]


def model_files(cache_dir: Path, plan: ExportPlan, prefix: str = "") -> tuple[str, str, list[ModelFile]]:
    """The raw layers of the one snapshot in ``plan`` (``plan_export`` with symlinks), sorted by path.

    Each LFS file's digest is its etag; a git-named file is read once here (through the safe opens) to learn its
    sha256, and its git sha1 checked against its name.

    Returns:
        (repo folder, commit, files): the files and one ``refs/<name>`` entry per ref at the commit.

    Raises:
        UsageError: not exactly one repo at one commit. CacheError: a file does not match its name, or cannot be
            opened safely (exit 5).
    """
    folder, commit = _one_commit(plan)
    blobs = {e.name.rsplit("/", 1)[1]: e for e in plan.entries
             if e.kind == "file" and e.name.startswith(f"{folder}/blobs/")}
    record = read_record(cache_dir, folder, commit)
    base, lead = f"{folder}/snapshots/{commit}/", f"{prefix}/" if prefix else ""
    files = []
    for e in plan.entries:
        if e.name.startswith(f"{folder}/refs/") and e.kind == "data":
            data = e.target.encode()
            files.append(ModelFile(lead + e.name, _sha256(data), len(data), commit, "ref", WEIGHT_CONFIG, data=data))
        elif not e.name.startswith(base) or e.kind not in ("symlink", "file"):
            continue
        elif e.kind == "symlink":
            blob = blobs[e.target.rsplit("/", 1)[1]]
            digest = f"sha256:{blob.etag}" if len(blob.etag) == 64 else _sha256_of(blob)
            files.append(ModelFile(lead + e.name, digest, blob.size, blob.etag, "file",
                                   media_type_of(e.name), entry=blob, rel=e.name[len(base):]))
        else:  # a real file in the snapshot (a cache written without symlinks): named by warm's record
            recorded = record.files.get(e.name[len(base):]) if record else None
            etag = recorded[1].partition(":")[2] if recorded else ""
            digest, git = _hashes(e, etag)
            files.append(ModelFile(lead + e.name, digest, e.size, etag or git, "file", media_type_of(e.name),
                                   entry=Entry(e.name, "file", source=e.source, etag=etag, size=e.size),
                                   rel=e.name[len(base):]))
    return folder, commit, sorted(files, key=lambda f: f.path)


def _open(entry: Entry):
    parts = entry.name.split("/")
    is_blob = len(parts) == 3 and parts[1] == "blobs"
    return open_blob_source(entry.source, entry.etag) if is_blob else open_plain_source(entry)


def _hashes(entry: Entry, etag: str) -> tuple[str, str]:
    """(``sha256:<hex>``, git sha1 hex) of a file, read once through the safe opens, checked against ``etag``
    (when given) and its planned size.

    Raises:
        CacheError: the bytes do not match ``etag`` or the size (exit 5).
    """
    sha, git = hashlib.sha256(), BlobHash("git-sha1", entry.size)
    named = BlobHash.for_etag(etag, entry.size) if etag else None
    got = 0
    with _open(entry) as f:
        while chunk := f.read(_CHUNK):
            got += len(chunk)
            for h in (sha, git, named):
                if h is not None:
                    h.update(chunk)
    if got != entry.size or (named is not None and named.hexdigest() != etag):
        raise CacheError(f"{entry.source}: its content does not match its name {etag or '(size)'}: nothing pushed",
                         hint="run `hfcache verify --repair` first")
    return f"sha256:{sha.hexdigest()}", git.hexdigest()


def _sha256_of(blob: Entry) -> str:
    return _hashes(blob, blob.etag)[0]


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _source_url(folder: str, commit: str) -> str:
    """The repo at ``commit`` on huggingface.co (the id and commit name it; a mirror serves the same commit)."""
    parsed = parse_folder_name(folder)
    repo_id, repo_type = (parsed[0], parsed[1]) if parsed else (folder, "model")
    kind = "" if repo_type == "model" else f"{repo_type}s/"
    return f"https://huggingface.co/{kind}{repo_id}/tree/{commit}"


def _technical(cache_dir: Path, folder: str, commit: str, files: Sequence[ModelFile]) -> dict:
    """The config's ``config``: ``format`` from the weight files, ``precision`` from ``config.json`` (only what
    is known; config.json read bounded, through the safe opens, with ``bounds.loads_json``)."""
    out: dict[str, str] = {}
    kinds = {PurePosixPath(f.path).suffix.lower() for f in files if f.media_type == WEIGHT}
    for suffix, name in ((".safetensors", "safetensors"), (".gguf", "gguf"), (".onnx", "onnx"), (".bin", "pytorch"),
                         (".pt", "pytorch"), (".h5", "tensorflow"), (".msgpack", "flax")):
        if suffix in kinds:
            out["format"] = name
            break
    try:
        raw = safefs.read_snapshot_file(cache_dir / folder / "snapshots" / commit, "config.json", _MAX_CONFIG_JSON)
        document = loads_json(raw, "config.json") if raw else None
    except (OSError, ValueError, CacheError):
        document = None
    dtype = document.get("torch_dtype") or document.get("dtype") if isinstance(document, dict) else None
    if isinstance(dtype, str) and re.fullmatch(r"[a-z0-9_]{1,32}", dtype):
        out["precision"] = dtype
    return out


def artifact_documents(cache_dir: Path, folder: str, commit: str, files: Sequence[ModelFile],
                       annotations: Mapping[str, str]) -> tuple[bytes, bytes]:
    """The config and manifest bytes (canonical JSON) of the ModelPack artifact of ``files``.

    Args:
        cache_dir: the source cache (``config.json`` is read for the precision); folder, commit: the snapshot.
        files: the layers, in artifact order (:func:`model_files`); annotations: the manifest's annotations.

    Returns:
        (config_bytes, manifest_bytes).
    """
    parsed = parse_folder_name(folder)
    config = {
        "descriptor": {"name": parsed[0] if parsed else folder, "version": commit,
                       "sourceURL": _source_url(folder, commit)},
        "config": _technical(cache_dir, folder, commit, files),
        "modelfs": {"type": "layers", "diffIds": [f.digest for f in files]},
    }
    config_bytes = _canonical(config)
    layers = []
    for f in files:
        meta = _canonical({"name": PurePosixPath(f.path).name, "size": f.size, **_METADATA}).decode()
        notes = {"org.cncf.model.filepath": f.path, "org.opencontainers.image.title": f.path,
                 "org.cncf.model.file.metadata+json": meta, "org.cncf.model.file.mediatype.untested": "true",
                 "io.hfcache.etag": f.etag}
        if f.kind == "ref":
            notes["io.hfcache.kind"] = "ref"
        layers.append({"mediaType": f.media_type, "digest": f.digest, "size": f.size, "annotations": notes})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "artifactType": ARTIFACT_TYPE,
                "config": {"mediaType": CONFIG_TYPE, "digest": _sha256(config_bytes), "size": len(config_bytes)},
                "layers": layers, "annotations": dict(annotations)}
    return config_bytes, _canonical(manifest)


class _CheckedBody(io.RawIOBase):
    """An upload body read from an open cache file: hashed as it is sent, checked at its end against the digest
    and size the manifest names (a file changed or swapped after it was planned: CacheError, the upload never
    completes), under the throughput floor, progress to ``sink``. ``seek(0)`` (a redirect's resend) starts over."""

    def __init__(self, opener: Callable[[], io.BufferedIOBase], digest: str, size: int, shown: str,
                 sink: TransferSink | None) -> None:
        self._opener, self._digest, self._size, self._shown, self._sink = opener, digest, size, shown, sink
        self._f = None
        self.seek(0)

    def readable(self) -> bool:
        return True

    def __len__(self) -> int:  # requests' super_len: the body's length (with tell), not a chunked upload
        return self._size

    def tell(self) -> int:
        return self.sent

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset != 0 or whence != 0:
            raise io.UnsupportedOperation("an upload body only starts over")
        if self._f is not None:
            self._f.close()
        self._f = self._opener()
        self._hash, self.sent = hashlib.sha256(), 0
        self._floor = Throughput(*min_rate(), f"upload of {PurePosixPath(self._shown).name}")
        return 0

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(_CHUNK if size is None or size < 0 else min(size, _CHUNK))
        self._hash.update(data)
        self.sent += len(data)
        self._floor.feed(len(data))
        if self.sent > self._size or (not data and (self.sent != self._size
                                                    or f"sha256:{self._hash.hexdigest()}" != self._digest)):
            raise CacheError(f"{self._shown}: its bytes are not the {self._size} bytes of {self._digest[:19]}... "
                             "(corrupt, or changed while it was pushed): the push stopped, no manifest written",
                             hint="run `hfcache verify --repair` on the cache, then push again")
        if self._sink is not None and data:
            self._sink.advance(len(data))
        return data

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        super().close()


def send_blob(client, container, digest: str, size: int, opener: Callable[[], io.BufferedIOBase], shown: str,
              sink: TransferSink | None, label: str) -> int:
    """Upload one blob from the open file ``opener()`` gives unless the registry has it (HEAD); the bytes sent.

    The distribution API's monolithic upload (POST, then PUT with ``?digest=``), as :func:`hfcache.oci.upload.upload`,
    but streamed from a descriptor (library gap: ``upload`` takes a path, which a group member could swap).

    Raises:
        CacheError: the bytes are not ``digest`` (exit 5). RegistryAuthError, HubError: the registry refused.
        pace.TooSlow: below the throughput floor (``network_errors`` makes it EndpointUnreachable).
    """
    head = client.do_request(url(client, container, "blobs", digest), "HEAD")
    if head.status_code == 200:
        return 0
    started = client.do_request(f"{client.prefix}://{container.upload_blob_url()}", "POST",
                                headers={"Content-Length": "0"})
    check(started, f"start upload to {container.registry}/{container.api_prefix}", 202)
    location = client._get_location(started, container)  # oras: makes a relative Location absolute
    if not location:
        raise HubError(f"registry {container.registry}: no upload location in its answer",
                       hint="the registry does not speak the distribution API's blob upload")
    separator = "&" if "?" in location else "?"
    if sink is not None:
        sink.begin(label, size)
    with _CheckedBody(opener, digest, size, shown, sink) as body:
        done = client.do_request(f"{location}{separator}digest={digest}", "PUT", data=body,
                                 headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        check(done, f"upload {digest}", 201, 204)
        return body.sent


def send_bytes(client, container, data: bytes, label: str) -> int:
    """Upload ``data`` (a config, a ref) as a blob unless the registry has it; the bytes sent."""
    return send_blob(client, container, _sha256(data), len(data), lambda: io.BytesIO(data), label, None, label)


def send_file(client, container, f: ModelFile, sink: TransferSink | None) -> int:
    """Upload one layer of :func:`model_files` (a ref's bytes, or the file streamed from the cache)."""
    if f.kind == "ref":
        return send_bytes(client, container, f.data, f.path)
    entry = f.entry
    assert entry is not None
    return send_blob(client, container, f.digest, f.size, lambda: _open(entry), entry.source, sink,
                     PurePosixPath(f.path).name)


def snapshot_digests(files: Sequence[ModelFile]) -> dict[str, str]:
    """{path in the snapshot: sha256 hex} of the files (not refs) of :func:`model_files`: what a signature covers."""
    return {f.rel: f.digest.partition(":")[2] for f in files if f.kind == "file"}


def signed_snapshots(cache_dir: Path, plan: ExportPlan, sign_key: Path, *, password: bytes | None = None,
                     password_hint: str | None = None) -> list[bytes]:
    """One signature bundle per snapshot of an image push (``--sign-key``), each over that snapshot's files with the
    digests the push computes (the model name ``REPO_ID@<commit>``), in the order of the snapshots' folder names.

    Raises:
        UsageError: an unusable key or password. CacheError: a file does not match its name (exit 5).
    """
    snapshots = sorted({(parts[0], parts[2]) for parts in (e.name.split("/") for e in plan.entries)
                        if len(parts) == 3 and parts[1] == "snapshots"})
    by_name = {e.name: e for e in plan.entries if e.kind == "file"}
    out = []
    for folder, commit in snapshots:
        # One repo at one commit (what model_files reads): that folder's entries but the other snapshots', a blob
        # the plan shares with another repo (a hardlink entry) as the file it links to.
        entries = tuple(replace(by_name[e.target], name=e.name) if e.kind == "hardlink" and e.target in by_name else e
                        for e in plan.entries if (e.name == folder or e.name.startswith(f"{folder}/")) and not (
                            e.name.startswith(f"{folder}/snapshots/") and e.name.split("/")[2] != commit))
        _, _, files = model_files(cache_dir, ExportPlan(entries, (folder,), 0))
        repo_id = (parse_folder_name(folder) or (folder,))[0]
        out.append(sign(files, f"{repo_id}@{commit}", sign_key, password=password, password_hint=password_hint))
    return out


def sign(files: Sequence[ModelFile], repo: str, sign_key: Path, *, password: bytes | None = None,
         password_hint: str | None = None) -> bytes:
    """A model-signing v1.0 bundle over the snapshot's files, from the digests the push computed (no rehash).

    Args:
        files: :func:`model_files`' files. repo: the model name (``REPO_ID@<commit>``). sign_key: a PEM EC private
            key; password: its password (encrypted keys); password_hint: where the caller reads it from, for the
            error of a missing one.

    Raises:
        UsageError: an unusable key (:func:`hfcache.integrity.signatures.sign_files`).
    """
    from ..integrity.signatures import SIGN_PASSWORD_HINT, sign_files

    return sign_files(snapshot_digests(files), repo, Path(sign_key), password=password,
                      password_hint=password_hint or SIGN_PASSWORD_HINT)


def attach_bundles(client, container, manifest_bytes: bytes, bundles: Sequence[bytes]) -> tuple[str, ...]:
    """Attach each of ``bundles`` as a referrer of the pushed manifest, annotated with the model it signs and its
    key (so that a re-push replaces the earlier one, :mod:`hfcache.oci.referrers`); their digests, in order."""
    if not bundles:
        return ()
    from ..integrity.signatures import bundle_identity
    from .referrers import attach

    subject = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _sha256(manifest_bytes),
               "size": len(manifest_bytes)}
    out = []
    for bundle in bundles:
        model, key = bundle_identity(bundle)
        out.append(attach(client, container, subject, bundle, model=model, key=key))
    return tuple(out)
