"""hfcache.oci.image without a registry: layer split, reproducible layers, image documents, references, credentials."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from hfcache.errors import UsageError
from hfcache.move.export import plan_export
from hfcache.oci.image import (
    CONFIG_TYPE,
    LAYER_GZIP,
    MANIFEST_TYPE,
    Credentials,
    Layer,
    image_documents,
    parse_reference,
    split_plan,
    write_layer,
)

SHARED = b"[PAD]\n[UNK]\nhello\n"
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def make_cache(root: Path) -> Path:
    """Two repos sharing one blob (named by its sha256), each with a ref and a snapshot link."""
    etag = hashlib.sha256(SHARED).hexdigest()
    for folder, commit, extra in (("models--org--a", COMMIT_A, b"a-only"), ("models--org--b", COMMIT_B, b"b-only")):
        repo = root / folder
        (repo / "blobs").mkdir(parents=True)
        (repo / "blobs" / etag).write_bytes(SHARED)
        extra_etag = hashlib.sha256(extra).hexdigest()
        (repo / "blobs" / extra_etag).write_bytes(extra)
        (repo / "snapshots" / commit / "sub").mkdir(parents=True)
        (repo / "snapshots" / commit / "vocab.txt").symlink_to(f"../../blobs/{etag}")
        (repo / "snapshots" / commit / "sub" / "extra.bin").symlink_to(f"../../../blobs/{extra_etag}")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
    return root


def members(layer_bytes: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer_bytes))) as tar:
        return tar.getmembers()


def test_repo_split_gives_self_contained_layers(tmp_path):
    plan = plan_export(make_cache(tmp_path / "cache"))
    assert any(e.kind == "hardlink" for e in plan.entries)  # the shared blob, once, in the single plan
    layers = split_plan(plan, "repo")
    assert [layer.repos for layer in layers] == [("models--org--a",), ("models--org--b",)]
    for layer in layers:
        names = [e.name for e in layer.entries]
        assert names[0] == "CACHEDIR.TAG" and all(n == "CACHEDIR.TAG" or n.startswith(layer.repos[0]) for n in names)
        for e in layer.entries:
            if e.kind == "hardlink":
                assert e.target in names[:names.index(e.name)]
    # Each layer extracts alone: the shared blob is a file in both.
    out = io.BytesIO()
    write_layer(layers[1], out)
    shared = [m for m in members(out.getvalue()) if m.name.endswith(hashlib.sha256(SHARED).hexdigest())]
    assert len(shared) == 1 and shared[0].isfile()
    assert split_plan(plan, "single") == [plan]
    with pytest.raises(UsageError):
        split_plan(plan, "per-file")


def test_layers_are_byte_identical_whatever_the_mtimes(tmp_path):
    cache = make_cache(tmp_path / "cache")
    first, second = io.BytesIO(), io.BytesIO()
    digest, size, diff_id = write_layer(plan_export(cache), first)
    for path in [cache, *cache.rglob("*")]:
        os.utime(path, (1_000, 2_000_000), follow_symlinks=False)
    assert write_layer(plan_export(cache), second) == (digest, size, diff_id)
    data = first.getvalue()
    assert data == second.getvalue() and digest == f"sha256:{hashlib.sha256(data).hexdigest()}" and size == len(data)
    assert data[3] & 0x08 == 0 and data[4:8] == b"\0\0\0\0"  # gzip: no FNAME flag, MTIME 0
    assert diff_id == f"sha256:{hashlib.sha256(gzip.decompress(data)).hexdigest()}"
    assert {m.mtime for m in members(data)} == {0}


def test_image_documents_are_canonical_and_complete(tmp_path):
    plan = plan_export(make_cache(tmp_path / "cache"))
    layers = [(Layer(f"sha256:{'1' * 64}", 10, f"sha256:{'2' * 64}", ("models--org--a",), 0), plan)]
    config_bytes, manifest_bytes = image_documents(layers, {"io.hfcache.repos": "x"}, "arm64")
    config, manifest = json.loads(config_bytes), json.loads(manifest_bytes)
    assert config == {"architecture": "arm64", "os": "linux", "config": {"Labels": {"io.hfcache.repos": "x"}},
                      "rootfs": {"type": "layers", "diff_ids": [f"sha256:{'2' * 64}"]}}
    assert manifest["mediaType"] == MANIFEST_TYPE and manifest["config"]["mediaType"] == CONFIG_TYPE
    assert manifest["config"]["digest"] == f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    assert manifest["layers"][0]["mediaType"] == LAYER_GZIP
    assert manifest["layers"][0]["annotations"]["io.hfcache.commits"] == f"org/a@{COMMIT_A},org/b@{COMMIT_B}"
    assert manifest_bytes == json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    assert str(tmp_path) not in manifest_bytes.decode() + config_bytes.decode()


@pytest.mark.parametrize("reference", ["", "http://registry/x:v1", "a b:v1", "registry.io/x@sha256:abc",
                                       "registry.io/x@md5:" + "0" * 32, "registry.io/HF/cache:v1",
                                       "registry.io/hf/cache:-v1", "registry.io/hf/cache:" + "v" * 129,
                                       "registry.io:99999/hf/cache:v1", "registry.io/hf//cache:v1",
                                       "registry.io/hf/cache-:v1", "registry.io/" + "a" * 250 + ":v1"])
def test_bad_references_are_usage_errors_with_a_hint(reference):
    """The distribution spec's grammar (an uppercase name would be a registry 404, exit 3, without this)."""
    with pytest.raises(UsageError) as raised:
        parse_reference(reference)
    assert raised.value.hint


def test_timeouts_must_be_finite_and_positive():
    from hfcache.units import parse_timeout

    assert parse_timeout("2.5") == 2.5 and parse_timeout(10.0) == 10.0
    for bad in ("nan", "inf", "-1", "0", "soon", ""):
        with pytest.raises(UsageError):
            parse_timeout(bad)


def test_references_parse_like_docker():
    ref = parse_reference("127.0.0.1:5000/hf/cache:v1")
    assert (ref.registry, ref.api_prefix, ref.tag, ref.digest) == ("127.0.0.1:5000", "hf/cache", "v1", None)
    ref = parse_reference("localhost/hf/cache__x.y-z:V_1.0")  # `localhost` is a registry, as for docker
    assert (ref.registry, ref.api_prefix, ref.tag) == ("localhost", "hf/cache__x.y-z", "V_1.0")
    digest = "sha256:" + "0" * 64
    assert parse_reference(f"registry.io/hf/cache@{digest}").digest == digest


def test_credentials_never_show_the_password():
    creds = Credentials("bot", "hunter2-secret")
    assert "hunter2" not in repr(creds) and "hunter2" not in str(creds)


def test_push_option_errors_are_usage_errors_before_any_network(tmp_path):
    from click.testing import CliRunner

    from hfcache.cli.main import cli

    cache = make_cache(tmp_path / "cache")
    runner = CliRunner()
    for args, needle in ((["--arch", "AMD 64"], "--arch"), (["--username", "u"], "--password-stdin"),
                         (["--password-stdin"], "--username"), (["--layers", "file"], "--layers")):
        result = runner.invoke(cli, ["push", "127.0.0.1:9/x/y:v1", "--cache-dir", str(cache), *args], input="pw\n")
        # Click's own errors exit 2; hfcache's UsageError (exit code 2 in main()) propagates out of the group.
        refused = result.exit_code == 2 or (isinstance(result.exception, UsageError)
                                            and result.exception.exit_code == 2)
        assert refused and needle in (result.output + str(result.exception)), (args, result.output)
