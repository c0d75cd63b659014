"""hfcache prune on a warmed fixture cache plus synthetic repos of known sizes and ages.

Prunes are real ``python -m hfcache prune`` processes (plus the Python API where that is the point). Every test that
removes something ends with :func:`assert_healthy`: ``hfcache verify`` (a real process) passes, huggingface_hub's own
``scan_cache_dir`` does not complain, no snapshot link dangles, and the tokenizers the test pinned (or kept) still
load offline in a fresh transformers process.

Last use is measured on caches whose atimes never change: every blob's atime is set to 0 (as on a ``noatime`` mount
or a read-only image layer), so only the snapshot folder and ref mtimes can drive the decisions.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
EXAMPLES = Path(__file__).parent.parent.parent / "examples"
DAY = 86400
KIB = 1024
FIXTURE_REPOS = ["bert-base-uncased", "openai-community/gpt2", "FacebookAI/roberta-base"]

#: Holds a download lock the way huggingface_hub does while it downloads a blob, until stdin closes.
HOLD_LOCK = (
    "import sys\n"
    "from huggingface_hub.utils import WeakFileLock\n"
    "with WeakFileLock(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


# ------------------------------------------------------------------------------------------------ cache builders


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


def folder_of(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def warm_fixture(cache: Path, repos=FIXTURE_REPOS) -> None:
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(r) for r in repos], cache_dir=cache, endpoint=server.endpoint,
                              token=False)
    assert report.ok, [r.error for r in report.repos]


def add_revision(cache: Path, repo_id: str, seed: str, files: dict[str, bytes], refs=(), no_exist=(),
                 tree: bool = False) -> str:
    """Write one revision in huggingface_hub's layout: blobs named by git sha1, relative links, refs, markers."""
    folder = folder_of(cache, repo_id)
    commit = hashlib.sha1(seed.encode()).hexdigest()
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    listing = {}
    for path, data in files.items():
        etag = git_sha1(data)
        blob = folder / "blobs" / etag
        if not blob.exists():
            blob.write_bytes(data)
        link = folder / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        listing[path] = {"size": len(data), "blob_id": etag}
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    for name in no_exist:
        (folder / ".no_exist" / commit / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / ".no_exist" / commit / name).touch()
    if tree:
        (folder / "trees").mkdir(exist_ok=True)
        (folder / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    return commit


def unique_files(tag: str, size: int, count: int = 1) -> dict[str, bytes]:
    """``count`` files whose contents are unique to ``tag``, ``size`` bytes in total."""
    each = size // count
    return {f"file{i}.bin": (f"{tag}/{i}:".encode() * each)[:each] for i in range(count)}


def set_last_use(cache: Path, repo_id: str, commit: str, when: float) -> None:
    """Set a revision's snapshot folder and refs mtimes to ``when`` (its blob atimes are left as they are)."""
    folder = folder_of(cache, repo_id)
    os.utime(folder / "snapshots" / commit, (when, when))
    for ref in (folder / "refs").rglob("*") if (folder / "refs").exists() else ():
        if ref.is_file() and ref.read_text().strip() == commit:
            os.utime(ref, (when, when))


def freeze_atimes(cache: Path) -> None:
    """atime 0 on every blob (mtime kept): a cache where reads are never recorded (noatime, read-only layers)."""
    for blob in cache.glob("*/blobs/*"):
        st = blob.lstat()
        os.utime(blob, ns=(0, st.st_mtime_ns), follow_symlinks=False)


def commit_of(cache: Path, repo_id: str, ref: str = "main") -> str:
    return (folder_of(cache, repo_id) / "refs" / ref).read_text()


def tree(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for p in cache.rglob("*")}


# ------------------------------------------------------------------------------------------------ running and checking


def prune_json(cache: Path, *args: str, dry_run: bool = False) -> dict:
    proc = run_hfcache(["prune", "--cache-dir", str(cache), "--json", "--dry-run" if dry_run else "--yes", *args])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def removed_revisions(document: dict) -> list[tuple[str, str]]:
    return [(r["repo_id"], r["commit_hash"]) for r in document["revisions"]]


def dangling_links(cache: Path) -> list[str]:
    return [str(p) for p in cache.glob("*/snapshots/**/*") if p.is_symlink() and not p.exists()]


def assert_healthy(cache: Path, loads: dict[str, str] | None = None) -> None:
    """verify passes (a real process), scan_cache_dir is happy, no link dangles, ``loads`` load offline.

    Args:
        loads: repo id to load -> the golden repo whose input ids it must produce.
    """
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"], report["problems"]
    assert dangling_links(cache) == []
    assert scan_cache_dir(cache).warnings == []
    if loads:
        loaded = offline_load(cache, list(loads))
        for repo_id, golden in loads.items():
            assert loaded[repo_id].get("input_ids") == golden_ids(golden), loaded[repo_id]


@pytest.fixture(scope="module")
def bert_lock(tmp_path_factory) -> Path:
    """An hfcache.lock pinning bert-base-uncased (its legacy folder and google-bert/bert-base-uncased)."""
    tmp = tmp_path_factory.mktemp("lock")
    with HubServer(HUB) as server:
        (tmp / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "bert-base-uncased"\n')
        proc = run_hfcache(["lock"], cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return tmp / "hfcache.lock"


@pytest.fixture
def cache(tmp_path) -> Path:
    path = tmp_path / "cache"
    warm_fixture(path)
    return path


# ------------------------------------------------------------------------------------------------ policies


def test_age_policy_follows_mtimes_when_atimes_never_change(cache):
    now = time.time()
    ages = {"synth/old": 40, "synth/mid": 20, "synth/new": 1, "synth/ref-touched": 40}
    commits = {}
    for repo_id, age in ages.items():
        commits[repo_id] = add_revision(cache, repo_id, repo_id, unique_files(repo_id, 10 * KIB, 3), refs=["main"])
        set_last_use(cache, repo_id, commits[repo_id], now - age * DAY)
    # An old snapshot whose ref was rewritten 2 days ago: the ref's mtime is a use.
    os.utime(folder_of(cache, "synth/ref-touched") / "refs" / "main", (now - 2 * DAY, now - 2 * DAY))
    freeze_atimes(cache)

    document = prune_json(cache, "--older-than", "30d")
    assert removed_revisions(document) == [("synth/old", commits["synth/old"])]
    assert {r["reason"] for r in document["revisions"]} == {"older_than"}
    assert not folder_of(cache, "synth/old").exists()
    assert all(blob.lstat().st_atime == 0 for blob in cache.glob("*/blobs/*"))  # prune itself records no use

    document = prune_json(cache, "--older-than", "10d")
    assert removed_revisions(document) == [("synth/mid", commits["synth/mid"])]
    # The warmed fixture repos were used just now (warm sets the snapshot mtime), the rest within 10 days.
    assert {r["repo_id"] for r in json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)
            ["repos"]} == {"synth/new", "synth/ref-touched", "bert-base-uncased", "google-bert/bert-base-uncased",
                           "openai-community/gpt2", "FacebookAI/roberta-base"}
    assert_healthy(cache, {"bert-base-uncased": "google-bert/bert-base-uncased",
                           "openai-community/gpt2": "openai-community/gpt2"})


def test_a_read_recorded_in_atime_counts_as_a_use(cache):
    now = time.time()
    commit = add_revision(cache, "synth/read", "read", unique_files("read", 4 * KIB), refs=["main"])
    set_last_use(cache, "synth/read", commit, now - 40 * DAY)
    freeze_atimes(cache)
    blob = next(folder_of(cache, "synth/read").glob("blobs/*"))
    os.utime(blob, (now - 3 * DAY, blob.lstat().st_mtime))  # where atime works, a read 3 days ago is a use
    assert prune_json(cache, "--older-than", "30d")["revisions"] == []
    assert folder_of(cache, "synth/read").exists()
    assert_healthy(cache)


def test_size_policy_removes_exactly_the_least_recently_used(cache):
    now = time.time()
    # Six synthetic revisions of 100 KiB each (unique contents), used 10, 9, ..., 5 days ago; one repo has two.
    expected_order = []
    for i, age in enumerate([10, 9, 8, 7, 6, 5]):
        repo_id = "synth/multi" if i in (1, 3) else f"synth/r{i}"
        ref = "v1" if i == 1 else "main"
        commit = add_revision(cache, repo_id, f"rev{i}", unique_files(f"rev{i}", 100 * KIB, 2), refs=[ref])
        set_last_use(cache, repo_id, commit, now - age * DAY)
        expected_order.append((repo_id, commit))
    freeze_atimes(cache)
    before = json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)["size_on_disk"]

    # 250 KiB over budget: the three least recently used revisions (300 KiB) must go, and nothing else.
    budget = before - 250 * KIB
    plan = prune_json(cache, "--max-size", str(budget), dry_run=True)
    assert removed_revisions(plan) == expected_order[:3]
    assert {r["reason"] for r in plan["revisions"]} == {"over_budget"}
    assert [r["bytes_freed"] for r in plan["revisions"]] == [100 * KIB] * 3
    assert plan["summary"]["bytes_kept"] == before - 300 * KIB <= budget and plan["summary"]["budget_met"]

    # Pinning the least recently used one moves the budget onto the next in line.
    pinned = prune_json(cache, "--max-size", str(budget), "--keep", "synth/r0", dry_run=True)
    assert removed_revisions(pinned) == expected_order[1:4]

    document = prune_json(cache, "--max-size", f"{budget}B")
    assert removed_revisions(document) == expected_order[:3]
    assert document["result"]["removed"] == len(document["items"]) and document["result"]["failed"] == 0
    multi = folder_of(cache, "synth/multi")
    assert not (multi / "refs" / "v1").exists() and (multi / "refs" / "main").exists()  # one revision of two
    after = json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)["size_on_disk"]
    assert after == before - 300 * KIB
    assert_healthy(cache)


