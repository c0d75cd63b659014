"""``pull --verify-key`` never publishes a file no signature covers, whatever its name (docs/security.md): model_signing
leaves ``.git/``, ``.github/``, ``.gitattributes`` and ``.gitignore`` out of a bundle by default, and hfcache used to
drop them from both sides of the check, so an artifact could publish an unsigned ``.git/config`` (whose
``core.fsmonitor`` git runs) or ``.github/`` workflow into a "verified" snapshot. Now such a file is unsigned unless
the bundle lists it (exit 1, named, with the reason); a bundle that does list it (``model_signing sign
--no-ignore-git-paths``) covers it. Both formats, a real registry (tests/registry.py), the target unchanged and a canary
outside it untouched on every refusal.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import (
    MANIFEST,
    attach_signature,
    key_pair,
    layer,
    push_artifact,
    signed_files,
    snapshot_files,
    tree,
)
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.registry import available, member, push_tar, running_registry
from tests.testhub import HubServer

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "openai-community/gpt2"
GPT2 = "models--openai-community--gpt2"
MODEL_SIGNING = str(Path(sys.executable).with_name("model_signing"))
PLANTED = {".gitattributes": b"*.json filter=lfs\n", ".gitignore": b"*\n",
           ".github/workflows/ci.yml": b"on: push\njobs: {x: {runs-on: self-hosted, steps: [{run: id}]}}\n",
           ".git/config": b"[core]\n\tfsmonitor = touch /tmp/owned\n"}


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("git-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("git-registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    return key_pair(tmp_path_factory.mktemp("git-keys"), "team")


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


def files_with(seed: Path, extra: dict[str, bytes]) -> tuple[str, list[tuple[str, bytes, str]]]:
    commit, files = snapshot_files(seed)
    return commit, files + [(path, data, git_sha1(data)) for path, data in extra.items()]


def push(seed: Path, host: str, name: str, fmt: str, extra: dict[str, bytes]) -> str:
    """gpt2's signed snapshot with ``extra`` files added, as an image or a ModelPack artifact (unsigned yet)."""
    commit, files = files_with(seed, extra)
    if fmt == "modelpack":
        layers = [layer(host, name, f"{GPT2}/snapshots/{commit}/{path}", data, etag) for path, data, etag in files]
        return push_artifact(host, name, "v1", layers, commit=commit)
    members = [member(f"{GPT2}/blobs/{etag}", data) for _, data, etag in files]
    members += [member(f"{GPT2}/snapshots/{commit}/{path}", link="../" * (2 + path.count("/")) + f"blobs/{etag}")
                for path, _, etag in files]
    members.append(member(f"{GPT2}/refs/main", commit.encode()))
    return push_tar(host, name, members)


def pull(ref: str, target: Path, public: Path) -> subprocess.CompletedProcess:
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--verify-key", str(public)],
                       env=clean_env(HOME=str(target.parent / "home")))


@pytest.mark.parametrize("fmt", ["image", "modelpack"])
@pytest.mark.parametrize("path", sorted(PLANTED))
def test_a_git_path_the_bundle_does_not_list_is_refused_as_unsigned(seed, registry, keys, tmp_path, fmt, path):
    private, public = keys
    ref = push(seed, registry.host, f"git/{fmt}-{path.strip('.').replace('/', '-')}", fmt, {path: PLANTED[path]})
    attach_signature(ref, signed_files(seed), private)  # what hfcache sign / push --sign-key sign: the real files
    target, canary = tmp_path / "target", Canary(tmp_path)
    proc = pull(ref, target, public)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert lines[-2].startswith("hfcache: error: refused the pull, nothing was written: "), proc.stderr
    assert f"unsigned: {path} ({path}: model-signing leaves git paths" in lines[-2], proc.stderr
    assert lines[-1].startswith("hint: ") and "signatures verified" not in proc.stdout
    assert not target.exists()
    canary.assert_unchanged()


def test_a_git_path_planted_in_the_targets_snapshot_is_named_unsigned(seed, registry, keys, tmp_path):
    """The target's snapshot of the pulled commit holds a ``.github/`` file a member planted: the snapshot after the
    pull is what the signature must cover, so the pull is refused and the target left as it was."""
    private, public = keys
    ref = push(seed, registry.host, "git/planted-target", "image", {})
    attach_signature(ref, signed_files(seed), private)
    commit, _ = snapshot_files(seed)
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    planted = target / GPT2 / "snapshots" / commit / ".github" / "workflows" / "ci.yml"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(PLANTED[".github/workflows/ci.yml"])
    before = tree(target)
    proc = pull(ref, target, public)
    assert proc.returncode == 1 and "unsigned: .github/workflows/ci.yml" in proc.stderr, proc.stdout + proc.stderr
    assert tree(target) == before


def test_a_bundle_that_lists_the_git_path_covers_it(seed, registry, keys, tmp_path):
    """``model_signing sign key --no-ignore-git-paths`` lists ``.gitattributes``: then it is signed, and the pull
    publishes it like any signed file (the rule is the signed set, not the name)."""
    private, public = keys
    commit, files = files_with(seed, {".gitattributes": PLANTED[".gitattributes"]})
    folder = tmp_path / "model" / commit  # model_signing names the model after its folder: the commit
    for path, data, _ in files:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    bundle = tmp_path / "listed.sig"
    ms = subprocess.run([MODEL_SIGNING, "sign", "key", "--private_key", str(private), "--signature", str(bundle),
                         "--no-ignore-git-paths", str(folder)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 0, ms.stdout + ms.stderr
    ref = push(seed, registry.host, "git/listed", "modelpack", {".gitattributes": PLANTED[".gitattributes"]})
    _attach(ref, bundle.read_bytes())
    target = tmp_path / "target"
    proc = pull(ref, target, public)
    assert proc.returncode == 0 and "signatures verified" in proc.stdout, proc.stdout + proc.stderr
    assert (target / GPT2 / "snapshots" / commit / ".gitattributes").read_bytes() == PLANTED[".gitattributes"]


def _attach(ref: str, bundle: bytes) -> None:
    from hfcache.oci.referrers import attach
    from hfcache.oci.registry import connect, parse_reference

    container = parse_reference(ref)
    request = urllib.request.Request(f"http://{container.registry}/v2/{container.api_prefix}/manifests/"
                                     f"{container.tag}", headers={"Accept": MANIFEST})
    with urllib.request.urlopen(request, timeout=30) as answer:  # loopback registry
        body = answer.read()
    subject = {"mediaType": MANIFEST, "digest": f"sha256:{hashlib.sha256(body).hexdigest()}", "size": len(body)}
    attach(connect(container, True, None, 30), container, subject, bundle)
    assert json.loads(bundle)["dsseEnvelope"]
