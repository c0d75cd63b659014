"""push/pull against a real OCI registry (Debian's docker-registry, the CNCF distribution registry) on 127.0.0.1.

Pushes a warmed fixture cache, checks the image is a valid OCI image (manifest, config with rootfs.diff_ids that
match the layers' uncompressed bytes) with a reproducible digest, pulls it into an empty cache that verifies and
loads offline, and checks that altered registry content, hostile layers and missing credentials change nothing.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import GOLDEN, clean_env, golden_ids, offline_load, run_hfcache, visible_entries
from tests.registry import Registry, available, push_image, running_registry, tar_bytes
from tests.testhub import HubServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(available() is not None and not os.environ.get("CI"),
                                                   reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
REPOS = sorted(GOLDEN["repos"])
USER, PASSWORD = "ci-bot", "s3cret-Registry-Pass"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The 9 fixture repos warmed from the test Hub server (tokenizer files)."""
    root = tmp_path_factory.mktemp("oci-src") / "cache"
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(r) for r in REPOS], cache_dir=root, endpoint=server.endpoint,
                              token=False)
    assert report.ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("auth-registry"), users={USER: PASSWORD}) as reg:
        yield reg


def hfcache_json(args: list[str], **kwargs) -> dict:
    proc = run_hfcache([*args, "--json"], **kwargs)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def get(registry: Registry, path: str, accept: str = "*/*") -> bytes:
    request = urllib.request.Request(f"http://{registry.host}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:  # loopback registry
        return response.read()


def test_pushed_image_is_a_valid_oci_image_with_a_reproducible_digest(cache, registry, tmp_path):
    first = hfcache_json(["push", f"{registry.host}/hf/cache:v1", "--cache-dir", str(cache), "--plain-http"])
    assert len(first["layers"]) == len(REPOS)  # one layer per repo folder
    assert first["bytes_uploaded"] == first["bytes_total"]

    raw = get(registry, "hf/cache/manifests/v1", "application/vnd.oci.image.manifest.v1+json")
    assert f"sha256:{hashlib.sha256(raw).hexdigest()}" == first["digest"]
    manifest = json.loads(raw)
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}
    config = json.loads(get(registry, f"hf/cache/blobs/{manifest['config']['digest']}"))
    assert config["os"] == "linux" and config["architecture"] and config["rootfs"]["type"] == "layers"
    names = set()
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        blob = get(registry, f"hf/cache/blobs/{layer['digest']}")
        assert blob[3] == 0 and blob[4:8] == b"\0\0\0\0", "gzip header: no file name, mtime 0"
        tar_bytes = gzip.decompress(blob)
        assert f"sha256:{hashlib.sha256(tar_bytes).hexdigest()}" == diff_id
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            members = tar.getmembers()
        assert {m.mtime for m in members} == {0} and {m.uid for m in members} == {0}
        names |= {m.name.split("/")[0] for m in members}
    # The image root is the cache: repo folders and CACHEDIR.TAG, nothing else.
    assert names == {"CACHEDIR.TAG"} | {p.name for p in cache.glob("models--*")}
    annotations = manifest["annotations"]
    assert annotations["org.opencontainers.image.title"]
    assert sorted(annotations["io.hfcache.repos"].split(",")) == sorted(first["repos"])
    assert str(cache) not in raw.decode() and str(tmp_path.parent) not in raw.decode()
    assert str(cache) not in json.dumps(config)

    # Every mtime changed (files, links, folders): the same bytes, the same digest; only the manifest is re-sent.
    for path in [cache, *cache.rglob("*")]:
        os.utime(path, (1_234_567, 7_654_321), follow_symlinks=False)
    second = hfcache_json(["push", f"{registry.host}/hf/cache:v2", "--cache-dir", str(cache), "--plain-http"])
    assert second["digest"] == first["digest"]
    assert [layer["transferred"] for layer in second["layers"]] == [0] * len(REPOS)

    single = hfcache_json(["push", f"{registry.host}/hf/one:v1", "--cache-dir", str(cache), "--plain-http",
                           "--layers", "single"])
    assert len(single["layers"]) == 1
    assert single["layers"][0]["size"] < sum(layer["size"] for layer in first["layers"])  # shared vocab once


def test_pull_into_an_empty_cache_verifies_and_loads_offline(cache, registry, tmp_path):
    pushed = hfcache_json(["push", f"{registry.host}/hf/pull:v1", "--cache-dir", str(cache), "--plain-http"])
    target = tmp_path / "target" / "hub"
    pulled = hfcache_json(["pull", f"{registry.host}/hf/pull:v1", "--cache-dir", str(target), "--plain-http"])
    assert pulled["digest"] == pushed["digest"]
    assert pulled["bytes_downloaded"] == sum(layer["size"] for layer in pushed["layers"])
    assert len(pulled["repos"]) == len(REPOS)
    verify = run_hfcache(["verify", "--cache-dir", str(target)])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    from huggingface_hub import scan_cache_dir

    assert not scan_cache_dir(target).warnings
    loaded = offline_load(target, REPOS)
    for repo_id in REPOS:
        assert loaded[repo_id].get("input_ids") == golden_ids(repo_id), loaded[repo_id]

    # By digest, into the same cache: nothing new. Offline mode (a pod's env) does not stop a registry pull.
    again = hfcache_json(["pull", f"{registry.host}/hf/pull@{pushed['digest']}", "--cache-dir", str(target),
                          "--plain-http"], env=clean_env(HF_HUB_OFFLINE="1"))
    assert again["blobs_new"] == 0 and again["blobs_existing"] > 0