def test_pins_from_a_lock_and_keep_survive_an_impossible_budget(cache, bert_lock):
    gpt2 = commit_of(cache, "openai-community/gpt2")
    document = prune_json(cache, "--max-size", "0", "--keep-lock", str(bert_lock), "--keep", "openai-community/gpt2",
                          "--keep", "nobody/nothing")
    pinned = {(p["repo_id"], p["commit_hash"]) for p in document["pinned"]}
    bert = commit_of(cache, "bert-base-uncased")
    assert pinned == {("bert-base-uncased", bert), ("google-bert/bert-base-uncased", bert),
                      ("openai-community/gpt2", gpt2)}
    assert {r["repo_id"] for r in document["revisions"]} == {"FacebookAI/roberta-base"}
    summary = document["summary"]
    assert not summary["budget_met"] and summary["revisions_pinned"] == 3 and summary["bytes_kept"] > 0
    assert summary["bytes_kept"] == summary["bytes_pinned"]  # everything left is pinned
    assert any("cannot reach --max-size" in w for w in document["warnings"])
    assert any("--keep nobody/nothing: no such repo" in w for w in document["warnings"])
    assert not folder_of(cache, "FacebookAI/roberta-base").exists()
    assert_healthy(cache, {"bert-base-uncased": "google-bert/bert-base-uncased",
                           "openai-community/gpt2": "openai-community/gpt2"})


