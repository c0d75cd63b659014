"""What a cache (or a member of a shared cache's group) writes is data, not authority.

- the ``verify --fast`` record is honoured only when this euid owns it and nobody else can write it; its write goes
  through the checked ``.locks`` descriptor (a ``.locks`` swapped for a link mid-run leaves nothing outside);
- JSON a cache supplies (warm's per-commit record, the ``--fast`` record) is bounded: nested 100,000 levels deep it
  is a problem of its repo (verify error row, repair removes it, warm/export exit 5), never exit 70;
- a 1,000-level folder chain in a snapshot (or under ``refs/``) is that repo's layout problem in ``ls``, ``verify``,
  ``doctor`` and ``prune``'s plan, never exit 70.

Caches are made by ``hfcache warm`` against the test Hub; only the hostile part is written by hand. Members act
through ``setpriv`` (tests/users.py); their scripts run with the test interpreter's standard library only.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hfcache.cli.main import cli
from tests.canary import Canary
from tests.chains import plant_chain, remove_tree
from tests.helpers import clean_env, run_hfcache
from tests.users import ALICE, GROUP, Runtime, needs_root

BERT = "google-bert/bert-base-uncased"
BERT_FOLDER = "models--google-bert--bert-base-uncased"
DEEP = 100_000
CHAIN = 1_000
#: The environment of root's own commands: PYTHONPATH so that ``python -m hfcache`` finds the checkout from any cwd.
ENV = clean_env(PYTHONPATH=str(Path(__file__).resolve().parent.parent.parent))


def hf(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Root's ``hfcache ARGS``, checked for what must never happen: a traceback or an internal error (exit 70)."""
    proc = run_hfcache(list(args), env=ENV, timeout=timeout)
    assert proc.returncode != 70 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, \
        proc.stderr
    return proc


def warm(cache: Path, endpoint: str) -> None:
    proc = hf("warm", BERT, "--cache-dir", str(cache), "--endpoint", endpoint)
    assert proc.returncode == 0, proc.stderr


def verify(cache: Path, *args: str) -> tuple[int, dict]:
    proc = hf("verify", "--cache-dir", str(cache), "--json", *args)
    return proc.returncode, json.loads(proc.stdout)


def shared_cache(base: Path, name: str) -> Path:
    cache = base / name
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)  # the documented recipe: chgrp GROUP; chmod 2775
    return cache


def outside_canary(base: Path) -> Canary:
    base.mkdir()
    return Canary(base)


def blobs(cache: Path) -> list[Path]:
    return sorted((cache / BERT_FOLDER / "blobs").iterdir())


def commit(cache: Path) -> str:
    return (cache / BERT_FOLDER / "refs" / "main").read_text().strip()


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def kinds(report: dict) -> set[tuple[str, str]]:
    return {(p["repo_id"], p["kind"]) for p in report["problems"]}


def note_of(report: dict) -> str:
    notes = [p["detail"] for p in report["problems"] if p["kind"] == "fast_record_ignored"]
    assert len(notes) == 1, report["problems"]
    return notes[0]


#: A member's forgery: corrupt the first blob (with "flip"), then write a --fast record vouching for its new stamp (every blob of
#: the cache, as a root run would have recorded them) and rename it over root's (``.locks`` is group-writable).
FORGE = r"""
import json, os, sys
cache, folder, flip = sys.argv[1], sys.argv[2], sys.argv[3] == "flip"
blobs = os.path.join(cache, folder, "blobs")
names = sorted(os.listdir(blobs))
victim = os.path.join(blobs, names[0])
if flip:
    data = bytearray(open(victim, "rb").read()); data[len(data) // 2] ^= 1
    open(victim, "r+b").write(bytes(data))
rows = []
for name in names:
    st = os.stat(os.path.join(blobs, name))
    rows.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, name])
tmp = os.path.join(cache, ".locks", "forged.tmp")
open(tmp, "w").write(json.dumps({"version": 1, "blobs": sorted(rows)}))
os.chmod(tmp, 0o644)
os.replace(tmp, os.path.join(cache, ".locks", "hfcache-verified.json"))
"""


