"""prune and doctor on caches whose shared Xet blob store huggingface_hub 2.4 wrote itself.

The unmodified library and hf_xet download ``gpt2``, ``openai-community/gpt2`` (the same repo under its legacy and
canonical ids: every payload shared) and ``FacebookAI/roberta-base`` (which shares one payload with gpt2) from the
Xet test Hub (:mod:`tests.xet_caches`); hostile variants are planted on top of such a cache. Prunes are real
``python -m hfcache prune`` processes; revisions are aged through their snapshot and ref mtimes, every payload's atime
set to 0 (as on a ``noatime`` mount), so ``--older-than 30d`` picks exactly the repos a test ages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache
from tests.xet_caches import library_download, store_linked_blobs, store_payloads, xet_hub

REPOS = ["gpt2", "openai-community/gpt2", "FacebookAI/roberta-base"]
GPT2_FOLDERS = ("models--gpt2", "models--openai-community--gpt2")
OLD = 1_000_000_000  # 2001: older than any --older-than of these tests


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("xet-prune")
    with xet_hub() as server:
        library_download(server.endpoint, work / "cache", REPOS)
    cache = work / "cache"
    assert store_linked_blobs(cache), "the library wrote no store links"
    return cache


@pytest.fixture
def cache(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "canary.txt"
    path.write_bytes(b"outside the cache: never touched\n" * 64)
    return path


def age(cache: Path, *folders: str) -> None:
    """Make ``folders``' revisions look unused since 2001. A payload's atime is every linking repo's last use, so
    every payload's atime goes back to 0 (reading roberta-base's files would make gpt2 look used)."""
    for payload in store_payloads(cache):
        os.utime(payload, (0, payload.stat().st_mtime))
    for folder in folders:
        paths = [*(cache / folder / "refs").rglob("*"), *(cache / folder / "snapshots").iterdir()]
        for path in paths:
            os.utime(path, (OLD, OLD), follow_symlinks=False)


def prune(cache: Path, *args: str) -> dict:
    proc = run_hfcache(["prune", "--cache-dir", str(cache), "--older-than", "30d", "--json", *args])
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def sizes(cache: Path) -> dict[str, int]:
    """Xet hash -> size of every payload of the store."""
    return {p.name: p.stat().st_size for p in store_payloads(cache)}


def manifest(cache: Path, xet_hash: str) -> list[str]:
    path = cache / "blobs" / xet_hash[:2] / f"{xet_hash}.refs"
    return path.read_text().splitlines()


def users(cache: Path) -> dict[str, set[str]]:
    """Xet hash -> repo folders whose blobs link to it."""
    out: dict[str, set[str]] = {}
    for link in store_linked_blobs(cache):
        out.setdefault(Path(os.readlink(link)).name, set()).add(link.parent.parent.name)
    return out


def snapshot_bytes(cache: Path, folder: str) -> dict[str, bytes]:
    snapshot = next((cache / folder / "snapshots").iterdir())
    return {str(p.relative_to(snapshot)): p.read_bytes() for p in snapshot.rglob("*") if p.is_file()}


def only_gpt2(cache: Path) -> list[str]:
    """Payloads only the two gpt2 folders link to (sorted)."""
    return sorted(h for h, folders in users(cache).items() if folders <= set(GPT2_FOLDERS))


def test_pruning_one_id_keeps_every_payload_the_other_uses(cache: Path) -> None:
    before = sizes(cache)
    shared = users(cache)
    assert all(set(GPT2_FOLDERS) <= folders for folders in shared.values() if "models--gpt2" in folders)
    age(cache, "models--gpt2")
    dry = prune(cache, "--dry-run")
    assert [r["repo_id"] for r in dry["revisions"]] == ["gpt2"]
    assert dry["summary"]["bytes_freed"] == 0
    assert not [i for i in dry["items"] if i["kind"] == "payload"]
    done = prune(cache, "--yes")
    assert done["result"]["failed"] == 0 and done["result"]["bytes_freed"] == 0
    assert sizes(cache) == before
    assert not (cache / "models--gpt2").exists()
    # Every manifest is rewritten without the removed links and still names every remaining one.
    for xet_hash, folders in users(cache).items():
        lines = manifest(cache, xet_hash)
        assert not [line for line in lines if line.startswith("models--gpt2/")]
        assert {line.split("/")[0] for line in lines} == folders
    loaded = offline_load(cache, ["openai-community/gpt2"])
    assert loaded["openai-community/gpt2"].get("input_ids") == golden_ids("openai-community/gpt2"), loaded


def test_pruning_both_ids_frees_exactly_the_payloads_nobody_else_uses(cache: Path) -> None:
    before = sizes(cache)
    freeable = only_gpt2(cache)
    kept = sorted(set(before) - set(freeable))
    assert freeable and kept, "roberta-base shares no payload with gpt2 any more"
    roberta = snapshot_bytes(cache, "models--FacebookAI--roberta-base")
    age(cache, *GPT2_FOLDERS)
    dry = prune(cache, "--dry-run")
    expected = sum(before[h] for h in freeable)
    planned = sorted(i["path"].rsplit("/", 1)[-1] for i in dry["items"] if i["kind"] == "payload")
    assert planned == freeable, (dry["warnings"], dry["revisions"])
    assert dry["summary"]["bytes_freed"] == expected
    assert sum(r["bytes_freed"] for r in dry["revisions"]) == expected
    done = prune(cache, "--yes")
    assert done["summary"]["bytes_freed"] == expected and done["result"]["bytes_freed"] == expected
    after = sizes(cache)
    assert sorted(after) == kept
    assert sum(before.values()) - sum(after.values()) == expected
    for xet_hash in freeable:
        assert not (cache / "blobs" / xet_hash[:2] / f"{xet_hash}.refs").exists()
    for xet_hash in kept:
        assert all(line.startswith("models--FacebookAI--roberta-base/") for line in manifest(cache, xet_hash))
    assert snapshot_bytes(cache, "models--FacebookAI--roberta-base") == roberta


@pytest.mark.parametrize("variant", ["missing", "outside"])
def test_a_payload_with_a_missing_or_hostile_manifest_is_leaked(cache: Path, canary: Path, variant: str) -> None:
    before = sizes(cache)
    leaked, *freed = only_gpt2(cache)
    refs = cache / "blobs" / leaked[:2] / f"{leaked}.refs"
    if variant == "missing":
        refs.unlink()
    else:
        # Lines the library's sweep skips (absolute, '..'): with them only, it would find no reference and delete.
        refs.write_text(f"{canary}\n../outside/{canary.name}\nmodels--gpt2/../../outside/{canary.name}\n")
    canary_bytes = canary.read_bytes()
    age(cache, *GPT2_FOLDERS)
    dry = prune(cache, "--dry-run")
    expected = sum(before[h] for h in freed)
    assert dry["summary"]["bytes_freed"] == expected
    assert any(leaked in w for w in dry["warnings"]), dry["warnings"]
    done = prune(cache, "--yes")
    assert done["result"]["bytes_freed"] == expected
    after = sizes(cache)
    assert leaked in after and after[leaked] == before[leaked]
    assert sum(before.values()) - sum(after.values()) == expected
    assert canary.read_bytes() == canary_bytes and not canary.is_symlink()


def test_a_planted_lock_link_is_never_followed(cache: Path, canary: Path) -> None:
    before = sizes(cache)
    locked, *rest = only_gpt2(cache)
    canary_bytes = canary.read_bytes()
    lock = cache / "blobs" / locked[:2] / f"{locked}.lock"
    lock.unlink()
    lock.symlink_to(canary)  # filelock opens with O_TRUNC: followed, it would empty the canary
    age(cache, *GPT2_FOLDERS)
    done = prune(cache, "--yes")
    assert canary.read_bytes() == canary_bytes
    statuses = {i["path"].rsplit("/", 1)[-1]: i for i in done["items"] if i["kind"] == "payload"}
    assert statuses[locked]["status"] == "skipped" and "symlink" in statuses[locked]["note"]
    after = sizes(cache)
    assert locked in after and not set(rest) & set(after)
    assert done["result"]["bytes_freed"] == sum(before.values()) - sum(after.values())


def test_a_lock_hardlinked_to_an_outside_file_keeps_its_mode(cache: Path, canary: Path) -> None:
    """A group member plants ``<h>.lock`` as a hardlink to another file (``O_NOFOLLOW`` does not stop it): prune
    must not chmod that file (it once set 0666 on it) and leaves the payload alone."""
    locked, *_ = only_gpt2(cache)
    canary.chmod(0o600)
    mode_before, canary_bytes = canary.stat().st_mode, canary.read_bytes()
    lock = cache / "blobs" / locked[:2] / f"{locked}.lock"
    lock.unlink(missing_ok=True)
    os.link(canary, lock)
    age(cache, *GPT2_FOLDERS)
    done = prune(cache, "--yes")
    assert canary.stat().st_mode == mode_before and canary.read_bytes() == canary_bytes
    statuses = {i["path"].rsplit("/", 1)[-1]: i for i in done["items"] if i["kind"] == "payload"}
    assert statuses[locked]["status"] == "skipped" and "hard links" in statuses[locked]["note"]
    assert locked in sizes(cache)


def test_a_planted_payload_link_is_never_followed(cache: Path, tmp_path: Path) -> None:
    before = sizes(cache)
    planted, *_ = only_gpt2(cache)
    other = tmp_path / "outside-payload"
    payload = cache / "blobs" / planted[:2] / planted
    shutil.copyfile(payload, other)
    other_bytes = other.read_bytes()
    payload.chmod(0o644)
    payload.unlink()
    payload.symlink_to(other)
    age(cache, *GPT2_FOLDERS)
    done = prune(cache, "--yes")
    assert other.read_bytes() == other_bytes and payload.is_symlink()
    after = sizes(cache)
    assert done["result"]["bytes_freed"] == sum(before.values()) - before[planted] - sum(after.values())


#: Holds a payload's per-hash lock with huggingface_hub's own code (``_shared_blob_lock``) until stdin closes.
HOLD_STORE_LOCK = (
    "import sys\n"
    "from pathlib import Path\n"
    "from huggingface_hub.utils._shared_blobs import _shared_blob_lock\n"
    "with _shared_blob_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


def test_the_sweep_takes_the_librarys_per_hash_lock(cache: Path) -> None:
    before = sizes(cache)
    held, *rest = only_gpt2(cache)
    age(cache, *GPT2_FOLDERS)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_STORE_LOCK, str(cache / "blobs" / held[:2] / held)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        done = prune(cache, "--yes", "--lock-timeout", "1")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    payload_items = {i["path"].rsplit("/", 1)[-1]: i for i in done["items"] if i["kind"] == "payload"}
    assert payload_items[held]["status"] == "skipped", payload_items[held]
    after = sizes(cache)
    assert held in after and not set(rest) & set(after)
    assert done["result"]["bytes_freed"] == sum(before.values()) - sum(after.values())
    # Not swept: its manifest still names the removed links (a hint: no link is there any more), so
    # huggingface_hub's own sweep, run now that nobody holds the lock, finds no reference and frees it.
    assert manifest(cache, held) and all(line.startswith(GPT2_FOLDERS) for line in manifest(cache, held))
    sweep = ("import sys\nfrom pathlib import Path\nfrom huggingface_hub.utils._shared_blobs import sweep_shared_blob\n"
             "print(sweep_shared_blob(Path(sys.argv[1]), cache_dir=sys.argv[2]))\n")
    proc = subprocess.run([sys.executable, "-c", sweep, str(cache / "blobs" / held[:2] / held), str(cache)],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == str(before[held]), proc.stderr
    assert held not in sizes(cache)


@pytest.mark.parametrize("disabling", [{}, {"HF_HUB_DISABLE_XET": "1"}, {"HF_HUB_DISABLE_SHARED_BLOBS": "1"}])
def test_doctor_names_the_store_and_the_variables_that_turn_it_off(cache: Path, disabling: dict) -> None:
    proc = run_hfcache(["doctor", "--cache-dir", str(cache), "--json"], env=clean_env(**disabling))
    report = json.loads(proc.stdout)
    store = report["shared_store"]
    payloads = sizes(cache)
    assert store["path"] == str(cache / "blobs") and store["present"] and store["marked"]
    assert store["payloads"] == len(payloads) and store["payload_bytes"] == sum(payloads.values())
    assert store["disabling_variables"] == disabling and store["enabled"] is (not disabling)
    codes = {f["code"]: f for f in report["findings"]}
    assert "store.present" in codes
    if disabling:
        assert next(iter(disabling)) in codes["store.disabled"]["message"]
    else:
        assert "store.disabled" not in codes


def test_doctor_calls_a_store_with_a_planted_marker_unusable(cache: Path, canary: Path) -> None:
    marker = cache / "blobs" / ".huggingface-shared-blobs"
    canary.write_text("1\n")
    marker.unlink()
    marker.symlink_to(canary)
    proc = run_hfcache(["doctor", "--cache-dir", str(cache), "--json"])
    store = json.loads(proc.stdout)["shared_store"]
    assert store["present"] and not store["marked"] and store["payloads"] == 0
    assert any("symlink" in p for p in store["problems"]), store
    codes = {f["code"] for f in json.loads(proc.stdout)["findings"]}
    assert "store.unusable" in codes and "store.present" not in codes
    assert canary.read_text() == "1\n"


UNREFERENCED = ("import json, sys\nfrom huggingface_hub.utils._shared_blobs import unreferenced_shared_blobs\n"
                "print(json.dumps({p.name: s for p, s in unreferenced_shared_blobs(sys.argv[1]).items()}))\n")


def test_payloads_of_repo_folders_deleted_by_hand_are_what_the_library_calls_unreferenced(cache: Path) -> None:
    before = sizes(cache)
    for folder in GPT2_FOLDERS:
        shutil.rmtree(cache / folder)
    proc = subprocess.run([sys.executable, "-c", UNREFERENCED, str(cache)], capture_output=True, text=True,
                          timeout=60)
    unreferenced = json.loads(proc.stdout)
    assert unreferenced and sorted(unreferenced) == only_gpt2_of(before, cache)
    dry = prune(cache, "--dry-run")
    orphans = {i["path"].rsplit("/", 1)[-1]: i["bytes_freed"] for i in dry["items"] if i["kind"] == "payload"}
    assert orphans == unreferenced
    assert dry["summary"]["bytes_freed"] == sum(unreferenced.values())
    assert dry["summary"]["bytes_before"] == sum(before.values())
    done = prune(cache, "--yes")
    assert done["result"]["bytes_freed"] == sum(unreferenced.values())
    assert sizes(cache) == {h: s for h, s in before.items() if h not in unreferenced}


def only_gpt2_of(before: dict[str, int], cache: Path) -> list[str]:
    """Payloads of ``before`` no repo folder left in ``cache`` links to."""
    linked = set(users(cache))
    return sorted(h for h in before if h not in linked)


@pytest.fixture(scope="module")
def hardlinked(tmp_path_factory) -> Path:
    """``openai-community/gpt2`` by huggingface_hub (store links), then ``hfcache warm gpt2``: the legacy folder
    takes the payloads as hardlinks (one copy on disk), not links."""
    work = tmp_path_factory.mktemp("xet-prune-hardlinks")
    cache = work / "cache"
    with xet_hub() as server:
        library_download(server.endpoint, cache, ["openai-community/gpt2"])
        proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(cache), "--endpoint", server.endpoint])
        assert proc.returncode == 0, proc.stderr
    assert all(p.stat().st_nlink == 2 for p in store_payloads(cache))
    return cache


def test_a_payload_hardlinked_into_a_legacy_folder_is_freed_with_its_last_name(hardlinked: Path,
                                                                               tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(hardlinked), str(cache)], check=True)  # keeps the hardlinks warm made
    assert all(p.stat().st_nlink == 2 for p in store_payloads(cache))
    before = sizes(cache)
    age(cache, "models--openai-community--gpt2")
    first = prune(cache, "--yes")
    assert first["summary"]["bytes_freed"] == 0 and first["result"]["bytes_freed"] == 0
    assert sizes(cache) == before
    assert all(manifest(cache, h) == [] for h in before)  # rewritten: no link left, the hardlinks keep the bytes
    loaded = offline_load(cache, ["gpt2"])
    assert loaded["gpt2"].get("input_ids") == golden_ids("gpt2", "openai-community/gpt2"), loaded
    age(cache, "models--gpt2")
    dry = prune(cache, "--dry-run")
    assert dry["summary"]["bytes_freed"] == sum(before.values()), dry["warnings"]
    done = prune(cache, "--yes")
    assert done["result"]["bytes_freed"] == sum(before.values()) and sizes(cache) == {}
