"""A member of a shared cache's group races root's import, prune, lock files and warm's reads; deep folder chains.

The cache is the documented recipe (root-owned, group ``GROUP``, ``2775``: setgid, group-writable), so every folder
root walks can be swapped by a member between a check and a use. ALICE (a member, another uid through ``setpriv``)
runs a swap loop with ``renameat2(RENAME_EXCHANGE)`` (ctypes, standard library only) for a bounded number of rounds
while root runs the real command; each test asserts the command's exit code and one-line message, that a
:class:`~tests.canary.Canary` outside the cache (a root-only 0600 secret, a public file, a sub-folder) is byte for
byte unchanged with no new entry, and that the cache still verifies once the member stops.

A test passes only when root never acts through the member's link: the importer's ``shutil.copyfile``/``os.replace``
by path and ``share_dir``'s ``chmod`` by path once wrote through it (tests/unit/test_fs_discipline.py keeps them out).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.canary import Canary
from tests.chains import plant_chain
from tests.helpers import run_hfcache
from tests.shared_cache import (
    COMMITS,
    SHARED,
    export_tar,
    make_export,
    member_swaps,
    one_line_outcome,
    sha256,
    shared_cache,
    stop_member,
)
from tests.users import ALICE, GROUP, Runtime, needs_root


def verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -------------------------------------------------------------------------------------------------------- import


@needs_root
def test_import_of_shared_blobs_never_copies_or_moves_through_a_members_link(runtime: Runtime,
                                                                           tmp_path: Path) -> None:
    """The first repo's blob is exchanged with a link to root's secret, the next repos' blobs are planted as
    links to paths outside, their ``blobs/`` and ``trees/`` folders exchanged with links to a folder outside, while
    root imports an export whose repos share that blob. Root never copies the secret, never writes, renames or
    chmods outside; the import succeeds or refuses in one line; once the member stops, a re-import and ``verify``
    pass."""
    canary = Canary(tmp_path)
    names = make_export(tmp_path / "export", 6)
    source = export_tar(tmp_path / "export", tmp_path / "export.tar")
    etag = sha256(SHARED)
    outcomes, hits = [], 0
    for n in range(12):
        cache = shared_cache(runtime, f"import-race-{n}")
        stop = runtime.base / f"stop-import-{n}"
        first_blob = str(cache / names[0] / "blobs" / etag)
        spec = {"stop": str(stop), "rounds": 1_000_000, "hold": 0.003,
                # the first repo's blob becomes a link to the secret once published
                "exchange": [[first_blob, str(canary.secret)]]
                # the next repos' blobs/ and trees/ folders become links to a folder outside
                + [[str(cache / name / part), str(canary.dir), first_blob] for name in names[3:]
                   for part in ("blobs", "trees")],
                # the next repos' blobs are planted as links to outside paths once the first is published
                "plant": [[str(cache / names[1] / "blobs" / etag), str(canary.public), first_blob],
                          [str(cache / names[2] / "blobs" / etag), str(canary.dir / "stolen"), first_blob]]}
        for name in names:  # the member makes the repo folders first, as any member may
            subprocess.run([*ALICE.setpriv(), "mkdir", "-p", str(cache / name / "blobs"), str(cache / name / "trees")],
                           check=True, preexec_fn=lambda: os.umask(0o002))
        member = member_swaps(runtime, spec)
        try:
            time.sleep(0.2)
            proc = run_hfcache(["import", str(source), "--cache-dir", str(cache)], timeout=120)
        finally:
            hits += stop_member(member, stop)
        one_line_outcome(proc, {0: (), 1: ("refused",), 2: ("refused",),
                                5: ("symlink", "left alone", "changed", "not a directory")})
        outcomes.append(proc.returncode)
        canary.assert_unchanged()
        # The member stopped and put everything back: the import completes and the cache verifies.
        again = run_hfcache(["import", str(source), "--cache-dir", str(cache)], timeout=120)
        assert again.returncode == 0, again.stderr
        verify_ok(cache)
        assert os.lstat(canary.secret).st_mode & 0o777 == 0o600
    assert hits, f"the member never swapped anything (outcomes {outcomes})"


@needs_root
def test_import_never_copies_a_blob_swapped_for_a_link_or_fifo(tmp_path: Path) -> None:
    """Deterministic: the copy fallback (a repo whose hardlink of an already published blob fails) opens the
    source ``O_NOFOLLOW | O_NONBLOCK`` through its folder's fd and re-hashes it; a link to the secret, a FIFO or a
    file with other bytes there is refused in one line, and nothing is written outside."""
    from hfcache.cache.layout import RepoFolder

    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    etag = sha256(SHARED)
    first = RepoFolder(cache, "org/r0")
    second = RepoFolder(cache, "org/r1")
    first.make_dir(first.root / "blobs")
    for planted in ("link", "fifo", "other"):
        blob = first.blob_path(etag)
        blob.unlink(missing_ok=True)
        if planted == "link":
            os.symlink(canary.secret, blob)
        elif planted == "fifo":
            os.mkfifo(blob)
        else:
            blob.write_bytes(b"x" * len(SHARED))
        with pytest.raises(Exception) as raised:
            second.copy_blob(first.name, etag, len(SHARED))
        assert type(raised.value).__name__ == "UnsafeLayout", raised.value
        assert not os.path.lexists(second.blob_path(etag))
        left = list((second.root / "blobs").iterdir()) if (second.root / "blobs").exists() else []
        assert not left, f"a temporary file was left behind: {left}"
    blob.unlink()
    blob.write_bytes(SHARED)
    second.copy_blob(first.name, etag, len(SHARED))
    assert second.blob_path(etag).read_bytes() == SHARED
    canary.assert_unchanged()


# ---------------------------------------------------------------------------------------------------- prune


@needs_root
def test_prune_never_chmods_through_a_trash_folder_exchanged_with_a_link(runtime: Runtime, tmp_path: Path) -> None:
    """While root prunes revisions (each goes through ``<repo>/.hfcache-trash``, created and shared by root),
    the member exchanges that name with a link to root's 0600 secret, and ``.locks/<repo>`` with a link to a folder
    outside. The secret stays 0600 root's, nothing appears outside, prune ends in one line, the cache verifies."""
    canary = Canary(tmp_path)
    source = tmp_path / "export"
    names = make_export(source, 3)
    hits = 0
    for n in range(10):
        cache = shared_cache(runtime, f"prune-race-{n}")
        assert run_hfcache(["import", str(source), "--cache-dir", str(cache)]).returncode == 0
        stop = runtime.base / f"stop-prune-{n}"
        spec = {"stop": str(stop), "rounds": 2_000_000, "hold": 0,  # flip as fast as possible: tiny windows
                "exchange": [[str(cache / name / ".hfcache-trash"), str(canary.secret)] for name in names]
                + [[str(cache / ".locks" / name), str(canary.dir)] for name in names[1:]],
                "plant": []}
        member = member_swaps(runtime, spec)
        try:
            time.sleep(0.1)
            proc = run_hfcache(["prune", "--cache-dir", str(cache), "--max-size", "0", "--keep", "org/r0", "--yes"])
        finally:
            hits += stop_member(member, stop)
        one_line_outcome(proc, {0: (), 5: ("failed", "symlink", "left alone", "lock")})
        canary.assert_unchanged()
        st = os.lstat(canary.secret)
        assert (st.st_mode & 0o7777, st.st_uid) == (0o600, 0)
        verify_ok(cache)
    assert hits, "the member never swapped anything"