# ------------------------------------------------------------------------------------------- the --fast record


@needs_root
def test_a_members_forged_fast_record_is_ignored(runtime: Runtime, hub_server) -> None:
    cache = shared_cache(runtime.base, "fast-forged")
    canary = outside_canary(runtime.base / "fast-forged-outside")
    warm(cache, hub_server.endpoint)
    code, first = verify(cache, "--fast")
    record = cache / ".locks" / "hfcache-verified.json"
    st = record.lstat()
    assert code == 0 and first["blobs_hashed"] == 4
    # Authority for its writer only: root's record, never group-writable although every folder of the cache is.
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644, oct(st.st_mode)
    assert (cache / ".locks").stat().st_mode & 0o2070 == 0o2070

    proc = runtime.run(ALICE, ["-c", FORGE, str(cache), BERT_FOLDER, "flip"], umask=0o002)
    assert proc.returncode == 0, proc.stderr
    assert record.lstat().st_uid == ALICE.uid
    code, report = verify(cache, "--fast")
    assert code == 1 and report["blobs_skipped"] == 0 and report["blobs_hashed"] == 4
    assert (BERT, "blob_mismatch") in kinds(report)
    assert note_of(report) == (f"the --fast record is owned by uid {ALICE.uid}, not by uid 0 (this run): ignored, "
                               "every blob hashed")
    # Forged again (the run above replaced it with root's own): the table says so too.
    assert runtime.run(ALICE, ["-c", FORGE, str(cache), BERT_FOLDER, "record"], umask=0o002).returncode == 0
    human = hf("verify", "--cache-dir", str(cache), "--fast")
    assert human.returncode == 1 and "fast_record_ignored" in human.stdout and "blob_mismatch" in human.stdout

    assert hf("verify", "--repair", "--cache-dir", str(cache), "--endpoint", hub_server.endpoint).returncode == 0
    assert verify(cache)[0] == 0
    canary.assert_unchanged()


def test_a_group_writable_record_of_this_uid_is_ignored(tmp_path: Path, hub_server) -> None:
    """Root's own record made 0664 (as a umask-002 writer would leave it): anyone in the group could have rewritten
    it, so it vouches for nothing, even for a blob corrupted behind its back."""
    cache = tmp_path / "cache"
    canary = Canary(tmp_path)
    warm(cache, hub_server.endpoint)
    assert verify(cache, "--fast")[0] == 0
    record = cache / ".locks" / "hfcache-verified.json"
    victim = blobs(cache)[0]
    flip_byte(victim)
    doc = json.loads(record.read_text())
    st = victim.stat()
    doc["blobs"] = [row if row[5] != victim.name else [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                       st.st_ctime_ns, victim.name] for row in doc["blobs"]]
    record.write_text(json.dumps(doc))
    os.chmod(record, 0o664)
    code, report = verify(cache, "--fast")
    assert code == 1 and (BERT, "blob_mismatch") in kinds(report) and report["blobs_skipped"] == 0
    assert note_of(report) == "the --fast record is writable by group (mode 0664): ignored, every blob hashed"
    # This run's record replaces it, 0644 again; with the blob put back, the next run trusts it.
    assert stat.S_IMODE(record.lstat().st_mode) == 0o644
    flip_byte(victim)
    assert verify(cache)[0] == 0
    canary.assert_unchanged()


def test_fast_records_nested_too_deep_or_linked_are_ignored_not_fatal(tmp_path: Path, hub_server) -> None:
    cache = tmp_path / "cache"
    canary = Canary(tmp_path)
    warm(cache, hub_server.endpoint)
    record = cache / ".locks" / "hfcache-verified.json"
    record.write_text('{"version": 1, "blobs": ' + "[" * DEEP + "]" * DEEP + "}")
    os.chmod(record, 0o644)
    code, report = verify(cache, "--fast")
    assert code == 0 and report["blobs_hashed"] == 4
    assert note_of(report) == "the --fast record is JSON nested deeper than 64 levels: ignored, every blob hashed"
    # A record that is a FIFO (a member's trick to block the reader): never opened blocking.
    record.unlink()
    os.mkfifo(record)
    code, report = verify(cache, "--fast")
    assert code == 0 and note_of(report).startswith("the --fast record is not a regular file")
    record.unlink()
    assert verify(cache, "--fast")[0] == 0 and verify(cache)[0] == 0
    canary.assert_unchanged()


