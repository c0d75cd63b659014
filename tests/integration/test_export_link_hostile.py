"""The movers: ``link``, ``export`` (and warm's publish) against a group member, deep folder
chains and a DEST inside the source cache.

- A member of a shared cache's group (ALICE, via ``setpriv``) swaps ``blobs/`` or a snapshot folder for a link to
  a canary folder in a loop (``renameat2(RENAME_EXCHANGE)``) while root runs ``hfcache link --mode copy`` and
  ``--mode hardlink``: no canary byte may reach DEST, the canary stays unchanged, the cache still verifies.
- A 1,000-level folder chain in a snapshot (or a ``.no_exist`` folder): ``link`` and ``export`` exit 5 with one line
  naming the repo, never a traceback or exit 70.
- ``env``'s private ``HF_MODULES_CACHE`` folder in a TMPDIR anyone can write: a member exchanging its name with a
  link to a canary file never makes root chmod that file.
- ``export`` into the source cache (directly, as the cache itself, or through a symlink): exit 2, one line, and
  the cache holds nothing new and still verifies; ``link`` into its own SRC likewise.

Every hostile input is built here; every command runs as a real subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import hfcache
from hfcache.records import WarmRequest
from tests.canary import SECRET, Canary
from tests.chains import plant_chain, remove_tree
from tests.helpers import clean_env, run_hfcache
from tests.testhub import HubServer
from tests.users import ALICE, GROUP, needs_root

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "google-bert/bert-base-uncased"
FOLDER = "models--google-bert--bert-base-uncased"
#: Rounds of the swap race per case: each round is one full `hfcache link` run (well under 30 s in all).
ROUNDS = 25
T = 120


# ----------------------------------------------------------------------------------------------------- helpers


def warm(cache: Path) -> str:
    """Warm REPO into ``cache`` from the fixture Hub; return its commit."""
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(REPO)], cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos]
    return (cache / FOLDER / "refs" / "main").read_text()


def verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json"], timeout=T)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The error line of a refused command, after checking its exit code, that it is no crash, and ``needles``."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("hfcache: error:"), proc.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint:")), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def entries(root: Path) -> dict[str, tuple]:
    """Every path below ``root`` (links not followed) -> (type bits, size, link target)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            found[str(p.relative_to(root))] = (st.st_mode >> 12, st.st_size if p.is_file() and not p.is_symlink()
                                               else 0, os.readlink(p) if p.is_symlink() else None)
    return found


def assert_no_canary_byte(dest: Path) -> None:
    """No file below ``dest`` holds the canary's secret, and no canary name appears there."""
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            assert name not in ("secret", "public.txt", "sub"), p
            if p.is_symlink():
                assert not os.path.isabs(os.readlink(p)) and "canary" not in os.readlink(p), p
            elif p.is_file():
                assert SECRET not in p.read_bytes(), p






# ------------------------------------------------------------------- 1: a member swaps folders under `link`