def test_keep_a_ref_or_a_commit(cache):
    now = time.time()
    old = add_revision(cache, "synth/two", "two-old", unique_files("two-old", 8 * KIB), refs=["v1"])
    new = add_revision(cache, "synth/two", "two-new", unique_files("two-new", 8 * KIB), refs=["main"])
    for commit in (old, new):
        set_last_use(cache, "synth/two", commit, now - 50 * DAY)
    freeze_atimes(cache)
    plan = prune_json(cache, "--older-than", "30d", "--keep", "synth/two@main", dry_run=True)
    assert removed_revisions(plan) == [("synth/two", old)]
    plan = prune_json(cache, "--older-than", "30d", "--keep", f"synth/two@{old}", dry_run=True)
    assert removed_revisions(plan) == [("synth/two", new)]
    plan = prune_json(cache, "--older-than", "30d", "--keep", "synth/two@v2", dry_run=True)
    assert len(plan["revisions"]) == 2 and any("no revision or ref 'v2'" in w for w in plan["warnings"])


def test_detached_revisions_orphan_blobs_and_their_leftovers(cache):
    gpt2 = folder_of(cache, "openai-community/gpt2")
    main = commit_of(cache, "openai-community/gpt2")
    shared = (gpt2 / "snapshots" / main / "config.json").read_bytes()  # also used by main: must stay
    old = add_revision(cache, "openai-community/gpt2", "gpt2-old",
                       {"config.json": shared, "vocab.json": b'{"old": 1}'}, no_exist=["chat_template.jinja"],
                       tree=True)
    os.utime(gpt2 / "snapshots" / old, (time.time() - 2 * DAY,) * 2)
    old_vocab = git_sha1(b'{"old": 1}')
    (cache / ".locks" / gpt2.name / f"{old_vocab}.lock").touch()  # huggingface_hub leaves lock files behind
    orphan = b"nobody links to me"
    (gpt2 / "blobs" / git_sha1(orphan)).write_bytes(orphan)
    # A revision detached less than an hour ago is kept: it may be a download by commit hash in progress.
    fresh = add_revision(cache, "openai-community/gpt2", "gpt2-fresh", {"vocab.json": b'{"fresh": 1}'})
    freeze_atimes(cache)

    document = prune_json(cache)
    assert removed_revisions(document) == [("openai-community/gpt2", old)]
    assert document["revisions"][0]["reason"] == "detached"
    kinds = sorted((i["kind"], i["reason"], i["path"].split("/", 1)[1]) for i in document["items"])
    assert kinds == sorted([
        ("snapshot", "detached", f"snapshots/{old}"),
        ("no_exist", "detached", f".no_exist/{old}"),
        ("tree", "detached", f"trees/{old}.json"),
        ("blob", "unused", f"blobs/{old_vocab}"),
        ("lock", "unused", f"{gpt2.name}/{old_vocab}.lock"),
        ("blob", "orphan", f"blobs/{git_sha1(orphan)}"),
    ])
    assert document["summary"]["bytes_freed"] == len(b'{"old": 1}') + len(orphan)
    assert (gpt2 / "blobs" / git_sha1(shared)).exists() and (gpt2 / "snapshots" / fresh).exists()
    assert sorted(p.name for p in (gpt2 / "snapshots").iterdir()) == sorted([main, fresh])
    assert not (cache / ".locks" / gpt2.name / f"{old_vocab}.lock").exists()
    assert not (gpt2 / ".hfcache-trash").exists()
    assert_healthy(cache, {"openai-community/gpt2": "openai-community/gpt2"})