#: A member's swap loop: ``.locks`` exchanged with a link to the canary folder (``renameat2(RENAME_EXCHANGE)``, atomic:
#: at every instant one of the two names is the real folder) as fast as it goes, for ``seconds``.
SWAP = r"""
import ctypes, os, sys, time
cache, target, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
locks, link = os.path.join(cache, ".locks").encode(), os.path.join(cache, ".l").encode()
os.symlink(target, link)
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
end = time.monotonic() + seconds
rounds = 0
while time.monotonic() < end:
    if renameat2(-100, locks, -100, link, 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        rounds += 1
if rounds % 2:
    renameat2(-100, locks, -100, link, 2)
os.unlink(link)
print(rounds)
"""


@needs_root
@pytest.mark.slow
def test_locks_swapped_for_a_link_during_the_record_write_leaves_nothing_outside(runtime: Runtime,
                                                                                   hub_server) -> None:
    cache = shared_cache(runtime.base, "fast-swap")
    canary = outside_canary(runtime.base / "fast-swap-outside")
    warm(cache, hub_server.endpoint)
    member = subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", SWAP, str(cache), str(canary.dir), "12"],
                              env=runtime.env(ALICE), cwd=runtime.base, stdout=subprocess.PIPE, text=True)
    runs = 0
    try:  # in-process (Click's runner): ~20 runs a second, so the record's write meets the swap many times
        runner = CliRunner()
        while member.poll() is None and runs < 400:
            result = runner.invoke(cli, ["verify", "--fast", "--cache-dir", str(cache)])
            assert result.exit_code in (0, 1), result.output  # 1: the scan met .locks as a link (unsafe_layout)
            runs += 1
    finally:
        rounds = int(member.communicate(timeout=60)[0].strip() or 0)
    assert runs >= 20 and rounds > 1000, (runs, rounds)
    assert (cache / ".locks").is_dir() and not (cache / ".locks").is_symlink()
    canary.assert_unchanged()  # no record, no temp file written through the link
    assert verify(cache, "--fast")[0] == 0 and verify(cache)[0] == 0


# ----------------------------------------------------------------------------------------- warm's record, too deep


