"""``hfcache sync``: a node cache kept equal to the union of the locks in a folder, with the real command against the
test Hub (and a real S3-protocol server for ``--bucket``):

- locks added, removed and changed: the cache follows, and what a still-listed lock pins is never removed;
- readiness files flip only when a lock's content is complete and verified (a lock that cannot be fetched, a blob
  altered in the cache);
- the loop starts a pass when the folder changes, and SIGTERM ends it;
- ``--bucket`` takes file bodies from a bucket ``push s3://`` wrote, asking no Hub anything.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import clean_env, offline_load, run_hfcache
from tests.s3 import moto_server
from tests.testhub import HubServer

pytestmark = pytest.mark.slow

HUB = Path(__file__).parent.parent / "data" / "hub"
REPOS = {"gpt2": "openai-community/gpt2", "distil": "distilbert/distilbert-base-uncased",
         "bert": "bert-base-uncased", "roberta": "FacebookAI/roberta-base"}
FOLDERS = {"gpt2": "models--openai-community--gpt2", "distil": "models--distilbert--distilbert-base-uncased",
           "bert": "models--bert-base-uncased", "roberta": "models--FacebookAI--roberta-base"}


@pytest.fixture(scope="module")
def hub():
    with HubServer(HUB) as server:
        yield server


@pytest.fixture(scope="module")
def locks(hub, tmp_path_factory) -> dict[str, bytes]:
    """One lock per fixture repo (``hfcache lock`` against the test Hub): name -> its bytes."""
    made = {}
    for name, repo_id in REPOS.items():
        folder = tmp_path_factory.mktemp(f"lock-{name}")
        (folder / "hfcache.toml").write_text(f'endpoint = "{hub.endpoint}"\n\n[[repos]]\nrepo_id = "{repo_id}"\n')
        proc = run_hfcache(["lock"], cwd=folder)
        assert proc.returncode == 0, proc.stderr
        made[name] = (folder / "hfcache.lock").read_bytes()
    return made


def place(folder: Path, **named: bytes) -> None:
    """Make ``folder`` hold exactly the locks ``named`` (file name without ``.lock`` -> bytes)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in named.items():
        (folder / f"{name}.lock").write_bytes(data)


