"""hfcache verify (offline) and verify --repair on a warmed fixture cache with deliberate damage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
REQUESTS = [
    WarmRequest.parse("bert-base-uncased"),
    WarmRequest.parse("openai-community/gpt2"),
    WarmRequest.parse("FacebookAI/roberta-base"),
    WarmRequest.parse("mistralai/Mistral-7B-v0.1"),
    WarmRequest.parse("sentence-transformers/all-MiniLM-L6-v2", kind="model"),
]


def warm_fixture_cache(cache: Path) -> None:
    with HubServer(HUB) as server:
        report = hfcache.warm(REQUESTS, cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos]


def snapshot_file(cache: Path, folder: str, path: str) -> Path:
    return next((cache / folder / "snapshots").iterdir()) / path


def blob_of(cache: Path, folder: str, path: str) -> Path:
    link = snapshot_file(cache, folder, path)
    return (link.parent / os.readlink(link)).resolve()


def verify_json(cache: Path, *args: str) -> tuple[int, dict]:
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json", *args])
    return proc.returncode, json.loads(proc.stdout)


def inventory(cache: Path) -> dict[str, tuple[int, int]]:
    """blob path -> (inode, mtime_ns): what must not change for healthy files."""
    return {str(p.relative_to(cache)): (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in cache.glob("*/blobs/*")}


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def damage_flip(cache, outside):
    flip_byte(blob_of(cache, "models--openai-community--gpt2", "vocab.json"))
    return "openai-community/gpt2", "blob_mismatch"


def damage_truncate(cache, outside):
    blob = blob_of(cache, "models--openai-community--gpt2", "merges.txt")
    blob.write_bytes(blob.read_bytes()[:-100])
    return "openai-community/gpt2", "blob_mismatch"


def damage_append(cache, outside):
    blob = blob_of(cache, "models--mistralai--Mistral-7B-v0.1", "tokenizer.model")
    with open(blob, "ab") as f:
        f.write(b"\0")
    return "mistralai/Mistral-7B-v0.1", "blob_mismatch"


def damage_delete(cache, outside):
    blob_of(cache, "models--FacebookAI--roberta-base", "tokenizer.json").unlink()
    return "FacebookAI/roberta-base", "link_broken"


def damage_symlink_outside(cache, outside):
    blob = blob_of(cache, "models--openai-community--gpt2", "config.json")
    outside.write_bytes(blob.read_bytes())  # same bytes, but outside the cache: still not trusted
    blob.unlink()
    blob.symlink_to(outside)
    return "openai-community/gpt2", "blob_not_file"


def damage_ref_newline(cache, outside):
    ref = cache / "models--FacebookAI--roberta-base" / "refs" / "main"
    ref.write_text(ref.read_text() + "\n")
    return "FacebookAI/roberta-base", "ref_malformed"


def damage_absolute_link(cache, outside):
    link = snapshot_file(cache, "models--sentence-transformers--all-MiniLM-L6-v2", "1_Pooling/config.json")
    target = (link.parent / os.readlink(link)).resolve()
    link.unlink()
    link.symlink_to(target)
    return "sentence-transformers/all-MiniLM-L6-v2", "link_absolute"


DAMAGES = [damage_flip, damage_truncate, damage_append, damage_delete, damage_symlink_outside, damage_ref_newline,
           damage_absolute_link]


@pytest.fixture
def fixture_cache(tmp_path) -> Path:
    cache = tmp_path / "cache"
    warm_fixture_cache(cache)
    return cache


def test_healthy_cache_verifies_without_false_alarm_and_without_requests(fixture_cache):
    with HubServer(HUB) as server:
        code, report = verify_json(fixture_cache, "--endpoint", server.endpoint)
        assert server.requests == []  # no --repair: zero HTTP requests
    assert code == 0 and report["ok"] and report["problems"] == []
    assert report["blobs_hashed"] > 0 and report["bytes_hashed"] > 1_000_000


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.__name__ for d in DAMAGES])
def test_damage_is_named_offline_and_repair_fixes_only_it(fixture_cache, tmp_path, damage):
    outside = tmp_path / "outside.bin"
    healthy_before = inventory(fixture_cache)
    repo_id, kind = damage(fixture_cache, outside)
    damaged_now = inventory(fixture_cache)
    untouched = {k for k in healthy_before if damaged_now.get(k) == healthy_before[k]}

    # Server stopped: verify works offline and names the problem.
    code, report = verify_json(fixture_cache)
    assert code == 1
    named = [(p["repo_id"], p["kind"]) for p in report["problems"] if p["error"]]
    assert (repo_id, kind) in named, report["problems"]
    assert report["problems"] == sorted(report["problems"], key=lambda p: (p["repo_id"], p["revision"], p["path"],
                                                                           p["kind"], p["detail"]))

    with HubServer(HUB) as server:
        code, repaired = verify_json(fixture_cache, "--repair", "--endpoint", server.endpoint)
    assert code == 0, repaired
    assert repaired["ok"] and [p for p in repaired["problems"] if p["error"]] == []
    assert repaired["repairs"] and all(a["ok"] for a in repaired["repairs"])
    after = inventory(fixture_cache)
    for key in untouched:  # healthy blobs: same inode, same mtime
        assert after.get(key) == healthy_before[key], key
    assert not outside.exists() or outside.read_bytes()  # never deleted or written through
    assert scan_cache_dir(fixture_cache).warnings == []
    assert verify_json(fixture_cache)[0] == 0


@pytest.mark.slow
def test_repaired_cache_loads_offline(fixture_cache, tmp_path):
    for damage in DAMAGES:
        damage(fixture_cache, tmp_path / "outside.bin")
    assert verify_json(fixture_cache)[0] == 1
    with HubServer(HUB) as server:
        code, repaired = verify_json(fixture_cache, "--repair", "--endpoint", server.endpoint)
    assert code == 0, repaired["problems"]
    loaded = offline_load(fixture_cache, ["openai-community/gpt2", "FacebookAI/roberta-base",
                                          "mistralai/Mistral-7B-v0.1"])
    assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")
    assert loaded["FacebookAI/roberta-base"]["input_ids"] == golden_ids("FacebookAI/roberta-base")
    assert loaded["mistralai/Mistral-7B-v0.1"]["input_ids"] == golden_ids("mistralai/Mistral-7B-v0.1")


def test_verify_never_reads_through_a_symlink_outside_the_cache(fixture_cache, tmp_path):
    outside = tmp_path / "secret.txt"
    damage_symlink_outside(fixture_cache, outside)
    outside.write_bytes(b"x" * 10)
    code, report = verify_json(fixture_cache)
    assert code == 1
    assert outside.read_bytes() == b"x" * 10
    # Only regular blobs inside the cache were hashed: the 10 bytes behind the link were not read.
    assert report["bytes_hashed"] == sum({p.lstat().st_ino: p.lstat().st_size for p in fixture_cache.glob("*/blobs/*")
                                          if not p.is_symlink()}.values())


def test_cache_written_without_symlinks_verifies(tmp_path):
    # hfcache with HF_HUB_DISABLE_SYMLINKS=1 (real files, hardlinked to blobs) ...
    cache = tmp_path / "hfcache"
    with HubServer(HUB) as server:
        proc = run_hfcache(["warm", "gpt2", "FacebookAI/roberta-base", "--cache-dir", str(cache), "--endpoint",
                            server.endpoint], env=clean_env(HF_HUB_DISABLE_SYMLINKS="1"))
        assert proc.returncode == 0, proc.stderr
        # ... and huggingface_hub's own snapshot_download with symlinks disabled (real files, empty blobs/).
        hf_cache = tmp_path / "hf"
        script = ("import sys; from huggingface_hub import snapshot_download; "
                  "snapshot_download('openai-community/gpt2', cache_dir=sys.argv[1], endpoint=sys.argv[2])")
        subprocess.run([sys.executable, "-c", script, str(hf_cache), server.endpoint], check=True,
                       env=clean_env(HF_HUB_DISABLE_SYMLINKS="1"), capture_output=True)
    assert not any(p.is_symlink() for p in cache.rglob("*"))
    code, report = verify_json(cache)
    assert code == 0, report["problems"]
    assert {p["kind"] for p in report["problems"]} == {"no_symlinks"}
    code, report = verify_json(hf_cache)
    assert code == 0, report["problems"]
    assert "no_symlinks" in {p["kind"] for p in report["problems"]}
    assert report["bytes_hashed"] > 0  # checked against huggingface_hub's trees/<commit>.json listing
    # Damage a real file: the trees/ listing catches it.
    real = next(hf_cache.glob("models--openai-community--gpt2/snapshots/*/vocab.json"))
    flip_byte(real)
    code, report = verify_json(hf_cache)
    assert code == 1 and ("openai-community/gpt2", "file_mismatch") in {(p["repo_id"], p["kind"])
                                                                          for p in report["problems"]}


def test_lock_lists_missing_and_unlisted_files(fixture_cache, tmp_path):
    with HubServer(HUB) as server:
        (tmp_path / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "gpt2"\n'
                                               '[[repos]]\nrepo_id = "FacebookAI/roberta-base"\n')
        assert run_hfcache(["lock"], cwd=tmp_path).returncode == 0
    lock = str(tmp_path / "hfcache.lock")
    # gpt2 (legacy id) was never warmed under that name: every locked file is missing.
    code, report = verify_json(fixture_cache, "--lock", lock, "gpt2", "FacebookAI/roberta-base")
    assert code == 1
    kinds = {(p["repo_id"], p["kind"]) for p in report["problems"]}
    assert ("gpt2", "file_missing") in kinds
    assert ("FacebookAI/roberta-base", "file_missing") not in kinds
    extra = snapshot_file(fixture_cache, "models--FacebookAI--roberta-base", "extra.txt")
    extra.symlink_to(os.readlink(snapshot_file(fixture_cache, "models--FacebookAI--roberta-base", "merges.txt")))
    code, report = verify_json(fixture_cache, "--lock", lock, "FacebookAI/roberta-base")
    assert code == 0  # reported, not an error
    assert [(p["path"], p["kind"], p["error"]) for p in report["problems"]] == [("extra.txt", "file_unlisted", False)]


def test_leftover_incomplete_is_reported_not_an_error(fixture_cache):
    (fixture_cache / "models--openai-community--gpt2" / "blobs" / "abc.deadbeef.incomplete").write_bytes(b"x")
    code, report = verify_json(fixture_cache)
    assert code == 0
    assert [(p["kind"], p["error"]) for p in report["problems"]] == [("incomplete", False)]


def test_blob_mismatch_names_the_files_that_use_the_blob(fixture_cache):
    """A corrupt blob is named by the snapshot entries that link to it (repo, revision, path), not only by its hash."""
    flip_byte(blob_of(fixture_cache, "models--openai-community--gpt2", "vocab.json"))
    code, report = verify_json(fixture_cache)
    assert code == 1
    [problem] = [p for p in report["problems"] if p["kind"] == "blob_mismatch"]
    assert problem["linked_from"] == ["openai-community/gpt2@main:vocab.json"]
    people = run_hfcache(["verify", "--cache-dir", str(fixture_cache)])
    assert people.returncode == 1 and people.stderr == ""  # the report is the result: stdout
    assert "used by openai-community/gpt2@main:vocab.json" in people.stdout
    assert "distinct blobs" in people.stdout and "\n│" in people.stdout  # the table and the summary


def test_fast_skips_only_blobs_unchanged_since_a_recorded_run(fixture_cache):
    """verify --fast (goal P3 of docs/benchmarks.md): the default hashes every blob and writes nothing; a --fast run records what
    hashed right under .locks/ (invisible to huggingface_hub's scan and to ls); the next --fast run skips exactly
    the blobs whose inode, size, mtime and ctime are unchanged, so a rewrite is caught even with its mtime put back."""
    record = fixture_cache / ".locks" / "hfcache-verified.json"
    code, plain = verify_json(fixture_cache)
    assert code == 0 and plain["blobs_skipped"] == 0 and not record.exists()
    code, first = verify_json(fixture_cache, "--fast")
    assert code == 0 and first["blobs_skipped"] == 0 and first["blobs_hashed"] == plain["blobs_hashed"]
    assert record.is_file()
    code, second = verify_json(fixture_cache, "--fast")
    assert code == 0 and second["blobs_hashed"] == 0 and second["blobs_skipped"] == plain["blobs_hashed"]

    blob = blob_of(fixture_cache, "models--openai-community--gpt2", "vocab.json")
    before = blob.stat()
    flip_byte(blob)
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size, same mtime: only ctime moved
    code, third = verify_json(fixture_cache, "--fast")
    assert code == 1 and third["blobs_hashed"] == 1 and third["blobs_skipped"] == plain["blobs_hashed"] - 1
    assert [(p["repo_id"], p["kind"]) for p in third["problems"]] == [("openai-community/gpt2", "blob_mismatch")]
    code, fourth = verify_json(fixture_cache, "--fast")  # a bad blob is never recorded as good
    assert code == 1 and fourth["blobs_hashed"] == 1

    assert not scan_cache_dir(fixture_cache).warnings  # the record is not a repo to huggingface_hub
    listing = json.loads(run_hfcache(["ls", "--cache-dir", str(fixture_cache), "--json"]).stdout)
    assert all(not r["folder"].startswith(".") for r in listing["repos"])


def test_fast_with_a_corrupt_record_hashes_everything(fixture_cache):
    record = fixture_cache / ".locks" / "hfcache-verified.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text('{"version": 1, "blobs": [[1, 2, "x"]]}')
    code, report = verify_json(fixture_cache, "--fast")
    assert code == 0 and report["blobs_skipped"] == 0 and report["blobs_hashed"] > 0


def test_fast_never_follows_a_planted_record_link(fixture_cache, tmp_path):
    """A record that is a link (to a file of another user, say) is neither read nor written through."""
    outside = tmp_path / "outside.json"
    code, first = verify_json(fixture_cache, "--fast")
    record = fixture_cache / ".locks" / "hfcache-verified.json"
    outside.write_bytes(record.read_bytes())  # a valid record, reachable only through the link
    record.unlink()
    record.symlink_to(outside)
    code, report = verify_json(fixture_cache, "--fast")
    assert code == 0 and report["blobs_skipped"] == 0  # not read through the link
    assert outside.read_bytes() != b"" and not record.is_symlink()  # replaced by a file, the target untouched
    assert json.loads(outside.read_text()) == json.loads(record.read_text())