def test_warms_record_nested_too_deep_is_a_problem_of_its_repo(tmp_path: Path, hub_server) -> None:
    cache = tmp_path / "cache"
    canary = Canary(tmp_path)
    warm(cache, hub_server.endpoint)
    sha = commit(cache)
    rel = f".locks/{BERT_FOLDER}/hfcache/{sha}.json"
    (cache / rel).write_text("[" * DEEP + "]" * DEEP)

    code, report = verify(cache)
    rows = [p for p in report["problems"] if p["kind"] == "record_refused"]
    assert code == 1 and len(rows) == 1 and rows[0]["error"], report["problems"]
    assert (rows[0]["repo_id"], rows[0]["revision"], rows[0]["path"]) == (BERT, sha, rel)
    assert rows[0]["detail"] == "JSON nested deeper than 64 levels: warm's record refused"
    for args in (["warm", BERT, "--endpoint", hub_server.endpoint], ["export", str(tmp_path / "out.tar")]):
        proc = hf(*args, "--cache-dir", str(cache))
        assert proc.returncode == 5, proc.stderr
        assert proc.stderr.splitlines()[0] == (f"hfcache: error: {rel}: JSON nested deeper than 64 levels: warm's "
                                               "record refused"), proc.stderr
    assert not (tmp_path / "out.tar").exists()

    proc = hf("verify", "--repair", "--cache-dir", str(cache), "--endpoint", hub_server.endpoint, "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and [a["action"] for a in doc["repairs"]] == ["removed record"], doc
    assert not (cache / rel).exists()
    warm(cache, hub_server.endpoint)  # records the revision again
    assert (cache / rel).is_file() and verify(cache)[0] == 0
    canary.assert_unchanged()


# ------------------------------------------------------------------------------------------ folder chains, too deep


@pytest.fixture
def chains() -> Iterator[list[Path]]:
    """Folders a test planted a chain in; removed whatever the outcome (pytest's cleanup would recurse per level)."""
    planted: list[Path] = []
    yield planted
    for base in planted:
        remove_tree(base / "d")






def test_a_thousand_level_chain_in_a_snapshot_is_a_layout_problem(tmp_path: Path, hub_server, chains) -> None:
    cache = tmp_path / "cache"
    canary = Canary(tmp_path)
    warm(cache, hub_server.endpoint)
    sha = commit(cache)
    chains.append(cache / BERT_FOLDER / "snapshots" / sha)
    plant_chain(chains[-1], CHAIN, leaf="leaf.txt")
    expected = "d/d/d/… (65 levels): folder chain deeper than 64 levels (not read below; left alone)"

    proc = hf("ls", "--cache-dir", str(cache), "--json")
    repo = json.loads(proc.stdout)["repos"][0]
    assert proc.returncode == 0 and f"{sha[:12]}: {expected}" in repo["health"], repo
    assert hf("ls", "--cache-dir", str(cache)).returncode == 0

    code, report = verify(cache)
    rows = [p for p in report["problems"] if p["kind"] == "unsafe_layout"]
    assert code == 1 and [(p["repo_id"], p["revision"], p["path"]) for p in rows] == [(BERT, sha,
                                                                                       "d/d/d/… (65 levels)")]

    proc = hf("doctor", "--cache-dir", str(cache), "--json")
    findings = {f["code"]: f for f in json.loads(proc.stdout)["findings"]}
    assert proc.returncode == 1 and expected in findings["cache.unsafe_layout"]["message"]

    proc = hf("prune", "--cache-dir", str(cache), "--max-size", "0", "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert any(item.get("revision") == sha for item in plan["items"]), plan

    proc = hf("check", BERT, "--cache-dir", str(cache))
    assert proc.returncode == 1 and f"{BERT}@main: not loaded: unsafe cache layout" in proc.stdout + proc.stderr

    remove_tree(cache / BERT_FOLDER / "snapshots" / sha / "d")
    assert verify(cache)[0] == 0
    canary.assert_unchanged()


def test_a_thousand_level_chain_under_refs_leaves_the_repo_alone(tmp_path: Path, hub_server, chains) -> None:
    cache = tmp_path / "cache"
    canary = Canary(tmp_path)
    warm(cache, hub_server.endpoint)
    chains.append(cache / BERT_FOLDER / "refs")
    plant_chain(chains[-1], CHAIN, leaf="leaf.txt")
    code, report = verify(cache)
    assert code == 1 and (BERT, "unsafe_layout") in kinds(report)
    proc = hf("ls", "--cache-dir", str(cache), "--json")
    assert proc.returncode == 0 and "folder chain deeper than 64 levels" in json.loads(proc.stdout)["repos"][0]["health"]
    assert hf("doctor", "--cache-dir", str(cache)).returncode == 1
    remove_tree(cache / BERT_FOLDER / "refs" / "d")
    assert verify(cache)[0] == 0
    canary.assert_unchanged()


def test_a_fifo_at_the_trees_listing_never_blocks_verify(tmp_path: Path, hub_server) -> None:
    """Without warm's record, verify reads huggingface_hub's ``trees/<commit>.json``: a FIFO there is not opened
    blocking (the revision is then checked by blob names only)."""
    cache = tmp_path / "cache"
    canary = Canary(tmp_path)
    warm(cache, hub_server.endpoint)
    sha = commit(cache)
    (cache / ".locks" / BERT_FOLDER / "hfcache" / f"{sha}.json").unlink()
    (cache / BERT_FOLDER / "trees").mkdir(exist_ok=True)
    os.mkfifo(cache / BERT_FOLDER / "trees" / f"{sha}.json")
    started = time.monotonic()
    code, report = verify(cache)
    assert code == 0 and time.monotonic() - started < 60, report
    canary.assert_unchanged()