def test_a_malformed_ref_still_pins_its_revision(cache):
    roberta = folder_of(cache, "FacebookAI/roberta-base")
    ref = roberta / "refs" / "main"
    ref.write_text(ref.read_text() + "\n")  # hand-written: breaks offline loads, but says what the user wants
    os.utime(next((roberta / "snapshots").iterdir()), (time.time() - 2 * DAY,) * 2)
    freeze_atimes(cache)
    os.utime(ref, (time.time() - 2 * DAY,) * 2)
    assert prune_json(cache, dry_run=True)["items"] == []


def test_stale_and_live_incomplete_files(cache):
    gpt2 = folder_of(cache, "openai-community/gpt2")
    locks = cache / ".locks" / gpt2.name
    two_hours_ago = time.time() - 2 * 3600
    names = {
        "dead": "a" * 40 + ".1a2b3c4d.incomplete",  # killed download: old, lock file not held
        "live": "b" * 40 + ".5e6f7a8b.incomplete",  # old but a live download holds its lock (stalled, slow)
        "fresh": "c" * 40 + ".9c0d1e2f.incomplete",  # written a minute ago, no lock file
        "legacy": "d" * 64 + ".incomplete",  # older huggingface_hub name, no lock file
    }
    for key, name in names.items():
        (gpt2 / "blobs" / name).write_bytes(key.encode() * 1000)
        if key != "fresh":
            os.utime(gpt2 / "blobs" / name, (two_hours_ago, two_hours_ago))
    for etag in ("a" * 40, "b" * 40):
        (locks / f"{etag}.lock").touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(locks / f"{'b' * 40}.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        document = prune_json(cache)
        removed = sorted(i["path"].rsplit("/", 1)[1] for i in document["items"])
        assert removed == sorted([names["dead"], names["legacy"], f"{'a' * 40}.lock"])
        assert {i["reason"] for i in document["items"]} == {"stale_incomplete"}
        assert document["summary"]["bytes_freed"] == 4000 + 6000
        assert (gpt2 / "blobs" / names["live"]).exists() and (gpt2 / "blobs" / names["fresh"]).exists()
        assert (locks / f"{'b' * 40}.lock").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # The download died: the next prune takes its leftovers.
    document = prune_json(cache)
    assert sorted(i["path"].rsplit("/", 1)[1] for i in document["items"]) == sorted(
        [names["live"], f"{'b' * 40}.lock"])
    assert (gpt2 / "blobs" / names["fresh"]).exists()
    (gpt2 / "blobs" / names["fresh"]).unlink()
    assert_healthy(cache)


def test_python_api_plan_is_frozen_and_a_stale_plan_finds_things_gone(cache, tmp_path):
    from dataclasses import FrozenInstanceError

    from hfcache.prune import execute, plan_prune

    now = time.time()
    commit = add_revision(cache, "synth/old", "old", unique_files("old", 8 * KIB, 2), refs=["main"])
    set_last_use(cache, "synth/old", commit, now - 60 * DAY)
    gpt2 = folder_of(cache, "openai-community/gpt2")
    vocab = gpt2 / "snapshots" / commit_of(cache, "openai-community/gpt2") / "vocab.json"
    outside = tmp_path / "exported-vocab.json"
    os.link(vocab.parent / os.readlink(vocab), outside)  # an export hardlinked the blob out of the cache
    freeze_atimes(cache)
    first = plan_prune(cache, older_than=30 * DAY, keep=["bert-base-uncased"], now=now)
    second = plan_prune(cache, older_than=30 * DAY, keep=["bert-base-uncased"], now=now)
    assert first == second
    with pytest.raises(FrozenInstanceError):
        first.items[0].path = "elsewhere"  # type: ignore[misc]
    result = execute(first)
    assert {o.status for o in result.outcomes} == {"removed"} and result.exit_code == 0
    assert result.bytes_freed == first.bytes_freed == 8 * KIB
    # A plan made before someone else pruned: nothing left to do, nothing forced.
    stale = execute(second)
    assert {o.status for o in stale.outcomes} == {"gone"} and stale.bytes_freed == 0
    assert_healthy(cache, {"bert-base-uncased": "google-bert/bert-base-uncased"})
    # Everything else goes, but the blob hardlinked outside the cache keeps its bytes on disk.
    everything = plan_prune(cache, max_size=0, now=now)
    vocab_size = outside.stat().st_size
    assert everything.bytes_freed == everything.bytes_before - vocab_size
    assert any("hardlinked outside the cache" in w for w in everything.warnings)
    blob_item = next(i for i in everything.items if i.path.endswith(os.readlink(vocab).rsplit("/", 1)[1])
                     and i.kind == "blob" and i.folder == gpt2.name)
    assert blob_item.bytes_freed == 0


def rich_cache(cache: Path) -> dict[str, str]:
    """The fixture cache plus one of everything prune removes; returns the commits created."""
    now = time.time()
    made = {}
    made["old"] = add_revision(cache, "synth/old", "old", unique_files("old", 30 * KIB, 3), refs=["main"],
                               no_exist=["config.json"], tree=True)
    set_last_use(cache, "synth/old", made["old"], now - 60 * DAY)
    made["detached"] = add_revision(cache, "synth/keep", "detached", unique_files("detached", 20 * KIB, 2))
    made["kept"] = add_revision(cache, "synth/keep", "kept", unique_files("kept", 20 * KIB, 2), refs=["main"])
    set_last_use(cache, "synth/keep", made["detached"], now - 3 * DAY)
    set_last_use(cache, "synth/keep", made["kept"], now - 3 * DAY)
    keep = folder_of(cache, "synth/keep")
    (keep / "blobs" / git_sha1(b"orphan")).write_bytes(b"orphan")
    stale = keep / "blobs" / ("e" * 40 + ".deadbeef.incomplete")
    stale.write_bytes(b"partial" * 100)
    os.utime(stale, (now - 5 * 3600,) * 2)
    empty = folder_of(cache, "synth/empty")  # a warm that failed before its first download, long ago
    (empty / "blobs").mkdir(parents=True)
    (empty / "snapshots").mkdir()
    for path in (empty / "blobs", empty / "snapshots", empty):
        os.utime(path, (now - 2 * DAY,) * 2)
    freeze_atimes(cache)
    return made


def test_dry_run_prints_exactly_what_a_real_run_then_removes(cache, bert_lock):
    made = rich_cache(cache)
    args = ("--older-than", "30d", "--keep-lock", str(bert_lock))
    before = tree(cache)
    stamps = {p: p.lstat().st_mtime_ns for p in cache.rglob("*")}
    plan = prune_json(cache, *args, dry_run=True)
    assert tree(cache) == before and {p: p.lstat().st_mtime_ns for p in cache.rglob("*")} == stamps
    people = run_hfcache(["prune", "--cache-dir", str(cache), "--dry-run", *args], env=clean_env(COLUMNS="200"))
    assert people.returncode == 0 and "dry run" in people.stdout and people.stderr == ""
    for revision in plan["revisions"]:
        assert revision["commit_hash"][:12] in people.stdout
    assert {r["commit_hash"] for r in plan["revisions"]} == {made["old"], made["detached"]}
    assert {i["reason"] for i in plan["items"]} >= {"older_than", "detached", "unused", "orphan",
                                                    "stale_incomplete", "empty"}

    done = prune_json(cache, *args)
    strip = [{k: v for k, v in item.items() if k not in ("status", "note")} for item in done["items"]]
    assert strip == plan["items"]
    assert done["revisions"] == [dict(r, status="removed") for r in plan["revisions"]]
    assert {i["status"] for i in done["items"]} == {"removed"}
    assert done["summary"] == plan["summary"] and done["result"]["bytes_freed"] == plan["summary"]["bytes_freed"]

    # What disappeared is exactly the planned paths and what was inside them (plus nothing else).
    gone = before - tree(cache)
    planned = {i["path"] for i in plan["items"]}
    assert planned <= gone
    assert all(any(p == q or p.startswith(q + "/") for q in planned) for p in gone), sorted(gone)
    # Nothing new but the repo locks prune takes, as warm does.
    folders = {i["path"].split("/")[0] for i in plan["items"] if not i["path"].startswith(".locks/")}
    assert tree(cache) - before <= {f".locks/{f}" for f in folders} | {f".locks/{f}/hfcache-repo.lock" for f in folders}
    assert prune_json(cache, *args)["items"] == []  # idempotent
    assert_healthy(cache, {"bert-base-uncased": "google-bert/bert-base-uncased"})


def test_interactive_prompt_on_stderr(cache):
    now = time.time()
    commit = add_revision(cache, "synth/old", "old", unique_files("old", 4 * KIB), refs=["main"])
    set_last_use(cache, "synth/old", commit, now - 60 * DAY)
    freeze_atimes(cache)
    for answer, exists in (("n\n", True), ("y\n", False)):
        terminal, stdin = pty.openpty()  # a person at a terminal: stdin is a tty
        proc = subprocess.Popen([sys.executable, "-m", "hfcache", "prune", "--cache-dir", str(cache), "--older-than",
                                 "30d"], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env(COLUMNS="200"))
        os.close(stdin)
        os.write(terminal, answer.encode())
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            os.close(terminal)
        assert proc.returncode == 0, err
        assert "Remove 1 revision(s)" in err and commit[:12] in out  # the plan is the result (stdout), the question not
        assert folder_of(cache, "synth/old").exists() == exists
        assert ("nothing removed" in err) == exists
    assert_healthy(cache)


def example_commands() -> dict[str, list[str]]:
    """The prune command lines of examples/crontab and examples/k8s/prune-cronjob.yaml (after ``hfcache prune``)."""
    line = next(line for line in (EXAMPLES / "crontab").read_text().splitlines()
                if not line.startswith("#") and "hfcache prune" in line)
    cron = shlex.split(line.split("hfcache prune", 1)[1].split(">>", 1)[0])
    yaml = (EXAMPLES / "k8s" / "prune-cronjob.yaml").read_text()
    block = yaml.split("command:", 1)[1].split("env:", 1)[0]
    k8s = re.findall(r"^\s+- (\S+)\s*$", block, re.MULTILINE)
    assert k8s[:2] == ["hfcache", "prune"]
    return {"crontab": cron, "k8s": k8s[2:]}


@pytest.mark.parametrize("example", ["crontab", "k8s"])
def test_the_examples_command_lines_work(cache, bert_lock, example):
    args = example_commands()[example]
    assert "--yes" in args and "--keep-lock" in args and "--older-than" in args and "--max-size" in args
    values = {"--cache-dir": str(cache), "--keep-lock": str(bert_lock)}
    run = [values.get(args[i - 1], arg) if i else arg for i, arg in enumerate(args)]
    run = ["--dry-run" if arg == "--yes" else arg for arg in run]
    proc = run_hfcache(["prune", *run, "--json"] if "--json" not in run else ["prune", *run])
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["dry_run"] and document["policy"]["older_than"] == 30 * DAY
    assert document["policy"]["max_size"] in (50 * 10**9, 45 * 2**30)
    assert len(document["pinned"]) == 2  # bert-base-uncased and google-bert/bert-base-uncased


# ------------------------------------------------------------------------------------------------ concurrency


def test_prune_while_another_process_warms_the_same_cache(cache):
    now = time.time()
    gpt2 = folder_of(cache, "openai-community/gpt2")
    commit = commit_of(cache, "openai-community/gpt2")
    # gpt2 looks detached and lost a blob; the warm below re-downloads it (slowly) and writes refs/main again.
    (gpt2 / "refs" / "main").unlink()
    vocab = gpt2 / "snapshots" / commit / "vocab.json"
    (vocab.parent / os.readlink(vocab)).unlink()
    old = add_revision(cache, "synth/old", "old", unique_files("old", 20 * KIB, 2), refs=["main"])
    set_last_use(cache, "synth/old", old, now - 60 * DAY)
    freeze_atimes(cache)
    os.utime(gpt2 / "snapshots" / commit, (now - 2 * DAY,) * 2)

    with HubServer(HUB, throttle_bps=200_000) as server:
        warm = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", "openai-community/gpt2",
                                 "distilbert/distilbert-base-uncased", "--cache-dir", str(cache), "--endpoint",
                                 server.endpoint, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=clean_env())
        try:
            deadline = time.monotonic() + 60
            while not list(gpt2.glob("blobs/*.incomplete")):  # warm holds gpt2's repo lock and downloads
                assert warm.poll() is None and time.monotonic() < deadline, warm.stderr.read() if warm.poll() else ""
                time.sleep(0.02)
            # warm reads gpt2's config.json (custom-code check) while the first downloads run, which is a use by
            # atime: let that read happen (the throttled vocab.json takes ~5 s), then freeze the atimes again so the
            # prune plans gpt2 as detached and must re-check it under the lock. (Freezing at once raced the read.)
            time.sleep(1.0)
            freeze_atimes(cache)
            document = prune_json(cache, "--older-than", "30d")
            warm_out, warm_err = warm.communicate(timeout=120)
        finally:
            if warm.poll() is None:
                warm.kill()
    assert warm.returncode == 0, warm_err
    assert all(r["ok"] for r in json.loads(warm_out)["repos"])
    # Planned as detached, then re-checked under the repo lock once warm had published the ref: skipped.
    status = {(r["repo_id"], r["commit_hash"]): r["status"] for r in document["revisions"]}
    assert status == {("openai-community/gpt2", commit): "skipped", ("synth/old", old): "removed"}
    notes = {i["note"] for i in document["items"] if i["status"] == "skipped"}
    assert "a ref points to it now (main)" in notes
    assert (gpt2 / "refs" / "main").read_text() == commit and not folder_of(cache, "synth/old").exists()
    assert_healthy(cache, {"openai-community/gpt2": "openai-community/gpt2",
                           "distilbert/distilbert-base-uncased": "distilbert/distilbert-base-uncased"})