def _tree(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else
                                       hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("tamper", ["flip-a-byte", "recompressed"])
def test_altered_layer_in_the_registry_is_refused_and_changes_nothing(cache, registry, tmp_path, tamper):
    tag = f"{registry.host}/hf/tamper-{tamper}:v1"
    pushed = hfcache_json(["push", tag, "openai-community/gpt2", "--cache-dir", str(cache), "--plain-http"])
    victim = pushed["layers"][-1]["digest"]
    blob = registry.blob_path(victim)
    original = blob.read_bytes()  # content-addressed storage: restored afterwards for the other tests
    try:
        _tampered_pull_changes_nothing(registry, tag, victim, blob, original, tamper, tmp_path)
    finally:
        blob.write_bytes(original)


def _tampered_pull_changes_nothing(registry, tag, victim, blob, data, tamper, tmp_path) -> None:
    if tamper == "flip-a-byte":
        data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
    else:  # a valid gzip of the very same tar, other bytes: only the compressed digest can tell
        data = gzip.compress(gzip.decompress(data), compresslevel=1)
    blob.write_bytes(data)

    empty = tmp_path / "empty"
    proc = run_hfcache(["pull", tag, "--cache-dir", str(empty), "--plain-http"])
    assert proc.returncode == 3, proc.stderr
    assert victim in proc.stderr and "Traceback" not in proc.stderr
    assert not empty.exists() or (not visible_entries(empty) and not list(empty.glob("models--*")))

    existing = tmp_path / "existing"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("bert-base-uncased")], cache_dir=existing, endpoint=server.endpoint,
                            token=False).ok
    before = _tree(existing)
    proc = run_hfcache(["pull", tag, "--cache-dir", str(existing), "--plain-http", "--json"])
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["exit_code"] == 3 and victim in json.loads(proc.stdout)["error"]
    assert _tree(existing) == before


def _push_raw(registry: Registry, name: str, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> str:
    """Push an image whose one layer holds ``members`` (digests all correct) with raw HTTP calls."""
    return push_image(registry.host, name, "v1", [tar_bytes(members)])


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, linkname
    return info


def _sparse(name: str) -> tarfile.TarInfo:
    """10 bytes of data declaring 1 GiB (GNU sparse 0.1 in PAX headers): must be refused before it is expanded."""
    info = _info(name, size=10)
    info.pax_headers = {"GNU.sparse.map": "0,10", "GNU.sparse.size": str(1 << 30), "GNU.sparse.major": "0",
                        "GNU.sparse.minor": "1"}
    return info


@pytest.mark.parametrize("members, refused", [
    ([(_sparse("models--a--b/blobs/" + "0" * 40), b"x" * 10)], "a sparse file"),
    ([(_info("../escape", size=3), b"bad")], "escaping path"),
    ([(_info("models--a--b/snapshots/" + "a" * 40 + "/x", tarfile.SYMTYPE, linkname="/etc/passwd"), None)],
     "leaves the repo"),
    ([(_info("models--a--b/blobs/" + "b" * 64, size=3), b"bad")], "does not match"),
    ([(_info("etc/cron.d/x", size=3), b"bad")], "not part of a Hugging Face cache"),
])
def test_a_hostile_image_with_valid_digests_gets_the_import_refusals(registry, tmp_path, members, refused):
    ref = _push_raw(registry, f"hf/hostile-{abs(hash(refused))}", members)
    target = tmp_path / "target"
    proc = run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http"])
    assert proc.returncode in (2, 3), proc.stderr
    assert refused in proc.stderr
    assert not target.exists() or not any(target.glob("models--*"))
    assert not (tmp_path / "escape").exists()


def test_auth_refuses_without_credentials_and_works_with_password_stdin(cache, auth_registry, tmp_path):
    ref = f"{auth_registry.host}/hf/private:v1"
    args = ["push", ref, "openai-community/gpt2", "--cache-dir", str(cache), "--plain-http"]
    anonymous = run_hfcache(args)
    assert anonymous.returncode == 3
    assert "requires authentication" in anonymous.stderr and "--password-stdin" in anonymous.stderr

    wrong = run_hfcache([*args, "--username", USER, "--password-stdin"], input_text="not-the-password\n")
    assert wrong.returncode == 3 and "refused the credentials" in wrong.stderr

    pushed = run_hfcache([*args, "--username", USER, "--password-stdin", "--json"], input_text=PASSWORD + "\n")
    assert pushed.returncode == 0, pushed.stderr
    assert PASSWORD not in pushed.stdout + pushed.stderr

    target = tmp_path / "pulled"
    denied = run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http"])
    assert denied.returncode == 3 and not any(target.glob("models--*"))

    # The ecosystem's auth file (containers-auth.json(5), as written by `podman login`).
    auth_file = tmp_path / "auth.json"
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auth_file.write_text(json.dumps({"auths": {auth_registry.host: {"auth": token}}}), encoding="utf-8")
    pulled = run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--json"],
                         env=clean_env(REGISTRY_AUTH_FILE=str(auth_file)))
    assert pulled.returncode == 0, pulled.stderr
    assert PASSWORD not in pulled.stdout + pulled.stderr
    written = [p for p in target.rglob("*") if p.is_file() and not p.is_symlink()]
    assert written and not any(PASSWORD.encode() in p.read_bytes() or token.encode() in p.read_bytes()
                               for p in written)
    loaded = offline_load(target, ["openai-community/gpt2"])["openai-community/gpt2"]
    assert loaded.get("input_ids") == golden_ids("openai-community/gpt2")


