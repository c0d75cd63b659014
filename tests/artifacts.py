"""What the OCI tests push by hand and sign: ModelPack artifacts built from a warmed gpt2 cache the way ``hfcache push
--format modelpack`` lays them out (raw distribution-API calls, tests/registry.py), so that hostile variants can be
made; keys and model-signing bundles attached to them as referrers; and ``pull --verify-key`` of them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.helpers import clean_env, run_hfcache
from tests.registry import member, put_blob, put_manifest

REPO = "openai-community/gpt2"
GPT2 = "models--openai-community--gpt2"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
MODEL_MANIFEST = "application/vnd.cncf.model.manifest.v1+json"


def snapshot_files(cache: Path, folder: str = GPT2) -> tuple[str, list[tuple[str, bytes, str]]]:
    """(commit, [(path in the snapshot, bytes, blob name)]) of the cache's main snapshot."""
    commit = (cache / folder / "refs" / "main").read_text()
    snap = cache / folder / "snapshots" / commit
    files = []
    for path in sorted(p for p in snap.rglob("*") if not p.is_dir()):
        files.append((str(path.relative_to(snap)), path.read_bytes(), os.path.basename(os.readlink(path))))
    return commit, files


def layer(host: str, name: str, filepath: str, data: bytes, etag: str | None, media: str = WEIGHT_CONFIG,
          **extra: str) -> dict:
    annotations = {"org.cncf.model.filepath": filepath, "org.opencontainers.image.title": filepath,
                   "org.cncf.model.file.mediatype.untested": "true", **extra}
    if etag is not None:
        annotations["io.hfcache.etag"] = etag
    return {"mediaType": media, "digest": put_blob(host, name, data), "size": len(data), "annotations": annotations}


def push_artifact(host: str, name: str, tag: str, layers: list[dict], *, commit: str = "0" * 40,
                  annotations: dict | None = None) -> str:
    """A ModelPack manifest (artifactType, model config with modelfs.diffIds) over ``layers``; returns the ref."""
    config = json.dumps({"descriptor": {"name": REPO, "version": commit},
                         "config": {}, "modelfs": {"type": "layers", "diffIds": [x["digest"] for x in layers]}},
                        sort_keys=True, separators=(",", ":")).encode()
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": MODEL_MANIFEST,
                "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                           "digest": put_blob(host, name, config), "size": len(config)},
                "layers": layers, "annotations": {"io.hfcache.format": "modelpack", **(annotations or {})}}
    put_manifest(host, name, tag, json.dumps(manifest, sort_keys=True).encode(), MANIFEST)
    return f"{host}/{name}:{tag}"


def artifact_of(cache: Path, host: str, name: str, tag: str, prefix: str | None = None, annotated: bool = True,
                **overrides) -> str:
    """The artifact ``hfcache push --format modelpack`` would write for gpt2 (``overrides``: path -> bytes)."""
    commit, files = snapshot_files(cache)
    base = f"{prefix}/" if prefix else ""
    layers = [layer(host, name, f"{base}{GPT2}/snapshots/{commit}/{path}", overrides.get(path, data), etag)
              for path, data, etag in files]
    layers.append(layer(host, name, f"{base}{GPT2}/refs/main", commit.encode(), None, **{"io.hfcache.kind": "ref"}))
    return push_artifact(host, name, tag, layers, commit=commit,
                         annotations={"io.hfcache.prefix": prefix} if prefix and annotated else None)


def tree(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else
                                       hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """:func:`write_key` into ``folder``, created if missing."""
    folder.mkdir(parents=True, exist_ok=True)
    return write_key(folder, name)


def attach_signature(ref: str, files: dict[str, str], private: Path) -> None:
    """Sign ``files`` ({path: sha256}) with hfcache's signing (model-signing v1.0) and attach the bundle as a
    referrer of ``ref``'s manifest (the tag fallback on this registry)."""
    import urllib.request

    from hfcache.integrity.signatures import sign_files
    from hfcache.oci.referrers import attach
    from hfcache.oci.registry import connect, parse_reference

    container = parse_reference(ref)
    request = urllib.request.Request(f"http://{container.registry}/v2/{container.api_prefix}/manifests/"
                                     f"{container.tag}", headers={"Accept": MANIFEST})
    with urllib.request.urlopen(request, timeout=30) as answer:  # loopback registry
        body = answer.read()
    subject = {"mediaType": MANIFEST, "digest": f"sha256:{hashlib.sha256(body).hexdigest()}", "size": len(body)}
    attach(connect(container, True, None, 30), container, subject, sign_files(files, REPO, private))


def signed_files(seed: Path, **overrides: bytes) -> dict[str, str]:
    _, files = snapshot_files(seed)
    return {path: hashlib.sha256(overrides.get(path, data)).hexdigest() for path, data, _ in files}


MODEL_SIGNING = str(Path(sys.executable).with_name("model_signing"))


def write_key(folder: Path, name: str, *, password: bytes | None = None) -> tuple[Path, Path]:
    """A fresh EC P-256 key pair as PEM files ``<name>.pem`` (private) and ``<name>.pub``."""
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def image_members(seed: Path, ref: bytes | None, *extra) -> list:
    """The seed's gpt2 folder as an image's tar entries (blobs, the signed snapshot, its .no_exist markers), with
    ``refs/main`` holding ``ref`` (none when None), then ``extra`` entries."""
    commit, files = snapshot_files(seed)
    out = [member(f"{GPT2}/blobs/{etag}", data) for _, data, etag in files]
    out += [member(f"{GPT2}/snapshots/{commit}/{path}", link=f"../../blobs/{etag}") for path, _, etag in files]
    out += [member(f"{GPT2}/.no_exist/{commit}/{p.name}", b"") for p in (seed / GPT2 / ".no_exist" / commit).iterdir()]
    if ref is not None:
        out.append(member(f"{GPT2}/refs/main", ref))
    return out + list(extra)


def pull(ref: str, target: Path, public: Path, *args: str) -> subprocess.CompletedProcess:
    """``hfcache pull REF --verify-key PUBLIC`` into ``target`` (its HOME beside it)."""
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--verify-key", str(public), *args],
                       env=clean_env(HOME=str(target.parent / "home")))


def refused(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """A signed pull refused: exit ``code``, no "signatures verified", the last lines the error (with every needle)
    and its hint."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "signatures verified" not in proc.stdout
    assert lines and lines[-2].startswith("hfcache: error: "), proc.stderr
    assert all(needle in lines[-2] for needle in needles), proc.stderr
    assert lines[-1].startswith("hint: "), proc.stderr


def verified(proc: subprocess.CompletedProcess) -> None:
    """A signed pull that worked and said so."""
    assert proc.returncode == 0 and "signatures verified" in proc.stdout, proc.stdout + proc.stderr
