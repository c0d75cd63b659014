"""``hfcache push --format modelpack``: one repo at one commit as a CNCF ModelPack artifact (modelpack/model-spec
``docs/spec.md``, ``annotations.md``, ``config.md``); push's signatures (both formats). One raw layer per snapshot
file and per ref, its ``org.cncf.model.filepath`` its path in a hub cache (docs/oci.md), streamed through the safe
opens and hashed as sent: a file whose bytes are not its name is refused (exit 5).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from ..bounds import loads_json
from ..cache import safefs
from ..cache.content import GIT_SHA1, SHA256, algorithm_of, hash_fd
from ..cache.published import read_record
from ..errors import CacheError, UsageError
from ..move.export import Entry, ExportPlan
from ..move.export_store import open_blob_source, open_plain_source
from ..names import parse_folder_name, url_prefix
from .peer import MANIFEST_TYPE, MODEL_CONFIG, MODEL_MANIFEST, canonical, digest_of
from .registry import TransferSink
from .upload import upload, upload_bytes

WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".onnx", ".msgpack", ".ckpt", ".tflite")
_FORMATS = ((".safetensors", "safetensors"), (".gguf", "gguf"), (".onnx", "onnx"), (".bin", "pytorch"),
            (".pt", "pytorch"), (".h5", "tensorflow"), (".msgpack", "flax"))
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MAX_CONFIG_JSON = 4 * 1024 * 1024
#: Every layer's ``org.cncf.model.file.metadata+json`` (annotations.md): as a tar header has them, mode 0644, owner
#: root, the epoch (RFC 3339), typeflag '0' (48).
_METADATA = {"mode": 0o644, "uid": 0, "gid": 0, "mtime": "1970-01-01T00:00:00Z", "typeflag": 48}


@dataclass(frozen=True)
class ModelFile:
    """One raw layer: ``path`` in the artifact, ``digest`` (``sha256:<hex>``) and ``size`` of its bytes, ``etag``
    (the cache's blob name: sha256 or git sha1; a ref's commit), ``kind`` (``file`` or ``ref``), ``media_type``,
    ``entry`` (where its bytes are in the source cache; None for a ref, whose bytes are ``data``), ``rel`` (the
    path in the snapshot; ``""`` for a ref)."""

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
    """``--prefix`` without a trailing ``/`` (``""`` for None); UsageError naming what :func:`prefix_problem` found."""
    if prefix is None:
        return ""
    why = prefix_problem(prefix)
    if why:
        raise UsageError(f"--prefix {prefix!r}: {why}",
                         hint="a relative folder such as models (KServe's Modelcar and oci+native:// with subPath: "
                              "models read models/)")
    return prefix.rstrip("/")


def prefix_problem(prefix: str) -> str:
    """Why ``prefix`` (push's ``--prefix``, pull's annotation) is not a folder push writes under, ``""`` when it is
    one: at most 8 relative folders of letters, digits, ``.``, ``_``, ``-`` (a trailing ``/`` allowed)."""
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
    """The raw layer media type of the snapshot file ``name``: weights, docs, code, else ``weight.config``."""
    lower = PurePosixPath(name).name.lower()
    if lower.endswith(_WEIGHTS):
        return WEIGHT
    if lower.endswith(".py"):
        return CODE
    if lower.endswith((".md", ".rst")) or lower.startswith(("license", "licence", "notice", "copying")):
        return DOC
    return WEIGHT_CONFIG


def snapshots_of(plan: ExportPlan) -> list[tuple[str, str]]:
    """(repo folder, commit) of every snapshot folder in ``plan``, sorted."""
    return sorted({(parts[0], parts[2]) for e in plan.entries if e.kind == "dir"
                   for parts in (e.name.split("/"),) if len(parts) == 3 and parts[1] == "snapshots"})


def repo_id_of(folder: str) -> str:
    """``ORG/NAME`` of a repo folder (the folder name itself when it is none)."""
    return (parse_folder_name(folder) or (folder,))[0]


def model_files(cache_dir: Path, plan: ExportPlan, prefix: str = "") -> tuple[str, str, list[ModelFile]]:
    """(repo folder, commit, the raw layers sorted by path) of the one snapshot in ``plan`` (``plan_export`` with
    symlinks): each file (a git-named one read once here for its sha256) and one ``refs/<name>`` layer per ref at the
    commit. Raises UsageError: not exactly one repo at one commit; CacheError: a file does not match its name, or
    cannot be opened safely (exit 5)."""
    snapshots = snapshots_of(plan)
    if len(plan.repos) != 1 or len(snapshots) != 1:
        found = ", ".join(f"{f}@{c[:12]}" for f, c in snapshots[:4]) or ", ".join(plan.repos[:4])
        raise UsageError(f"a ModelPack artifact holds one model: push each repo to its own tag (found {found})",
                         hint="name one REPO_ID@REVISION, or use --format image for several repos")
    folder, commit = snapshots[0]
    blobs = {e.name.rsplit("/", 1)[1]: e for e in plan.entries
             if e.kind == "file" and e.name.startswith(f"{folder}/blobs/")}
    record = read_record(cache_dir, folder, commit)
    base, lead = f"{folder}/snapshots/{commit}/", f"{prefix}/" if prefix else ""
    files = []
    for e in plan.entries:
        if e.name.startswith(f"{folder}/refs/") and e.kind == "data":
            data = e.target.encode()
            files.append(ModelFile(lead + e.name, digest_of(data), len(data), commit, "ref", WEIGHT_CONFIG, data=data))
        elif not e.name.startswith(base) or e.kind not in ("symlink", "file"):
            continue
        elif e.kind == "symlink":
            blob = blobs[e.target.rsplit("/", 1)[1]]
            digest = f"sha256:{blob.etag}" if len(blob.etag) == 64 else _hashes(blob, blob.etag)[0]
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
    """(``sha256:<hex>``, git sha1 hex) of a file, read once; CacheError (exit 5): not ``etag``'s bytes or size."""
    with _open(entry) as f:
        digests, got = hash_fd(f.fileno(), (SHA256, GIT_SHA1), shown=entry.source, close=False)
    if got != entry.size or (etag and digests.get(algorithm_of(etag) or "") != etag):
        raise CacheError(f"{entry.source}: its content does not match its name {etag or '(size)'}: nothing pushed",
                         hint="run `hfcache verify --repair` first")
    return f"sha256:{digests[SHA256]}", digests[GIT_SHA1]


