"""Every field a registry supplies is type-checked where it enters (docs/security.md, "signature bundles" and docs/oci.md):
a ModelPack layer whose ``mediaType`` was a list or an object made ``pull`` exit 70 (``unhashable type``), and the
same kind of value elsewhere (sizes, digests, annotations, config fields, referrer manifests and indexes, a ``push
--base`` image's manifest, index and config) must be exit 2 or 3 with one ``hfcache: error:`` line and a hint, never
a traceback, and nothing written.

Distribution validates the manifests it stores (a list where Go wants a string is refused at upload), so the
registry here is hand-written (tests/hostile.py ``PeerServer``, on 127.0.0.1) and serves the hostile
documents as they are, each consistent with its digest. Configs are blobs the real registry does not read: the base
image's config fields are also pushed to ``docker-registry`` (tests/registry.py) for the one case that succeeds.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import urllib.request
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.hostile import PeerServer, body
from tests.oci_peer import NAME, Image, serve_image
from tests.registry import available, put_blob, put_manifest, running_registry
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
RAW = "application/vnd.cncf.model.weight.config.v1.raw"
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
FOLDER = "models--hostile--fields"
COMMIT = "c" * 40
DATA = b'{"model_type": "bert"}\n'
#: A value of every JSON type but the one expected, and numbers past what a descriptor can hold.
NOT_TEXT = [["x"], {"a": 1}, 5, None, True]
BAD_SIZES = ["12", 1.5, True, -1, 2**64, 10**30, None, [1]]


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


@pytest.fixture(scope="module")
def peer():
    with PeerServer() as server:
        server.routes["/v2/"] = body(b"{}")
        yield server


def serve(peer: PeerServer, name: str, manifest: dict, config: dict | bytes) -> str:
    """Serve ``manifest`` (by tag ``v1``, with its digest header) and its config blob; return the reference."""
    config_bytes = config if isinstance(config, bytes) else json.dumps(config).encode()
    manifest = copy.deepcopy(manifest)
    if isinstance(manifest.get("config"), dict) and manifest["config"].get("digest") == "CONFIG":
        manifest["config"]["digest"], manifest["config"]["size"] = sha(config_bytes), len(config_bytes)
    raw = json.dumps(manifest).encode()
    peer.routes[f"/v2/{name}/manifests/v1"] = body(raw, **{"Content-Type": MANIFEST, "Docker-Content-Digest": sha(raw)})
    peer.routes[f"/v2/{name}/blobs/{sha(config_bytes)}"] = body(config_bytes)
    return f"{peer.host}/{name}:v1"


def pull(ref: str, target: Path, *args: str):
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", *args],
                       env=clean_env(HOME=str(target.parent)), timeout=90)


def refused(proc, code: int, *needles: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert len(lines) >= 2 and lines[-2].startswith("hfcache: error: "), proc.stderr
    assert all(needle in lines[-2] for needle in needles), proc.stderr
    assert lines[-1].startswith("hint: "), proc.stderr


def _case(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:10]


# --- ModelPack artifacts --------------------------------------------------------------------------------------------


def modelpack(**layer_changes) -> tuple[dict, dict]:
    """A one-file ModelPack manifest and config hfcache maps onto the cache; ``layer_changes`` replace fields of the
    layer (``annotations.<key>`` an annotation)."""
    digest = sha(DATA)
    annotations = {"org.cncf.model.filepath": f"{FOLDER}/snapshots/{COMMIT}/config.json",
                   "io.hfcache.etag": git_sha1(DATA)}
    layer = {"mediaType": RAW, "digest": digest, "size": len(DATA), "annotations": annotations}
    for key, value in layer_changes.items():
        if key.startswith("annotations."):
            annotations[key.split(".", 1)[1].replace("_", ".")] = value
        else:
            layer[key] = value
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": "application/vnd.cncf.model.manifest.v1+json",
                "config": {"mediaType": "application/vnd.cncf.model.config.v1+json", "digest": "CONFIG", "size": 0},
                "layers": [layer]}
    config = {"descriptor": {"name": "hostile/fields", "version": COMMIT}, "config": {},
              "modelfs": {"type": "layers", "diffIds": [layer["digest"] if isinstance(layer["digest"], str)
                                                        else digest]}}
    return manifest, config


@pytest.mark.parametrize("media_type", NOT_TEXT, ids=_case)
def test_a_modelpack_media_type_that_is_no_text_is_exit_2(peer, tmp_path, media_type):
    ref = serve(peer, f"mp/media-{_case(media_type)}", *modelpack(mediaType=media_type))
    refused(pull(ref, tmp_path / "target"), 2, "has media type")
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("size", BAD_SIZES, ids=_case)
def test_a_modelpack_size_that_is_no_int64_is_exit_2(peer, tmp_path, size):
    ref = serve(peer, f"mp/size-{_case(size)}", *modelpack(size=size))
    refused(pull(ref, tmp_path / "target"), 2, "a layer descriptor is malformed (digest or size)")


@pytest.mark.parametrize("digest", NOT_TEXT + ["sha256:" + "A" * 64], ids=_case)
def test_a_modelpack_digest_that_is_no_digest_is_exit_2(peer, tmp_path, digest):
    ref = serve(peer, f"mp/digest-{_case(digest)}", *modelpack(digest=digest))
    refused(pull(ref, tmp_path / "target"), 2, "malformed")


@pytest.mark.parametrize("field, value, needle", [
    ("annotations", ["x"], "its annotations are a list, not an object"),
    ("annotations", "x", "its annotations are a text, not an object"),
    ("annotations", None, "its annotations are null, not an object"),
    ("annotations.org_cncf_model_filepath", ["a/b"], "org.cncf.model.filepath annotation is a list, not a path"),
    ("annotations.org_cncf_model_filepath", {"p": 1}, "annotation is an object, not a path"),
    ("annotations.org_cncf_model_filepath", 7, "annotation is a number, not a path"),
    ("annotations.org_cncf_model_filepath", True, "annotation is a boolean, not a path"),
    ("annotations.io_hfcache_etag", 5, "it is a number"),
    ("annotations.io_hfcache_etag", ["a" * 40], "it is a list"),
], ids=lambda v: _case(v) if not isinstance(v, str) else v.split(".")[-1][:20])
def test_modelpack_annotations_of_another_type_are_exit_2(peer, tmp_path, field, value, needle):
    ref = serve(peer, f"mp/note-{_case((field, value))}", *modelpack(**{field: value}))
    refused(pull(ref, tmp_path / "target"), 2, needle)


@pytest.mark.parametrize("change, needle", [
    (lambda c: c.update(descriptor=["x"]), "the config's descriptor is a list, not an object"),
    (lambda c: c.update(descriptor="x"), "the config's descriptor is a text, not an object"),
    (lambda c: c["descriptor"].update(version=5), "descriptor.version is a number, not a text"),
    (lambda c: c["descriptor"].update(version=[COMMIT]), "descriptor.version is a list, not a text"),
    (lambda c: c["modelfs"].update(diffIds={"0": "x"}), "modelfs.diffIds do not match"),
    (lambda c: c.update(modelfs=[1]), "modelfs.diffIds do not match"),
], ids=["descriptor-list", "descriptor-text", "version-number", "version-list", "diffids-object", "modelfs-list"])
def test_modelpack_config_fields_of_another_type_are_exit_2(peer, tmp_path, change, needle):
    manifest, config = modelpack()
    change(config)
    ref = serve(peer, f"mp/config-{_case(needle)}", manifest, config)
    refused(pull(ref, tmp_path / "target"), 2, needle)


# --- image manifests and configs ------------------------------------------------------------------------------------


def image(**layer_changes) -> tuple[dict, bytes]:
    real = Image()
    manifest = json.loads(real.manifest)
    manifest["layers"][0].update(layer_changes)
    return manifest, real.config


@pytest.mark.parametrize("media_type", NOT_TEXT, ids=_case)
def test_an_image_layer_media_type_that_is_no_text_is_exit_2(peer, tmp_path, media_type):
    ref = serve(peer, f"img/media-{_case(media_type)}", *image(mediaType=media_type))
    refused(pull(ref, tmp_path / "target"), 2, "has media type")


@pytest.mark.parametrize("size", BAD_SIZES, ids=_case)
def test_an_image_layer_size_that_is_no_int64_is_exit_2(peer, tmp_path, size):
    ref = serve(peer, f"img/size-{_case(size)}", *image(size=size))
    refused(pull(ref, tmp_path / "target"), 2, "a layer descriptor is malformed")


@pytest.mark.parametrize("change, code, needle", [
    (lambda m, c: m.update(mediaType=["x"]), 2, "is not an image manifest"),
    (lambda m, c: m.update(config=["x"]), 2, "no valid config descriptor"),
    (lambda m, c: m["config"].update(digest={"x": 1}), 2, "no valid config descriptor"),
    (lambda m, c: m.update(layers={"0": 1}), 2, "rootfs.diff_ids do not match"),
    (lambda m, c: c.update(rootfs={"diff_ids": {"0": "x"}}), 2, "rootfs.diff_ids do not match"),
    (lambda m, c: c.update(rootfs=["x"]), 2, "rootfs.diff_ids do not match"),
    (lambda m, c: m.update(annotations={"io.hfcache.prefix": ["models"]}), 2, "is not a relative folder"),
    (lambda m, c: m.update(annotations={"io.hfcache.base.layers": 5}), 2, "does not name the manifest's first"),
], ids=["media-list", "config-list", "config-digest-object", "layers-object", "diff-ids-object", "rootfs-list",
        "prefix-list", "base-layers-number"])
def test_image_manifest_and_config_fields_of_another_type_are_refused(peer, tmp_path, change, code, needle):
    real = Image()
    manifest, config = json.loads(real.manifest), json.loads(real.config)
    manifest["config"]["digest"] = "CONFIG"
    change(manifest, config)
    ref = serve(peer, f"img/doc-{_case(needle)}-{code}", manifest, config)
    refused(pull(ref, tmp_path / "target"), code, needle)
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("annotations", [["x"], "x", 5, {"io.hfcache.repos": ["a", 1], "io.hfcache.commits": {}}],
                         ids=["list", "text", "number", "values"])
def test_annotations_and_an_artifact_type_of_another_type_only_inform(peer, tmp_path, annotations):
    """Annotations (and ``artifactType``) that are not what they should be decide nothing: the image pulls as the
    plain image it is, and they never reach the output unescaped or crash a label."""
    real = Image()
    manifest, config = json.loads(real.manifest), json.loads(real.config)
    manifest["config"]["digest"] = "CONFIG"
    manifest.update(annotations=annotations, artifactType=["y"])
    manifest["layers"][0]["annotations"] = annotations
    name = f"img/notes-{_case(annotations)}"
    ref = serve(peer, name, manifest, config)
    peer.routes[f"/v2/{name}/blobs/{sha(real.layer)}"] = body(real.layer)
    proc = pull(ref, tmp_path / "target", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


# --- signature referrers (pull --verify-key) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signed_peer(tmp_path_factory):
    """A PeerServer serving the valid small image (tests/oci_peer.py) at ``hf/evil:v1``, and a key."""
    from tests.artifacts import key_pair

    folder = tmp_path_factory.mktemp("fields-keys")
    with PeerServer() as server:
        real = Image()
        ref = serve_image(server, real)
        yield server, ref, sha(real.manifest), key_pair(folder, "k")


def referrer(subject: str, **layer_changes) -> tuple[bytes, dict]:
    bundle = b'{"not": "a bundle"}'
    layer = {"mediaType": BUNDLE, "digest": sha(bundle), "size": len(bundle), **layer_changes}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": BUNDLE,
                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": sha(b"{}"), "size": 2},
                "layers": [layer], "subject": {"mediaType": MANIFEST, "digest": subject, "size": 1}}
    return bundle, manifest


def serve_referrers(server: PeerServer, subject: str, index: dict, documents: list[tuple[bytes, dict]]) -> None:
    for bundle, manifest in documents:
        raw = json.dumps(manifest).encode()
        server.routes[f"/v2/{NAME}/manifests/{sha(raw)}"] = body(raw, **{"Content-Type": MANIFEST})
        server.routes[f"/v2/{NAME}/blobs/{sha(bundle)}"] = body(bundle)
    raw = json.dumps(index).encode()
    server.routes[f"/v2/{NAME}/manifests/sha256-{subject.split(':')[1]}"] = body(raw, **{"Content-Type": INDEX})


def _listing(entries: list) -> dict:
    return {"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}


def _entry(manifest: dict, **changes) -> dict:
    raw = json.dumps(manifest).encode()
    return {"mediaType": MANIFEST, "digest": sha(raw), "size": len(raw), "artifactType": BUNDLE, **changes}


@pytest.mark.parametrize("case", ["index-manifests-number", "index-manifests-object", "index-media-list",
                                  "entry-artifact-list", "entry-digest-object", "subject-list", "subject-digest-list",
                                  "layer-media-list", "layers-object", "bundle-size-text", "bundle-size-bool",
                                  "bundle-size-huge", "bundle-list-json"])
def test_referrer_indexes_and_manifests_of_other_types_are_refused(signed_peer, tmp_path, case):
    server, ref, subject, (_private, public) = signed_peer
    bundle, manifest = referrer(subject)
    entries, index, code, needle = None, None, 1, "unsigned"
    if case.startswith("index-"):
        index = _listing([_entry(manifest)])
        index.update({"index-manifests-number": {"manifests": 5}, "index-manifests-object": {"manifests": {"a": 1}},
                      "index-media-list": {"mediaType": [INDEX]}}[case])
        code, needle = 3, "is not an image index"
    elif case == "entry-artifact-list":
        entries = [_entry(manifest, artifactType=[BUNDLE])]
    elif case == "entry-digest-object":
        entries = [_entry(manifest, digest={"sha256": "x"})]
    elif case in ("subject-list", "subject-digest-list"):
        manifest["subject"] = [subject] if case == "subject-list" else {"digest": [subject]}
    elif case == "layer-media-list":
        manifest["layers"][0]["mediaType"] = [BUNDLE]
    elif case == "layers-object":
        manifest["layers"] = {"0": manifest["layers"][0]}
    elif case.startswith("bundle-size-"):
        manifest["layers"][0]["size"] = {"bundle-size-text": "19", "bundle-size-bool": True,
                                         "bundle-size-huge": 2**70}[case]
        code, needle = 3, "its bundle declares"
    elif case == "bundle-list-json":  # a "bundle" that is JSON of another shape: no signature, after the layers
        bundle = b'[{"verificationMaterial": {"publicKey": {"hint": ["x"]}}}]'
        manifest["layers"][0].update(digest=sha(bundle), size=len(bundle))
        code, needle = 1, "refused the pull, nothing was written"
    serve_referrers(server, subject, index or _listing(entries or [_entry(manifest)]), [(bundle, manifest)])
    target, canary = tmp_path / "target", Canary(tmp_path)
    refused(pull(ref, target, "--verify-key", str(public)), code, needle)
    assert not target.exists()
    canary.assert_unchanged()


# --- push --base: the base image's manifest, index and config -----------------------------------------------------


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fields-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("openai-community/gpt2")], cache_dir=root, endpoint=server.endpoint,
                            token=False).ok
    return root


def base_documents() -> tuple[dict, dict]:
    from hfcache.oci.image import architecture

    layer = b"base layer bytes"
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "CONFIG", "size": 0},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(layer),
                            "size": len(layer)}]}
    config = {"architecture": architecture(), "os": "linux", "config": {"Env": ["PATH=/bin"]},
              "rootfs": {"type": "layers", "diff_ids": [sha(b"diff")]}}
    return manifest, config


def push_on(peer: PeerServer, seed: Path, base: str, tmp_path: Path):
    return run_hfcache(["push", f"{peer.host}/base/out:v1", "openai-community/gpt2", "--cache-dir", str(seed),
                        "--plain-http", "--base", base], env=clean_env(HOME=str(tmp_path)), timeout=90)


@pytest.mark.parametrize("change, needle", [
    (lambda m, c: m.update(mediaType=["x"]), "its mediaType is a list, not a text"),
    (lambda m, c: m.update(mediaType={"a": 1}), "its mediaType is an object, not a text"),
    (lambda m, c: m["layers"][0].update(mediaType=["x"]), "a layer hfcache does not copy (media type a list"),
    (lambda m, c: m["layers"][0].update(mediaType={"a": 1}), "a layer hfcache does not copy (media type an object"),
    (lambda m, c: m["layers"][0].update(size=True), "a malformed digest or size"),
    (lambda m, c: m["layers"][0].update(size=2**64), "a malformed digest or size"),
    (lambda m, c: m.update(layers=5), "its layers are a number, not a list"),
    (lambda m, c: m.update(config=["x"]), "its manifest names no config"),
    (lambda m, c: c.update(os=["linux"]), "an image for ['linux']"),
    (lambda m, c: c.update(rootfs={"diff_ids": {"0": 1}}), "its config's diff_ids do not match"),
], ids=["media-list", "media-object", "layer-media-list", "layer-media-object", "layer-size-bool",
        "layer-size-huge", "layers-number", "config-list", "os-list", "diff-ids-object"])
def test_a_base_images_fields_of_another_type_are_exit_2(peer, seed, tmp_path, change, needle):
    manifest, config = base_documents()
    change(manifest, config)
    base = serve(peer, f"base/img-{_case(needle)}", manifest, config)
    refused(push_on(peer, seed, base, tmp_path), 2, needle)


@pytest.mark.parametrize("manifests, needle", [
    (5, "its index's manifests are a number, not a list"),
    ({"a": 1}, "its index's manifests are an object, not a list"),
    ([{"platform": ["linux"], "digest": "sha256:" + "1" * 64}], "no linux/"),
    ([{"platform": {"os": ["linux"], "architecture": "amd64"}, "digest": "sha256:" + "1" * 64}], "no linux/"),
], ids=["number", "object", "platform-list", "os-list"])
def test_a_base_index_of_another_shape_is_exit_2(peer, seed, tmp_path, manifests, needle):
    raw = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}).encode()
    name = f"base/index-{_case(manifests)}"
    peer.routes[f"/v2/{name}/manifests/v1"] = body(raw, **{"Content-Type": INDEX})
    refused(push_on(peer, seed, f"{peer.host}/{name}:v1", tmp_path), 2, needle)


@pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))
def test_base_config_values_of_another_type_are_dropped_never_copied(seed, tmp_path):
    """``Env`` holding a number, ``Entrypoint`` a text, ``User`` a list: the image-spec says lists of texts and
    texts; such values are left out of the pushed config (the rest of the base kept), on the real registry."""
    import gzip
    import io
    import tarfile

    from hfcache.oci.image import architecture

    with running_registry(tmp_path / "registry") as registry:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo("bin")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        layer = gzip.compress(raw.getvalue(), mtime=0)
        config = json.dumps({"architecture": architecture(), "os": "linux",
                             "config": {"Env": ["PATH=/bin", 5], "Entrypoint": "sh", "Cmd": ["-c", "true"],
                                        "User": ["root"], "WorkingDir": "/models"},
                             "rootfs": {"type": "layers", "diff_ids": [sha(raw.getvalue())]}}).encode()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": put_blob(registry.host, "base/odd", config),
                                          "size": len(config)},
                               "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                           "digest": put_blob(registry.host, "base/odd", layer),
                                           "size": len(layer)}]}).encode()
        put_manifest(registry.host, "base/odd", "v1", manifest, MANIFEST)
        proc = run_hfcache(["push", f"{registry.host}/base/out:v1", "openai-community/gpt2", "--cache-dir", str(seed),
                            "--plain-http", "--base", f"{registry.host}/base/odd:v1"],
                           env=clean_env(HOME=str(tmp_path)), timeout=120)
        assert proc.returncode == 0, proc.stderr
        request = urllib.request.Request(f"http://{registry.host}/v2/base/out/manifests/v1",
                                         headers={"Accept": MANIFEST})
        with urllib.request.urlopen(request, timeout=30) as answer:  # loopback registry
            pushed = json.loads(answer.read())
        with urllib.request.urlopen(f"http://{registry.host}/v2/base/out/blobs/{pushed['config']['digest']}",
                                    timeout=30) as answer:
            kept = json.loads(answer.read())["config"]
    assert kept["Cmd"] == ["-c", "true"] and kept["WorkingDir"] == "/models", kept
    assert not {"Env", "Entrypoint", "User"} & set(kept), kept
