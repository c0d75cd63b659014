"""``hfcache pull`` skips what the cache holds (docs/oci.md "Pull: what is checked"): a tar layer whose diff_id an
earlier pull recorded, while every entry it held is unchanged by stat, is not downloaded; a record another user wrote
(or anyone could rewrite) is ignored; a changed entry makes the layer fetched again; a tampered blob is re-hashed and
refused. And the ``--prefix`` image format (``io.hfcache.prefix``), stripped on pull.

What is downloaded is read from the registry's own access log (Debian's ``docker-registry``, started here with it
enabled): a skipped layer has no ``GET /v2/<name>/blobs/<digest>``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import GOLDEN, clean_env, golden_ids, offline_load, run_hfcache
from tests.registry import available, logged_registry, put_blob, put_manifest, tar_bytes
from tests.testhub import HubServer
from tests.users import ALICE

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
REPOS = sorted(GOLDEN["repos"])[:2]
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
RECORD = (".locks", "hfcache-pulled.json")



@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("skip-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(r) for r in REPOS], cache_dir=root, endpoint=server.endpoint,
                            token=False).ok
    return root


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    with logged_registry(tmp_path_factory.mktemp("skip-registry")) as pair:
        yield pair


def run(args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return run_hfcache(args, env=clean_env(**extra))


def push(cache: Path, ref: str) -> dict:
    proc = run(["push", ref, "--cache-dir", str(cache), "--plain-http", "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def pull(ref: str, target: Path, *args: str) -> subprocess.CompletedProcess:
    return run(["pull", ref, "--cache-dir", str(target), "--plain-http", *args])


def layer_gets(log: Path, name: str, digests: list[str]) -> dict[str, int]:
    """How many ``GET /v2/<name>/blobs/<digest>`` the registry logged, per digest."""
    text = log.read_text(errors="replace")
    return {d: text.count(f"\"GET /v2/{name}/blobs/{d} ") for d in digests}


def verified(cache: Path) -> None:
    proc = run(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def folder_of(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def test_a_second_pull_downloads_no_layer_and_a_changed_layer_is_the_only_one_fetched(seed, logged, tmp_path):
    registry, log = logged
    pushed = push(seed, f"{registry.host}/skip/img:v1")
    digests = [layer["digest"] for layer in pushed["layers"]]
    target, canary = tmp_path / "target", Canary(tmp_path)
    first = pull(f"{registry.host}/skip/img:v1", target)
    assert first.returncode == 0, first.stderr
    assert layer_gets(log, "skip/img", digests) == {d: 1 for d in digests}

    proc = pull(f"{registry.host}/skip/img:v1", target, "--json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert layer_gets(log, "skip/img", digests) == {d: 1 for d in digests}  # no layer body downloaded again
    assert again["skipped_layers"] == digests and again["bytes_downloaded"] == 0
    assert again["blobs_new"] == 0 and again["blobs_existing"] > 0 and sorted(again["repos"]) == \
        sorted(folder_of(r) for r in REPOS)

    # One repo changes (a second ref to its commit): only its layer is fetched; the other is still held.
    changed = tmp_path / "changed"
    shutil.copytree(seed, changed, symlinks=True)
    folder = folder_of(REPOS[1])
    (changed / folder / "refs" / "v2").write_text((changed / folder / "refs" / "main").read_text())
    second = push(changed, f"{registry.host}/skip/img:v2")
    new = [layer["digest"] for layer in second["layers"]]
    assert len(set(new) - set(digests)) == 1
    proc = pull(f"{registry.host}/skip/img:v2", target, "--json")
    assert proc.returncode == 0, proc.stderr
    gets = layer_gets(log, "skip/img", new)
    assert {d: gets[d] for d in new if d not in digests} == {d: 1 for d in new if d not in digests}
    assert {d: gets[d] for d in new if d in digests} == {d: 1 for d in new if d in digests}  # not fetched again
    assert (target / folder / "refs" / "v2").read_text() == (seed / folder / "refs" / "main").read_text()
    verified(target)
    loaded = offline_load(target, REPOS)
    assert all(loaded[r]["input_ids"] == golden_ids(r) for r in REPOS)
    canary.assert_unchanged()


def test_a_second_pull_of_a_modelpack_artifact_downloads_no_layer(seed, logged, tmp_path):
    registry, log = logged
    ref = f"{registry.host}/skip/mp:v1"
    proc = run(["push", ref, REPOS[0], "--cache-dir", str(seed), "--plain-http", "--format", "modelpack", "--json"])
    assert proc.returncode == 0, proc.stderr
    digests = sorted({layer["digest"] for layer in json.loads(proc.stdout)["layers"]})
    target = tmp_path / "target"
    assert pull(ref, target).returncode == 0
    assert layer_gets(log, "skip/mp", digests) == {d: 1 for d in digests}
    proc = pull(ref, target, "--json")
    assert proc.returncode == 0, proc.stderr
    assert layer_gets(log, "skip/mp", digests) == {d: 1 for d in digests}  # every file and the ref: held
    assert sorted(set(json.loads(proc.stdout)["skipped_layers"])) == digests
    verified(target)


def _record(target: Path) -> Path:
    return target.joinpath(*RECORD)


def test_a_record_another_user_wrote_or_anyone_can_rewrite_is_ignored(seed, logged, tmp_path):
    registry, log = logged
    pushed = push(seed, f"{registry.host}/skip/trust:v1")
    digests = [layer["digest"] for layer in pushed["layers"]]
    target = tmp_path / "target"
    assert pull(f"{registry.host}/skip/trust:v1", target).returncode == 0
    record = _record(target)
    assert record.stat().st_uid == os.geteuid() and record.stat().st_mode & 0o022 == 0
    for n, tamper in enumerate([lambda p: os.chmod(p, 0o664), lambda p: os.chown(p, ALICE.uid, ALICE.gid)], 2):
        tamper(record)
        proc = pull(f"{registry.host}/skip/trust:v1", target, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["skipped_layers"] == []
        assert layer_gets(log, "skip/trust", digests) == {d: n for d in digests}
        assert record.stat().st_uid == os.geteuid() and record.stat().st_mode & 0o022 == 0  # this run's replaced it
    verified(target)


def test_a_changed_entry_is_fetched_again_and_a_tampered_blob_is_refused(seed, logged, tmp_path):
    registry, log = logged
    pushed = push(seed, f"{registry.host}/skip/change:v1")
    digests = [layer["digest"] for layer in pushed["layers"]]
    target = tmp_path / "target"
    assert pull(f"{registry.host}/skip/change:v1", target).returncode == 0
    folder = folder_of(REPOS[0])
    commit = (target / folder / "refs" / "main").read_text()
    victim = next(p for p in sorted((target / folder / "snapshots" / commit).iterdir()) if p.is_symlink())
    blob = (victim.parent / os.readlink(victim)).resolve()
    victim.unlink()  # the snapshot lost a file: its layer is no longer held
    proc = pull(f"{registry.host}/skip/change:v1", target, "--json")
    assert proc.returncode == 0, proc.stderr
    skipped = json.loads(proc.stdout)["skipped_layers"]
    assert len(skipped) == len(digests) - 1 and victim.is_symlink()
    verified(target)

    data = blob.read_bytes()  # other bytes of the same size under the blob's name (a member could write them)
    blob.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file() and not p.is_symlink()}
    canary = Canary(tmp_path)
    proc = pull(f"{registry.host}/skip/change:v1", target)
    assert proc.returncode == 1, proc.stderr
    assert "does not hold the content its name says" in proc.stderr.splitlines()[-2] and "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file() and not p.is_symlink()} == before
    canary.assert_unchanged()


def _push_prefixed(host: str, name: str, tag: str, tar: bytes, prefix: str) -> str:
    blob = gzip.compress(tar, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]}})
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": put_blob(host, name, config.encode()), "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": put_blob(host, name, blob), "size": len(blob)}],
                "annotations": {"io.hfcache.prefix": prefix}}
    put_manifest(host, name, tag, json.dumps(manifest).encode(), MANIFEST)
    return f"{host}/{name}:{tag}"


def _prefixed_tar(cache: Path, prefix: str, extra: list | None = None) -> bytes:
    members = [(tarfile.TarInfo(prefix), None)]
    members[0][0].type = tarfile.DIRTYPE
    for path in sorted(cache.rglob("*")):
        rel = path.relative_to(cache)
        if rel.parts[0] == ".locks":
            continue
        info = tarfile.TarInfo(f"{prefix}/{rel}")
        if path.is_symlink():
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            members.append((info, None))
        elif path.is_dir():
            info.type = tarfile.DIRTYPE
            members.append((info, None))
        else:
            data = path.read_bytes()
            info.size = len(data)
            members.append((info, data))
    return tar_bytes(members + (extra or []))


def test_an_image_under_a_prefix_is_stripped_and_an_entry_outside_it_refused(seed, logged, tmp_path):
    registry, _ = logged
    ref = _push_prefixed(registry.host, "skip/prefix", "v1", _prefixed_tar(seed, "models"), "models")
    target, canary = tmp_path / "target", Canary(tmp_path)
    proc = pull(ref, target)
    assert proc.returncode == 0, proc.stderr
    assert not (target / "models").exists() and (target / folder_of(REPOS[0]) / "refs" / "main").is_file()
    verified(target)
    assert offline_load(target, REPOS[:1])[REPOS[0]]["input_ids"] == golden_ids(REPOS[0])

    outside = tarfile.TarInfo(f"{folder_of(REPOS[0])}/refs/evil")
    outside.size = 40
    bad = _push_prefixed(registry.host, "skip/prefix", "v2", _prefixed_tar(seed, "models", [(outside, b"0" * 40)]),
                         "models")
    other = tmp_path / "other"
    proc = pull(bad, other)
    assert proc.returncode == 2 and "outside the image's prefix 'models'" in proc.stderr.splitlines()[-2], proc.stderr
    assert not other.exists()
    weird = _push_prefixed(registry.host, "skip/prefix", "v3", _prefixed_tar(seed, "models"), "../x")
    proc = pull(weird, other)
    assert proc.returncode == 2 and "is not a relative folder" in proc.stderr.splitlines()[-2], proc.stderr
    canary.assert_unchanged()


# --- a member of a shared cache races root's pulls: the skip checks and the record never act through a link --------


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("swapped", [("locks",), ("blobs", "snapshot")])
def test_a_members_swaps_during_pulls_never_make_root_act_outside_the_cache(seed, logged, runtime, tmp_path,
                                                                           swapped):
    from tests.shared_cache import member_swaps, shared_cache, stop_member

    registry, _ = logged
    ref = f"{registry.host}/skip/race:v1"
    push(seed, ref)
    cache = shared_cache(runtime, f"race-cache-{'-'.join(swapped)}")
    assert pull(ref, cache).returncode == 0  # root's first pull: the record of its layers in .locks
    folder = folder_of(REPOS[0])
    commit = (cache / folder / "refs" / "main").read_text()
    canary = Canary(tmp_path)
    canary.watch(cache.parent)
    stop = runtime.base / f"race-stop-{'-'.join(swapped)}"
    paths = {"locks": [str(cache / ".locks"), str(canary.dir)],
             "blobs": [str(cache / folder / "blobs"), str(canary.sub)],
             "snapshot": [str(cache / folder / "snapshots" / commit), str(canary.dir)]}
    member = member_swaps(runtime, {"stop": str(stop), "rounds": 100000, "hold": 0.002, "plant": [],
                                    "exchange": [paths[name] for name in swapped]})
    try:
        for _ in range(15):
            proc = pull(ref, cache)
            assert proc.returncode != 70 and "Traceback" not in proc.stderr, proc.stderr
            assert proc.returncode in (0, 1, 5), proc.stderr
            if proc.returncode:
                assert any(line.startswith("hfcache: error: ") for line in proc.stderr.splitlines()), proc.stderr
    finally:
        hits = stop_member(member, stop)
    assert hits > 0
    canary.assert_unchanged()
    record = _record(cache)
    assert not record.exists() or (record.stat().st_uid == 0 and record.stat().st_mode & 0o022 == 0)
    assert pull(ref, cache).returncode == 0  # once the member stops, the cache is whole and pulls again
    verified(cache)