#: ALICE's loop: exchange NAME with a link to the canary folder until STOP exists, then put the real folder back.
SWAP = textwrap.dedent("""
    import ctypes, os, sys, time
    parent, name, target, spare, stop = sys.argv[1:6]
    other = sys.argv[6] if len(sys.argv) > 6 else name  # the link's name in SPARE
    libc = ctypes.CDLL(None, use_errno=True)
    RENAME_EXCHANGE = 2
    # The link waits in the member's own folder (same filesystem): nothing but the swapped name changes in the cache.
    fd, sfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY), os.open(spare, os.O_RDONLY | os.O_DIRECTORY)
    os.symlink(target, other, dir_fd=sfd)
    swaps = 0
    def exchange():
        if libc.renameat2(fd, name.encode(), sfd, other.encode(), RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
    while not os.path.exists(stop):
        exchange()
        swaps += 1
        time.sleep(0.00005)
    if swaps % 2:
        exchange()
    os.unlink(other, dir_fd=sfd)
    print(swaps)
""")


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A world-traversable folder (other uids cannot enter pytest's 0700 tmp_path)."""
    base = Path(tempfile.mkdtemp(prefix="hfcache-movers-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def shared_cache(base: Path) -> Path:
    """The documented group-shared recipe (chgrp GROUP; chmod 2775), warmed by root."""
    cache = base / "cache"
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)
    warm(cache)
    return cache


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["copy", "hardlink"])
@pytest.mark.parametrize("swapped", ["blobs", "snapshot"])
def test_link_under_a_members_swap_loop_reads_nothing_outside(shared_base: Path, mode: str, swapped: str) -> None:
    cache = shared_cache(shared_base)
    canary = Canary(shared_base)
    commit = (cache / FOLDER / "refs" / "main").read_text()
    parent, name = (cache / FOLDER, "blobs") if swapped == "blobs" else (cache / FOLDER / "snapshots", commit)
    assert os.stat(parent).st_mode & 0o070 == 0o070, "the recipe makes every folder group-writable"
    # Root-only files under the names `link` will look up in the swapped folder (a private config.json next to
    # an application, another cache's blobs): a walk that resolves a name through the link copies them.
    decoys = [canary.dir / n for n in sorted(os.listdir(parent / name))]
    for decoy in decoys:
        decoy.write_bytes(SECRET)
        os.chmod(decoy, 0o600)
    canary.watch(*decoys)
    stop, spare = shared_base / "stop", shared_base / "alice"
    spare.mkdir()
    os.chown(spare, ALICE.uid, ALICE.gid)
    alice = subprocess.Popen([*ALICE.setpriv(), "/usr/bin/python3", "-c", SWAP, str(parent), name, str(canary.dir),
                              str(spare), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    codes = []
    try:
        time.sleep(0.2)
        assert alice.poll() is None, alice.communicate()
        for i in range(ROUNDS):
            dest = shared_base / f"dest-{i}"
            proc = run_hfcache(["link", str(cache), str(dest), "--mode", mode], timeout=T)
            codes.append(proc.returncode)
            if proc.returncode == 0:
                assert_no_canary_byte(dest)
            else:  # refused: the swap was seen (a link where a folder belongs), nothing was made
                one_line_error(proc, proc.returncode)
                assert proc.returncode in (2, 5), proc.stderr
                assert not dest.exists()
            assert not [p for p in shared_base.iterdir() if p.name.endswith(".partial")]
            canary.assert_unchanged()
    finally:
        stop.touch()
        out, err = alice.communicate(timeout=30)
    assert alice.returncode == 0, err
    assert int(out.strip()) > 0, "the member's loop never swapped"
    print(f"{swapped} {mode}: exit codes {sorted(codes)}, {out.strip()} swaps")
    canary.assert_unchanged()
    verify_ok(cache)
    # The last good link is a whole, working copy of the cache (not a half of one).
    good = [shared_base / f"dest-{i}" for i, code in enumerate(codes) if code == 0]
    if good:
        verify_ok(good[-1])


@needs_root
@pytest.mark.slow
def test_export_under_a_members_swap_loop_reads_nothing_outside(shared_base: Path) -> None:
    # A cache without symlinks (real files in snapshots/, what `export --materialize` and huggingface_hub without
    # symlink support write), group-shared: export copies those files from the snapshot folder a member swaps.
    source = shared_cache(shared_base)
    cache = shared_base / "real-files"
    proc = run_hfcache(["export", str(cache), "--cache-dir", str(source), "--materialize", "--group-writable",
                        "--chown", f"0:{GROUP}"], timeout=T)
    assert proc.returncode == 0, proc.stderr
    os.chmod(cache, 0o2775)
    canary = Canary(shared_base)
    commit = (cache / FOLDER / "refs" / "main").read_text()
    parent = cache / FOLDER / "snapshots"
    decoys = [canary.dir / n for n in sorted(os.listdir(parent / commit))]
    for decoy in decoys:
        decoy.write_bytes(SECRET)
        os.chmod(decoy, 0o600)
    canary.watch(*decoys)
    stop, spare = shared_base / "stop", shared_base / "alice"
    spare.mkdir()
    os.chown(spare, ALICE.uid, ALICE.gid)
    alice = subprocess.Popen([*ALICE.setpriv(), "/usr/bin/python3", "-c", SWAP, str(parent), commit,
                              str(canary.dir), str(spare), str(stop)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    codes, lines = [], set()
    try:
        time.sleep(0.2)
        assert alice.poll() is None, alice.communicate()
        for i in range(ROUNDS):
            dest = shared_base / (f"out-{i}" if i % 2 else f"out-{i}.tar")
            proc = run_hfcache(["export", str(dest), "--cache-dir", str(cache)], timeout=T)
            codes.append(proc.returncode)
            if proc.returncode != 0:  # the swap was seen: refused, nothing written
                lines.add(one_line_error(proc, 5).split(": ")[-1][:60])
                assert not dest.exists()
            elif dest.is_dir():
                assert_no_canary_byte(dest)
            else:
                assert SECRET not in dest.read_bytes(), dest
            canary.assert_unchanged()
    finally:
        stop.touch()
        out, err = alice.communicate(timeout=30)
    assert alice.returncode == 0 and int(out.strip()) > 0, err
    print(f"export: exit codes {sorted(codes)}, {out.strip()} swaps; {sorted(lines)}")
    canary.assert_unchanged()
    verify_ok(cache)


def _fchmod_dir(path: Path, mode: int) -> None:
    """chmod the real folder ``path`` (never a link's target): the test's own reset, raced by the member too."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # the member's link is in place right now
            time.sleep(0.001)
            continue
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return


@needs_root
@pytest.mark.slow
def test_env_never_chmods_through_a_swapped_modules_folder(shared_base: Path) -> None:
    # HF_HOME cannot be written (a file where its folder would go), so `env` points HF_MODULES_CACHE at
    # <TMPDIR>/hfcache-modules-0 and makes that folder private again; TMPDIR is writable by all without the sticky
    # bit, so a member can exchange the folder's name with a link to the canary's public file.
    canary = Canary(shared_base)
    tmp = shared_base / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o777)
    (shared_base / "file").write_text("")
    modules = tmp / f"hfcache-modules-{os.geteuid()}"
    modules.mkdir()
    stop = shared_base / "stop"
    # The link waits beside the folder (moving a folder to another parent needs write access to the folder).
    alice = subprocess.Popen([*ALICE.setpriv(), "/usr/bin/python3", "-c", SWAP, str(tmp), modules.name,
                              str(canary.public), str(tmp), str(stop), "alice-link"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    env = {**clean_env(), "HF_HOME": str(shared_base / "file" / "hf"), "TMPDIR": str(tmp)}
    codes = []
    try:
        time.sleep(0.2)
        for _ in range(ROUNDS):
            _fchmod_dir(modules, 0o777)  # ours, but others could plant code in it: env must make it private
            proc = run_hfcache(["env", "--cache-dir", str(shared_base / "c"), "--format", "dotenv"], env=env,
                               timeout=T)
            codes.append(proc.returncode)
            if proc.returncode:  # the link was in place: refused, naming it
                one_line_error(proc, 5, str(modules), "not a private folder of uid 0")
            else:
                assert f"HF_MODULES_CACHE={modules}" in proc.stdout
            canary.assert_unchanged()
    finally:
        stop.touch()
        out, err = alice.communicate(timeout=30)
    assert alice.returncode == 0 and int(out.strip()) > 0, err
    print(f"env: exit codes {sorted(codes)}")
    canary.assert_unchanged()
    assert stat.S_IMODE(os.lstat(modules).st_mode) in (0o700, 0o777)


# ---------------------------------------------------------------------- 2: a 1,000-level chain in a snapshot


@pytest.mark.parametrize("where", ["snapshot", ".no_exist"])
def test_a_thousand_level_chain_is_exit_5_naming_the_repo(tmp_path: Path, where: str) -> None:
    cache = tmp_path / "cache"
    commit = warm(cache)
    canary = Canary(tmp_path)
    top = cache / FOLDER / ("snapshots" if where == "snapshot" else ".no_exist") / commit
    top.mkdir(parents=True, exist_ok=True)
    plant_chain(top, 1000, leaf="deep.txt", content=b"at the bottom\n")
    try:
        before = sorted(os.listdir(tmp_path))
        runs = {
            "link copy": run_hfcache(["link", str(cache), str(tmp_path / "copy"), "--mode", "copy"], timeout=T),
            "link hardlink": run_hfcache(["link", str(cache), str(tmp_path / "hard"), "--mode", "hardlink"],
                                         timeout=T),
            "export dir": run_hfcache(["export", str(tmp_path / "out"), "--cache-dir", str(cache)], timeout=T),
            "export tar": run_hfcache(["export", str(tmp_path / "out.tar"), REPO, "--cache-dir", str(cache)],
                                      timeout=T),
        }
        for what, proc in runs.items():
            line = one_line_error(proc, 5, FOLDER)
            assert "deeper than 64" in line or "unsafe" in line, (what, line)
        assert sorted(os.listdir(tmp_path)) == before  # no DEST, no staging folder left
        canary.assert_unchanged()
    finally:
        remove_tree(top / "d")  # pytest's own cleanup (shutil.rmtree) recurses per level
    verify_ok(cache)


# --------------------------------------------------------------------- 3: DEST inside the source cache


def test_export_into_the_source_cache_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm(cache)
    canary = Canary(tmp_path)
    (tmp_path / "into-cache").symlink_to(cache, target_is_directory=True)
    (tmp_path / "into-repo").symlink_to(cache / FOLDER / "snapshots", target_is_directory=True)
    (cache / "empty").mkdir()  # an empty folder in the cache: what write_dir would otherwise accept as DEST
    (tmp_path / "to-empty").symlink_to(cache / "empty", target_is_directory=True)
    before = entries(cache)
    dests = {
        "a new folder in the cache": [str(cache / "exported")],
        "an empty folder in the cache": [str(cache / "empty")],
        "the cache itself": [str(cache)],
        "through a symlinked folder": [str(tmp_path / "into-cache" / "exported")],
        "through a symlink into a repo": [str(tmp_path / "into-repo" / "x")],
        "a symlink to a folder in the cache": [str(tmp_path / "to-empty")],
        "with .. after a symlink": [str(tmp_path / "into-repo" / ".." / "y")],
        "a tar in the cache": [str(cache / "out.tar")],
        "a tar through a symlink": [str(tmp_path / "into-cache" / "out.tar"), "--format", "tar"],
        "materialized": [str(cache / "m"), "--materialize"],
    }
    for what, args in dests.items():
        proc = run_hfcache(["export", *args, "--cache-dir", str(cache)], timeout=T)
        one_line_error(proc, 2, "inside the source cache")
        assert entries(cache) == before, what
    # ... and the JSON form says the same in one document.
    proc = run_hfcache(["export", str(cache / "j"), "--cache-dir", str(cache), "--json"], timeout=T)
    assert proc.returncode == 2 and json.loads(proc.stdout)["exit_code"] == 2
    assert entries(cache) == before
    (cache / "empty").rmdir()
    assert {r.repo_id for r in scan_cache_dir(cache).repos} == {REPO}
    verify_ok(cache)
    canary.assert_unchanged()
    # A DEST beside the cache (a sibling whose name starts like it) is fine.
    ok = run_hfcache(["export", str(tmp_path / "cache-export"), "--cache-dir", str(cache)], timeout=T)
    assert ok.returncode == 0, ok.stderr
    verify_ok(tmp_path / "cache-export")


def test_link_into_its_own_source_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm(cache)
    (tmp_path / "into-cache").symlink_to(cache, target_is_directory=True)
    before = entries(cache)
    for mode in ("symlink", "copy", "hardlink"):
        for dest in (cache / "linked", tmp_path / "into-cache" / "linked"):
            proc = run_hfcache(["link", str(cache), str(dest), "--mode", mode], timeout=T)
            one_line_error(proc, 2, "inside the source cache")
            assert entries(cache) == before, (mode, dest)
    # Linking again onto a DEST that already is the symlink (beside the cache) still succeeds.
    dest = tmp_path / "runtime-cache"
    for _ in range(2):
        proc = run_hfcache(["link", str(cache), str(dest)], timeout=T)
        assert proc.returncode == 0, proc.stderr
    verify_ok(cache)