@needs_root
def test_shared_folders_are_created_and_chmod_ed_through_their_descriptor(runtime: Runtime,
                                                                           tmp_path: Path) -> None:
    """Deterministic: ``make_dirs`` (used for ``.locks``, prune's trash, lock folders) refuses a component that
    is a link, and never chmods or chowns its target; the folders it makes get the shared bits."""
    from hfcache.cache.safefs import UnsafeLayout
    from hfcache.cache.sharing import cache_policy, make_dirs

    canary = Canary(tmp_path)
    cache = shared_cache(runtime, "make-dirs")
    os.symlink(canary.secret, cache / ".hfcache-trash")
    os.symlink(canary.dir, cache / ".locks")
    for target in (cache / ".hfcache-trash", cache / ".locks" / "models--org--x"):
        with pytest.raises(UnsafeLayout):
            make_dirs(target, cache, cache_policy(cache))
    canary.assert_unchanged()
    make_dirs(cache / "models--org--y" / "blobs", cache, cache_policy(cache))
    st = os.stat(cache / "models--org--y" / "blobs")
    assert st.st_gid == GROUP and st.st_mode & 0o2070 == 0o2070


# ---------------------------------------------------------------------------------------------------- deep chains




@needs_root
def test_prune_removes_a_thousand_level_chain_planted_in_a_snapshot(runtime: Runtime, tmp_path: Path) -> None:
    """A member plants a 1,000-level folder chain in a snapshot (Python 3.11's ``shutil.rmtree`` and
    ``os.walk`` recurse per level: exit 70 before). Prune removes that revision, chain included, without exit 70;
    the canary is unchanged and the cache verifies."""
    canary = Canary(tmp_path)
    source = tmp_path / "export"
    make_export(source, 2)
    cache = shared_cache(runtime, "deep-chain")
    assert run_hfcache(["import", str(source), "--cache-dir", str(cache)]).returncode == 0
    chain = cache / "models--org--r1" / "snapshots" / COMMITS[1] / "deep"
    subprocess.run([*ALICE.setpriv(), runtime.python, "-c",
                    "import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
                    "for _ in range(1000):\n    os.mkdir('d', dir_fd=fd)\n"
                    "    nfd = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = nfd\n",
                    str(chain.parent)], check=True, cwd=runtime.base, env=runtime.env(ALICE))
    proc = run_hfcache(["prune", "--cache-dir", str(cache), "--max-size", "0", "--keep", "org/r0", "--yes", "--json"])
    assert proc.returncode == 0, proc.stderr
    items = json.loads(proc.stdout)["items"]
    snap = [i for i in items if i["kind"] == "snapshot"]
    assert [i["status"] for i in snap] == ["removed"], items
    assert not (cache / "models--org--r1").exists()
    canary.assert_unchanged()
    verify_ok(cache)


