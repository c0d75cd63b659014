"""``hfcache push --format modelpack`` and ``--prefix models`` against a real registry (Debian's docker-registry),
read by independent clients: skopeo (the raw manifest), modelpack-client (the spec's config schema, extraction into
a folder) and transformers offline (the extracted folder is a cache it loads); the registry's own access log
shows a blob shared by two repos is uploaded once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import golden_ids, offline_load, run_hfcache
from tests.hostile import PeerServer, forward
from tests.registry import Registry, available, push_shell_base, running_registry
from tests.testhub import HubServer
from tests.users import ALICE, GROUP, needs_root

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
BERT, DISTIL = "google-bert/bert-base-uncased", "distilbert/distilbert-base-uncased"
MODEL_TYPES = {"application/vnd.cncf.model.weight.v1.raw", "application/vnd.cncf.model.weight.config.v1.raw",
               "application/vnd.cncf.model.doc.v1.raw", "application/vnd.cncf.model.code.v1.raw"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """bert-base-uncased and distilbert-base-uncased (they share vocab.txt and tokenizer.json), plus a hand-made LFS
    file (a sha256-named blob) in bert's snapshot, so a raw layer's digest is the etag itself."""
    root = tmp_path_factory.mktemp("mp-src") / "cache"
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(r) for r in (BERT, DISTIL)], cache_dir=root,
                              endpoint=server.endpoint, token=False)
    assert report.ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("mp-registry")) as reg:
        yield reg


def push(registry: Registry, tag: str, cache: Path, *args: str, ok: bool = True):
    proc = run_hfcache(["push", f"{registry.host}/{tag}", "--cache-dir", str(cache), "--plain-http", "--json", *args])
    if ok:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    return proc


def skopeo_raw(registry: Registry, tag: str) -> bytes:
    proc = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{registry.host}/{tag}"],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def blob(registry: Registry, name: str, digest: str) -> bytes:
    with urllib.request.urlopen(f"http://{registry.host}/v2/{name}/blobs/{digest}", timeout=30) as r:
        return r.read()


def commit_of(cache: Path, repo: str) -> str:
    return (cache / f"models--{repo.replace('/', '--')}" / "refs" / "main").read_text().strip()


def verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def modelpack_pull(registry: Registry, tag: str, dest: Path):
    from modelpack_client import ModelPackClient

    return ModelPackClient(insecure=True, tls_verify=False).pull(f"{registry.host}/{tag}", dest)


def load_offline(cache: Path, repo: str) -> None:
    got = offline_load(cache, [repo])[repo]
    assert got.get("input_ids") == golden_ids(repo), got


def test_modelpack_artifact_is_read_by_skopeo_modelpack_client_and_transformers(cache, registry, tmp_path):
    canary = Canary(tmp_path)
    commit = commit_of(cache, BERT)
    first = push(registry, "mp/bert:v1", cache, "--format", "modelpack", BERT)
    assert first["format"] == "modelpack" and first["repos"] == [f"{BERT}@{commit}"]

    raw = skopeo_raw(registry, "mp/bert:v1")
    assert f"sha256:{hashlib.sha256(raw).hexdigest()}" == first["digest"]
    manifest = json.loads(raw)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    assert manifest["annotations"]["io.hfcache.format"] == "modelpack"
    assert manifest["annotations"]["io.hfcache.repos"] == f"{BERT}@{commit}"
    snapshot = cache / "models--google-bert--bert-base-uncased" / "snapshots" / commit
    by_path = {layer["annotations"]["org.cncf.model.filepath"]: layer for layer in manifest["layers"]}
    expected = {f"models--google-bert--bert-base-uncased/snapshots/{commit}/{p.name}" for p in snapshot.iterdir()}
    assert set(by_path) == expected | {"models--google-bert--bert-base-uncased/refs/main"}
    for path, layer in by_path.items():
        notes = layer["annotations"]
        assert layer["mediaType"] in MODEL_TYPES and notes["org.opencontainers.image.title"] == path
        assert notes["org.cncf.model.file.mediatype.untested"] == "true"
        meta = json.loads(notes["org.cncf.model.file.metadata+json"])
        assert meta == {"name": path.rsplit("/", 1)[1], "mode": 420, "uid": 0, "gid": 0, "size": layer["size"],
                        "mtime": "1970-01-01T00:00:00Z", "typeflag": 48}
        data = (cache / path).read_bytes()
        assert layer["digest"] == f"sha256:{hashlib.sha256(data).hexdigest()}" and layer["size"] == len(data)
        if path.endswith("/refs/main"):
            assert data.decode() == commit and notes["io.hfcache.kind"] == "ref"
        else:
            assert notes["io.hfcache.etag"] == os.readlink(cache / path).rsplit("/", 1)[1]
    assert by_path[f"models--google-bert--bert-base-uncased/snapshots/{commit}/vocab.txt"]["mediaType"] == \
        "application/vnd.cncf.model.weight.config.v1.raw"

    from modelpack_client.schema import CONFIG_SCHEMA

    config = json.loads(blob(registry, "mp/bert", manifest["config"]["digest"]))
    jsonschema.Draft202012Validator(CONFIG_SCHEMA).validate(config)
    assert config["descriptor"] == {"name": BERT, "version": commit,
                                    "sourceURL": f"https://huggingface.co/{BERT}/tree/{commit}"}
    assert config["modelfs"]["diffIds"] == [layer["digest"] for layer in manifest["layers"]]
    assert str(cache) not in raw.decode() and str(tmp_path) not in json.dumps(config)

    folder = tmp_path / "extracted"
    pulled = modelpack_pull(registry, "mp/bert:v1", folder)
    assert len(pulled.files) == len(manifest["layers"])
    assert not [p for p in folder.rglob("*") if p.is_symlink()]
    load_offline(folder, BERT)

    # Every mtime changed: the same artifact digest, and no layer is sent again.
    for path in [cache, *cache.rglob("*")]:
        os.utime(path, (1_234_567, 7_654_321), follow_symlinks=False)
    second = push(registry, "mp/bert:v2", cache, "--format", "modelpack", f"{BERT}@main")
    assert second["digest"] == first["digest"]
    assert [layer["transferred"] for layer in second["layers"]] == [0] * len(first["layers"])
    verify_ok(cache)
    canary.assert_unchanged()


def test_prefix_models_puts_every_path_under_models_in_both_formats(cache, registry, tmp_path):
    commit = commit_of(cache, BERT)
    push(registry, "mp/bert-kserve:v1", cache, "--format", "modelpack", BERT, "--prefix", "models")
    manifest = json.loads(skopeo_raw(registry, "mp/bert-kserve:v1"))
    assert manifest["annotations"]["io.hfcache.prefix"] == "models"
    paths = [layer["annotations"]["org.cncf.model.filepath"] for layer in manifest["layers"]]
    assert paths and all(p.startswith("models/models--google-bert--bert-base-uncased/") for p in paths)
    folder = tmp_path / "extracted"
    modelpack_pull(registry, "mp/bert-kserve:v1", folder)
    assert [p.name for p in folder.iterdir()] == ["models"]
    load_offline(folder / "models", BERT)

    image = push(registry, "mp/cache-kserve:v1", cache, "--prefix", "models")
    assert image["prefix"] == "models" and image["format"] == "image"
    manifest = json.loads(skopeo_raw(registry, "mp/cache-kserve:v1"))
    assert manifest["annotations"]["io.hfcache.prefix"] == "models"
    names: set[str] = set()
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(registry, "mp/cache-kserve", layer["digest"])))) \
                as tar:
            members = tar.getmembers()
            names |= {m.name for m in members}
            root = tmp_path / "rootfs"
            tar.extractall(root, filter="tar")
    assert all(n == "models" or n.startswith("models/") for n in names)
    assert f"models/models--google-bert--bert-base-uncased/snapshots/{commit}/vocab.txt" in names
    load_offline(root / "models", BERT)  # what a Modelcar's /models or an image volume with subPath: models holds
    # Without --prefix the digest is the one it always was (the prefix changes nothing else).
    plain = push(registry, "mp/cache-plain:v1", cache)
    assert plain["digest"] != image["digest"] and plain["prefix"] == ""


@pytest.mark.parametrize("prefix", ["/abs", "../up", "a/../b", "models/", "x y"])
def test_a_bad_prefix_is_exit_2_before_anything_is_sent(cache, registry, prefix):
    proc = push(registry, "mp/bad:v1", cache, "--prefix", prefix, ok=False)
    if prefix == "models/":  # a trailing slash is the same folder
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stderr
    assert "--prefix" in proc.stderr and "Traceback" not in proc.stderr


def test_modelpack_of_two_repos_or_two_revisions_is_exit_2(cache, registry, tmp_path):
    proc = push(registry, "mp/two:v1", cache, "--format", "modelpack", ok=False)
    assert proc.returncode == 2
    assert "a ModelPack artifact holds one model: push each repo to its own tag" in proc.stderr
    proc = push(registry, "mp/two:v1", cache, "--format", "modelpack", BERT, DISTIL, ok=False)
    assert proc.returncode == 2 and "one model" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/two/manifests/v1", timeout=10)


def _logging_registry(workdir: Path):
    """docker-registry with its access log on (tests/registry.py turns it off): one line per request."""
    import contextlib
    import socket

    @contextlib.contextmanager
    def run():
        workdir.mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = workdir / "config.yml"
        config.write_text(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: false\nstorage:\n"
                          f"  filesystem:\n    rootdirectory: {workdir / 'storage'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
        log = (workdir / "access.log").open("wb")
        proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
                    break
                except OSError:
                    time.sleep(0.1)
            yield Registry(host=f"127.0.0.1:{port}", root=workdir / "storage"), workdir / "access.log"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()
    return run()


def test_two_repos_sharing_a_file_upload_it_once(cache, tmp_path):
    with _logging_registry(tmp_path / "reg") as (registry, log):
        one = push(registry, "models/shared:bert", cache, "--format", "modelpack", BERT)
        two = push(registry, "models/shared:distilbert", cache, "--format", "modelpack", DISTIL)
        time.sleep(0.5)
        lines = log.read_text(errors="replace").splitlines()
    shared = {x["digest"] for x in one["layers"]} & {x["digest"] for x in two["layers"]}
    vocab = hashlib.sha256((cache / "models--google-bert--bert-base-uncased" / "snapshots" /
                            commit_of(cache, BERT) / "vocab.txt").read_bytes()).hexdigest()
    assert f"sha256:{vocab}" in shared
    for digest in shared:
        puts = [line for line in lines if '"PUT ' in line and f"digest={digest}" in line.replace("%3A", ":")]
        heads = [line for line in lines if '"HEAD ' in line and digest in line]
        assert len(puts) == 1, puts  # sent by the first push only
        assert len(heads) == 2, heads  # both pushes asked first
        assert [x["transferred"] for x in two["layers"] if x["digest"] == digest] == [0]


def _lfs_copy(cache: Path, tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A copy of the cache with an LFS file (a sha256-named blob) in bert's snapshot."""
    copy = tmp_path / "lfs-cache"
    shutil.copytree(cache, copy, symlinks=True)
    data = b"\x00weights" * 1000
    etag = hashlib.sha256(data).hexdigest()
    folder = copy / "models--google-bert--bert-base-uncased"
    (folder / "blobs" / etag).write_bytes(data)
    link = folder / "snapshots" / commit_of(cache, BERT) / "model.safetensors"
    link.symlink_to(f"../../blobs/{etag}")
    return copy, folder / "blobs" / etag, data


