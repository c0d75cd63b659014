"""The suite cleans up after itself: a run leaves no more than a few MB behind it.

Each test runs a real pytest session in a subprocess, with its own ``TMPDIR`` (so pytest's basetemp and every
``tempfile`` folder land in a place of the test's own) and its own ``HFCACHE_TEST_CACHE``, with the project's
conftest and pyproject.toml (retention policy), then measures what that session left there and in ``/tmp``:

- a representative slice of the suite (tmp_path-heavy unit tests, a local Hub, another uid's runtime and folder
  chains, a real registry, the session-wide model repos) leaves less than ``MAX_LEFT_BYTES``, no runtime folder and
  no process, and says so on its summary line;
- the measurement can fail: pytest's old default retention (``all``) leaves the megabytes a test wrote; a test
  that leaves a process running fails the session, which names and stops it; a failed test's folder is kept
  for inspection (and reported) until the next failed run replaces it;
- a runtime folder of a killed run is removed by the next session, one of a live session is not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import cleanup
from tests.canary import Canary
from tests.helpers import clean_env
from tests.users import EVE, needs_root

#: Each test runs a pytest session of its own (minutes, and CPU the suite's workers share): run with -m slow.
pytestmark = [pytest.mark.slow, pytest.mark.timing]

REPO = Path(__file__).resolve().parents[2]
#: A representative slice: unit tests that write caches in tmp_path, a local Hub (hub_server), another uid's
#: runtime and 1,000-level folder chains (runtime fixture), a real registry and module-wide fixture folders.
SLICE = ("tests/unit/test_locking.py", "tests/unit/test_paths.py", "tests/integration/test_untrusted_cache_records.py",
         "tests/integration/test_oci.py")


def _private_tmp(base: Path) -> Path:
    """A TMPDIR like /tmp (1777) below a world-traversable folder: other uids' runtimes work from it too."""
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    tmp = base / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    return tmp