def test_the_iterative_remove_handles_any_depth_and_follows_no_link(tmp_path: Path) -> None:
    """``safefs.rmtree`` (every removal below the root): 3,000 levels with a file at the bottom, links to a folder
    and to a file outside inside it; the chain goes, the targets stay."""
    from hfcache.cache import safefs

    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    plant_chain(cache / "repo" / "trash" / "x", 3000)
    os.symlink(canary.dir, cache / "repo" / "trash" / "x" / "to-dir")
    os.symlink(canary.secret, cache / "repo" / "trash" / "x" / "d" / "to-file")
    assert safefs.rmtree(cache, ("repo", "trash", "x"))
    assert list((cache / "repo" / "trash").iterdir()) == []
    canary.assert_unchanged()


def test_a_chain_deeper_than_the_bound_left_in_an_empty_repo_folder_is_reported_not_fatal(tmp_path: Path) -> None:
    """The repo-folder removal walks at most ``bounds.MAX_TREE_DEPTH`` levels: a deeper chain of empty folders
    outside ``snapshots/`` is "left alone" for that folder (skipped), never exit 70."""
    from hfcache.bounds import MAX_TREE_DEPTH, TooDeep
    from hfcache.cache.safefs_tree import iter_tree

    cache = tmp_path / "cache"
    plant_chain(cache / "models--org--x" / "blobs", MAX_TREE_DEPTH + 5)
    with pytest.raises(TooDeep):
        list(iter_tree(cache, ("models--org--x",)))
    assert len(list(iter_tree(cache, ("models--org--x",), max_depth=MAX_TREE_DEPTH + 10))) == MAX_TREE_DEPTH + 7


# ---------------------------------------------------------------------------------------------------- lock files


@pytest.mark.parametrize("soft", [False, True], ids=["flock", "soft-marker"])
def test_a_lock_folder_swapped_after_filelock_resolves_it_is_not_followed(tmp_path: Path, monkeypatch,
                                                                          soft: bool) -> None:
    """filelock 4 resolves a lock's folder with ``os.path.realpath`` and then opens that path string: a member
    who swaps ``.locks/<folder>`` for a link right after that made root create the lock file outside the cache (a
    near miss showed up as exit 5 "No such file or directory" in the prune race above). The swap is made exactly
    in that window here (``realpath`` does it), for the flock lock and the soft marker; the lock file must land in
    the folder hfcache checked, none outside."""
    from hfcache.cache import locking
    from hfcache.cache.layout import RepoFolder

    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    folder = RepoFolder(cache, "org/x")
    folder.make_dir(folder.locks)
    real_open = os.open
    swapped = []

    def member_swaps_then_open(path, flags, *args, **kwargs):
        # The member's exchange lands in the last moment: after every check, just before the lock file's open.
        if not swapped and str(path).endswith("hfcache-repo.lock"):
            os.rename(folder.locks, folder.locks.with_name("moved"))
            os.symlink(canary.dir, folder.locks)
            swapped.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    if soft:
        monkeypatch.setattr(locking, "flock_error", lambda directory: 38)  # ENOSYS: the soft marker
    monkeypatch.setattr(os, "open", member_swaps_then_open)
    with folder.repo_lock():
        pass
    monkeypatch.setattr(os, "open", real_open)
    assert swapped, "the lock file was never opened"
    canary.assert_unchanged()
    assert (folder.locks.with_name("moved") / "hfcache-repo.lock").exists() or soft  # a soft marker goes at release
    assert not (canary.dir / "hfcache-repo.lock").exists()


def test_warms_reads_of_a_fetched_blob_never_follow_or_wait(tmp_path: Path, hub_server) -> None:
    """warm re-reads configs and weight indexes it fetched (custom code, shards): from the root, through
    descriptors (``RepoFolder.read_blob``), so a blob a member swapped for a FIFO or a link to ``/dev/zero`` after
    the fetch is refused at once, never read or waited on."""
    from hfcache.cache.layout import RepoFolder
    from hfcache.cache.safefs import UnsafeLayout

    cache = tmp_path / "cache"
    assert run_hfcache(["warm", "gpt2", "--endpoint", hub_server.endpoint, "--cache-dir", str(cache)]).returncode == 0
    folder = RepoFolder(cache, "gpt2")
    blob = next(p for p in (cache / "models--gpt2" / "blobs").iterdir())
    size = blob.stat().st_size
    assert len(folder.read_blob(blob.name, size)) == size
    saved = blob.read_bytes()
    for hostile in ("fifo", "/dev/zero"):
        blob.unlink()
        os.mkfifo(blob) if hostile == "fifo" else os.symlink(hostile, blob)
        started = time.monotonic()
        with pytest.raises(UnsafeLayout):
            folder.read_blob(blob.name, size)
        assert time.monotonic() - started < 5
    blob.unlink()
    blob.write_bytes(saved)
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0