def sync(hub, locks_dir: Path, cache: Path, ready: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_hfcache(["sync", "--locks", str(locks_dir), "--cache-dir", str(cache), "--ready-dir", str(ready),
                        "--endpoint", hub.endpoint, "--once", "--json", *args], timeout=300)
    return proc, json.loads(proc.stdout.splitlines()[-1])


def snapshots(cache: Path, key: str) -> list[str]:
    folder = cache / FOLDERS[key] / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_the_cache_follows_locks_added_removed_and_changed(hub, locks, tmp_path):
    locks_dir, cache, ready = tmp_path / "locks", tmp_path / "cache", tmp_path / "ready"
    place(locks_dir, a=locks["gpt2"], x=locks["distil"])
    proc, report = sync(hub, locks_dir, cache, ready, "--grace", "0s")
    assert proc.returncode == 0 and report["ok"], proc.stderr
    assert sorted(p.name for p in ready.iterdir()) == ["a.lock.json", "x.lock.json"]
    assert snapshots(cache, "gpt2") and snapshots(cache, "distil")
    gpt2_blobs = sorted(p.name for p in (cache / FOLDERS["gpt2"] / "blobs").iterdir())

    # a removed; b and c added (c pins what a pinned); x changed from distilbert to roberta
    place(locks_dir, b=locks["bert"], c=locks["gpt2"], x=locks["roberta"])
    proc, report = sync(hub, locks_dir, cache, ready, "--grace", "0s")
    assert proc.returncode == 0 and report["ok"], proc.stderr
    assert sorted(p.name for p in ready.iterdir()) == ["b.lock.json", "c.lock.json", "x.lock.json"]
    x_state = json.loads((ready / "x.lock.json").read_text())
    assert x_state["ready"] and x_state["sha256"] == [s for s in report["locks"] if s["name"] == "x.lock"][0]["sha256"]
    assert not snapshots(cache, "distil"), "no lock pins distilbert any more: removed (--grace 0s)"
    assert report["revisions_removed"] == 1  # its blobs are bert's too (hardlinked): few bytes freed
    assert sorted(p.name for p in (cache / FOLDERS["gpt2"] / "blobs").iterdir()) == gpt2_blobs, \
        "what a still-listed lock pins is never removed"
    loads = offline_load(cache, [REPOS["gpt2"], REPOS["bert"], REPOS["roberta"]])
    assert all("input_ids" in r for r in loads.values()), loads


def test_an_unpinned_revision_used_within_the_grace_period_stays(hub, locks, tmp_path):
    locks_dir, cache, ready = tmp_path / "locks", tmp_path / "cache", tmp_path / "ready"
    place(locks_dir, a=locks["gpt2"], x=locks["distil"])
    assert sync(hub, locks_dir, cache, ready)[0].returncode == 0
    place(locks_dir, a=locks["gpt2"])
    proc, report = sync(hub, locks_dir, cache, ready, "--grace", "1h")
    assert proc.returncode == 0 and report["revisions_removed"] == 0
    assert snapshots(cache, "distil"), "used a moment ago: kept for the grace period"


def test_readiness_needs_complete_and_verified_content(hub, locks, tmp_path):
    locks_dir, cache, ready = tmp_path / "locks", tmp_path / "cache", tmp_path / "ready"
    broken = locks["roberta"].replace(b'repo_id = "FacebookAI/roberta-base"', b'repo_id = "acme/not-on-the-hub"')
    broken = broken.replace(b'canonical_id = "FacebookAI/roberta-base"', b'canonical_id = "acme/not-on-the-hub"')
    place(locks_dir, a=locks["gpt2"], z=broken)
    proc, report = sync(hub, locks_dir, cache, ready, "--grace", "0s")
    states = {s["name"]: s for s in report["locks"]}
    assert proc.returncode == 3 and states["a.lock"]["ready"] and not states["z.lock"]["ready"], proc.stdout
    assert "not-on-the-hub" in states["z.lock"]["error"]
    assert sorted(p.name for p in ready.iterdir()) == ["a.lock.json"]

    blob = max((cache / FOLDERS["gpt2"] / "blobs").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    data[10] ^= 1
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))  # same size: the stat-only check of the lock is satisfied, the hash is not
    place(locks_dir, a=locks["gpt2"])
    proc, report = sync(hub, locks_dir, cache, ready, "--grace", "0s")
    assert proc.returncode == 1 and not report["locks"][0]["ready"], proc.stdout
    assert blob.name in report["locks"][0]["error"]
    assert not list(ready.iterdir()), "an altered blob flips the lock to not ready"


def test_the_loop_follows_a_change_of_the_folder_and_stops_on_sigterm(hub, locks, tmp_path):
    locks_dir, cache, ready = tmp_path / "locks", tmp_path / "cache", tmp_path / "ready"
    place(locks_dir, a=locks["gpt2"])
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "sync", "--locks", str(locks_dir), "--cache-dir",
                             str(cache), "--ready-dir", str(ready), "--endpoint", hub.endpoint, "--interval", "1h",
                             "--json"], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (ready / "a.lock.json").exists(), "the first pass")
        (locks_dir / "b.lock").write_bytes(locks["distil"])
        _wait_for(lambda: (ready / "b.lock.json").exists(), "a pass after the folder changed (interval 1h)")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    passes = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"locks"' in line]
    assert len(passes) >= 2 and passes[-1]["ok"], out


def _wait_for(condition, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_bodies_from_a_bucket_ask_no_hub(hub, locks, tmp_path):
    seed, locks_dir, cache = tmp_path / "seed", tmp_path / "locks", tmp_path / "cache"
    place(locks_dir, a=locks["gpt2"])
    assert run_hfcache(["warm", "--lock", str(locks_dir / "a.lock"), "--cache-dir", str(seed), "--endpoint",
                        hub.endpoint]).returncode == 0
    with moto_server(tmp_path) as s3:
        s3.bucket("sync-src")
        env = clean_env(**s3.env())
        assert run_hfcache(["push", "s3://sync-src/hf", "--lock", str(locks_dir / "a.lock"), "--cache-dir", str(seed)],
                           env=env).returncode == 0
        mark = s3.mark()
        proc = run_hfcache(["sync", "--locks", str(locks_dir), "--cache-dir", str(cache), "--bucket", "s3://sync-src/hf",
                            "--endpoint", "http://127.0.0.1:9", "--once", "--json"], env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["ok"]
        assert [r for r in s3.requests(mark) if "/blobs/" in r], "the bodies came from the bucket"
    loads = offline_load(cache, [REPOS["gpt2"]])
    assert "input_ids" in loads[REPOS["gpt2"]], loads
