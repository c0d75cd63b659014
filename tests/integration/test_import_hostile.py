"""import against hostile tars built here with ``tarfile`` (docs/security.md: tars, links, sizes).

Each test warms a real target cache from the test Hub, keeps a canary folder beside it, runs ``hfcache import`` in a
subprocess on a tar made to attack it, and checks: the exit code and the message naming the entry, that the target
is exactly as it was (every file, link and ref), that the canary is byte-for-byte unchanged with no new file, and that
the target still verifies.

Also covered: a ``trees/`` listing, a snapshot file or a ``.no_exist`` marker contradicting a commit the target knows
(warm's record), a ref to a commit with no snapshot, GNU sparse PAX maps refused before tarfile reads them, malformed
tar numbers and listing sizes (exit 2, not 70), repo folder names that are no repo id, a target marker planted as a
link, and a lock folder swapped for a link after it was checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import hfcache
from hfcache.cache import safefs
from hfcache.cache.locking import file_lock
from hfcache.move.import_plan import MAX_REF_BYTES, MAX_TREE_BYTES
from hfcache.move.import_source import MAX_HEADER_BYTES
from hfcache.records import WarmRequest
from tests.helpers import clean_env, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
BERT = "models--google-bert--bert-base-uncased"
EVIL = b"[PAD]\n[UNK]\nattacker\n"
NEW_COMMIT = hashlib.sha1(b"a commit nobody has").hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def state(root: Path, skip_locks: bool = True) -> dict[str, tuple]:
    """Every entry under ``root``: link target, content hash or folder."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for name in dirs + names:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if skip_locks and rel.split(os.sep)[0] == ".locks":
                continue
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[rel] = ("dir",)
    return out


@pytest.fixture(scope="module")
def warmed_template(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("import-template") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("google-bert/bert-base-uncased")], cache_dir=cache,
                            endpoint=server.endpoint, token=False).ok
    return cache


@pytest.fixture
def target(warmed_template, tmp_path):
    """(cache, canary folder, commit of bert-base-uncased, state before): a fresh copy of the warmed cache."""
    cache = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(warmed_template), str(cache)], check=True)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "vocab.txt").write_bytes(b"canary\n")
    commit = (cache / BERT / "refs" / "main").read_text()
    return cache, canary, commit, state(cache), state(canary, skip_locks=False)


def add(tar: tarfile.TarFile, name: str, data: bytes | None = None, link: str | None = None, **pax) -> None:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info)
    else:
        info.size = len(data)
        info.pax_headers = pax
        tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, entries) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            add(tar, *entry[:2], **(entry[2] if len(entry) > 2 else {}))
    return path


def declared_only(path: Path, name: str, declared: int, data: bytes = b"x" * 10, kind=tarfile.REGTYPE) -> Path:
    """A tar whose one member declares ``declared`` bytes but carries only ``data`` (a truncated or bomb header)."""
    info = tarfile.TarInfo(name)
    info.size, info.type = declared, kind
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    path.write_bytes(header + data + b"\0" * (-len(data) % 512) + b"\0" * 1024)
    return path


