"""``pull --verify-key`` against images crafted to publish what the signature does not cover:
tar entries named ``./models--...`` (the importer drops the ``./``; the signature check used to skip such names, so
a replaced ``config.json`` was published as "signatures verified"), and an image that brings no snapshot file at
all (nothing checked is not "verified"). Each is refused with exit 1, nothing is published, and a canary outside
the target is unchanged.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import attach_signature, key_pair, signed_files
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.registry import available, push_tar, running_registry
from tests.testhub import HubServer

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "openai-community/gpt2"
GPT2 = "models--openai-community--gpt2"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EVIL = b'{"architectures": ["EVIL-VIA-DOTSLASH"]}'


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bypass-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("bypass-registry")) as reg:
        yield reg



def _members(cache: Path, name_prefix: str, *, replace: dict[str, bytes] | None = None,
             only: tuple[str, ...] | None = None) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The cache's gpt2 folder as tar members named ``name_prefix + path``; ``replace`` turns a snapshot link into a
    real file with other bytes; ``only`` keeps the entries under those folders of the repo."""
    members = []
    for path in sorted((cache / GPT2).rglob("*")):
        rel = str(path.relative_to(cache))
        inner = rel.split("/", 2)[1] if "/" in rel else ""
        if only is not None and inner not in only:
            continue
        info = tarfile.TarInfo(name_prefix + rel)
        name = rel.rsplit("/", 1)[-1]
        if replace and "/snapshots/" in rel and name in replace:
            data = replace[name]
            info.size = len(data)
            members.append((info, data))
        elif path.is_symlink():
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            members.append((info, None))
        elif path.is_dir():
            info.type = tarfile.DIRTYPE
            members.append((info, None))
        else:
            data = path.read_bytes()
            info.size = len(data)
            members.append((info, data))
    return members



def _pull(ref: str, target: Path, public: Path) -> subprocess.CompletedProcess:
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--verify-key", str(public)],
                       env=clean_env())


def _refused(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and needle in proc.stderr, proc.stderr
    assert "signatures verified" not in proc.stdout


def test_dot_slash_names_are_checked_as_the_importer_publishes_them(seed, registry, tmp_path):
    private, public = key_pair(tmp_path / "keys", "team")
    canary = Canary(tmp_path)
    # control: the same image with plain names and the signed bytes pulls and verifies
    good = push_tar(registry.host, "bypass/good", _members(seed, ""))
    attach_signature(good, signed_files(seed), private)
    proc = _pull(good, tmp_path / "ok", public)
    assert proc.returncode == 0 and "signatures verified" in proc.stdout, proc.stdout + proc.stderr
    # ./ names with config.json replaced by other bytes: the signature covers the real config.json
    ref = push_tar(registry.host, "bypass/dotslash", _members(seed, "./", replace={"config.json": EVIL}))
    attach_signature(ref, signed_files(seed), private)
    target = tmp_path / "target"
    _refused(_pull(ref, target, public), "changed: config.json")
    assert not target.exists()
    canary.assert_unchanged()


def test_an_image_without_snapshot_files_is_not_verified(seed, registry, tmp_path):
    private, public = key_pair(tmp_path / "keys", "team")
    ref = push_tar(registry.host, "bypass/nosnap", _members(seed, "", only=("blobs", "refs")))
    attach_signature(ref, signed_files(seed), private)
    target = tmp_path / "target"
    _refused(_pull(ref, target, public), "brings no snapshot files")
    assert not target.exists()


def test_a_modelpack_etag_naming_another_held_blob_is_refused(seed, registry, tmp_path):
    """A layer whose bytes are the signed config.json but whose ``io.hfcache.etag`` names another git-sha1 blob the
    target already holds: the held blob was re-hashed against its name only, the layer skipped, and the snapshot's
    config.json linked to the other bytes while the signature check saw the layer's digest."""
    import shutil

    from tests.artifacts import GPT2 as FOLDER
    from tests.artifacts import layer, push_artifact, snapshot_files

    private, public = key_pair(tmp_path / "keys", "team")
    commit, files = snapshot_files(seed)
    git_named = [(p, d, e) for p, d, e in files if len(e) == 40]
    (cfg_path, cfg_data, _), (other_path, other_data, other_etag) = git_named[0], git_named[1]
    layers = [layer(registry.host, "bypass/etag", f"{FOLDER}/snapshots/{'1' * 40}/{path}", data,
                    other_etag if path == cfg_path else etag) for path, data, etag in files if path != other_path]
    for entry in layers:  # the descriptor's size is the held blob's: the layer is never fetched, only compared
        if entry["annotations"].get("io.hfcache.etag") == other_etag:
            entry["size"] = len(other_data)
    ref = push_artifact(registry.host, "bypass/etag", "v1", layers, commit="1" * 40)
    attach_signature(ref, signed_files(seed), private)
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)  # the target holds every blob of gpt2 already
    before = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    canary = Canary(tmp_path)
    proc = _pull(ref, target, public)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"names {FOLDER}/blobs/{other_etag} as its blob, which holds other bytes" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == before
    canary.assert_unchanged()
    assert cfg_data != other_data and other_path != cfg_path


