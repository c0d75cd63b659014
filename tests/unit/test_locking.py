"""hfcache.cache.locking's soft lock (the lock used where flock does not work) and hfcache.cache.sharing's policy, on real files.

The soft lock is used here directly (no flock patching needed: it never calls flock); the end-to-end runs with flock
made to fail are in tests/integration/test_shared.py.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import SoftFileLock, Timeout

from hfcache.cache.locking import STALE_AFTER, LockTimeout, SoftLock, file_lock, holder_of, try_lock
from hfcache.cache.sharing import make_dirs, policy_of


def aged(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_an_empty_lock_file_left_by_a_flock_run_holds_nothing(tmp_path: Path) -> None:
    lock_file = tmp_path / "x.lock"
    lock_file.touch()
    aged(lock_file, 60)
    # The library gap: filelock's SoftFileLock (huggingface_hub's fallback) takes it for a live holder, forever.
    with pytest.raises(Timeout):
        SoftFileLock(str(lock_file)).acquire(timeout=1)
    lock = SoftLock(str(lock_file))
    lock.acquire(timeout=0)
    assert lock_file.read_text().split("\n")[0] == str(os.getpid())  # our record replaced the empty file
    lock.release()
    assert not lock_file.exists()


def test_a_fresh_empty_marker_is_a_holder_still_writing_its_record(tmp_path: Path) -> None:
    lock_file = tmp_path / "x.lock"
    lock_file.touch()
    with pytest.raises(Timeout):
        SoftLock(str(lock_file)).acquire(timeout=0.5)


def test_a_marker_not_refreshed_for_stale_after_is_taken_over_unless_its_owner_lives_here(tmp_path: Path) -> None:
    lock_file = tmp_path / "x.lock"
    lock_file.write_text("4242\nother-node\n")  # a holder on another host: its pid cannot be probed from here
    with pytest.raises(Timeout):
        SoftLock(str(lock_file)).acquire(timeout=0.5)
    assert holder_of(lock_file) == "pid 4242 on other-node"
    aged(lock_file, STALE_AFTER + 5)
    lock = SoftLock(str(lock_file))
    lock.acquire(timeout=1)
    lock.release()

    # A live process on this host keeps its lock, however old the marker.
    lock_file.write_text(f"{os.getppid()}\n{socket.gethostname()}\n")
    aged(lock_file, STALE_AFTER + 5)
    with pytest.raises(Timeout):
        SoftLock(str(lock_file)).acquire(timeout=0.5)


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_file = tmp_path / "x.lock"
    lock_file.write_text(f"{dead.stdout.strip()}\n{socket.gethostname()}\n")
    lock = SoftLock(str(lock_file))
    lock.acquire(timeout=1)
    lock.release()


def test_file_lock_times_out_naming_the_file_and_holder_and_tells_the_waiter(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("hfcache.cache.locking.NOTICE_AFTER", 0.3)
    lock_file = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from hfcache.cache.locking import file_lock\n"
                               f"with file_lock(Path({str(lock_file)!r})):\n print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waits = []
        started = time.monotonic()
        with pytest.raises(LockTimeout) as info, file_lock(lock_file, timeout=1.5, on_wait=waits.append):
            pass
        assert 1.5 <= time.monotonic() - started < 10
        assert info.value.exit_code == 5 and str(lock_file) in info.value.message
        assert f"pid {holder.pid}" in info.value.message  # from /proc/locks
        assert len(waits) == 1 and waits[0].path == str(lock_file) and f"pid {holder.pid}" in waits[0].holder
        with try_lock(lock_file) as why:
            assert why == "a download holds its lock"
    finally:
        holder.kill()
        holder.wait()
    with try_lock(lock_file) as why:
        assert why == ""
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o664  # group-writable whatever the umask


@pytest.mark.parametrize(("mode", "dirs", "files"), [
    (0o2775, 0o2075, 0o064), (0o0775, 0o2075, 0o064), (0o2770, 0o2070, 0o060),
    (0o0777, 0o2077, 0o066), (0o1777, 0o2077, 0o066),
])
def test_policy_mirrors_the_roots_group_and_other_bits(mode: int, dirs: int, files: int) -> None:
    policy = policy_of(mode, 123)
    assert policy is not None and (policy.gid, policy.dir_bits, policy.file_bits) == (123, dirs, files)


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o2755])
def test_a_root_not_group_writable_is_not_shared(mode: int) -> None:
    assert policy_of(mode, 0) is None


def test_make_dirs_shares_every_folder_it_creates_whatever_the_umask(tmp_path: Path) -> None:
    policy = policy_of(0o2775, os.getegid())
    old = os.umask(0o077)
    try:
        make_dirs(tmp_path / "a" / "b" / "c", tmp_path, policy)
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o2775, oct(path.stat().st_mode)
