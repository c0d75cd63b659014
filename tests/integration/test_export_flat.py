"""``export DEST REPO@REV --flat``: one revision's files as real files at DEST, for runtimes that take a folder path
(vLLM, TGI ``--model-id /models/x``): hashed on the way, idempotent, never merged into another folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import HUB, golden_ids, offline_load, run_hfcache, warm
from tests.testhub import HubServer

ST = "sentence-transformers/all-MiniLM-L6-v2"  # files in a subfolder (1_Pooling/config.json)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("flat") / "cache"
    warm(cache, "openai-community/gpt2")
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(ST, kind="all")], cache_dir=cache, endpoint=server.endpoint,
                              token=False)
    assert report.ok
    return cache


def flat(cache: Path, dest: Path, spec: str, *extra: str):
    return run_hfcache(["export", str(dest), spec, "--flat", "--cache-dir", str(cache), *extra])


def test_a_revision_as_real_files_at_dest_rerun_is_a_no_op(cache, tmp_path):
    dest = tmp_path / "models" / "gpt2"
    proc = flat(cache, dest, "openai-community/gpt2@main", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    snapshot = next((cache / "models--openai-community--gpt2" / "snapshots").iterdir())
    expected = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    assert report["repo"] == f"openai-community/gpt2@{snapshot.name}" and report["unchanged"] is False
    assert report["files"] == expected == sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
    for path in expected:
        assert not (dest / path).is_symlink() and (dest / path).stat().st_nlink == 1
        assert (dest / path).read_bytes() == (snapshot / path).read_bytes()
    assert report["bytes"] == sum((dest / p).stat().st_size for p in expected)
    # a runtime given the folder path loads it as a local model folder, offline
    loaded = offline_load(cache, [str(dest)])
    assert loaded[str(dest)]["input_ids"] == golden_ids("openai-community/gpt2")

    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*")}
    again = flat(cache, dest, "openai-community/gpt2")  # bare id: its main
    assert again.returncode == 0 and "already holds the" in again.stdout, again.stderr
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*")} == before


def test_subfolders_and_a_changed_or_foreign_dest_is_refused(cache, tmp_path):
    dest = tmp_path / "st"
    assert flat(cache, dest, ST).returncode == 0
    assert (dest / "1_Pooling" / "config.json").read_bytes() == (HUB / ST / "1_Pooling" / "config.json").read_bytes()
    (dest / "vocab.txt").write_text("changed\n")
    refused = flat(cache, dest, ST)
    assert refused.returncode == 2 and "holds other files than" in refused.stderr, refused.stderr
    assert (dest / "vocab.txt").read_text() == "changed\n"  # never merged into


@pytest.mark.parametrize("args", [["openai-community/gpt2", ST], [], ["openai-community/gpt2", "--format", "tar"]])
def test_flat_takes_one_repo_and_a_folder(cache, tmp_path, args):
    proc = run_hfcache(["export", str(tmp_path / "x"), *args, "--flat", "--cache-dir", str(cache)])
    assert proc.returncode == 2 and "--flat takes one" in proc.stderr and not (tmp_path / "x").exists()


def test_a_blob_that_does_not_match_its_name_is_never_exported(cache, tmp_path):
    copy = tmp_path / "cache"
    warm(copy, "openai-community/gpt2")
    blob = max((copy / "models--openai-community--gpt2" / "blobs").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    blob.write_bytes(bytes(data))
    proc = flat(copy, tmp_path / "out", "openai-community/gpt2")
    assert proc.returncode == 5 and "does not match its blob name" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
