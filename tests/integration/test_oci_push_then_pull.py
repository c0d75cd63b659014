"""``pull`` of what ``push`` wrote (``--base``, ``--prefix``, ``--format modelpack``, signatures), against the real
registry with its access log on (``docker-registry serve``, tests/registry.py ``logged_registry``), with the real
command: exit code and one-line message, a canary outside the cache unchanged, and ``hfcache verify`` on the cache
still passing where a cache is involved.

- ``pull`` reads what ``push --prefix models --base IMAGE`` writes (the base's layers are skipped, never fetched);
- ``pull --verify-key`` judges the key file before any request, and a key no bundle names before any layer;
- ``pull --verify-key`` covers what the snapshot holds after the pull (a planted file is unsigned);
- a pulled (either format) or imported cache keeps warm's record: a re-pointed link fails ``verify``;
- ``--format modelpack`` refuses ``--layers`` and ``--arch``;
- messages: a ModelPack ``--base``, a signature pulled as an image, bad ``--prefix`` values;
- the same base by tag or by digest gives the same image digest;
- pull's blob counts agree between a first pull, a partial one and a pull of what the cache holds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import key_pair
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.registry import available, logged_registry, put_blob, put_manifest, tar_bytes
from tests.testhub import HubServer

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
GPT2, BERT, DISTIL = "openai-community/gpt2", "google-bert/bert-base-uncased", "distilbert/distilbert-base-uncased"
FOLDER = "models--openai-community--gpt2"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("r2-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(r) for r in (GPT2, BERT, DISTIL)], cache_dir=root,
                            endpoint=server.endpoint, token=False).ok
    return root


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    with logged_registry(tmp_path_factory.mktemp("r2-registry")) as pair:
        yield pair


def run(args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return run_hfcache(args, env=clean_env(**extra), timeout=120)


def push(cache: Path, ref: str, *args: str) -> dict:
    proc = run(["push", ref, *args, "--cache-dir", str(cache), "--plain-http", "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def pull(ref: str, target: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", *args], env=clean_env(),
                       timeout=timeout)


def refused(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The one error line of a refusal (then its hint), with exit ``code`` and every needle in it."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in lines if line.startswith("hfcache: error: ")]
    assert len(errors) == 1, proc.stderr
    assert all(needle in errors[0] for needle in needles), proc.stderr
    return errors[0]


def verified(cache: Path) -> None:
    proc = run(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def blob_gets(log: Path, name: str) -> list[str]:
    """The blob digests ``GET /v2/<name>/blobs/...`` the registry logged (configs included)."""
    time.sleep(0.3)  # the access log is written after the answer
    text = log.read_text(errors="replace")
    marker = f'"GET /v2/{name}/blobs/'
    return [chunk.split(" ", 1)[0] for chunk in text.split(marker)[1:]]


def commit_of(cache: Path, folder: str = FOLDER) -> str:
    return (cache / folder / "refs" / "main").read_text()


# --- push --base, then pull -------------------------------------------------------------------------------------


def tiny_base(host: str, name: str, tag: str) -> tuple[str, str]:
    """A base image with a layer holding ``bin/sh`` (a script; no real shell is needed to read the image), pushed
    by hand. Returns (its manifest digest, its layer digest)."""
    sh = tarfile.TarInfo("bin/sh")
    body = b"#!/bin/false\n"
    sh.size, sh.mode = len(body), 0o755
    folder = tarfile.TarInfo("bin")
    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
    tar = tar_bytes([(folder, None), (sh, body)])
    layer = gzip.compress(tar, mtime=0)
    from hfcache.oci.image import architecture

    config = json.dumps({"architecture": architecture(), "os": "linux", "config": {"Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]}}
                        ).encode()
    layer_digest = put_blob(host, name, layer)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": put_blob(host, name, config), "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": layer_digest, "size": len(layer)}]}).encode()
    return put_manifest(host, name, tag, manifest, MANIFEST), layer_digest


def test_pull_reads_what_push_base_writes_skipping_the_base_and_tag_or_digest_give_one_image(seed, logged,
                                                                                             tmp_path):
    registry, log = logged
    canary = Canary(tmp_path)
    base_digest, base_layer = tiny_base(registry.host, "library/tinysh", "1")
    by_tag = push(seed, f"{registry.host}/kserve/gpt2:tag", GPT2, "--prefix", "models", "--base",
                  f"{registry.host}/library/tinysh:1")
    by_digest = push(seed, f"{registry.host}/kserve/gpt2:digest", GPT2, "--prefix", "models", "--base",
                     f"{registry.host}/library/tinysh@{base_digest}")
    assert by_tag["digest"] == by_digest["digest"]  # 7: the base is recorded by its digest, however it was typed
    manifest = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                          f"docker://{registry.host}/kserve/gpt2:tag"], capture_output=True,
                                         text=True, check=True, timeout=60).stdout)
    assert manifest["annotations"]["org.opencontainers.image.base.name"] == \
        f"{registry.host}/library/tinysh@{base_digest}"
    assert manifest["annotations"]["io.hfcache.base.layers"] == base_layer
    assert manifest["layers"][0]["digest"] == base_layer

    target = tmp_path / "target"
    proc = pull(f"{registry.host}/kserve/gpt2:tag", target, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert base_layer not in [x["digest"] for x in report["layers"]]
    assert base_layer not in blob_gets(log, "kserve/gpt2")  # never downloaded: not cache content
    assert not (target / "bin").exists() and not (target / "models").exists()
    assert (target / FOLDER / "snapshots" / commit_of(seed)).is_dir()
    verified(target)

    # An annotation that does not name the first layers is refused, not trusted to hide cache layers.
    layers = manifest["layers"][1:] + manifest["layers"][:1]
    forged = dict(manifest, layers=layers)
    put_manifest(registry.host, "kserve/gpt2", "forged", json.dumps(forged).encode(), MANIFEST)
    refused(pull(f"{registry.host}/kserve/gpt2:forged", tmp_path / "fresh"), 2, "io.hfcache.base.layers",
            "first layers")
    assert not (tmp_path / "fresh").exists()
    canary.assert_unchanged()


# --- --verify-key -----------------------------------------------------------------------------------------------



def rsa_public(path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def test_a_bad_verify_key_file_is_refused_before_any_request(tmp_path):
    """No registry runs at 127.0.0.1:1: a key judged after connecting would be exit 3 (unreachable), not 2."""
    private, _ = key_pair(tmp_path / "keys", "team")
    fifo = tmp_path / "keys" / "fifo.pub"
    os.mkfifo(fifo)
    canary = Canary(tmp_path)
    for key, needle in ((private, "not a PEM public key"), (rsa_public(tmp_path / "keys" / "rsa.pub"), "not an EC"),
                        (fifo, "not a regular file")):
        started = time.monotonic()
        proc = pull("127.0.0.1:1/ml/gpt2:v1", tmp_path / "target", "--verify-key", str(key), timeout=60)
        assert time.monotonic() - started < 30  # a FIFO never blocks
        refused(proc, 2, str(key), needle)
    refused(pull("127.0.0.1:1/ml/gpt2:v1", tmp_path / "target", "--verify-key", str(tmp_path / "gone.pub")), 2,
            "gone.pub", "does not exist")
    assert not (tmp_path / "target").exists()
    canary.assert_unchanged()


@pytest.mark.parametrize("fmt", ["modelpack", "image"])
def test_a_key_no_bundle_names_is_refused_before_any_layer(seed, logged, tmp_path, fmt):
    registry, log = logged
    private, _ = key_pair(tmp_path / "keys", "team")
    _, other = key_pair(tmp_path / "keys", "other")
    name = f"signed/hint-{fmt}"
    pushed = push(seed, f"{registry.host}/{name}:v1", GPT2, "--format", fmt, "--sign-key", str(private))
    canary, target = Canary(tmp_path), tmp_path / "target"
    before = len(blob_gets(log, name))
    line = refused(pull(f"{registry.host}/{name}:v1", target, "--verify-key", str(other)), 1,
                   "none of its 1 signature(s) is by the key", str(other), "nothing was written")
    assert "Traceback" not in line
    fetched = blob_gets(log, name)[before:]
    layers = {x["digest"] for x in pushed["layers"]}
    assert not layers & set(fetched), fetched  # no layer body was requested
    assert not target.exists()
    canary.assert_unchanged()


@pytest.mark.parametrize("fmt", ["modelpack", "image"])
def test_verify_key_names_a_planted_file_the_signature_does_not_cover(seed, logged, tmp_path, fmt):
    registry, _ = logged
    private, public = key_pair(tmp_path / "keys", "team")
    ref = f"{registry.host}/signed/planted-{fmt}:v1"
    push(seed, ref, GPT2, "--format", fmt, "--sign-key", str(private))
    target = tmp_path / "target"
    proc = pull(ref, target)  # a first pull, then a member plants extra.py and a file goes missing
    assert proc.returncode == 0, proc.stderr
    snapshot = target / FOLDER / "snapshots" / commit_of(seed)
    (snapshot / "extra.py").write_text("import os; os.system('id')\n")
    (snapshot / "config.json").unlink()
    canary = Canary(tmp_path)
    line = refused(pull(ref, target, "--verify-key", str(public)), 1, "unsigned: extra.py")
    assert "nothing was written" in line
    assert not (snapshot / "config.json").exists()  # nothing published
    (snapshot / "extra.py").unlink()
    proc = pull(ref, target, "--verify-key", str(public))
    assert proc.returncode == 0 and "signatures verified" in proc.stdout, proc.stderr
    assert (snapshot / "config.json").exists()
    verified(target)
    canary.assert_unchanged()


# --- the file-to-blob mapping survives pull and import ------------------------------------------------------------


def repoint_fails_verify(cache: Path, commit: str) -> None:
    snapshot = cache / FOLDER / "snapshots" / commit
    config = os.readlink(snapshot / "config.json")
    (snapshot / "tokenizer_config.json").unlink()
    os.symlink(config, snapshot / "tokenizer_config.json")
    proc = run(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tokenizer_config.json" in proc.stdout + proc.stderr


@pytest.mark.parametrize("how", ["image", "modelpack", "import"])
def test_a_pulled_or_imported_cache_keeps_which_blob_each_file_is(seed, logged, tmp_path, how):
    registry, _ = logged
    target, canary, commit = tmp_path / "target", Canary(tmp_path), commit_of(seed)
    if how == "import":
        tar = tmp_path / "gpt2.tar"
        proc = run(["export", str(tar), GPT2, "--cache-dir", str(seed)])
        assert proc.returncode == 0, proc.stderr
        proc = run(["import", str(tar), "--cache-dir", str(target)])
    else:
        ref = f"{registry.host}/mapped/{how}:v1"
        push(seed, ref, GPT2, "--format", how)
        proc = pull(ref, target)
    assert proc.returncode == 0, proc.stderr
    verified(target)
    record = target / ".locks" / FOLDER / "hfcache" / f"{commit}.json"
    assert json.loads(record.read_text())["files"]["tokenizer_config.json"]["hash"].startswith(("git-sha1:",
                                                                                                 "sha256:"))
    repoint_fails_verify(target, commit)
    canary.assert_unchanged()


# --- refusals with one line ---------------------------------------------------------------------------------------


def test_modelpack_refuses_layers_and_arch_and_bad_prefixes_say_why(seed, logged, tmp_path):
    registry, _ = logged
    canary = Canary(tmp_path)
    ref = f"{registry.host}/refused/gpt2:v1"
    for extra, needle in ((["--layers", "single"], "--layers is for --format image"),
                          (["--layers", "repo"], "--layers is for --format image"),
                          (["--arch", "amd64"], "--arch is for --format image")):
        refused(run(["push", ref, GPT2, "--cache-dir", str(seed), "--plain-http", "--format", "modelpack", *extra]),
                2, needle)
    for prefix, needle in (("/".join("abcdefghi"), "at most 8 folders"), ("-x", "must not start with -"),
                           ("", "must not be empty"), ("/models", "relative"), ("a/../b", "'..'")):
        refused(run(["push", ref, GPT2, "--cache-dir", str(seed), "--plain-http", "--prefix", prefix]), 2,
                f"--prefix {prefix!r}", needle)
    gone = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode != 0  # nothing was pushed
    verified(seed)
    canary.assert_unchanged()


def test_a_modelpack_base_and_a_signature_pulled_as_an_image_are_named_for_what_they_are(seed, logged, tmp_path):
    registry, _ = logged
    canary = Canary(tmp_path)
    private, _ = key_pair(tmp_path / "keys", "team")
    artifact = f"{registry.host}/named/gpt2:mp"
    push(seed, artifact, GPT2, "--format", "modelpack", "--sign-key", str(private))
    refused(run(["push", f"{registry.host}/named/car:v1", GPT2, "--cache-dir", str(seed), "--plain-http", "--base",
                 artifact]), 2, "a ModelPack artifact (application/vnd.cncf.model.manifest.v1+json)",
            "not a container image")
    index = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                       f"docker://{registry.host}/named/gpt2:mp"], capture_output=True, text=True,
                                      check=True, timeout=60).stdout)
    digest = "sha256:" + hashlib.sha256(json.dumps(index, sort_keys=True, separators=(",", ":"),
                                                   ensure_ascii=False).encode()).hexdigest()
    referrers = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                           f"docker://{registry.host}/named/gpt2:sha256-{digest[7:]}"],
                                          capture_output=True, text=True, check=True, timeout=60).stdout)
    signature = f"{registry.host}/named/gpt2@{referrers['manifests'][0]['digest']}"
    target = tmp_path / "target"
    refused(pull(signature, target), 2, "is a signature (an OCI referrer), not an image; pull the image it signs")
    assert not target.exists()
    canary.assert_unchanged()


# --- blob counts ----------------------------------------------------------------------------------------------------


def test_blob_counts_agree_between_a_first_a_partial_and_a_repeated_pull(seed, logged, tmp_path):
    """bert and distilbert share vocab.txt and tokenizer.json: one content in two repo layers."""
    registry, _ = logged
    canary = Canary(tmp_path)
    ref = f"{registry.host}/counts/two:v1"
    push(seed, ref, BERT, DISTIL)
    target = tmp_path / "target"
    first = json.loads(pull(ref, target, "--json").stdout)
    again = json.loads(pull(ref, target, "--json").stdout)
    assert len(again["skipped_layers"]) == 2
    # One layer changed on disk (a snapshot entry rewritten): that layer alone is fetched again.
    bert = target / "models--google-bert--bert-base-uncased"
    shutil.rmtree(bert / "snapshots")
    partial = json.loads(pull(ref, target, "--json").stdout)
    assert len(partial["skipped_layers"]) == 1
    assert first["blob_contents"] == again["blob_contents"] == partial["blob_contents"], (first, again, partial)
    assert first["blobs_new"] + first["blobs_existing"] == again["blobs_existing"]
    proc = pull(ref, target)
    assert f"{first['blob_contents']} distinct blobs" in proc.stdout, proc.stdout
    verified(target)
    canary.assert_unchanged()
