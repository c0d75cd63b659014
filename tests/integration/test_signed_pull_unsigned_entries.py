"""``pull --verify-key`` publishes nothing beyond what its signatures cover (docs/security.md, "signature bundles";
red team, round four): a signed snapshot whose image also carried a ``trees/<commit>.json`` listing extra files
(``tokenizer.py``, ``model.safetensors``: an offline ``snapshot_download`` then called the snapshot incomplete, and an
online one would trust the listing), ``.no_exist`` markers of that commit, or blobs nothing links to (one in a new
``models--evil--x`` folder) was published with exit 0. Now a listing is never published by a signed pull (no
signature covers one); a marker of a signed commit must not mark absent a file its signature covers (huggingface_hub
reads the marker before the file); and every blob must be used by a signed snapshot: else exit 3, one line naming
the entry, nothing written. ModelPack artifacts can carry none of the three (exit 2). Images and artifacts are
pushed to a real registry with raw distribution-API calls (tests/registry.py); each refusal leaves a fresh target
uncreated, an existing one byte for byte as it was, and a canary outside unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
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
EVIL = b"print('pwned')\n"
EVIL_SHA1 = hashlib.sha1(b"blob %d\0" % len(EVIL) + EVIL).hexdigest()  # git object id


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("extras-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("extras-registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    return key_pair(tmp_path_factory.mktemp("extras-keys"), "team")


def signed(seed: Path, host: str, name: str, private: Path, members: list) -> str:
    """An image of ``members`` (one layer), signed as ``hfcache push --sign-key`` signs gpt2's snapshot."""
    ref = push_tar(host, name, members)
    attach_signature(ref, signed_files(seed), private)
    return ref


def listing(seed: Path, **extra: dict) -> bytes:
    """huggingface_hub's ``trees/<commit>.json`` of the seed's snapshot (format 1), with ``extra`` entries."""
    _, files = snapshot_files(seed)
    entries = {path: {"size": len(data), "blob_id": etag} for path, data, etag in files}
    return json.dumps({"format_version": 1, "files": {**entries, **extra}}).encode()


def refused_everywhere(seed: Path, ref: str, public: Path, tmp_path: Path, code: int, *needles: str) -> None:
    """Refused (exit ``code``, one line holding ``needles``) into a fresh target, which is not created, and into a
    copy of the seed, which stays byte for byte as it was; a canary is unchanged."""
    canary, fresh, held = Canary(tmp_path), tmp_path / "fresh", tmp_path / "held"
    refused(pull(ref, fresh, public), code, *needles)
    assert not fresh.exists()
    shutil.copytree(seed, held, symlinks=True)
    before = tree(held)
    refused(pull(ref, held, public, "--move-refs"), code, *needles)
    assert tree(held) == before
    canary.assert_unchanged()


def offline_snapshot_download(cache: Path) -> subprocess.CompletedProcess:
    code = f"from huggingface_hub import snapshot_download; print(snapshot_download({REPO!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env=clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent)))


# --- the control ------------------------------------------------------------------------------------------------------


def test_the_legitimate_signed_pull_publishes_the_snapshot_its_markers_and_refs(seed, registry, keys, tmp_path):
    """What ``hfcache push --sign-key`` sends of a warmed gpt2 (blobs, snapshot, the markers of the optional files
    the Hub lacks, ``refs/main``), plus a listing that agrees with the signature: published, the cache verifies and
    loads offline; the listing is not published (nothing a signature covers vouches for a listing)."""
    private, public = keys
    commit, _ = snapshot_files(seed)
    ref = signed(seed, registry.host, "extras/control", private,
                 image_members(seed, commit.encode(), member(f"{GPT2}/trees/{commit}.json", listing(seed))))
    target = tmp_path / "target"
    verified(pull(ref, target, public))
    assert tree(target / GPT2 / "snapshots") == tree(seed / GPT2 / "snapshots")
    assert tree(target / GPT2 / ".no_exist") == tree(seed / GPT2 / ".no_exist") != {}
    assert (target / GPT2 / "refs" / "main").read_text() == commit
    assert not (target / GPT2 / "trees").exists()
    assert run_hfcache(["verify", "--cache-dir", str(target)], env=clean_env()).returncode == 0
    loaded = offline_snapshot_download(target)
    assert loaded.returncode == 0 and commit in loaded.stdout, loaded.stderr


# --- F1a: listings and markers of the signed commit -------------------------------------------------------------------