# ------------------------------------------------------------------------------------------------ SIGKILL


def kill_cache(cache: Path, now: float, repos: int = 120) -> None:
    """The fixture cache plus ``repos`` synthetic repos: each with an old detached revision; a third of them old
    (removed whole), a third recent, a third over budget (equal sizes, so any order frees the same bytes)."""
    warm_fixture(cache, ["bert-base-uncased"])
    for i in range(repos):
        repo_id = f"synth/k{i:03d}"
        detached = add_revision(cache, repo_id, f"k{i}-detached", unique_files(f"k{i}-d", 6 * KIB, 6),
                                no_exist=["config.json"])
        main = add_revision(cache, repo_id, f"k{i}-main", unique_files(f"k{i}-m", 6 * KIB, 6), refs=["main"],
                            tree=True)
        age = (40 * DAY) if i % 3 == 0 else (5 * DAY + i) if i % 3 == 1 else 3600 + i
        set_last_use(cache, repo_id, detached, now - 2 * DAY)
        set_last_use(cache, repo_id, main, now - age)
        if i % 5 == 0:
            (cache / ".locks" / folder_of(cache, repo_id).name).mkdir(parents=True, exist_ok=True)
            for blob in folder_of(cache, repo_id).glob("blobs/*"):
                (cache / ".locks" / folder_of(cache, repo_id).name / f"{blob.name}.lock").touch()
    freeze_atimes(cache)


