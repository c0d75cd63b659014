"""``pull --verify-key`` covers what a signed pull makes visible, refs included (docs/security.md, "signature
bundles"): a registry serving a correctly signed snapshot plus a ``refs/main`` naming an older commit the target
already holds used to get "signatures verified" and move ``main`` to that unsigned revision (with ``--move-refs``, as
an update job pulls, or into a target without ``main``). Both formats are pushed to a real registry with raw
distribution-API calls (tests/registry.py); each refusal is exit 3 with one line and its hint, publishes nothing
(the target byte for byte as it was, or not created), and a canary outside the target is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import (
    attach_signature,
    image_members,
    key_pair,
    layer,
    pull,
    push_artifact,
    refused,
    signed_files,
    snapshot_files,
    tree,
    verified,
)
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.registry import available, member, push_tar, running_registry
from tests.testhub import HubServer

pytestmark = [pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "openai-community/gpt2"
GPT2 = "models--openai-community--gpt2"
OLDER = "b" * 40  #: a revision the target holds that no signature covers (a copy of the signed one's files)


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refs-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("refs-registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    return key_pair(tmp_path_factory.mktemp("refs-keys"), "team")




def modelpack(seed: Path, host: str, name: str, ref: bytes) -> str:
    """The artifact ``push --format modelpack`` writes for gpt2, its ref layer holding ``ref``."""
    commit, files = snapshot_files(seed)
    layers = [layer(host, name, f"{GPT2}/snapshots/{commit}/{path}", data, etag) for path, data, etag in files]
    layers.append(layer(host, name, f"{GPT2}/refs/main", ref, None, **{"io.hfcache.kind": "ref"}))
    return push_artifact(host, name, "v1", layers, commit=commit)


def signed_image(seed: Path, host: str, name: str, private: Path, ref: bytes | None, *extra) -> str:
    ref_ = push_tar(host, name, image_members(seed, ref, *extra))
    attach_signature(ref_, signed_files(seed), private)
    return ref_


def holding_older(seed: Path, target: Path, *, main: str | None) -> Path:
    """A copy of the seed that also holds the unsigned revision OLDER (the signed snapshot's files under another
    commit), with ``refs/main`` at ``main`` (removed when None)."""
    commit, _ = snapshot_files(seed)
    shutil.copytree(seed, target, symlinks=True)
    shutil.copytree(target / GPT2 / "snapshots" / commit, target / GPT2 / "snapshots" / OLDER, symlinks=True)
    if main is None:
        (target / GPT2 / "refs" / "main").unlink()
    else:
        (target / GPT2 / "refs" / "main").write_text(main)
    return target



# --- the rollback, both formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["image", "modelpack"])
@pytest.mark.parametrize("main", ["signed", None], ids=["move-refs", "no-main"])
def test_a_signed_artifact_cannot_roll_main_back_to_an_unsigned_revision(seed, registry, keys, tmp_path, fmt, main):
    """The signed snapshot plus ``refs/main`` -> OLDER, which the target holds: with ``--move-refs`` (main at the
    signed commit) or into a target without main, main used to end at OLDER. Refused, nothing published."""
    private, public = keys
    commit, _ = snapshot_files(seed)
    name = f"refs/rollback-{fmt}-{main or 'nomain'}"
    ref = signed_image(seed, registry.host, name, private, OLDER.encode()) if fmt == "image" else \
        modelpack(seed, registry.host, name, OLDER.encode())
    if fmt == "modelpack":
        attach_signature(ref, signed_files(seed), private)
    target = holding_older(seed, tmp_path / "target", main=commit if main else None)
    before, canary = tree(target), Canary(tmp_path)
    refused(pull(ref, target, public, "--move-refs"), 3, f"{GPT2}/refs/main names commit {OLDER}",
            "which no signature of this pull covers", f"signed: {commit[:12]}")
    assert tree(target) == before
    refused(pull(ref, target, public), 3, f"{GPT2}/refs/main names commit {OLDER}")  # without --move-refs too
    assert tree(target) == before
    fresh = tmp_path / "fresh"
    refused(pull(ref, fresh, public), 3, f"{GPT2}/refs/main names commit {OLDER}")
    assert not fresh.exists()
    canary.assert_unchanged()


@pytest.mark.parametrize("fmt", ["image", "modelpack"])
def test_a_ref_to_the_signed_commit_still_moves_with_move_refs(seed, registry, keys, tmp_path, fmt):
    """The control: the same artifact with ``refs/main`` at the signed commit is an update: main moves from OLDER to
    it with ``--move-refs``, and the cache verifies."""
    private, public = keys
    commit, _ = snapshot_files(seed)
    name = f"refs/update-{fmt}"
    ref = signed_image(seed, registry.host, name, private, commit.encode()) if fmt == "image" else \
        modelpack(seed, registry.host, name, commit.encode())
    if fmt == "modelpack":
        attach_signature(ref, signed_files(seed), private)
    target = holding_older(seed, tmp_path / "target", main=OLDER)
    verified(pull(ref, target, public, "--move-refs"))
    assert (target / GPT2 / "refs" / "main").read_text() == commit
    assert run_hfcache(["verify", "--cache-dir", str(target)], env=clean_env()).returncode == 0
    fresh = tmp_path / "fresh"
    verified(pull(ref, fresh, public))
    assert (fresh / GPT2 / "refs" / "main").read_text() == commit


def test_a_modelpack_ref_layer_the_target_holds_is_bound_too(seed, registry, keys, tmp_path):
    """A ref layer whose bytes the target's ref already holds is not downloaded; it still names OLDER, which the
    signature does not cover: the artifact is crafted, refused even though main would not change."""
    private, public = keys
    ref = modelpack(seed, registry.host, "refs/held-ref", OLDER.encode())
    attach_signature(ref, signed_files(seed), private)
    target = holding_older(seed, tmp_path / "target", main=OLDER)
    before = tree(target)
    refused(pull(ref, target, public), 3, f"{GPT2}/refs/main names commit {OLDER}")
    assert tree(target) == before


# --- everything else that names a commit, in the image format -------------------------------------------------------


def test_a_ref_hardlinked_to_a_blob_naming_an_unsigned_commit_is_refused(seed, registry, keys, tmp_path):
    """import reads a hardlinked ref's commit from the entry it repeats: a git-sha1 blob whose bytes are OLDER (a
    valid blob, named by its hash) behind ``refs/main``."""
    private, public = keys
    commit, _ = snapshot_files(seed)
    data = OLDER.encode() + b"\n"
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id
    ref = signed_image(seed, registry.host, "refs/hardlink", private, None, member(f"{GPT2}/blobs/{blob}", data),
                       member(f"{GPT2}/refs/main", hardlink=f"{GPT2}/blobs/{blob}"))
    target = holding_older(seed, tmp_path / "target", main=commit)
    before = tree(target)
    refused(pull(ref, target, public, "--move-refs"), 3, f"{GPT2}/refs/main names commit {OLDER}")
    assert tree(target) == before


@pytest.mark.parametrize("entry", [f".no_exist/{OLDER}/tokenizer.json", f"trees/{OLDER}.json", "refs/v1"])
def test_markers_listings_and_other_refs_about_an_unsigned_commit_are_refused(seed, registry, keys, tmp_path, entry):
    """A ``.no_exist`` marker or ``trees/`` listing about OLDER (what a load of OLDER then believes) and a second
    ref naming it: nothing about a commit the signature did not cover is published."""
    import json

    private, public = keys
    commit, files = snapshot_files(seed)
    data = {"refs/v1": OLDER.encode(), f".no_exist/{OLDER}/tokenizer.json": b"",
            f"trees/{OLDER}.json": json.dumps({"files": {}}).encode()}[entry]
    ref = signed_image(seed, registry.host, f"refs/about-{abs(hash(entry)) % 10**6}", private, commit.encode(),
                       member(f"{GPT2}/{entry}", data))
    target = holding_older(seed, tmp_path / "target", main=commit)
    before, canary = tree(target), Canary(tmp_path)
    refused(pull(ref, target, public), 3, f"{GPT2}/{entry}", OLDER, "which no signature of this pull covers")
    assert tree(target) == before
    canary.assert_unchanged()