def run_import(tar: Path, cache: Path, *extra: str, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    """``hfcache import`` in a subprocess; with ``fsize`` the child may not write a file larger than that."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))) if fsize else None
    return subprocess.run([sys.executable, "-m", "hfcache", "import", str(tar), "--cache-dir", str(cache), *extra],
                          capture_output=True, text=True, env=clean_env(), timeout=300, preexec_fn=limit)


def assert_refused(proc, code: int, *words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def assert_untouched(target) -> None:
    cache, canary, _, before, canary_before = target
    assert state(cache) == before
    assert state(canary, skip_locks=False) == canary_before
    assert not list(cache.glob(".locks/hfcache-import-*"))
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -------------------------------------------------------------------------------------------------- no overwrite


def test_a_link_to_an_existing_commit_cannot_retarget_it(target, tmp_path):
    cache, _, commit, _, _ = target
    evil = git_sha1(EVIL)
    tar = tmp_path / "evil.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as t:
        add(t, f"{BERT}/blobs/{evil}", EVIL)
        add(t, f"{BERT}/snapshots/{commit}/vocab.txt", link=f"../../blobs/{evil}")
    proc = run_import(tar, cache)
    assert_refused(proc, 1, f"{BERT}/snapshots/{commit}/vocab.txt", "already has it with other content",
                   "nothing was changed")
    assert_untouched(target)


def test_a_real_file_vouched_for_by_the_tars_own_listing_cannot_overwrite(target, tmp_path):
    cache, _, commit, _, _ = target
    listing = {"format_version": 1, "files": {"vocab.txt": {"size": len(EVIL), "blob_id": git_sha1(EVIL)}}}
    tar = write_tar(tmp_path / "evil.tar", [
        (f"{BERT}/snapshots/{commit}/vocab.txt", EVIL),
        (f"{BERT}/trees/{commit}.json", json.dumps(listing).encode()),
    ])
    proc = run_import(tar, cache)
    assert_refused(proc, 1, f"{BERT}/snapshots/{commit}/vocab.txt", "other content")
    assert_untouched(target)


def test_the_same_content_is_accepted_and_left_as_it_is(target, tmp_path):
    """The control: re-importing what the target already has changes nothing and succeeds."""
    cache, _, commit, before, _ = target
    vocab = (cache / BERT / "snapshots" / commit / "vocab.txt").read_bytes()
    with tarfile.open(tmp_path / "same.tar", "w", format=tarfile.PAX_FORMAT) as t:
        add(t, f"{BERT}/blobs/{git_sha1(vocab)}", vocab)
        add(t, f"{BERT}/snapshots/{commit}/vocab.txt", link=f"../../blobs/{git_sha1(vocab)}")
        add(t, f"{BERT}/refs/main", commit.encode())
    tar = tmp_path / "same.tar"
    proc = run_import(tar, cache, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["blobs_existing"] == 1
    assert state(cache) == before


def _new_revision_tar(path: Path, commit: str, ref_to: str | None = None) -> Path:
    evil = git_sha1(EVIL)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        add(t, f"{BERT}/blobs/{evil}", EVIL)
        add(t, f"{BERT}/snapshots/{commit}/vocab.txt", link=f"../../blobs/{evil}")
        add(t, f"{BERT}/refs/main", (ref_to or commit).encode())
    return path


def test_an_imported_ref_does_not_move_an_existing_one_unless_asked(target, tmp_path):
    cache, _, commit, _, _ = target
    tar = _new_revision_tar(tmp_path / "newer.tar", NEW_COMMIT)
    proc = run_import(tar, cache)
    assert_refused(proc, 1, f"{BERT}/refs/main", f"points to {commit}", "--move-refs")
    assert_untouched(target)

    proc = run_import(tar, cache, "--move-refs", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["moved_refs"] == [f"{BERT}/refs/main"]
    assert (cache / BERT / "refs" / "main").read_text() == NEW_COMMIT
    assert (cache / BERT / "snapshots" / commit / "vocab.txt").resolve().name != git_sha1(EVIL)  # old one intact
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0


# -------------------------------------------------------------------------------------------------- check first


def test_a_path_that_is_a_file_and_a_folder_is_refused_before_anything_is_written(target, tmp_path):
    cache, _, commit, _, _ = target
    evil = git_sha1(EVIL)
    with tarfile.open(tmp_path / "both.tar", "w", format=tarfile.PAX_FORMAT) as t:
        add(t, f"{BERT}/blobs/{evil}", EVIL)
        add(t, f"{BERT}/snapshots/{NEW_COMMIT}/a", link=f"../../blobs/{evil}")
        add(t, f"{BERT}/snapshots/{NEW_COMMIT}/a/b", link=f"../../../blobs/{evil}")
    assert_refused(run_import(tmp_path / "both.tar", cache), 2, f"{NEW_COMMIT}/a", "a file and a folder at once")
    assert_untouched(target)

    # Against the target: its vocab.txt is a link where the tar needs a folder.
    with tarfile.open(tmp_path / "under.tar", "w", format=tarfile.PAX_FORMAT) as t:
        add(t, f"{BERT}/blobs/{evil}", EVIL)
        add(t, f"{BERT}/snapshots/{commit}/vocab.txt/x", link=f"../../../blobs/{evil}")
    assert_refused(run_import(tmp_path / "under.tar", cache), 1, "vocab.txt is a file or symlink where a folder must be")
    assert_untouched(target)


def test_a_ref_to_a_commit_neither_side_has_is_refused(target, tmp_path):
    cache = target[0]
    tar = _new_revision_tar(tmp_path / "dangling.tar", NEW_COMMIT, ref_to="d" * 40)
    assert_refused(run_import(tar, cache), 1,
                   f"names commit {'d' * 40}, of which neither the source nor the target has a snapshot")
    assert_untouched(target)
    assert not (cache / BERT / "blobs" / git_sha1(EVIL)).exists()


# -------------------------------------------------------------------------------------------------- bounds


def test_a_sparse_gigabyte_blob_is_refused_before_a_byte_is_written(target, tmp_path):
    cache = target[0]
    tar = tmp_path / "sparse.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as t:  # 10 bytes of data expanding to 1 GiB of holes
        add(t, f"{BERT}/blobs/{'0' * 40}", b"x" * 10, **{"GNU.sparse.map": "0,10", "GNU.sparse.size": str(1 << 30),
                                                       "GNU.sparse.major": "0", "GNU.sparse.minor": "1"})
    assert tar.stat().st_size < 16 * 1024
    # The child may not write any file over 1 MiB: reading the blob into staging would kill it (SIGXFSZ).
    proc = run_import(tar, cache, fsize=1 << 20)
    assert_refused(proc, 2, f"{BERT}/blobs/{'0' * 40}", "a sparse file")
    assert_untouched(target)


def test_a_blob_larger_than_the_free_space_is_refused_before_writing(target, tmp_path):
    cache = target[0]
    tar = declared_only(tmp_path / "huge.tar", f"{BERT}/blobs/{'0' * 40}", 1 << 50)  # 1 PiB declared, 10 bytes sent
    proc = run_import(tar, cache, fsize=1 << 20)
    assert_refused(proc, 5, f"{BERT}/blobs/{'0' * 40}", "do not fit", "nothing was imported")
    assert_untouched(target)


@pytest.mark.parametrize(("name", "declared", "message"), [
    (f"{BERT}/trees/{NEW_COMMIT}.json", MAX_TREE_BYTES + 1, f"more than the {MAX_TREE_BYTES} a trees entry"),
    (f"{BERT}/refs/main", MAX_REF_BYTES + 1, f"more than the {MAX_REF_BYTES} a refs entry"),
    (f"{BERT}/.no_exist/{NEW_COMMIT}/x.json", 1, "more than the 0 a .no_exist entry"),
])
def test_metadata_past_its_cap_is_refused_unread(target, tmp_path, name, declared, message):
    tar = declared_only(tmp_path / "meta.tar", name, declared)
    assert_refused(run_import(tar, target[0], fsize=1 << 20), 2, name, message)
    assert_untouched(target)


def test_a_huge_pax_header_is_refused_before_it_is_read(target, tmp_path):
    tar = declared_only(tmp_path / "pax.tar", "././@PaxHeader", 1 << 30, kind=tarfile.XHDTYPE)
    assert_refused(run_import(tar, target[0]), 2, f"more than {MAX_HEADER_BYTES}")
    assert_untouched(target)


def test_a_deeply_nested_listing_is_refused(target, tmp_path):
    deep = b'{"format_version": 1, "files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    tar = write_tar(tmp_path / "deep.tar", [(f"{BERT}/trees/{NEW_COMMIT}.json", deep)])
    assert_refused(run_import(tar, target[0]), 2, f"trees/{NEW_COMMIT}.json", "nested too deep")
    assert_untouched(target)


# ------------------------------------------------------------------------------------------ link: the same kind


@pytest.mark.parametrize("mode", ["hardlink", "copy"])
def test_link_refuses_a_source_whose_link_leaves_its_blobs(target, tmp_path, mode):
    cache, canary, commit, _, _ = target
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(cache), str(src)], check=True)
    (src / BERT / "snapshots" / commit / "leak.txt").symlink_to(canary / "vocab.txt")
    dest = tmp_path / "dest"
    proc = run_hfcache(["link", str(src), str(dest), "--mode", mode])
    assert_refused(proc, 2, "leak.txt", "outside its repo's blobs/")
    assert not dest.exists() and not list(tmp_path.glob(".dest.*"))
    assert_untouched(target)

    (src / BERT / "snapshots" / commit / "leak.txt").unlink()
    proc = run_hfcache(["link", str(src), str(dest), "--mode", mode])
    assert proc.returncode == 0, proc.stderr
    assert run_hfcache(["verify", "--cache-dir", str(dest)]).returncode == 0
    assert state(canary, skip_locks=False) == target[4]


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