def kill_budget(cache: Path) -> str:
    """A --max-size that removes the 20 least recently used of the repos used 5 days ago."""
    size = json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)["size_on_disk"]
    old = sum(1 for i in range(120) if i % 3 == 0) * 2 * 6 * KIB + sum(1 for i in range(120) if i % 3) * 6 * KIB
    return str(size - old - 20 * 6 * KIB)


KILL_ARGS = ("--older-than", "30d", "--keep", "bert-base-uncased")


def start_prune(cache: Path, budget: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hfcache", "prune", "--cache-dir", str(cache), "--yes", "--json",
                             "--max-size", budget, *KILL_ARGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env())


def finish_and_compare(cache: Path, budget: str, reference: set[str]) -> None:
    """The state a kill leaves must verify; the next prune must reach exactly the uninterrupted result."""
    assert dangling_links(cache) == []
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    assert proc.returncode == 0, json.loads(proc.stdout)["problems"]
    # verify read every blob; on this relatime mount that set their atimes (a "use"). The cache under test is one
    # whose atimes never change (noatime, read-only layers), so put them back as such a mount would have left them.
    freeze_atimes(cache)
    document = prune_json(cache, "--max-size", budget, *KILL_ARGS)
    assert document["result"]["failed"] == 0 and document["result"]["skipped"] == 0
    assert tree(cache) == reference, (sorted(tree(cache) - reference)[:5], sorted(reference - tree(cache))[:5])


