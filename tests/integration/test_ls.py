"""hfcache ls on a warmed fixture cache plus deliberately damaged repos."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, many_repos_cache, run_hfcache
from tests.testhub import HubServer

REPOS = ["openai-community/gpt2", "FacebookAI/roberta-base", "google-t5/t5-small", "google-bert/bert-base-chinese",
         "bert-base-uncased", "distilbert/distilbert-base-uncased"]


@pytest.fixture(scope="module")
def damaged_cache(tmp_path_factory) -> tuple[Path, Path]:
    """A cache warmed from the fixture hub, a lock of two of its repos, and four damaged repos."""
    tmp = tmp_path_factory.mktemp("ls")
    cache = tmp / "cache"
    hub_root = Path(__file__).parent.parent / "data" / "hub"
    with HubServer(hub_root) as server:
        report = hfcache.warm([WarmRequest.parse(r) for r in REPOS], cache_dir=cache, endpoint=server.endpoint,
                              token=False)
        assert report.ok, [r.error for r in report.repos]
        (tmp / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "bert-base-uncased"\n'
                                          '[[repos]]\nrepo_id = "google-t5/t5-small"\n')
        proc = run_hfcache(["lock"], cwd=tmp)
        assert proc.returncode == 0, proc.stderr

    gpt2 = cache / "models--openai-community--gpt2"
    next((gpt2 / "blobs").iterdir()).unlink()  # a missing blob: a broken link
    roberta = cache / "models--FacebookAI--roberta-base"
    ref = roberta / "refs" / "main"
    ref.write_text(ref.read_text() + "\n")  # a hand-written ref with a trailing newline
    t5 = cache / "models--google-t5--t5-small" / "blobs"
    (t5 / "0123abcd.5f5f5f5f.incomplete").write_bytes(b"partial")  # a killed download
    chinese = cache / "models--google-bert--bert-base-chinese"
    link = next((chinese / "snapshots").rglob("vocab.txt"))
    target = (link.parent / os.readlink(link)).resolve()
    link.unlink()
    link.symlink_to(target)  # a snapshot link made absolute
    return cache, tmp / "hfcache.lock"


def ls_json(cache: Path, *args: str) -> dict:
    proc = run_hfcache(["ls", "--cache-dir", str(cache), "--json", *args])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_repo_is_listed_with_its_health(damaged_cache):
    cache, _ = damaged_cache
    document = ls_json(cache)
    health = {r["repo_id"]: r["health"] for r in document["repos"]}
    assert set(health) == set(REPOS) | {"google-bert/bert-base-uncased"}
    assert "broken link (missing blob)" in health["openai-community/gpt2"]
    assert "refs/main: malformed" in health["FacebookAI/roberta-base"]
    assert "1 leftover .incomplete file(s)" in health["google-t5/t5-small"]
    assert "vocab.txt: absolute link" in health["google-bert/bert-base-chinese"]
    assert health["distilbert/distilbert-base-uncased"] == "ok"
    assert health["bert-base-uncased"] == "ok"
    assert document["totals"]["unhealthy"] == 4
    # huggingface_hub's own scan hides the repos with a malformed ref or a broken link; hfcache lists them.
    hf_ids = {r.repo_id for r in scan_cache_dir(cache).repos}
    assert "FacebookAI/roberta-base" not in hf_ids and "openai-community/gpt2" not in hf_ids


def test_sizes_equal_unique_blob_bytes(damaged_cache):
    cache, _ = damaged_cache
    document = ls_json(cache)
    total: dict[tuple[int, int], int] = {}
    for repo in document["repos"]:
        blobs = cache / repo["folder"] / "blobs"
        seen = {}
        for blob in blobs.iterdir():
            st = blob.lstat()
            seen[(st.st_dev, st.st_ino)] = st.st_size
        assert repo["size_on_disk"] == sum(seen.values()), repo["repo_id"]
        total.update(seen)
    # Legacy alias and the shared vocab.txt are hardlinks: the cache total counts them once.
    assert document["size_on_disk"] == sum(total.values())
    assert document["size_on_disk"] < sum(r["size_on_disk"] for r in document["repos"])


def test_pinned_flags_follow_the_lock(damaged_cache):
    cache, lock = damaged_cache
    pinned = {r["repo_id"]: r["pinned"] for r in ls_json(cache, "--lock", str(lock))["repos"]}
    assert pinned == {
        "bert-base-uncased": True, "google-bert/bert-base-uncased": True, "google-t5/t5-small": True,
        "openai-community/gpt2": False, "FacebookAI/roberta-base": False, "google-bert/bert-base-chinese": False,
        "distilbert/distilbert-base-uncased": False,
    }
    assert {r["pinned"] for r in ls_json(cache)["repos"]} == {None}


def test_json_matches_the_table(damaged_cache):
    cache, lock = damaged_cache
    document = ls_json(cache, "--lock", str(lock), "--sort", "size")
    env = clean_env(COLUMNS="300")
    proc = run_hfcache(["ls", "--cache-dir", str(cache), "--lock", str(lock), "--sort", "size"], env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [line.strip("│ ").split("│") for line in proc.stdout.splitlines() if line.startswith("│")]
    table = [(cells[0].strip(), cells[3].strip(), cells[6].strip()) for cells in rows]
    expected = [(r["repo_id"], str(r["files"]), "yes" if r["pinned"] else "no") for r in document["repos"]]
    assert table == expected
    sizes = [r["size_on_disk"] for r in document["repos"]]
    assert sizes == sorted(sizes, reverse=True)


def test_revisions_and_filters(damaged_cache):
    cache, _ = damaged_cache
    document = ls_json(cache, "google-t5/t5-small", "--revisions")
    assert [r["repo_id"] for r in document["repos"]] == ["google-t5/t5-small"]
    revision = document["repos"][0]["revisions"][0]
    assert revision["refs"] == ["main"] and len(revision["commit_hash"]) == 40
    assert revision["last_used"].endswith("+00:00")


def test_ls_reads_only(damaged_cache):
    cache, _ = damaged_cache
    before = {p: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in cache.rglob("*")}
    ls_json(cache)
    after = {p: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in cache.rglob("*")}
    assert before == after


def test_missing_cache_is_an_error(tmp_path):
    proc = run_hfcache(["ls", "--cache-dir", str(tmp_path / "nope")])
    assert proc.returncode == 5 and "no cache at" in proc.stderr


def test_large_listing_is_streamed_with_the_same_document(damaged_cache, tmp_path):
    """Over 100 repos `ls --json` writes one repo at a time (goal P4 of docs/benchmarks.md): byte for byte the document that
    print_json(ls_dict(...)) builds whole, damaged repos, mixed case ids and the lock's pins included."""
    import shutil

    from hfcache.cache.scan import scan_cache
    from hfcache.cli.render.ls import _SORT_KEYS, ls_dict
    from hfcache.warming.lockfile import pinned_revisions, read_lock

    source, lock = damaged_cache
    cache = tmp_path / "cache"
    shutil.copytree(source, cache, symlinks=True)
    gpt2 = cache / "models--openai-community--gpt2"
    for i in range(110):  # copies of a broken repo under ids that sort differently with and without case
        shutil.copytree(gpt2, cache / f"models--Org{i % 3}--{'Z' if i % 2 else 'a'}-{i}", symlinks=True)
    shutil.copytree(gpt2, cache / "datasets--Org0--a-0", symlinks=True)  # same id as a model: type breaks the tie
    proc = run_hfcache(["ls", "--cache-dir", str(cache), "--json", "--lock", str(lock)])
    assert proc.returncode == 0, proc.stderr
    document = ls_dict(scan_cache(cache), pinned_revisions(read_lock(lock)))
    document["repos"].sort(key=_SORT_KEYS["name"])
    assert proc.stdout == json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n"
    assert document["totals"]["repos"] == len(ls_json(source)["repos"]) + 111
    assert [(r["repo_id"], r["repo_type"]) for r in document["repos"] if r["repo_id"] == "Org0/a-0"] == [
        ("Org0/a-0", "dataset"), ("Org0/a-0", "model")]
    assert any(r["pinned"] for r in document["repos"]) and any(r["problems"] for r in document["repos"])
    # The same document whether the repos are scanned here or in forked worker processes (scan.stream_repos).
    import functools
    import io

    from hfcache.cache.scan_stream import stream_repos
    from hfcache.cli.render.ls import repo_summary, stream_ls_json

    pinned = pinned_revisions(read_lock(lock))
    for workers in (1, 2, 3):
        out = io.StringIO()
        summaries = stream_repos(cache, functools.partial(repo_summary, pinned=pinned), workers=workers)
        stream_ls_json(str(cache), summaries, out)
        assert out.getvalue() == proc.stdout, workers



