"""ls, verify and verify --repair on caches whose shared Xet blob store huggingface_hub 2.4 wrote itself.

The unmodified library and hf_xet download from the Xet test Hub (:mod:`tests.xet_caches`): ``gpt2`` and
``openai-community/gpt2`` (one repo under two ids: every payload linked from two repo folders) through Xet, and, in
the mixed cache, ``FacebookAI/roberta-base`` with ``HF_HUB_DISABLE_XET=1`` (plain blobs). A repo blob that is a
store link of the library's exact shape is a healthy blob with its payload's size and inode (counted once, as
``hf cache ls`` and ``scan_cache_dir`` count it); hostile variants planted on such a cache are reported and never
followed (a canary outside the cache stays byte-for-byte unchanged).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import clean_env, run_hfcache
from tests.xet_caches import library_download, store_linked_blobs, store_payloads, xet_hub

XET_REPOS = ["gpt2", "openai-community/gpt2"]
PLAIN_REPOS = ["FacebookAI/roberta-base"]
HF = Path(sys.executable).parent / "hf"
CANARY = b"outside the cache: never touched\n" * 64


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """``xet``: a cache of store links only; ``mixed``: store links and plain blobs side by side."""
    work = tmp_path_factory.mktemp("xet-readers")
    with xet_hub() as server:
        library_download(server.endpoint, work / "xet" / "cache", XET_REPOS)
        library_download(server.endpoint, work / "mixed" / "cache", XET_REPOS)
        library_download(server.endpoint, work / "mixed" / "cache", PLAIN_REPOS, HF_HUB_DISABLE_XET="1")
    caches = {"xet": work / "xet" / "cache", "mixed": work / "mixed" / "cache"}
    for cache in caches.values():
        assert store_linked_blobs(cache), "the library wrote no store links"
    assert [p for p in (caches["mixed"] / "models--FacebookAI--roberta-base" / "blobs").iterdir()
            if not p.is_symlink()], "HF_HUB_DISABLE_XET=1 wrote no plain blob"
    return caches


@pytest.fixture(params=["xet", "mixed"])
def cache(request, pristine: dict[str, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(pristine[request.param], copy, symlinks=True)
    return copy


@pytest.fixture
def mixed(pristine: dict[str, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(pristine["mixed"], copy, symlinks=True)
    return copy


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "x"
    path.write_bytes(CANARY)
    return path


def verify_json(cache: Path, *args: str, timeout: float = 120) -> tuple[int, dict]:
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json", *args], timeout=timeout)
    return proc.returncode, json.loads(proc.stdout)


def links(cache: Path) -> dict[str, tuple[str, int]]:
    """repo blob path -> (link text, payload inode) of every store link."""
    return {str(p.relative_to(cache)): (os.readlink(p), p.stat().st_ino) for p in store_linked_blobs(cache)}


def library_scan(cache: Path) -> tuple[int, dict[str, int]]:
    code = ("import json, sys; from huggingface_hub import scan_cache_dir; s = scan_cache_dir(sys.argv[1]); "
            "print(json.dumps([s.size_on_disk, {r.repo_id: r.size_on_disk for r in s.repos}, len(s.warnings)]))")
    proc = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.returncode == 0, proc.stderr
    total, repos, warnings = json.loads(proc.stdout)
    assert warnings == 0
    return total, repos


def test_ls_sizes_equal_the_library_and_hf_cache_ls(cache):
    proc = run_hfcache(["ls", "--cache-dir", str(cache), "--json"])
    assert proc.returncode == 0, proc.stderr
    ours = json.loads(proc.stdout)
    assert all(r["health"] == "ok" for r in ours["repos"]), [r["problems"] for r in ours["repos"]]
    total, repos = library_scan(cache)
    assert ours["size_on_disk"] == total
    assert {r["repo_id"]: r["size_on_disk"] for r in ours["repos"]} == repos
    shown = subprocess.run([str(HF), "cache", "ls", "--format", "json", "--cache-dir", str(cache)],
                           capture_output=True, text=True, timeout=120, env=clean_env())
    assert shown.returncode == 0, shown.stderr
    from huggingface_hub.utils._cache_manager import _format_size

    assert {r["repo_id"]: r["size"] for r in json.loads(shown.stdout)} == {
        r["repo_id"]: _format_size(r["size_on_disk"]) for r in ours["repos"]}
    # A payload two repo folders link to is counted once in the total.
    assert ours["size_on_disk"] < sum(r["size_on_disk"] for r in ours["repos"])


def test_verify_is_clean_offline_and_repair_keeps_every_link(cache):
    before = links(cache)
    with xet_hub() as server:
        code, report = verify_json(cache, "--endpoint", server.endpoint)
        assert (code, report["problems"]) == (0, []), report["problems"]
        assert report["blobs_hashed"] > 0
        assert report["bytes_hashed"] == sum(p.stat().st_size for p in store_payloads(cache)) + sum(
            p.stat().st_size for p in cache.glob("*--*/blobs/*") if not p.is_symlink())
        code, repaired = verify_json(cache, "--repair", "--endpoint", server.endpoint)
        assert code == 0, repaired["problems"]
        assert server.requests == []
    assert links(cache) == before


def test_corrupt_payload_is_found_and_repaired_without_a_dangling_link(mixed):
    payload = max(store_payloads(mixed), key=lambda p: p.stat().st_size)
    users = [p for p in store_linked_blobs(mixed) if os.readlink(p).endswith(payload.name)]
    assert len(users) >= 2  # gpt2 and openai-community/gpt2
    os.chmod(payload, 0o644)
    with open(payload, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    code, report = verify_json(mixed)
    assert code == 1
    bad = {(p["repo_id"], p["path"]) for p in report["problems"] if p["kind"] == "blob_mismatch"}
    assert bad == {(_repo_of(u), f"blobs/{u.name}") for u in users}
    with xet_hub() as server:
        code, repaired = verify_json(mixed, "--repair", "--endpoint", server.endpoint)
    assert code == 0, repaired["problems"]
    for path in mixed.glob("*--*/blobs/*"):
        assert path.exists(), f"{path} dangles"
    assert verify_json(mixed)[0] == 0


def _repo_of(blob: Path) -> str:
    return blob.parent.parent.name.removeprefix("models--").replace("--", "/")


def plant_outside_link(cache: Path, canary: Path) -> str:
    blob = sorted(store_linked_blobs(cache))[0]
    blob.unlink()
    blob.symlink_to("../../../outside/x")
    return f"blobs/{blob.name}"


def plant_other_shape(cache: Path, canary: Path) -> str:
    blob = sorted(store_linked_blobs(cache))[0]
    xet_hash = os.path.basename(os.readlink(blob))
    other = "ab" if xet_hash[:2] != "ab" else "cd"
    os.makedirs(cache / "blobs" / other, exist_ok=True)
    os.symlink(canary, cache / "blobs" / other / xet_hash)  # even the wrong-prefix path holds a way out
    blob.unlink()
    blob.symlink_to(f"../../blobs/{other}/{xet_hash}")
    return f"blobs/{blob.name}"


def _replace_payload(cache: Path, make) -> str:
    blob = sorted(store_linked_blobs(cache))[0]
    payload = (blob.parent / os.readlink(blob))
    os.chmod(payload, 0o644)
    payload.unlink()
    make(payload)
    return f"blobs/{blob.name}"


def plant_payload_symlink(cache: Path, canary: Path) -> str:
    return _replace_payload(cache, lambda p: p.symlink_to(canary))


def plant_payload_fifo(cache: Path, canary: Path) -> str:
    return _replace_payload(cache, os.mkfifo)


def plant_payload_folder(cache: Path, canary: Path) -> str:
    return _replace_payload(cache, os.mkdir)


def plant_marker_symlink(cache: Path, canary: Path) -> str:
    canary.write_bytes(b"1\n")  # what the marker holds: followed, it would pass
    marker = cache / "blobs" / ".huggingface-shared-blobs"
    marker.unlink()
    marker.symlink_to(canary)
    return f"blobs/{sorted(store_linked_blobs(cache))[0].name}"


def plant_dangling(cache: Path, canary: Path) -> str:
    return _replace_payload(cache, lambda p: None)


def plant_marker_missing(cache: Path, canary: Path) -> str:
    (cache / "blobs" / ".huggingface-shared-blobs").unlink()
    return f"blobs/{sorted(store_linked_blobs(cache))[0].name}"


HOSTILE = [plant_outside_link, plant_other_shape, plant_payload_symlink, plant_payload_fifo, plant_payload_folder,
           plant_marker_symlink, plant_dangling, plant_marker_missing]


@pytest.mark.parametrize("plant", HOSTILE, ids=[p.__name__ for p in HOSTILE])
def test_hostile_store_links_are_reported_never_followed(mixed, canary, plant):
    where = plant(mixed, canary)
    kept = canary.read_bytes()
    code, report = verify_json(mixed, timeout=60)
    assert code == 1
    assert where in {p["path"] for p in report["problems"] if p["kind"] == "blob_not_file"}, report["problems"]
    proc = run_hfcache(["ls", "--cache-dir", str(mixed), "--json"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["totals"]["unhealthy"] >= 1
    with xet_hub() as server:
        code, repaired = verify_json(mixed, "--repair", "--endpoint", server.endpoint, timeout=120)
    assert code == 0, repaired["problems"]
    assert canary.read_bytes() == kept
    assert not canary.is_symlink() and canary.stat().st_nlink == 1


def test_absolute_snapshot_link_to_a_store_blob_is_relinked_offline(mixed):
    snapshot = next((mixed / "models--gpt2" / "snapshots").iterdir())
    entry = next(p for p in sorted(snapshot.iterdir()) if (p.parent / os.readlink(p)).is_symlink())
    blob = (entry.parent / os.readlink(entry)).parent.resolve() / os.path.basename(os.readlink(entry))
    entry.unlink()
    entry.symlink_to(blob)  # absolute, to the repo blob that is a store link
    before = links(mixed)
    with xet_hub() as server:
        code, repaired = verify_json(mixed, "--repair", "--endpoint", server.endpoint)
        assert server.requests == []
    assert code == 0, repaired["problems"]
    assert [a["action"] for a in repaired["repairs"]] == ["relinked"]
    assert not os.path.isabs(os.readlink(entry))
    assert links(mixed) == before