@pytest.fixture(scope="module")
def kill_reference(tmp_path_factory) -> tuple[float, str, set[str]]:
    """(now, budget, the tree an uninterrupted prune leaves)."""
    now = time.time()
    cache = tmp_path_factory.mktemp("reference") / "cache"
    kill_cache(cache, now)
    budget = kill_budget(cache)
    plan = prune_json(cache, "--max-size", budget, *KILL_ARGS, dry_run=True)
    assert sum(r["reason"] == "over_budget" for r in plan["revisions"]) == 20
    document = prune_json(cache, "--max-size", budget, *KILL_ARGS)
    assert document["result"]["removed"] == len(plan["items"]) > 1000
    assert_healthy(cache, {"bert-base-uncased": "google-bert/bert-base-uncased"})
    return now, budget, tree(cache)


def test_sigkill_while_waiting_for_a_repo_lock(tmp_path, kill_reference):
    now, budget, reference = kill_reference
    cache = tmp_path / "cache"
    kill_cache(cache, now)
    # Another process holds the repo lock of k060 (as a warm would): prune finishes k000..k059, then waits there.
    lock = cache / ".locks" / "models--synth--k060" / "hfcache-repo.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        prune = start_prune(cache, budget)
        deadline = time.monotonic() + 60
        while (folder_of(cache, "synth/k059") / "snapshots" / hashlib.sha1(b"k59-detached").hexdigest()).exists() \
                or (folder_of(cache, "synth/k057")).exists():
            assert prune.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        assert prune.poll() is None  # blocked on k060's lock
        prune.send_signal(signal.SIGKILL)
        prune.wait(timeout=30)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not folder_of(cache, "synth/k000").exists() and folder_of(cache, "synth/k060").exists()
    assert len(list(folder_of(cache, "synth/k060").glob("snapshots/*"))) == 2  # untouched
    finish_and_compare(cache, budget, reference)