def test_an_lfs_file_is_a_weight_layer_named_by_its_etag_and_a_corrupt_one_is_refused(cache, registry, tmp_path):
    canary = Canary(tmp_path)
    copy, blob_path, data = _lfs_copy(cache, tmp_path)
    etag = blob_path.name
    pushed = push(registry, "mp/lfs:v1", copy, "--format", "modelpack", BERT)
    manifest = json.loads(skopeo_raw(registry, "mp/lfs:v1"))
    weights = [x for x in manifest["layers"] if x["annotations"]["org.cncf.model.filepath"].endswith("safetensors")]
    assert [(x["digest"], x["mediaType"], x["annotations"]["io.hfcache.etag"]) for x in weights] == \
        [(f"sha256:{etag}", "application/vnd.cncf.model.weight.v1.raw", etag)]
    assert blob(registry, "mp/lfs", f"sha256:{etag}") == data
    config = json.loads(blob(registry, "mp/lfs", manifest["config"]["digest"]))
    assert config["config"]["format"] == "safetensors"
    assert pushed["digest"]

    # The same bytes but one flipped, under the same name, pushed to a fresh registry repository: refused (exit 5),
    # the registry never stores a blob under the etag, no manifest is written.
    blob_path.write_bytes(b"\x01" + data[1:])
    proc = push(registry, "mp/lfs-bad:v1", copy, "--format", "modelpack", BERT, ok=False)
    assert proc.returncode == 5, proc.stderr
    assert "its bytes are not the" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # the error and its hint
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/lfs-bad/manifests/v1", timeout=10)
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/lfs-bad/blobs/sha256:{etag}", timeout=10)
    canary.assert_unchanged()