def _technical(cache_dir: Path, folder: str, commit: str, files: Sequence[ModelFile]) -> dict:
    """The config's ``config``: ``format`` from the weight files, ``precision`` from ``config.json``, when known."""
    out: dict[str, str] = {}
    kinds = {PurePosixPath(f.path).suffix.lower() for f in files if f.media_type == WEIGHT}
    for suffix, name in _FORMATS:
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
    """(config bytes, manifest bytes), canonical JSON, of the artifact of ``files`` (in artifact order) with the
    manifest ``annotations``."""
    parsed = parse_folder_name(folder)
    repo_id, repo_type = parsed or (folder, "model")
    config_bytes = canonical({
        "descriptor": {"name": repo_id, "version": commit,
                       "sourceURL": f"https://huggingface.co/{url_prefix(repo_type)}{repo_id}/tree/{commit}"},
        "config": _technical(cache_dir, folder, commit, files),
        "modelfs": {"type": "layers", "diffIds": [f.digest for f in files]},
    })
    layers = []
    for f in files:
        meta = canonical({"name": PurePosixPath(f.path).name, "size": f.size, **_METADATA}).decode()
        notes = {"org.cncf.model.filepath": f.path, "org.opencontainers.image.title": f.path,
                 "org.cncf.model.file.metadata+json": meta, "org.cncf.model.file.mediatype.untested": "true",
                 "io.hfcache.etag": f.etag}
        if f.kind == "ref":
            notes["io.hfcache.kind"] = "ref"
        layers.append({"mediaType": f.media_type, "digest": f.digest, "size": f.size, "annotations": notes})
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": MODEL_MANIFEST,
                "config": {"mediaType": MODEL_CONFIG, "digest": digest_of(config_bytes), "size": len(config_bytes)},
                "layers": layers, "annotations": dict(annotations)}
    return config_bytes, canonical(manifest)