def _session(tmp: Path, args: list[str], *, timeout: float = 900, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` in the project, with ``TMPDIR=tmp`` and a private HFCACHE_TEST_CACHE; the
    completed process's ``args`` is replaced by its pid."""
    environment = clean_env(**{"TMPDIR": str(tmp), "HFCACHE_TEST_CACHE": str(tmp.parent / "hfcache-test"), **env})
    environment.pop("PYTEST_ADDOPTS", None)
    # The child is a session of its own (its conftest gives it a token), not a worker of this one's xdist controller.
    for name in [n for n in environment if n.startswith("PYTEST_XDIST_")] + [cleanup.SESSION_VAR,
                                                                             cleanup.SESSION_PID_VAR]:
        environment.pop(name, None)
    # -n 0: one process, as these sessions were designed (pyproject's addopts run the suite in xdist workers).
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *args]
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=environment) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
    return subprocess.CompletedProcess(child.pid, child.returncode, out, err)


def _summary(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("hfcache test cleanup:")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    return lines[0]


def _runtimes() -> set[Path]:
    return set(cleanup.RUNTIME_ROOT.glob(f"{cleanup.RUNTIME_PREFIX}*"))


def _write_tests(folder: Path, source: str) -> Path:
    """A test file outside tests/, run with the project's conftest as a plugin (``-p tests.conftest``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "test_synthetic.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def _synthetic(tmp: Path, test_file: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _session(tmp, ["-p", "tests.conftest", "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"),
                          *extra, str(test_file)], timeout=120, **env)


@pytest.mark.slow
def test_a_passing_slice_of_the_suite_leaves_a_few_mb_at_most(tmp_path):
    tmp = _private_tmp(tmp_path / "run")
    proc = _session(tmp, list(SLICE))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    line = _summary(proc)
    assert line.startswith("hfcache test cleanup: left nothing"), line
    assert "stopped" not in line and "runtime folder" not in line, line
    left = cleanup.tree_bytes(tmp)
    assert left <= cleanup.MAX_LEFT_BYTES, (left, sorted(p.name for p in tmp.rglob("*"))[:50])
    assert cleanup.tree_bytes(tmp.parent / "hfcache-test") == 0
    mine = [base for base in _runtimes() if (owner := cleanup._runtime_owner(base)) and owner[1] == proc.args]
    assert not mine, mine  # the other-uid runtimes the slice made (marked with the child's pid) are gone


LEAKY = """
    import os, subprocess, sys

    def test_writes_eight_megabytes(tmp_path):
        (tmp_path / "blob").write_bytes(os.urandom(8 * 2**20))
"""


def test_the_old_retention_keeps_what_tests_wrote_and_the_check_sees_it(tmp_path):
    """pytest's default (``all``): the 8 MB a passing test wrote stay; the summary names them."""
    tmp = _private_tmp(tmp_path / "run")
    test_file = _write_tests(tmp_path / "src", LEAKY)
    proc = _synthetic(tmp, test_file, "-o", "tmp_path_retention_policy=all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MiB in " in _summary(proc), _summary(proc)
    assert cleanup.tree_bytes(tmp) > cleanup.MAX_LEFT_BYTES

    # The project's policy: the same passing test leaves nothing.
    tmp2 = _private_tmp(tmp_path / "run2")
    proc = _synthetic(tmp2, test_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(proc).startswith("hfcache test cleanup: left nothing"), _summary(proc)
    assert cleanup.tree_bytes(tmp2) <= cleanup.MAX_LEFT_BYTES


FAILING = """
    import os

    def test_fails_after_writing(tmp_path):
        (tmp_path / "evidence").write_bytes(os.urandom(2 * 2**20))
        assert False, "planted failure"
"""


def test_a_failed_run_keeps_its_failed_tests_folders_until_the_next_failed_run(tmp_path):
    """Kept for inspection, and reported; passing runs in between leave it (pytest removes a passing session's own
    basetemp before it prunes older ones); the next failed run replaces it (``tmp_path_retention_count = 1``)."""
    tmp = _private_tmp(tmp_path / "run")
    failing = _write_tests(tmp_path / "src", FAILING)
    proc = _synthetic(tmp, failing)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MiB in " in _summary(proc)
    found = (tmp / f"pytest-of-{_user()}").glob("pytest-[0-9]*/**/test_fails_after_writing0/evidence")  # xdist: popen-gwN/
    [kept] = found
    proc = _synthetic(tmp, _write_tests(tmp_path / "src2", LEAKY))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert kept.exists() and _summary(proc).startswith("hfcache test cleanup: left nothing")
    proc = _synthetic(tmp, failing)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not kept.exists()
    assert len(list((tmp / f"pytest-of-{_user()}").glob("pytest-[0-9]*"))) == 1
    assert cleanup.tree_bytes(tmp) <= cleanup.MAX_LEFT_BYTES


def _user() -> str:
    import getpass

    return getpass.getuser()


STRAY = """
    import subprocess, sys

    def test_leaves_a_process_running():
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
"""


def test_a_process_left_running_fails_the_session_and_is_stopped(tmp_path):
    tmp = _private_tmp(tmp_path / "run")
    test_file = _write_tests(tmp_path / "src", STRAY)
    started = time.monotonic()
    proc = _synthetic(tmp, test_file)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _summary(proc)
    assert "stopped 1 process(es) still running: " in line and "time.sleep(600)" in line, line
    pid = int(line.split("still running: ")[1].split()[0])
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid), line
    assert time.monotonic() - started < 60


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


DEEP = """
    from tests.chains import plant_chain

    def test_leaves_a_deep_chain_in_its_tmp_path(tmp_path):
        plant_chain(tmp_path / "cache" / "trash", 1500, leaf="bottom.bin", content=b"x" * 4096)
"""


def test_a_chain_deeper_than_the_recursion_limit_is_removed_with_the_passing_tests_folder(tmp_path):
    """shutil.rmtree (Python 3.11) raised RecursionError in the teardown and left the chain; now it goes."""
    tmp = _private_tmp(tmp_path / "run")
    proc = _synthetic(tmp, _write_tests(tmp_path / "src", DEEP))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "RecursionError" not in proc.stdout
    assert _summary(proc).startswith("hfcache test cleanup: left nothing"), _summary(proc)
    assert not list(tmp.rglob("bottom.bin")) and cleanup.tree_bytes(tmp) <= cleanup.MAX_LEFT_BYTES


@needs_root  # chowns a folder to EVE
def test_the_next_session_removes_a_killed_runs_runtime_folder_only(tmp_path):
    """A marker naming a process that is gone: removed at the next session start; one naming a live process (this
    one), and a recent unmarked folder, are left alone; an unmarked one older than UNMARKED_AGE goes."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead_start = cleanup._start_time(gone.pid)
    gone.kill()
    gone.wait()
    root = tmp_path / "root"
    root.mkdir()
    dead, live, unmarked = root / "hfcache-users-dead", root / "hfcache-users-live", root / "hfcache-users-other"
    stale = root / "hfcache-users-stale"
    canary = Canary(tmp_path)
    for base in (dead, live, unmarked, stale):
        (base / "c0" / "blobs").mkdir(parents=True)
        os.symlink(canary.dir, base / "c0" / "blobs" / "to-canary")  # what a member could plant: not followed
        os.symlink(canary.secret, base / "c0" / "secret")
    (dead / cleanup.RUNTIME_MARKER).write_text(f"tok {gone.pid} {dead_start}\n")
    cleanup.mark_runtime(live, "tok2")
    old = time.time() - cleanup.UNMARKED_AGE - 60
    os.utime(stale, (old, old))
    # Another uid's folder with a dead marker, in a world-writable /tmp: not ours to judge.
    eves = root / "hfcache-users-eve"
    (eves / "sub").mkdir(parents=True)
    (eves / cleanup.RUNTIME_MARKER).write_text(f"tok {gone.pid} {dead_start}\n")
    for path in (eves, eves / "sub", eves / cleanup.RUNTIME_MARKER):
        os.chown(path, EVE.uid, EVE.gid)
    assert cleanup.sweep_dead_runtimes(root) == [dead, stale]
    assert not dead.exists() and not stale.exists() and live.exists() and unmarked.exists() and eves.exists()
    canary.assert_unchanged()
    assert cleanup.session_runtimes("tok2", root) == [live]


def test_the_base_cache_is_bounded_to_its_newest_tarball(tmp_path):
    """Two base tarballs (an older recipe's and the current one): the session's end keeps the newest only."""
    root = tmp_path / "hfcache-test"
    root.mkdir()
    old, new = root / "base-bookworm-0000000000000000.tar", root / "base-bookworm-1111111111111111.tar"
    old.write_bytes(b"old" * 1000)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    new.write_bytes(b"new" * 1000)
    (root / "hfcache-podman-killed" / "storage").mkdir(parents=True)
    (root / "hfcache-podman-killed" / "storage" / "layer").write_bytes(os.urandom(6 * 2**20))
    tmp = _private_tmp(tmp_path / "run")
    test_file = _write_tests(tmp_path / "src", LEAKY)
    proc = _synthetic(tmp, test_file, HFCACHE_TEST_CACHE=str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not old.exists() and new.exists()
    line = _summary(proc)
    assert f"in {root} (the container tests' base rootfs cache" in line, line
    assert "; 6 MiB more there (podman homes of container runs" in line, line
    shutil.rmtree(root)