def test_a_blob_swapped_for_a_link_to_a_secret_is_refused_and_the_secret_never_leaves(cache, registry, tmp_path):
    canary = Canary(tmp_path)
    copy = tmp_path / "swap-cache"
    shutil.copytree(cache, copy, symlinks=True)
    folder = copy / "models--google-bert--bert-base-uncased"
    vocab = os.readlink(folder / "snapshots" / commit_of(cache, BERT) / "vocab.txt").rsplit("/", 1)[1]
    secret = next(p for p in [canary.secret] if p.is_file())
    (folder / "blobs" / vocab).unlink()
    (folder / "blobs" / vocab).symlink_to(secret)
    proc = push(registry, "mp/swap:v1", copy, "--format", "modelpack", BERT, ok=False)
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/swap/manifests/v1", timeout=10)
    secret_digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    assert not registry.blob_path(f"sha256:{secret_digest}").exists()
    canary.assert_unchanged()


#: The member's loop (as ALICE): argv PATH TARGET STOP. Exchanges PATH with a link to TARGET (renameat2
#: RENAME_EXCHANGE) for ~2 ms, then leaves the real file there for ~10 ms, until STOP exists; prints the swaps. Most
#: of the time a push plans the real file, then may open, read or send it while it is the link.
BLINK = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
path, target, stop = sys.argv[1:4]
link, hits = os.path.join(os.path.dirname(path), f".blink-{os.getpid()}"), 0
while not os.path.exists(stop):
    os.symlink(target, link)
    if libc.renameat2(-100, link.encode(), -100, path.encode(), 2) == 0:
        hits += 1
        time.sleep(0.002)
        libc.renameat2(-100, link.encode(), -100, path.encode(), 2)
    os.unlink(link)
    time.sleep(0.01)