def test_a_listing_naming_files_no_signature_covers_is_not_published(seed, registry, keys, tmp_path):
    """The red team's listing: the signed files plus ``tokenizer.py`` and an LFS ``model.safetensors``. It used to
    land in the target (offline ``snapshot_download`` then raised "incomplete"); it is not published, into a fresh
    target or one that holds the snapshot, and the snapshot still loads offline."""
    private, public = keys
    commit, _ = snapshot_files(seed)
    forged = listing(seed, **{"tokenizer.py": {"size": len(EVIL), "blob_id": EVIL_SHA1},
                              "model.safetensors": {"size": 5, "blob_id": "0" * 40, "lfs_sha256": "1" * 64,
                                                    "lfs_size": 5}})
    ref = signed(seed, registry.host, "extras/listing", private,
                 image_members(seed, commit.encode(), member(f"{GPT2}/trees/{commit}.json", forged)))
    fresh, held = tmp_path / "fresh", tmp_path / "held"
    verified(pull(ref, fresh, public))
    assert not (fresh / GPT2 / "trees").exists()
    loaded = offline_snapshot_download(fresh)
    assert loaded.returncode == 0 and commit in loaded.stdout, loaded.stderr
    shutil.copytree(seed, held, symlinks=True)
    before = tree(held / GPT2)
    verified(pull(ref, held, public))
    assert tree(held / GPT2) == before
    for cache in (fresh, held):
        assert run_hfcache(["verify", "--cache-dir", str(cache)], env=clean_env()).returncode == 0


@pytest.mark.parametrize("marked", ["config.json", "config.json/x", "tokenizer_config.json@held"])
def test_a_marker_claiming_a_signed_file_absent_is_refused(seed, registry, keys, tmp_path, marked):
    """A ``.no_exist`` marker of the signed commit for a file the signature covers (huggingface_hub's
    ``try_to_load_from_cache`` reads the marker first: the signed file would be hidden), or below one; ``@held``:
    the artifact leaves the file out and the target holds it (the signature covers the snapshot after the pull)."""
    private, public = keys
    commit, _ = snapshot_files(seed)
    path, _, held = marked.partition("@")
    members = [m for m in image_members(seed, commit.encode()) if not (held and m[0].name.endswith(f"/{path}"))]
    ref = signed(seed, registry.host, f"extras/marker-{hashlib.sha1(marked.encode()).hexdigest()[:8]}", private,
                 [*members, member(f"{GPT2}/.no_exist/{commit}/{path}", b"")])
    needles = ("refused the pull, nothing was written: ", f"{GPT2}/.no_exist/{commit}/{path} marks {path} absent",
               "whose signature covers it")
    if not held:
        refused_everywhere(seed, ref, public, tmp_path, 3, *needles)
        return
    target, canary = tmp_path / "held", Canary(tmp_path)
    shutil.copytree(seed, target, symlinks=True)
    before = tree(target)
    refused(pull(ref, target, public), 3, *needles)
    assert tree(target) == before
    canary.assert_unchanged()


# --- F1b: blobs no signed snapshot uses -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["new-folder", "signed-folder", "hardlink-in-new-folder"])
def test_a_blob_no_signed_snapshot_uses_is_refused(seed, registry, keys, tmp_path, where):
    """A blob in a new repo folder (``models--evil--x`` appeared in the target), an unreferenced one in the signed
    folder, or a hardlink repeating a signed blob into a new folder: nothing links to it, no signature covers it."""
    private, public = keys
    commit, files = snapshot_files(seed)
    etag = files[0][2]
    extra, name = {
        "new-folder": (member(f"models--evil--x/blobs/{EVIL_SHA1}", EVIL), f"models--evil--x/blobs/{EVIL_SHA1}"),
        "signed-folder": (member(f"{GPT2}/blobs/{EVIL_SHA1}", EVIL), f"{GPT2}/blobs/{EVIL_SHA1}"),
        "hardlink-in-new-folder": (member(f"models--evil--x/blobs/{etag}", hardlink=f"{GPT2}/blobs/{etag}"),
                                   f"models--evil--x/blobs/{etag}"),
    }[where]
    ref = signed(seed, registry.host, f"extras/blob-{where}", private, image_members(seed, commit.encode(), extra))
    refused_everywhere(seed, ref, public, tmp_path, 3, "refused the pull, nothing was written: ",
                       f"{name} is used by no snapshot a signature of this pull covers")
    assert not (tmp_path / "held" / "models--evil--x").exists()


# --- both formats: a ModelPack artifact carries none of them ----------------------------------------------------------


@pytest.mark.parametrize("section", ["blobs", ".no_exist", "trees"])
def test_a_modelpack_artifact_can_carry_no_blob_marker_or_listing(seed, registry, keys, tmp_path, section):
    """A ModelPack layer maps to a snapshot file or a ref only: one naming a blob, a marker or a listing of the
    signed commit is refused before any layer is fetched (exit 2, naming its path)."""
    private, public = keys
    commit, files = snapshot_files(seed)
    host, name = registry.host, f"extras/modelpack-{section.strip('.')}"
    path = {"blobs": f"{GPT2}/blobs/{EVIL_SHA1}", ".no_exist": f"{GPT2}/.no_exist/{commit}/config.json",
            "trees": f"{GPT2}/trees/{commit}.json"}[section]
    layers = [layer(host, name, f"{GPT2}/snapshots/{commit}/{p}", data, etag) for p, data, etag in files]
    layers.append(layer(host, name, path, EVIL if section == "blobs" else b"", EVIL_SHA1))
    ref = push_artifact(host, name, "v1", layers, commit=commit)
    attach_signature(ref, signed_files(seed), private)
    refused_everywhere(seed, ref, public, tmp_path, 2, path, "not <repo folder>/snapshots/<commit>/<path>")