def test_registry_errors_are_one_line_with_exit_code_3(cache, registry, tmp_path):
    https = run_hfcache(["push", f"{registry.host}/hf/x:v1", "openai-community/gpt2", "--cache-dir", str(cache), "--timeout", "10"])
    assert https.returncode == 3 and "--plain-http" in https.stderr and "Traceback" not in https.stderr
    missing = run_hfcache(["pull", f"{registry.host}/hf/nothing:v1", "--cache-dir", str(tmp_path / "c"),
                           "--plain-http"])
    assert missing.returncode == 3 and "not found" in missing.stderr
    bad = run_hfcache(["push", "not a ref", "--cache-dir", str(cache)])
    assert bad.returncode == 2
    by_digest = run_hfcache(["push", f"{registry.host}/hf/x@sha256:{'0' * 64}", "--cache-dir", str(cache),
                             "--plain-http"])
    assert by_digest.returncode == 2 and "tag" in by_digest.stderr
    no_stdin_user = run_hfcache(["pull", f"{registry.host}/hf/x:v1", "--username", "u", "--plain-http"])
    assert no_stdin_user.returncode == 2


def test_push_of_a_lock_records_its_hash_and_a_corrupt_cache_is_never_pushed(registry, tmp_path):
    lock = Path(__file__).parents[2] / "examples" / "hfcache.lock"
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        warmed = run_hfcache(["warm", "--lock", str(lock), "--cache-dir", str(cache), "--endpoint", server.endpoint])
    assert warmed.returncode == 0, warmed.stderr
    pushed = hfcache_json(["push", f"{registry.host}/hf/locked:v1", "--lock", str(lock), "--cache-dir", str(cache),
                           "--plain-http"])
    raw = get(registry, "hf/locked/manifests/v1", "application/vnd.oci.image.manifest.v1+json")
    annotations = json.loads(raw)["annotations"]
    assert annotations["io.hfcache.lock.sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert str(lock.parent) not in raw.decode() and str(cache) not in raw.decode()
    assert "openai-community/gpt2@" in annotations["io.hfcache.repos"] and len(pushed["layers"]) >= 3

    blob = next(p for p in (cache / "models--openai-community--gpt2" / "blobs").iterdir())
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")  # same size, other content
    corrupt = run_hfcache(["push", f"{registry.host}/hf/corrupt:v1", "--lock", str(lock), "--cache-dir", str(cache),
                           "--plain-http"])
    # A corrupt source cache is a cache problem (exit 5), like a broken snapshot link.
    assert corrupt.returncode == 5 and "corrupt" in corrupt.stderr and "Traceback" not in corrupt.stderr
    lines = corrupt.stderr.splitlines()
    assert lines[-1].startswith("hint: ") and lines[-2].startswith("hfcache: error: ")
    with pytest.raises(urllib.error.HTTPError):
        get(registry, "hf/corrupt/manifests/v1", "application/vnd.oci.image.manifest.v1+json")


def test_push_of_a_lock_without_cache_dir_uses_the_manifests_cache(registry, tmp_path):
    # Every --lock command picks its cache the same way (README "Which cache a --lock command uses"): push too.
    examples = Path(__file__).parents[2] / "examples"
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(examples / "hfcache.lock", project / "hfcache.lock")
    (project / "hfcache.toml").write_text('cache_dir = "cache"\n' + (examples / "hfcache.toml").read_text())
    env = clean_env(HF_HUB_CACHE=str(tmp_path / "not-this-one"))
    with HubServer(HUB) as server:
        warmed = run_hfcache(["warm", "--lock", "hfcache.lock", "--endpoint", server.endpoint], cwd=project, env=env)
    assert warmed.returncode == 0, warmed.stderr
    assert (project / "cache" / "models--openai-community--gpt2").is_dir()
    assert not (tmp_path / "not-this-one").exists()
    pushed = hfcache_json(["push", f"{registry.host}/hf/project:v1", "--lock", "hfcache.lock", "--plain-http"],
                          cwd=project, env=env)
    raw = get(registry, "hf/project/manifests/v1", "application/vnd.oci.image.manifest.v1+json")
    assert "openai-community/gpt2@" in json.loads(raw)["annotations"]["io.hfcache.repos"]
    assert len(pushed["layers"]) >= 3