def test_two_modelpack_layers_naming_one_blob_with_other_digests_are_refused(seed, registry, tmp_path):
    """Only the first layer of an etag is fetched: a later layer naming the same blob with its own (signed) digest
    was linked to the first one's bytes, unread ("signatures verified" over a config.json holding another file)."""
    from tests.artifacts import GPT2 as FOLDER
    from tests.artifacts import layer, push_artifact, snapshot_files

    private, public = key_pair(tmp_path / "keys", "team")
    commit, files = snapshot_files(seed)
    git_named = [(p, d, e) for p, d, e in files if len(e) == 40]
    first_path, _, first_etag = git_named[0]
    victim = git_named[1][0]
    layers = [layer(registry.host, "bypass/same-etag", f"{FOLDER}/snapshots/{'2' * 40}/{path}", data,
                    first_etag if path == victim else etag) for path, data, etag in files]
    ref = push_artifact(registry.host, "bypass/same-etag", "v1", layers, commit="2" * 40)
    attach_signature(ref, signed_files(seed), private)
    target, canary = tmp_path / "target", Canary(tmp_path)
    proc = _pull(ref, target, public)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"name the same blob {first_etag[:12]} with other digests or sizes" in proc.stderr, proc.stderr
    assert "signatures verified" not in proc.stdout and not target.exists()
    canary.assert_unchanged()


def test_a_bundle_signed_for_another_model_is_refused(seed, registry, tmp_path):
    """The bundle's model name must name the pulled repo or commit: a bundle signed for another model with the
    same files verified any repo at any commit."""
    from hfcache.integrity.signatures import sign_files
    from tests.artifacts import artifact_of

    private, public = key_pair(tmp_path / "keys", "team")
    ref = artifact_of(seed, registry.host, "bypass/other-model", "v1")
    good = artifact_of(seed, registry.host, "bypass/this-model", "v1")
    import hashlib as _h
    import urllib.request

    from hfcache.oci.referrers import attach
    from hfcache.oci.registry import connect, parse_reference

    for reference, name in ((ref, "evil/other@" + "3" * 40), (good, REPO)):
        container = parse_reference(reference)
        request = urllib.request.Request(f"http://{container.registry}/v2/{container.api_prefix}/manifests/"
                                         f"{container.tag}", headers={"Accept": MANIFEST})
        with urllib.request.urlopen(request, timeout=30) as answer:  # loopback registry
            body = answer.read()
        subject = {"mediaType": MANIFEST, "digest": f"sha256:{_h.sha256(body).hexdigest()}", "size": len(body)}
        attach(connect(container, True, None, 30), container, subject, sign_files(signed_files(seed), name, private))
    target = tmp_path / "target"
    proc = _pull(ref, target, public)
    assert proc.returncode == 1 and "the bundle signs evil/other@" in proc.stderr, proc.stdout + proc.stderr
    assert not target.exists()
    proc = _pull(good, tmp_path / "good", public)
    assert proc.returncode == 0 and "signatures verified" in proc.stdout, proc.stdout + proc.stderr
