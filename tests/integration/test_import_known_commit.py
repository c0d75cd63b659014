"""import against an attacker's report on the untrusted-cache work (docs/security.md): tars built here with ``tarfile``, run through
``hfcache import`` in a subprocess, each checked for its exit code and one-line message, an unchanged target and
canary, and a target that still verifies (helpers from test_import_hostile).

Covered: a ``trees/`` listing, a snapshot file or a ``.no_exist`` marker contradicting a commit the target knows
(warm's record), a ref to a commit with no snapshot, GNU sparse PAX maps refused before tarfile reads them, malformed
tar numbers and listing sizes (exit 2, not 70), repo folder names that are no repo id, a target marker planted as a
link, and a lock folder swapped for a link after it was checked.
"""

from __future__ import annotations

import io
import json
import os
import resource
import tarfile
import time
from pathlib import Path

import pytest

from hfcache.cache import safefs
from hfcache.cache.locking import file_lock
from tests.integration.test_import_hostile import (  # fixtures
    BERT,
    EVIL,
    assert_refused,
    assert_untouched,
    git_sha1,
    run_import,
    state,
    write_tar,
)

ONES = "1" * 40


def _blob(cache: Path) -> tuple[str, bytes]:
    """A blob of the warmed repo: (name, content)."""
    blob = sorted((cache / BERT / "blobs").iterdir())[0]
    return blob.name, blob.read_bytes()


# ------------------------------------------------------------------------------ a commit the target knows


def test_a_listing_contradicting_a_known_commit_is_refused(target, tmp_path):
    cache, _, commit, _, _ = target
    listing = {"format_version": 1, "files": {
        "vocab.txt": {"type": "file", "oid": "0" * 40, "blob_id": "0" * 40, "size": 3},
        "evil.bin": {"type": "file", "oid": git_sha1(EVIL), "blob_id": git_sha1(EVIL), "size": len(EVIL)}}}
    tar = write_tar(tmp_path / "t.tar", [(f"{BERT}/trees/{commit}.json", json.dumps(listing).encode())])
    proc = run_import(tar, cache)
    assert_refused(proc, 1, f"{BERT}/trees/{commit}.json", "the target's record of that commit")
    assert len(proc.stderr.strip().splitlines()) <= 2  # the error line and its hint
    assert_untouched(target)
    assert not (cache / BERT / "trees").exists()


def test_a_listing_agreeing_with_the_known_commit_is_accepted(target, tmp_path):
    cache, _, commit, _, _ = target
    vocab = (cache / BERT / "snapshots" / commit / "vocab.txt").read_bytes()
    listing = {"format_version": 1, "files": {"vocab.txt": {"blob_id": git_sha1(vocab), "size": len(vocab)}}}
    tar = write_tar(tmp_path / "t.tar", [(f"{BERT}/trees/{commit}.json", json.dumps(listing).encode())])
    assert_refused(run_import(tar, cache), 0)
    assert (cache / BERT / "trees" / f"{commit}.json").is_file()


@pytest.mark.parametrize("how", ["snapshot file", "no_exist marker"])
def test_an_entry_the_known_commit_does_not_list_is_refused(target, tmp_path, how):
    cache, _, commit, _, _ = target
    name, data = _blob(cache)
    if how == "snapshot file":
        entries = [(f"{BERT}/blobs/{name}", data), (f"{BERT}/snapshots/{commit}/generation_config.json", data)]
        why = "does not list it"
    else:
        entries = [(f"{BERT}/.no_exist/{commit}/generation_config.json", b"")]
        why = "does not mark it absent"
    part = "snapshots" if how == "snapshot file" else ".no_exist"
    assert_refused(run_import(write_tar(tmp_path / "t.tar", entries), cache), 1,
                   f"{BERT}/{part}/{commit}/generation_config.json", why)
    assert_untouched(target)


@pytest.mark.parametrize("move", [False, True])
def test_a_ref_to_a_commit_with_only_markers_is_refused(target, tmp_path, move):
    cache = target[0]
    tar = write_tar(tmp_path / "t.tar", [(f"{BERT}/refs/main", ONES.encode()), (f"{BERT}/.no_exist/{ONES}/a", b"")])
    proc = run_import(tar, cache, *(["--move-refs"] if move else []))
    assert_refused(proc, 1, f"{BERT}/refs/main", f"names commit {ONES}, of which neither the source nor the target "
                   "has a snapshot")
    assert_untouched(target)


