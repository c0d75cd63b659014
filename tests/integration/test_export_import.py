"""export (dir, tar, materialized), import (verified, refusing hostile input) and link on warmed fixture caches."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import golden_ids, offline_load, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
# bert-base-uncased, distilbert and all-MiniLM-L6-v2 share the same vocab.txt blob.
SHARING = ["bert-base-uncased", "distilbert/distilbert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2"]


@pytest.fixture(scope="module")
def source_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("src") / "cache"
    with HubServer(HUB) as server:
        for spec in [*SHARING, "openai-community/gpt2"]:  # one by one: no hardlink dedup in the source
            report = hfcache.warm([WarmRequest.parse(spec)], cache_dir=cache, endpoint=server.endpoint, token=False)
            assert report.ok
    for blob in cache.glob("*/blobs/*"):  # undo warm's own dedup so the source stores shared files twice
        data = blob.read_bytes()
        blob.unlink()
        blob.write_bytes(data)
    return cache


def export(cache: Path, dest: Path, *args: str) -> dict:
    proc = run_hfcache(["export", str(dest), "--cache-dir", str(cache), "--json", *args])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything under ``root``: type, link target or content hash."""
    state = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            state[rel] = ("link", os.readlink(p))
        elif p.is_file():
            state[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            state[rel] = ("dir",)
    return state


def test_tar_is_byte_identical_whatever_the_disk_order_and_times(source_cache, tmp_path):
    first = export(source_cache, tmp_path / "a.tar")
    second = export(source_cache, tmp_path / "b.tar")
    assert first["sha256"] == second["sha256"]
    assert hashlib.sha256((tmp_path / "a.tar").read_bytes()).hexdigest() == first["sha256"]

    # The same content re-created in reverse order, with other mtimes, on another path.
    clone = tmp_path / "clone"
    entries = sorted(source_cache.rglob("*"), key=lambda p: str(p), reverse=True)
    for p in sorted((p for p in entries if p.is_dir() and not p.is_symlink()), key=lambda p: len(p.parts)):
        (clone / p.relative_to(source_cache)).mkdir(parents=True, exist_ok=True)
    for p in entries:
        target = clone / p.relative_to(source_cache)
        if p.is_symlink():
            target.symlink_to(os.readlink(p))
        elif p.is_file():
            target.write_bytes(p.read_bytes())
            os.utime(target, (1_000_000, 1_000_000 + hash(str(p)) % 10_000))
    third = export(clone, tmp_path / "c.tar")
    print("tar sha256:", first["sha256"], third["sha256"])
    assert third["sha256"] == first["sha256"]

    with tarfile.open(tmp_path / "a.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {m.mtime for m in members} == {0} and {(m.uid, m.gid) for m in members} == {(0, 0)}
    assert {m.uname for m in members} == {""}
    assert not any(m.name.endswith((".lock", ".incomplete")) for m in members)
    # .locks carries only warm's records (hfcache/cache/published.py), one per exported revision, so verify still knows
    # the expected files after the move.
    locks = [m.name for m in members if m.name.startswith(".locks/") and m.isfile()]
    assert locks and all(re.fullmatch(r"\.locks/[^/]+/hfcache/[0-9a-f]{40}\.json", n) for n in locks), locks


def test_shared_blobs_are_stored_once(source_cache, tmp_path):
    blobs = {p.name: p.stat().st_size for p in source_cache.glob("*/blobs/*")}
    assert len(blobs) < len(list(source_cache.glob("*/blobs/*")))  # the source stores duplicates
    report = export(source_cache, tmp_path / "x.tar")
    assert report["unique_bytes"] == sum(blobs.values())
    with tarfile.open(tmp_path / "x.tar") as tar:
        members = tar.getmembers()
    vocab = [m for m in members if m.name.endswith("/blobs/fb140275c155a9c7c5a3b3e0e77a9e839594a938")]
    assert len(vocab) == 4 and sum(m.isfile() for m in vocab) == 1 and sum(m.islnk() for m in vocab) == 3
    stored = sum(m.size for m in members if m.isfile() and "/blobs/" in m.name)
    assert stored == sum(blobs.values())

    out = tmp_path / "dir"
    export(source_cache, out)
    inodes = {p.stat().st_ino for p in out.glob("*/blobs/fb140275c155a9c7c5a3b3e0e77a9e839594a938")}
    assert len(inodes) == 1


@pytest.mark.slow
def test_materialized_export_has_no_symlinks_and_loads_offline(source_cache, tmp_path):
    out = tmp_path / "materialized"
    export(source_cache, out, "--materialize")
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    assert run_hfcache(["verify", "--cache-dir", str(out)]).returncode == 0
    loaded = offline_load(out, ["bert-base-uncased", "openai-community/gpt2"])
    assert loaded["bert-base-uncased"]["input_ids"] == golden_ids("google-bert/bert-base-uncased")
    assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")


@pytest.mark.slow
def test_relative_export_moved_elsewhere_loads_offline(source_cache, tmp_path):
    out = tmp_path / "first" / "cache"
    export(source_cache, out, "openai-community/gpt2")
    moved = tmp_path / "elsewhere" / "deeper" / "cache"
    moved.parent.mkdir(parents=True)
    shutil.move(str(out), str(moved))
    assert sorted(p.name for p in moved.iterdir()) == [".locks", "CACHEDIR.TAG", "models--openai-community--gpt2"]
    loaded = offline_load(moved, ["openai-community/gpt2"])
    assert loaded["openai-community/gpt2"]["input_ids"] == golden_ids("openai-community/gpt2")


def test_bare_id_before_the_same_id_at_a_revision_exports_every_revision(source_cache, tmp_path):
    """`export DEST REPO REPO@REV`: the bare id (every revision) wins, whatever the order (was exit 70)."""
    gpt2 = "openai-community/gpt2"
    both = export(source_cache, tmp_path / "a.tar", gpt2, f"{gpt2}@main")
    reverse = export(source_cache, tmp_path / "b.tar", f"{gpt2}@main", gpt2)
    bare = export(source_cache, tmp_path / "c.tar", gpt2)
    assert both["sha256"] == reverse["sha256"] == bare["sha256"]


def test_import_round_trip_merges_and_verifies(source_cache, tmp_path):
    export(source_cache, tmp_path / "x.tar", "openai-community/gpt2")
    target = tmp_path / "target"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("FacebookAI/roberta-base")], cache_dir=target,
                            endpoint=server.endpoint, token=False).ok
    before = tree_state(target)
    proc = run_hfcache(["import", str(tmp_path / "x.tar"), "--cache-dir", str(target), "--json"])
    assert proc.returncode == 0, proc.stderr
    after = tree_state(target)
    assert all(after[k] == v for k, v in before.items() if ".locks" not in k)  # nothing there was disturbed
    assert run_hfcache(["verify", "--cache-dir", str(target)]).returncode == 0
    assert "models--openai-community--gpt2/refs/main" in after