def test_sigkill_at_random_points(tmp_path, kill_reference):
    now, budget, reference = kill_reference
    rng = random.Random(20261129)
    interrupted = 0
    # Up to 10 runs until 5 kills landed mid-plan: on a loaded machine a kill can come after the prune finished,
    # and such a run proves nothing about interruption (it is still compared with the reference).
    for run in range(10):
        if interrupted >= 5:
            break
        cache = tmp_path / f"run{run}" / "cache"
        kill_cache(cache, now)
        initial = tree(cache)
        # A random point of progress (the moment a random repo's first snapshot leaves snapshots/), plus a random
        # few milliseconds: the kill lands between any two steps of a repo, whatever the speed of the machine.
        target = folder_of(cache, f"synth/k{rng.randrange(3, 115):03d}")
        snapshot = target / "snapshots" / hashlib.sha1(f"k{int(target.name[-3:])}-detached".encode()).hexdigest()
        prune = start_prune(cache, budget)
        deadline = time.monotonic() + 60
        while snapshot.exists() and prune.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.004))
        prune.send_signal(signal.SIGKILL)
        prune.wait(timeout=60)
        interrupted += tree(cache) not in (initial, reference)
        finish_and_compare(cache, budget, reference)
    assert interrupted >= 4  # the kills really cut the work short in the middle
    loaded = offline_load(cache, ["bert-base-uncased"])
    assert loaded["bert-base-uncased"]["input_ids"] == golden_ids("google-bert/bert-base-uncased")