def test_a_target_marker_planted_as_a_link_is_a_conflict(target, tmp_path):
    cache, canary, commit, _, _ = target
    (cache / BERT / ".no_exist" / commit / "vocab.json").unlink()
    os.symlink(canary / "vocab.txt", cache / BERT / ".no_exist" / commit / "vocab.json")
    before = state(cache)
    tar = write_tar(tmp_path / "t.tar", [(f"{BERT}/.no_exist/{commit}/vocab.json", b"")])
    assert_refused(run_import(tar, cache), 1, f".no_exist/{commit}/vocab.json",
                   "something other than an empty marker")
    assert state(cache) == before
    assert state(canary, skip_locks=False) == target[4]


@pytest.mark.parametrize("folder", ["models--a\nb--c", "models--a b--c", "models--a--b;c"])
def test_a_repo_folder_that_is_no_repo_id_is_refused(target, tmp_path, folder):
    cache, _, commit, _, _ = target
    tar = write_tar(tmp_path / "t.tar", [(f"{folder}/refs/main", commit.encode())])
    assert_refused(run_import(tar, cache), 2, "not part of a Hugging Face cache")
    assert_untouched(target)


# ------------------------------------------------------------------------------ tar and JSON parsing


def _sparse_10(path: Path, data: bytes) -> Path:
    """A PAX member in GNU sparse format 1.0: its sparse map is the start of its data."""
    name = f"{BERT}/blobs/{'0' * 40}"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
                            "GNU.sparse.realsize": "10"}
        t.addfile(info, io.BytesIO(data))
    return path


def test_a_huge_sparse_10_map_is_refused_before_it_is_read(target, tmp_path):
    # the tarfile hooks hfcache.move.import_source.BoundedTarInfo overrides: a Python that renames them must fail here
    assert all(hasattr(tarfile.TarInfo, f"_proc_gnusparse_{v}") for v in ("00", "01", "10"))
    tar = _sparse_10(tmp_path / "map.tar", b"3000000\n" + b"0\n" * 6_000_000)  # 12 MB of map
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = run_import(tar, target[0])
    assert_refused(proc, 2, f"{BERT}/blobs/{'0' * 40}", "a sparse file")
    assert time.monotonic() - started < 60  # reading the map took 72 s; refused, it is the interpreter's start-up
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 250 * 1024 or peak_kib == before  # 348 MB when tarfile read the map
    assert_untouched(target)


@pytest.mark.parametrize("data", [b"5\n", b"abc\n"])
def test_a_malformed_sparse_map_exits_2(target, tmp_path, data):
    proc = run_import(_sparse_10(tmp_path / "bad.tar", data), target[0])
    assert_refused(proc, 2, "a sparse file")
    assert "internal error" not in proc.stderr
    assert_untouched(target)


def test_a_malformed_number_in_a_tar_header_exits_2(target, tmp_path):
    info = tarfile.TarInfo(f"{BERT}/refs/main")
    info.size = 40
    header = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"\x80" + b"\xff" * 11  # a base-256 size, then the checksum recomputed
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    (tmp_path / "n.tar").write_bytes(bytes(header) + b"\0" * 1024)
    proc = run_import(tmp_path / "n.tar", target[0])
    assert proc.returncode in (2, 5), proc.stderr  # refused as unreadable or as too large, never a crash
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert_untouched(target)


def test_a_listing_size_of_1e400_exits_2(target, tmp_path):
    listing = b'{"format_version": 1, "files": {"x": {"blob_id": "' + b"0" * 40 + b'", "size": 1e400}}}'
    tar = write_tar(tmp_path / "t.tar", [(f"{BERT}/trees/{ONES}.json", listing)])
    proc = run_import(tar, target[0])
    assert_refused(proc, 2, f"trees/{ONES}.json", "not a trees/ listing")
    assert "internal error" not in proc.stderr
    assert_untouched(target)


# ------------------------------------------------------------------------------ locks


def test_a_lock_folder_swapped_for_a_link_after_it_was_opened_is_not_followed(tmp_path):
    """The race filelock alone loses: ``.locks/<folder>`` is checked, then replaced by a link to a canary before the
    lock file is opened. Opened through the descriptor of the checked folder, the lock lands in that folder."""
    cache, canary = tmp_path / "cache", tmp_path / "canary"
    canary.mkdir()
    (canary / "keep").write_bytes(b"canary\n")
    cache.mkdir()
    fd = safefs.open_dir(cache, (".locks", BERT), create=True)
    try:
        os.rename(cache / ".locks" / BERT, cache / ".locks" / "moved")
        os.symlink(canary, cache / ".locks" / BERT)
        with file_lock(cache / ".locks" / BERT / "hfcache-repo.lock", timeout=5, dir_fd=fd):
            assert (cache / ".locks" / "moved" / "hfcache-repo.lock").is_file()
    finally:
        os.close(fd)
    assert sorted(os.listdir(canary)) == ["keep"]
    assert (canary / "keep").read_bytes() == b"canary\n"