def test_import_counts_blob_entries_and_distinct_blobs_as_verify_does(source_cache, tmp_path):
    """Repos sharing content hold one blob entry each (hardlinked): import says so, and its distinct count is
    verify's."""
    export(source_cache, tmp_path / "x.tar", *SHARING)
    target = tmp_path / "target"
    proc = run_hfcache(["import", str(tmp_path / "x.tar"), "--cache-dir", str(target), "--json"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    verified = json.loads(run_hfcache(["verify", "--cache-dir", str(target), "--json"]).stdout)
    assert report["blob_contents"] == verified["blobs_hashed"] < report["blobs_new"]
    again = run_hfcache(["import", str(tmp_path / "x.tar"), "--cache-dir", str(target)])
    assert again.returncode == 0 and again.stderr == ""
    assert f"{report['blobs_new']} already there; {report['blob_contents']} distinct blobs" in again.stdout


def _hostile_tar(path: Path, source_tar: Path, mutate) -> None:
    with tarfile.open(source_tar) as src, tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            member, data = mutate(member, data)
            out.addfile(member, io.BytesIO(data) if data is not None else None)


def _evil_dotdot(member, data):
    if member.name.endswith("/refs/main"):
        member.name = "models--openai-community--gpt2/../../evil.txt"
    return member, data


def _evil_abs_link(member, data):
    if member.issym() and member.name.endswith("/config.json"):
        member.linkname = "/etc/passwd"
    return member, data


def _evil_corrupt_blob(member, data):
    if member.isfile() and "/blobs/" in member.name and data:
        data = bytes([data[0] ^ 1]) + data[1:]
    return member, data


@pytest.mark.parametrize(("mutate", "message"), [
    (_evil_dotdot, "absolute or escaping path"),
    (_evil_abs_link, "leaves the repo's blobs/"),
    (_evil_corrupt_blob, "content does not match the blob name"),
])
def test_hostile_tar_is_refused_and_the_target_is_unchanged(source_cache, tmp_path, mutate, message):
    export(source_cache, tmp_path / "good.tar", "openai-community/gpt2")
    _hostile_tar(tmp_path / "bad.tar", tmp_path / "good.tar", mutate)
    target = tmp_path / "target"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("google-t5/t5-small")], cache_dir=target, endpoint=server.endpoint,
                            token=False).ok
    before = tree_state(target)
    proc = run_hfcache(["import", str(tmp_path / "bad.tar"), "--cache-dir", str(target)])
    assert proc.returncode in (2, 3), proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert tree_state(target) == before
    assert not (tmp_path / "evil.txt").exists()