print(hits)
"""


@needs_root
def test_a_member_swapping_a_blob_for_a_link_during_push_never_ships_the_secret(runtime, registry, tmp_path):
    """A group member exchanges the weights blob of a shared cache with a link to root's 0600 secret, over and
    over, while root pushes it as a ModelPack artifact: each push either ships the real bytes or stops in one line
    (exit 5); the secret's bytes never reach the registry; once the member stops, the cache verifies and pushes."""
    from tests.shared_cache import SHARED, make_export, one_line_outcome, sha256, shared_cache, stop_member

    canary = Canary(tmp_path)
    cache = shared_cache(runtime, "mp-race")
    [name] = make_export(cache, 1)
    for folder in [cache / name, *(p for p in (cache / name).rglob("*") if p.is_dir() and not p.is_symlink())]:
        os.chown(folder, 0, GROUP)
        os.chmod(folder, 0o2775)
    target = str(cache / name / "blobs" / sha256(SHARED))
    secret = f"sha256:{hashlib.sha256(canary.secret.read_bytes()).hexdigest()}"
    outcomes, hits = [], 0
    for n in range(10):
        stop = runtime.base / f"stop-mp-{n}"
        member = subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", BLINK, target, str(canary.secret),
                                   str(stop)], cwd=runtime.base, env=runtime.env(ALICE), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.umask(0o002))
        try:
            time.sleep(0.1)
            proc = push(registry, f"mp/race{n}:v1", cache, "--format", "modelpack", "org/r0", ok=False)
        finally:
            hits += stop_member(member, stop)
        one_line_outcome(proc, {0: (), 5: ("symlink", "left alone", "changed", "not a regular file", "unsafe",
                                           "its bytes are not", "broken entry", "not the cache file")})
        outcomes.append((proc.stderr.strip().splitlines() or ["ok"])[0][:80])
        if proc.returncode == 0:
            assert blob(registry, f"mp/race{n}", f"sha256:{sha256(SHARED)}") == SHARED
        assert not registry.blob_path(secret).exists()
        canary.assert_unchanged()
    assert hits, f"the member never swapped anything (outcomes {outcomes})"
    verify_ok(cache)
    push(registry, "mp/race-after:v1", cache, "--format", "modelpack", "org/r0")


