"""Untrusted caches, second round (docs/security.md): readers of cache files (doctor, check, export, verify, ls) and warm's writers never act
outside the cache, never block on a FIFO or device, and never launder a broken revision.

Hostile parts are planted in tmp dirs; every command runs as a real subprocess (a timeout is a hang); each test
asserts the exit code, the one-line message, and that the canary folder outside the cache is byte-for-byte unchanged
with no new file in it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import hfcache
from hfcache.cache.layout import RepoFolder
from tests.helpers import run_hfcache
from tests.untrusted import FOLDER, REPO, make_canary, tree_state, verify, warm_two

#: Generous: a hang is what is tested; the machine is shared.
T = 120


def snapshot_of(cache: Path) -> Path:
    commit = (cache / FOLDER / "refs" / "main").read_text()
    return cache / FOLDER / "snapshots" / commit


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------- 1: FIFOs and devices in a snapshot

@pytest.mark.slow
@pytest.mark.parametrize("plant", ["fifo", "devzero"])
def test_doctor_check_verify_export_never_block_on_a_fifo_or_device(tmp_path: Path, plant: str) -> None:
    cache = tmp_path / "cache"
    warm_two(cache)
    config = snapshot_of(cache) / "config.json"
    config.unlink()
    if plant == "fifo":
        os.mkfifo(config)
    else:
        config.symlink_to("/dev/zero")
    c = str(cache)

    doctor = run_hfcache(["doctor", "--cache-dir", c, "--json"], timeout=T)
    assert doctor.returncode in (0, 1), doctor.stderr
    json.loads(doctor.stdout)  # finished, and reported

    check = run_hfcache(["check", REPO, "--cache-dir", c, "--json"], timeout=T)
    assert check.returncode == 1, check.stderr
    result = next(r for r in json.loads(check.stdout)["tokenizers"] if r["repo_id"] == REPO)
    assert "unsafe cache layout" in result["error"]
    assert ("not a regular file" if plant == "fifo" else "absolute link") in result["cause"]

    code, doc = verify(cache)
    assert code == 1
    kinds = {(p["path"], p["kind"]) for p in doc["problems"] if p["error"]}
    assert ("config.json", "unsafe_layout" if plant == "fifo" else "link_absolute") in kinds, kinds

    export = run_hfcache(["export", str(tmp_path / "E"), REPO, "--cache-dir", c], timeout=T)
    assert export.returncode == 5, export.stderr
    expected = "unsafe cache layout, nothing exported" if plant == "fifo" else "broken entry config.json (absolute)"
    assert expected in export.stderr and "config.json" in export.stderr, export.stderr
    assert not (tmp_path / "E").exists()


# ----------------------------------------------------------------- 1, 2: doctor and planted links around it

@pytest.mark.slow
@pytest.mark.parametrize("part", ["blobs", "snapshots", ".locks"])
def test_doctor_reports_a_planted_link_and_never_writes_through_it(tmp_path: Path, part: str) -> None:
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    warm_two(cache)
    link = cache / part if part == ".locks" else cache / FOLDER / part
    target = canary / part.lstrip(".")
    link.rename(target)
    link.symlink_to(target, target_is_directory=True)
    before = tree_state(canary)

    proc = run_hfcache(["doctor", "--cache-dir", str(cache), "--json"], timeout=T)
    assert proc.returncode == 1, proc.stderr
    findings = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "cache.unsafe_layout"]
    assert findings and findings[0]["severity"] == "error", json.loads(proc.stdout)["findings"]
    assert "a symlink" in findings[0]["message"] or "symlink or not a folder" in findings[0]["message"]
    assert tree_state(canary) == before  # no .hfcache-doctor-* probe created (and removed) in there


# ------------------------------------------------------------------ 3: a blobs/ swapped for a link while warm runs

def test_open_incomplete_and_publish_stay_in_the_blobs_folder_they_opened(tmp_path: Path) -> None:
    """The primitive: once open_incomplete has its blobs/ fd, swapping blobs/ for a link changes nothing."""
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    cache.mkdir()
    folder = RepoFolder(cache, REPO)
    etag = "a" * 40
    incomplete, out = folder.open_incomplete(etag)
    with out:
        out.write(b"content")
    real = cache / FOLDER / "blobs-moved"
    (cache / FOLDER / "blobs").rename(real)
    (cache / FOLDER / "blobs").symlink_to(canary, target_is_directory=True)
    before = tree_state(canary)
    folder.publish_blob(incomplete, etag)
    incomplete.unlink(missing_ok=True)
    assert tree_state(canary) == before
    assert (real / etag).read_bytes() == b"content"
    assert os.fspath(incomplete).startswith(str(cache))
    # Every later write meets the planted link and refuses it.
    with pytest.raises(hfcache.cache.safefs.UnsafeLayout, match="a symlink"):
        folder.open_incomplete(etag)
    with pytest.raises(hfcache.cache.safefs.UnsafeLayout):
        folder.link("b" * 40, "config.json", etag)
    assert tree_state(canary) == before


# ----------------------------------------------------- 4, 5, 6: symlinked snapshot, marker folder and ref

@pytest.mark.slow
@pytest.mark.parametrize("part", ["snapshots/<commit>", ".no_exist/<commit>", "refs/main"])
def test_a_symlinked_snapshot_marker_folder_or_ref_is_unsafe_everywhere(tmp_path: Path, part: str) -> None:
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    warm_two(cache)
    commit = (cache / FOLDER / "refs" / "main").read_text()
    link = cache / FOLDER / part.replace("<commit>", commit)
    if part == ".no_exist/<commit>":
        assert link.is_dir(), "the fixture repo has .no_exist markers"
    target = canary / "moved"
    link.rename(target)
    link.symlink_to(target, target_is_directory=target.is_dir())
    before = tree_state(canary)
    c = str(cache)

    check = run_hfcache(["check", REPO, "--cache-dir", c, "--json"], timeout=T)
    assert check.returncode == 1, check.stderr
    result = next(r for r in json.loads(check.stdout)["tokenizers"] if r["repo_id"] == REPO)
    assert result["error"] == "not loaded: unsafe cache layout" and "a symlink" in result["cause"]

    export = run_hfcache(["export", str(tmp_path / "E"), "--cache-dir", c], timeout=T)
    assert export.returncode == 5, export.stderr
    assert "unsafe cache layout, nothing exported" in export.stderr and FOLDER in export.stderr
    assert not (tmp_path / "E").exists()

    code, doc = verify(cache)
    assert code == 1 and (REPO, "unsafe_layout") in {(p["repo_id"], p["kind"]) for p in doc["problems"]}
    ls = run_hfcache(["ls", "--cache-dir", c, "--json"], timeout=T)
    assert ls.returncode == 0 and "a symlink" in json.dumps(ls.stdout)
    repair = run_hfcache(["verify", "--repair", "--cache-dir", c, "--json"], timeout=T)
    assert repair.returncode == 1, repair.stderr
    assert tree_state(canary) == before

    link.unlink()
    target.rename(link)
    assert verify(cache)[0] == 0


# ------------------------------------------------------------------------------- 7: export never launders

@pytest.mark.slow
def test_export_refuses_a_revision_that_lost_a_recorded_file_and_carries_the_record(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm_two(cache)
    good = run_hfcache(["export", str(tmp_path / "good"), "--cache-dir", str(cache)], timeout=T)
    assert good.returncode == 0, good.stderr
    # The record travels: verify on the export knows the expected files, and huggingface_hub is not bothered.
    records = list((tmp_path / "good" / ".locks" / FOLDER / "hfcache").glob("*.json"))
    assert len(records) == 1
    assert not scan_cache_dir(tmp_path / "good").warnings
    assert verify(tmp_path / "good")[0] == 0
    (snapshot_of(tmp_path / "good") / "tokenizer_config.json").unlink()
    code, doc = verify(tmp_path / "good")
    assert code == 1 and ("tokenizer_config.json", "file_missing") in {(p["path"], p["kind"]) for p in doc["problems"]}

    (snapshot_of(cache) / "config.json").unlink()
    assert verify(cache)[0] == 1
    proc = run_hfcache(["export", str(tmp_path / "E"), REPO, "--cache-dir", str(cache)], timeout=T)
    assert proc.returncode == 5, proc.stderr
    assert "lost config.json" in last_line(proc.stderr) or "lost config.json" in proc.stderr
    assert not (tmp_path / "E").exists()
    tar = run_hfcache(["export", str(tmp_path / "E.tar"), REPO, "--cache-dir", str(cache), "--format", "tar"],
                      timeout=T)
    assert tar.returncode == 5 and not (tmp_path / "E.tar").exists()