def test_chown_and_group_writable(source_cache, tmp_path):
    report = export(source_cache, tmp_path / "owned.tar", "openai-community/gpt2", "--chown", "1000:2000",
                    "--group-writable")
    with tarfile.open(tmp_path / "owned.tar") as tar:
        members = tar.getmembers()
    assert {(m.uid, m.gid) for m in members} == {(1000, 2000)}
    assert {m.mode for m in members if m.isdir()} == {0o775}
    assert {m.mode for m in members if m.isfile()} == {0o664}
    assert report["sha256"] != export(source_cache, tmp_path / "plain.tar", "openai-community/gpt2")["sha256"]
    if os.geteuid() == 0:
        out = tmp_path / "owned-dir"
        export(source_cache, out, "openai-community/gpt2", "--chown", "1000:2000")
        assert {(p.lstat().st_uid, p.lstat().st_gid) for p in out.rglob("*")} == {(1000, 2000)}


def test_link_modes(source_cache, tmp_path):
    nlink_before = {p: p.stat().st_nlink for p in source_cache.glob("*/blobs/*")}
    proc = run_hfcache(["link", str(source_cache), str(tmp_path / "hard"), "--mode", "hardlink", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["bytes_added"] == 0
    for blob, n in nlink_before.items():
        assert blob.stat().st_nlink == n + 1
    # No extra bytes: every regular file of the new cache is an inode the source already had.
    source_inodes = {p.lstat().st_ino for p in source_cache.rglob("*") if p.is_file() and not p.is_symlink()}
    new_files = [p for p in (tmp_path / "hard").rglob("*") if p.is_file() and not p.is_symlink()]
    assert new_files and {p.lstat().st_ino for p in new_files} <= source_inodes
    assert run_hfcache(["verify", "--cache-dir", str(tmp_path / "hard")]).returncode == 0

    proc = run_hfcache(["link", str(source_cache), str(tmp_path / "sym")])
    assert proc.returncode == 0 and (tmp_path / "sym").resolve() == source_cache.resolve()



def test_link_twice_is_a_no_op_and_other_content_is_refused(source_cache, tmp_path):
    """An init container that restarts runs `hfcache link` again onto the DEST it made: nothing changes, exit 0.
    A DEST holding anything else is still refused, and left as it is."""
    for mode in ("symlink", "hardlink", "copy"):
        dest = tmp_path / mode
        first = run_hfcache(["link", str(source_cache), str(dest), "--mode", mode])
        assert first.returncode == 0, first.stderr
        before = {str(p): (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in [dest, *dest.rglob("*")]}
        again = run_hfcache(["link", str(source_cache), str(dest), "--mode", mode, "--json"])
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["unchanged"] is True
        assert {str(p): (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in [dest, *dest.rglob("*")]} == before
        people = run_hfcache(["link", str(source_cache), str(dest), "--mode", mode])
        assert people.returncode == 0 and "nothing to do" in people.stdout
    # Something else at DEST: another mode's tree, an edited copy, an extra file, a symlink elsewhere.
    other = tmp_path / "other-cache"
    other.mkdir()
    (tmp_path / "elsewhere").symlink_to(other)
    edited = next(p for p in (tmp_path / "copy").rglob("*") if p.is_file() and not p.is_symlink())
    edited.write_bytes(edited.read_bytes() + b"x")
    (tmp_path / "hardlink" / "stray.txt").write_text("not from SRC")
    for dest, mode in [(tmp_path / "copy", "hardlink"), (tmp_path / "symlink", "copy"), (tmp_path / "copy", "copy"),
                       (tmp_path / "hardlink", "hardlink"), (tmp_path / "elsewhere", "symlink")]:
        listing = sorted(str(p) for p in dest.rglob("*"))
        proc = run_hfcache(["link", str(source_cache), str(dest), "--mode", mode])
        assert proc.returncode == 2 and "is not an empty directory" in proc.stderr, (dest, mode, proc.stderr)
        assert "hint:" in proc.stderr and sorted(str(p) for p in dest.rglob("*")) == listing


def test_hardlink_across_filesystems_is_a_clear_error(source_cache, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        proc = run_hfcache(["link", str(source_cache), str(mnt / "cache"), "--mode", "hardlink"])
        assert proc.returncode == 5 and "different filesystems" in proc.stderr
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)])
