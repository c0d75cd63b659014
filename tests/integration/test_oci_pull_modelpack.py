"""``hfcache pull`` of CNCF ModelPack artifacts (docs/oci.md "Pull: what is checked"): raw layers, one per file,
named by their path in the hub cache, mapped onto the standard cache layout with import's rules, all or nothing.

Artifacts are pushed here with raw distribution-API calls (tests/registry.py), built from a warmed cache the way
``hfcache push --format modelpack`` lays them out (format29: ``org.cncf.model.filepath`` = the file's path in the
cache, ``io.hfcache.etag`` = its blob name), so that hostile variants can be made: every refusal is checked for its
exit code and one line, the target unchanged, a canary outside it unchanged, and ``hfcache verify`` still passing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import (
    GPT2,
    MANIFEST,
    MODEL_MANIFEST,
    REPO,
    artifact_of,
    attach_signature,
    key_pair,
    layer,
    push_artifact,
    signed_files,
    snapshot_files,
    tree,
)
from tests.canary import Canary
from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache
from tests.registry import available, put_blob, put_manifest, running_registry
from tests.testhub import HubServer

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mp-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("mp-registry")) as reg:
        yield reg



def pull(ref: str, target: Path, *args: str) -> subprocess.CompletedProcess:
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", *args],
                       env=clean_env(HOME=str(target.parent / "home")))


def refused(proc: subprocess.CompletedProcess, code: int, needle: str) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines and lines[-2].startswith("hfcache: error: ") and needle in lines[-2], proc.stderr
    assert lines[-1].startswith("hint: "), proc.stderr



def verified(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)], env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("prefix, annotated", [(None, False), ("models", True), ("models", False)])
def test_an_artifact_becomes_the_standard_cache_layout_and_loads_offline(seed, registry, tmp_path, prefix, annotated):
    ref = artifact_of(seed, registry.host, "mp/gpt2", f"v1-{prefix or 'root'}-{annotated}", prefix=prefix,
                      annotated=annotated)
    target, canary = tmp_path / "target", Canary(tmp_path)
    proc = pull(ref, target, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["format"] == "modelpack" and report["repos"] == [GPT2] and report["skipped_layers"] == []
    commit, files = snapshot_files(seed)
    for path, data, etag in files:  # blobs named as the cache names them, relative links as import writes them
        link = target / GPT2 / "snapshots" / commit / path
        assert os.readlink(link) == "../" * (2 + path.count("/")) + f"blobs/{etag}"
        assert (target / GPT2 / "blobs" / etag).read_bytes() == data
    assert (target / GPT2 / "refs" / "main").read_text() == commit
    assert not (target / "models").exists()  # the prefix is stripped
    verified(target)
    assert offline_load(target, [REPO])[REPO]["input_ids"] == golden_ids(REPO)
    canary.assert_unchanged()


def test_an_artifact_of_another_tool_is_refused_naming_its_path(seed, registry, tmp_path):
    """modctl/KitOps write flat paths (config.json) and no commit: nothing maps them onto a cache."""
    _, files = snapshot_files(seed)
    layers = [layer(registry.host, "mp/flat", path, data, None) for path, data, _ in files]
    ref = push_artifact(registry.host, "mp/flat", "v1", layers)
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    before, canary = tree(target), Canary(tmp_path)
    refused(pull(ref, target), 2, "a ModelPack artifact hfcache cannot map onto a Hugging Face cache")
    assert tree(target) == before
    canary.assert_unchanged()
    verified(target)


@pytest.mark.parametrize("filepath, needle", [
    ("{folder}/snapshots/{commit}/../../../../escape", "absolute or escaping path"),
    ("/etc/{folder}", "absolute or escaping path"),
    ("{folder}/blobs/{etag}", "cannot map onto a Hugging Face cache"),
    ("models--a--b--c--d/snapshots/{commit}/x", "cannot map onto a Hugging Face cache"),
    ("{folder}/snapshots/not-a-commit/config.json", "no 40-hex commit"),
    ("{folder}/snapshots/{commit}/" + "d/" * 300 + "x", "more than 256 levels"),
])
def test_a_path_import_refuses_is_refused_before_any_layer_is_fetched(seed, registry, tmp_path, filepath, needle):
    commit, files = snapshot_files(seed)
    path, data, etag = files[0]
    layers = [layer(registry.host, "mp/paths", f"{GPT2}/snapshots/{commit}/{p}", d, e) for p, d, e in files[1:]]
    layers.append(layer(registry.host, "mp/paths", filepath.format(folder=GPT2, commit=commit, etag=etag), data, etag))
    ref = push_artifact(registry.host, "mp/paths", f"p{abs(hash(filepath)) % 10**8}", layers, commit=commit)
    target, canary = tmp_path / "target", Canary(tmp_path)
    refused(pull(ref, target), 2, needle)
    assert not target.exists()
    canary.assert_unchanged()


def test_bytes_that_are_not_their_etag_or_digest_are_refused_and_nothing_is_published(seed, registry, tmp_path):
    commit, files = snapshot_files(seed)
    regular = next((f for f in files if len(f[2]) == 40), None)
    lfs_or_any = files[0]
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    shutil.rmtree(target / GPT2 / "blobs")  # the target holds nothing of it: every layer must be fetched
    shutil.rmtree(target / GPT2 / "snapshots")
    before, canary = tree(target), Canary(tmp_path)
    if regular is not None:  # a regular file whose etag (git sha1) names other bytes; the digest is right
        path, data, _ = regular
        layers = [layer(registry.host, "mp/etag", f"{GPT2}/snapshots/{commit}/{p}", d,
                        "1" * 40 if p == path else e) for p, d, e in files]
        ref = push_artifact(registry.host, "mp/etag", "v1", layers, commit=commit)
        refused(pull(ref, target), 3, "not the git blob")
        assert tree(target) == before
    # a layer altered in the registry's storage: its bytes no longer hash to the digest
    ref = artifact_of(seed, registry.host, "mp/altered", "v1")
    path, data, etag = lfs_or_any
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    blob = registry.blob_path(digest)
    original = blob.read_bytes()
    try:
        blob.write_bytes(bytes([original[0] ^ 1]) + original[1:])
        refused(pull(ref, target), 3, "hashes to")
    finally:
        blob.write_bytes(original)
    assert tree(target) == before
    canary.assert_unchanged()


def test_tar_layers_two_models_and_a_version_mismatch_are_refused(seed, registry, tmp_path):
    commit, files = snapshot_files(seed)
    target = tmp_path / "target"
    path, data, etag = files[0]
    tar = [layer(registry.host, "mp/odd", f"{GPT2}/snapshots/{commit}/{path}", data, etag,
                 media="application/vnd.cncf.model.weight.v1.tar")]
    refused(pull(push_artifact(registry.host, "mp/odd", "tar", tar, commit=commit), target), 2, "media type")
    two = [layer(registry.host, "mp/odd", f"{GPT2}/snapshots/{commit}/{path}", data, etag),
           layer(registry.host, "mp/odd", f"models--x--y/snapshots/{commit}/{path}", data, etag)]
    refused(pull(push_artifact(registry.host, "mp/odd", "two", two, commit=commit), target), 2,
            "holds one model at one commit")
    one = two[:1]
    refused(pull(push_artifact(registry.host, "mp/odd", "ver", one, commit="a" * 40), target), 2,
            "descriptor.version")
    assert not target.exists()


def test_a_second_pull_downloads_nothing_and_a_tampered_local_blob_is_not_trusted(seed, registry, tmp_path):
    ref = artifact_of(seed, registry.host, "mp/again", "v1")
    target = tmp_path / "target"
    assert pull(ref, target).returncode == 0
    proc = pull(ref, target, "--json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    _, files = snapshot_files(seed)
    assert len(again["skipped_layers"]) == len(files) + 1 and again["bytes_downloaded"] == 0  # + refs/main
    assert again["blobs_new"] == 0 and again["blobs_existing"] == len({e for _, _, e in files})
    # a member plants other bytes (same size) under a blob's name: re-hashed, refused, nothing changed
    _, data, etag = files[0]
    blob = target / GPT2 / "blobs" / etag
    blob.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    before, canary = tree(target), Canary(tmp_path)
    refused(pull(ref, target), 1, f"{GPT2}/blobs/{etag} does not hold the content its name says")
    assert tree(target) == before
    canary.assert_unchanged()


# --- pull --verify-key: signatures (OCI referrers) checked against the staged digests before anything is published



def test_verify_key_accepts_a_signed_artifact_and_refuses_unsigned_or_wrongly_signed(seed, registry, tmp_path):
    private, public = key_pair(tmp_path / "keys", "team")
    _, other_public = key_pair(tmp_path / "keys", "other")
    canary = Canary(tmp_path)
    signed = artifact_of(seed, registry.host, "mp/signed", "v1")
    attach_signature(signed, signed_files(seed), private)
    target = tmp_path / "target"
    proc = pull(signed, target, "--verify-key", str(public), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["signed_by"]
    verified(target)

    # unsigned: refused before any layer is fetched; no target created
    unsigned = artifact_of(seed, registry.host, "mp/unsigned", "v1")
    fresh = tmp_path / "fresh"
    refused(pull(unsigned, fresh, "--verify-key", str(public)), 1, "unsigned")
    assert not fresh.exists()
    # the wrong key, and a bundle that signs other bytes for one file: nothing published
    refused(pull(signed, fresh, "--verify-key", str(other_public)), 1, "refused the pull, nothing was written")
    assert not fresh.exists()
    _, files = snapshot_files(seed)
    first = files[0][0]
    altered = artifact_of(seed, registry.host, "mp/altered-sig", "v1")
    attach_signature(altered, signed_files(seed, **{first: b"other bytes"}), private)
    refused(pull(altered, fresh, "--verify-key", str(public)), 1, f"changed: {first}")
    assert not fresh.exists()
    canary.assert_unchanged()


def test_verify_key_checks_the_image_format_too(seed, registry, tmp_path):
    private, public = key_pair(tmp_path / "keys", "team")
    proc = run_hfcache(["push", f"{registry.host}/mp/image:v1", REPO, "--cache-dir", str(seed), "--plain-http"],
                       env=clean_env())
    assert proc.returncode == 0, proc.stderr
    ref = f"{registry.host}/mp/image:v1"
    target = tmp_path / "target"
    refused(pull(ref, target, "--verify-key", str(public)), 1, "unsigned")
    attach_signature(ref, signed_files(seed), private)
    proc = pull(ref, target, "--verify-key", str(public))
    assert proc.returncode == 0, proc.stderr
    assert "signatures verified" in proc.stdout
    verified(target)


@pytest.mark.parametrize("fmt, prefix", [("modelpack", None), ("modelpack", "models"), ("image", "models")])
def test_what_hfcache_push_writes_pulls_back_signed_and_a_second_pull_downloads_nothing(seed, registry, tmp_path,
                                                                                        fmt, prefix):
    private, public = key_pair(tmp_path / "keys", "team")
    _, other = key_pair(tmp_path / "keys", "other")
    ref = f"{registry.host}/mp/pushed-{fmt}:{prefix or 'root'}"
    args = ["push", ref, REPO, "--cache-dir", str(seed), "--plain-http", "--format", fmt, "--sign-key", str(private)]
    proc = run_hfcache(args + (["--prefix", prefix] if prefix else []), env=clean_env())
    assert proc.returncode == 0, proc.stderr
    target, canary = tmp_path / "target", Canary(tmp_path)
    refused(pull(ref, target, "--verify-key", str(other)), 1, "refused the pull, nothing was written")
    assert not target.exists()
    proc = pull(ref, target, "--verify-key", str(public), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == fmt and not (target / "models").exists()
    verified(target)
    assert offline_load(target, [REPO])[REPO]["input_ids"] == golden_ids(REPO)
    proc = pull(ref, target, "--json")
    again = json.loads(proc.stdout)
    assert proc.returncode == 0 and again["bytes_downloaded"] == 0 and again["blobs_new"] == 0, proc.stderr
    assert len(again["skipped_layers"]) == len(again["layers"])
    canary.assert_unchanged()


def test_a_file_at_two_paths_is_fetched_once_and_linked_twice(seed, registry, tmp_path):
    commit, files = snapshot_files(seed)
    path, data, etag = files[0]
    layers = [layer(registry.host, "mp/twice", f"{GPT2}/snapshots/{commit}/{p}", d, e) for p, d, e in files]
    layers.append(layer(registry.host, "mp/twice", f"{GPT2}/snapshots/{commit}/copy/{path}", data, etag))
    ref = push_artifact(registry.host, "mp/twice", "v1", layers, commit=commit)
    target = tmp_path / "target"
    proc = pull(ref, target, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert sorted(x["transferred"] for x in report["layers"] if x["digest"] == digest) == [0, len(data)]
    snap = target / GPT2 / "snapshots" / commit
    assert os.readlink(snap / "copy" / path) == f"../../../blobs/{etag}" and (snap / "copy" / path).read_bytes() == data
    verified(target)


def test_a_manifest_nested_too_deep_is_one_line_exit_2(seed, registry, tmp_path):
    """The registry's JSON goes through bounds.loads_json: nesting past 64 levels is refused, never parsed on."""
    commit, files = snapshot_files(seed)
    layers = [layer(registry.host, "mp/deep", f"{GPT2}/snapshots/{commit}/{p}", d, e) for p, d, e in files]
    config = json.dumps({"descriptor": {"name": REPO, "version": commit}, "config": {},
                         "modelfs": {"type": "layers", "diffIds": [x["digest"] for x in layers]}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": MODEL_MANIFEST,
                "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                           "digest": put_blob(registry.host, "mp/deep", config), "size": len(config)},
                "layers": layers, "x": json.loads("[" * 80 + "]" * 80)}
    put_manifest(registry.host, "mp/deep", "v1", json.dumps(manifest).encode(), MANIFEST)
    target, canary = tmp_path / "target", Canary(tmp_path)
    refused(pull(f"{registry.host}/mp/deep:v1", target), 2, "nested too deep")
    assert not target.exists()
    canary.assert_unchanged()


def test_a_ref_the_target_has_elsewhere_moves_only_with_move_refs(seed, registry, tmp_path):
    ref = artifact_of(seed, registry.host, "mp/refs", "v1")
    commit, _ = snapshot_files(seed)
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    older = "b" * 40
    shutil.copytree(target / GPT2 / "snapshots" / commit, target / GPT2 / "snapshots" / older, symlinks=True)
    shutil.rmtree(target / GPT2 / "snapshots" / commit)
    (target / GPT2 / "refs" / "main").write_text(older)
    before, canary = tree(target), Canary(tmp_path)
    refused(pull(ref, target), 1, "pass --move-refs to move it")
    assert tree(target) == before
    proc = pull(ref, target, "--move-refs")
    assert proc.returncode == 0, proc.stderr
    assert (target / GPT2 / "refs" / "main").read_text() == commit and "--move-refs" in proc.stdout
    canary.assert_unchanged()