def _bundles_of(registry: Registry, tag: str, digest: str) -> list[bytes]:
    """The signature bundles attached to ``digest`` (read with hfcache's referrers client: the tag fallback)."""
    from hfcache.oci.referrers import bundles
    from hfcache.oci.registry import connect, parse_reference

    container = parse_reference(f"{registry.host}/{tag}")
    return bundles(connect(container, True, None, 30), container, digest)


def test_push_sign_key_attaches_a_bundle_the_model_signing_cli_verifies(cache, registry, tmp_path):
    from tests.artifacts import MODEL_SIGNING, write_key

    canary = Canary(tmp_path)
    private, public = write_key(tmp_path, "signer")
    commit = commit_of(cache, BERT)
    pushed = push(registry, "mp/signed:v1", cache, "--format", "modelpack", BERT, "--sign-key", str(private))
    assert pushed["signature"].startswith("sha256:")
    [bundle] = _bundles_of(registry, "mp/signed:v1", pushed["digest"])
    (tmp_path / "bundle.json").write_bytes(bundle)
    folder = tmp_path / "extracted"
    modelpack_pull(registry, "mp/signed:v1", folder)
    snapshot = folder / "models--google-bert--bert-base-uncased" / "snapshots" / commit
    ms = subprocess.run([MODEL_SIGNING, "verify", "key", "--signature", str(tmp_path / "bundle.json"),
                         "--public_key", str(public), str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 0, ms.stdout + ms.stderr
    (snapshot / "vocab.txt").write_bytes(b"[PAD]\n")  # the check is not vacuous: a changed file fails it
    ms = subprocess.run([MODEL_SIGNING, "verify", "key", "--signature", str(tmp_path / "bundle.json"),
                         "--public_key", str(public), str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode != 0

    # The image format signs its one snapshot too (same files, same digests); several snapshots: one bundle each.
    image = push(registry, "mp/signed-image:v1", cache, BERT, "--sign-key", str(private))
    assert len(_bundles_of(registry, "mp/signed-image:v1", image["digest"])) == 1
    two = push(registry, "mp/signed-two:v1", cache, "--sign-key", str(private))
    assert len(_bundles_of(registry, "mp/signed-two:v1", two["digest"])) == 2
    proc = push(registry, "mp/signed-bad:v1", cache, "--format", "modelpack", BERT, "--sign-key",
                str(public), ok=False)  # a public key is no signing key: refused before anything is sent
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/signed-bad/manifests/v1", timeout=10)
    canary.assert_unchanged()



@needs_root
@pytest.mark.skipif(not Path("/lib64/ld-linux-x86-64.so.2").exists(), reason="the hand-made shell base is x86-64")
def test_base_image_with_a_shell_for_the_modelcar_is_mounted_not_copied_and_runs_sh(cache, tmp_path):
    canary = Canary(tmp_path)
    commit = commit_of(cache, BERT)
    with _logging_registry(tmp_path / "reg") as (registry, log):
        base_layer, base_diff, base_config = push_shell_base(registry, "library/shell")
        pushed = push(registry, "ml/modelcar:v1", cache, BERT, "--prefix", "models", "--base",
                      f"{registry.host}/library/shell:v1")
        again = push(registry, "ml/modelcar:v2", cache, BERT, "--prefix", "models", "--base",
                     f"{registry.host}/library/shell:v1")
        manifest = json.loads(skopeo_raw(registry, "ml/modelcar:v1"))
        config = json.loads(blob(registry, "ml/modelcar", manifest["config"]["digest"]))
        layers = [blob(registry, "ml/modelcar", x["digest"]) for x in manifest["layers"]]
        time.sleep(0.5)
        lines = log.read_text(errors="replace").splitlines()
    assert again["digest"] == pushed["digest"]  # reproducible for the same base digest
    assert manifest["layers"][0] == {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                     "digest": base_layer, "size": len(layers[0])}
    assert config["rootfs"]["diff_ids"][0] == base_diff and len(config["rootfs"]["diff_ids"]) == len(layers)
    assert {k: v for k, v in config["config"].items() if k != "Labels"} == base_config["config"]
    assert "created" not in config and "history" not in config
    assert manifest["annotations"]["org.opencontainers.image.base.name"] == (
        f"{registry.host}/library/shell@{manifest['annotations']['org.opencontainers.image.base.digest']}")
    assert manifest["annotations"]["org.opencontainers.image.base.digest"].startswith("sha256:")
    # The base blob was mounted from library/shell, never uploaded into ml/modelcar.
    assert any("POST /v2/ml/modelcar/blobs/uploads/?mount=" + base_layer.replace(":", "%3A") in line
               or "POST /v2/ml/modelcar/blobs/uploads/?mount=" + base_layer in line for line in lines), lines[-20:]
    assert not [line for line in lines if '"PUT /v2/ml/modelcar/' in line and base_layer.split(":")[1] in line]

    # What the Modelcar does: run `sh -c` in the image, whose /models is the cache.
    rootfs = tmp_path / "rootfs"
    for data in layers:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
            tar.extractall(rootfs, filter="tar")
    probe = f"test -f /models/models--google-bert--bert-base-uncased/snapshots/{commit}/vocab.txt && echo ok"
    ran = subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", probe], capture_output=True, text=True,
                         timeout=30)
    assert (ran.returncode, ran.stdout.strip()) == (0, "ok"), ran.stderr
    load_offline(rootfs / "models", BERT)
    verify_ok(cache)
    canary.assert_unchanged()


def test_a_base_on_another_registry_or_with_modelpack_or_missing_is_exit_2(cache, registry, tmp_path):
    for args, needle in ((["--base", "other.example.com:5000/library/busybox:1"], "not on"),
                         (["--base", f"{registry.host}/library/none:v1"], "not found"),
                         (["--format", "modelpack", "--base", f"{registry.host}/library/shell:v1"],
                          "--base is for --format image")):
        proc = push(registry, "mp/based:v1", cache, BERT, *args, ok=False)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr.splitlines()[0] and "Traceback" not in proc.stderr
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/based/manifests/v1", timeout=10)


@pytest.mark.parametrize("fmt", ["image", "modelpack"])
def test_hfcache_pull_reads_a_prefixed_push_of_either_format_into_a_cache_that_verifies(cache, registry, tmp_path,
                                                                                      fmt):
    tag = f"mp/roundtrip-{fmt}:v1"
    pushed = push(registry, tag, cache, "--format", fmt, BERT, "--prefix", "models")
    target = tmp_path / "target" / "hub"
    proc = run_hfcache(["pull", f"{registry.host}/{tag}", "--cache-dir", str(target), "--plain-http", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["digest"] == pushed["digest"]
    assert sorted(p.name for p in target.iterdir() if p.name.startswith("models--")) == \
        ["models--google-bert--bert-base-uncased"]
    verify_ok(target)
    load_offline(target, BERT)


class _NoMountProxy(PeerServer):
    """A proxy in front of the registry that answers a cross-repository mount as a plain upload start (202, as a
    registry without mounts does), and can flip the last byte of one blob it serves (``alter``: a digest).
    docker-registry always mounts; the test Hub is no registry."""

    def __init__(self, upstream: str, alter: str | None = None) -> None:
        self.upstream, self.alter, self.mounts = upstream, alter, 0
        super().__init__()

    def _answer(self, h, head: bool) -> None:
        path = h.path
        if h.command == "POST" and "mount=" in path:
            self.mounts += 1
            path = path.split("?", 1)[0]
        status, headers, data = forward(h, self.upstream, path)
        if self.alter and h.command == "GET" and path.endswith(f"/blobs/{self.alter}") and data:
            data = data[:-1] + bytes([data[-1] ^ 1])
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)


def test_a_base_the_registry_will_not_mount_is_copied_with_its_digest_checked(cache, registry, tmp_path):
    base_layer, _, _ = push_shell_base(registry, "library/copyshell")
    with _NoMountProxy(registry.host) as proxy:
        proxied = Registry(host=proxy.host, root=registry.root)
        pushed = push(proxied, "ml/copied:v1", cache, BERT, "--prefix", "models", "--base",
                      f"{proxy.host}/library/copyshell:v1")
        assert proxy.mounts == 1
    manifest = json.loads(skopeo_raw(registry, "ml/copied:v1"))
    assert manifest["layers"][0]["digest"] == base_layer
    assert blob(registry, "ml/copied", base_layer) == blob(registry, "library/copyshell", base_layer)
    assert pushed["bytes_uploaded"] >= manifest["layers"][0]["size"]
    with _NoMountProxy(registry.host, alter=base_layer) as proxy:
        proxied = Registry(host=proxy.host, root=registry.root)
        proc = push(proxied, "ml/copied-bad:v1", cache, BERT, "--prefix", "models", "--base",
                    f"{proxy.host}/library/copyshell:v1", ok=False)
    assert proc.returncode == 3, proc.stderr
    assert "content does not match its digest" in proc.stderr.splitlines()[0] and "Traceback" not in proc.stderr
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{registry.host}/v2/ml/copied-bad/manifests/v1", timeout=10)


def test_modelpack_push_of_a_one_repo_lock_records_its_hash_and_a_wider_lock_is_exit_2(registry, tmp_path):
    import tomli_w
    import tomllib

    full = Path(__file__).parents[2] / "examples" / "hfcache.lock"
    document = tomllib.loads(full.read_text())
    document["repos"] = [r for r in document["repos"] if r["repo_id"] == "openai-community/gpt2"]
    assert len(document["repos"]) == 1
    lock = tmp_path / "hfcache.lock"
    lock.write_text(tomli_w.dumps(document))
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        warmed = run_hfcache(["warm", "--lock", str(full), "--cache-dir", str(cache), "--endpoint", server.endpoint])
    assert warmed.returncode == 0, warmed.stderr
    pushed = push(registry, "mp/locked:v1", cache, "--format", "modelpack", "--lock", str(lock))
    manifest = json.loads(skopeo_raw(registry, "mp/locked:v1"))
    assert manifest["annotations"]["io.hfcache.lock.sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert pushed["repos"] == [f"openai-community/gpt2@{document['repos'][0]['commit_hash']}"]
    assert str(tmp_path) not in json.dumps(manifest)
    proc = push(registry, "mp/locked-all:v1", cache, "--format", "modelpack", "--lock", str(full), ok=False)
    assert proc.returncode == 2 and "a ModelPack artifact holds one model" in proc.stderr


# --- push --sign-key ------------------------------------------------------------------------------------------------


def _pull(registry: Registry, tag: str, target: Path, *args: str):
    return run_hfcache(["pull", f"{registry.host}/{tag}", "--cache-dir", str(target), "--plain-http", *args])


def _two_repo_lock(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A lock of two repos of examples/hfcache.lock and a cache warmed from it: (lock, cache, repo ids)."""
    import tomli_w
    import tomllib

    document = tomllib.loads((Path(__file__).parents[2] / "examples" / "hfcache.lock").read_text())
    document["repos"] = [r for r in document["repos"] if r["repo_id"] != "openai-community/gpt2"]
    assert len(document["repos"]) == 2
    lock = tmp_path / "hfcache.lock"
    lock.write_text(tomli_w.dumps(document))
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        warmed = run_hfcache(["warm", "--lock", str(lock), "--cache-dir", str(cache), "--endpoint", server.endpoint])
    assert warmed.returncode == 0, warmed.stderr
    return lock, cache, [f"{r['repo_id']}@{r['commit_hash']}" for r in document["repos"]]


def test_push_lock_sign_key_signs_every_snapshot_and_pull_verify_key_checks_each(registry, tmp_path):
    from hfcache.integrity.signatures import bundle_identity
    from tests.artifacts import write_key

    lock, cache, repos = _two_repo_lock(tmp_path)
    private, public = write_key(tmp_path, "signer")
    _, other = write_key(tmp_path, "other")
    canary = Canary(tmp_path)
    pushed = push(registry, "mp/locked-signed:v1", cache, "--lock", str(lock), "--sign-key", str(private))
    found = _bundles_of(registry, "mp/locked-signed:v1", pushed["digest"])
    # One bundle per snapshot (the lock's two repos; the legacy id bert-base-uncased is also cached under its
    # canonical folder, so three snapshots), each named by its snapshot.
    assert len(found) == len(pushed["repos"]) >= len(repos) == 2
    assert sorted(bundle_identity(b)[0] for b in found) == sorted(pushed["repos"])
    target = tmp_path / "target"
    proc = _pull(registry, "mp/locked-signed:v1", target, "--verify-key", str(other))
    assert proc.returncode == 1 and "refused the pull, nothing was written" in proc.stderr, proc.stderr
    assert not (target / "models--bert-base-uncased").exists()
    proc = _pull(registry, "mp/locked-signed:v1", target, "--verify-key", str(public))
    assert proc.returncode == 0, proc.stderr
    assert "signatures verified" in proc.stdout
    verify_ok(target)
    verify_ok(cache)
    canary.assert_unchanged()


def test_signed_re_pushes_replace_their_referrer_and_a_key_rotation_keeps_both_keys(cache, registry, tmp_path):
    from hfcache.oci.referrers import KEY_ANNOTATION, MODEL_ANNOTATION, fallback_tag
    from tests.artifacts import write_key

    key_a, pub_a = write_key(tmp_path, "a")
    key_b, pub_b = write_key(tmp_path, "b")
    canary = Canary(tmp_path)
    digests = {push(registry, "mp/repushed:v1", cache, BERT, "--sign-key", str(key_a))["digest"] for _ in range(5)}
    digests.add(push(registry, "mp/repushed:v1", cache, BERT, "--sign-key", str(key_b))["digest"])
    (digest,) = digests  # reproducible: one manifest, signed six times
    with urllib.request.urlopen(urllib.request.Request(  # loopback registry
            f"http://{registry.host}/v2/mp/repushed/manifests/{fallback_tag(digest)}",
            headers={"Accept": "application/vnd.oci.image.index.v1+json"}), timeout=30) as r:
        index = json.loads(r.read())
    labels = [(m["annotations"][MODEL_ANNOTATION], m["annotations"][KEY_ANNOTATION]) for m in index["manifests"]]
    assert len(labels) == 2 and len(set(labels)) == 2, labels  # one per (model, key)
    assert {model for model, _ in labels} == {f"{BERT}@{commit_of(cache, BERT)}"}
    for public in (pub_b, pub_a):
        target = tmp_path / f"target-{public.stem}"
        proc = _pull(registry, "mp/repushed:v1", target, "--verify-key", str(public))
        assert proc.returncode == 0, proc.stderr
        verify_ok(target)
    canary.assert_unchanged()


def test_push_with_an_encrypted_sign_key_reads_its_password_from_the_environment(cache, registry, tmp_path):
    from tests.artifacts import write_key
    from tests.helpers import clean_env

    secret = "correct horse battery"
    locked, public = write_key(tmp_path, "locked", password=secret.encode())
    canary = Canary(tmp_path)
    args = ["push", f"{registry.host}/mp/locked-key:v1", BERT, "--cache-dir", str(cache), "--plain-http",
            "--sign-key", str(locked)]
    proc = run_hfcache(args)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]  # (the progress display's blank line)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("hfcache: error: ") and "the key is encrypted" in lines[0], proc.stderr
    assert lines[1].startswith("hint: ") and "HFCACHE_SIGN_KEY_PASSWORD" in lines[1]
    assert "--password-stdin reads" not in proc.stderr
    with pytest.raises(urllib.error.HTTPError):  # refused before anything was sent
        urllib.request.urlopen(f"http://{registry.host}/v2/mp/locked-key/manifests/v1", timeout=10)
    proc = run_hfcache(args + ["--json"], env=clean_env(HFCACHE_SIGN_KEY_PASSWORD=secret))
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout + proc.stderr
    digest = json.loads(proc.stdout)["digest"]
    assert len(_bundles_of(registry, "mp/locked-key:v1", digest)) == 1
    stored = [p for p in registry.root.rglob("data") if p.is_file()]
    assert stored and not any(secret.encode() in p.read_bytes() for p in stored)
    target = tmp_path / "target"
    assert _pull(registry, "mp/locked-key:v1", target, "--verify-key", str(public)).returncode == 0
    canary.assert_unchanged()