@pytest.mark.parametrize("signame, code, group", [("SIGINT", 130, False), ("SIGTERM", 143, False),
                                                   ("SIGTERM", 143, True), ("SIGINT", 130, True),
                                                   ("SIGKILL", -9, False)])
def test_interrupted_large_listing_leaves_no_worker_behind(tmp_path, signame, code, group):
    """A signal to the command (or to its whole process group: `kill %1`, systemd, Ctrl-C) ends the command with
    its exit code and no worker left; a parent killed outright leaves no worker running either."""
    import signal
    import subprocess
    import sys
    import time

    cache = many_repos_cache(tmp_path, 3000)
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "ls", "--cache-dir", str(cache), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), text=True,
                            start_new_session=group)
    children: set[int] = set()
    deadline = time.monotonic() + 20
    while not children and time.monotonic() < deadline and proc.poll() is None:
        children = {int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()}
        time.sleep(0.01)
    if not children:
        pytest.skip("the listing ended before its workers could be seen (one CPU, or a very fast disk)")
    # This test reads nothing yet: the command fills its stdout pipe and blocks writing it, its workers fill theirs
    # (the hardest moment: a worker must still notice its parent go, the parent must not wait for its reader).
    while time.monotonic() < deadline and "pipe_write" not in Path(f"/proc/{proc.pid}/wchan").read_text():
        time.sleep(0.01)
    children |= {int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()}
    if group:
        os.killpg(proc.pid, getattr(signal, signame))
    else:
        proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert '"exit_code"' not in out  # no error document glued to the begun listing

    def running() -> list[int]:
        alive = []
        for pid in children:
            try:
                if "zombie" not in Path(f"/proc/{pid}/status").read_text():
                    alive.append(pid)
            except FileNotFoundError:
                pass
        return alive

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running() == []