def send_file(client, container, f: ModelFile, sink: TransferSink | None) -> int:
    """Upload one layer of :func:`model_files` unless the registry has it (the file checked against its digest);
    the bytes sent."""
    if f.kind == "ref":
        return upload_bytes(client, container, f.data, f.path)
    entry = f.entry
    assert entry is not None
    return upload(client, container, f.digest, f.size, lambda: _open(entry), shown=entry.source, sink=sink,
                  label=PurePosixPath(f.path).name, verify=True)


def signed_snapshots(cache_dir: Path, plan: ExportPlan, sign_key: Path, *, password: bytes | None = None,
                     password_hint: str | None = None, lock=None) -> list[bytes]:
    """One bundle per snapshot of an image push (``--sign-key``), in the order of :func:`snapshots_of`, each
    :func:`sign`-ed over that snapshot's files as :func:`model_files` reads them (``lock``: the pushed lock); raises
    as those two do."""
    by_name = {e.name: e for e in plan.entries if e.kind == "file"}
    out = []
    for folder, commit in snapshots_of(plan):
        # One repo at one commit: that folder's entries but the other snapshots', a blob the plan shares with
        # another repo (a hardlink entry) as the file it links to.
        entries = tuple(replace(by_name[e.target], name=e.name) if e.kind == "hardlink" and e.target in by_name else e
                        for e in plan.entries if (e.name == folder or e.name.startswith(f"{folder}/")) and not (
                            e.name.startswith(f"{folder}/snapshots/") and e.name.split("/")[2] != commit))
        _, _, files = model_files(cache_dir, ExportPlan(entries, (folder,), 0))
        out.append(sign(files, f"{repo_id_of(folder)}@{commit}", sign_key, password=password,
                        password_hint=password_hint, proof=(cache_dir, folder, lock)))
    return out


def sign(files: Sequence[ModelFile], repo: str, sign_key: Path, *, proof: tuple, password: bytes | None = None,
         password_hint: str | None = None) -> bytes:
    """A model-signing v1.0 bundle over {path: sha256} of the ``files`` (no rehash), for the model ``repo``
    (``REPO_ID@<commit>``), signed with the PEM EC key ``sign_key`` (``password``: an encrypted key's;
    ``password_hint``: where the caller reads it), once the cache proves them what was fetched: ``proof`` is (cache
    root, repo folder, the pushed lock or None) (:func:`hfcache.integrity.signed_snapshot.prove_held`, exit 5).
    UsageError: an unusable key (:func:`hfcache.integrity.signatures.sign_files`)."""
    from ..integrity.signatures import SIGN_PASSWORD_HINT, sign_files
    from ..integrity.signed_snapshot import Held, prove_held

    held = {f.rel: Held(f.etag if f.entry is not None and f.entry.name.split("/")[1] == "blobs" else None, f.size,
                        {SHA256: f.digest.partition(":")[2], algorithm_of(f.etag) or "": f.etag})
            for f in files if f.kind == "file"}
    prove_held(proof[0], proof[1], repo.rpartition("@")[2], held, proof[2])

    digests = {f.rel: f.digest.partition(":")[2] for f in files if f.kind == "file"}  # what a signature covers
    return sign_files(digests, repo, Path(sign_key), password=password,
                      password_hint=password_hint or SIGN_PASSWORD_HINT)


def attach_bundles(client, container, manifest_bytes: bytes, bundles: Sequence[bytes]) -> tuple[str, ...]:
    """Attach each bundle as a referrer of the pushed manifest, annotated with the model it signs and its key (a
    re-push replaces the earlier one, :mod:`hfcache.oci.referrers`); their digests, in order."""
    if not bundles:
        return ()
    from ..integrity.signatures import bundle_identity
    from .referrers import attach

    subject = {"mediaType": MANIFEST_TYPE, "digest": digest_of(manifest_bytes), "size": len(manifest_bytes)}
    return tuple(attach(client, container, subject, bundle, model=model, key=key)
                 for bundle in bundles for model, key in (bundle_identity(bundle),))
