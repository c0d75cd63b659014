"""What a test run leaves behind, measured and cleaned at the end of the session (tests/conftest.py).

A run of the suite should leave no more than a few MB behind it. The places it writes:

- pytest's basetemp (``$TMPDIR/pytest-of-<user>/pytest-N``): ``tmp_path_retention_policy = "failed"`` in
  pyproject.toml removes each passing test's folder when it ends and the whole basetemp when the session passes;
  ``tmp_path_retention_count = 1`` keeps at most one failed run's folder (with its failed tests' folders and the
  session's fixtures), until the next failed run replaces it;
- ``/tmp/hfcache-users-*`` (:func:`tests.users.make_runtime`: other uids cannot enter pytest's 0700 basetemp), each
  marked with the session that made it (:func:`mark_runtime`), removed by the ``runtime`` fixture and, if a run was
  killed, by the next session (:func:`sweep_dead_runtimes`);
- ``/tmp/hfcache-users-session-*`` (:func:`make_session_home`): the session's HOME (with HF_HOME and the XDG
  folders below it) and TMPDIR, so that nothing written by default (huggingface_hub's and transformers' caches,
  hfcache's private ``hfcache-modules-<uid>``, pip's cache) lands in the real home or /tmp; removed by the
  controller at the session's end, or like a runtime folder by the next session;
- ``$HFCACHE_TEST_CACHE`` (``/var/cache/hfcache-test``): the container tests' debootstrapped base rootfs, a
  deliberate cache across runs (it saves a ~1 minute debootstrap from a Debian mirror); bounded to one tarball
  (:func:`prune_base_cache`) and named in the session's summary line;
- processes: every child the suite starts inherits :data:`SESSION_VAR`; any still running at the end is listed,
  stopped (by pid, only those carrying this session's token) and fails the session (:func:`session_processes`).

pytest's own removals (a passing test's ``tmp_path``, a passing session's basetemp, older numbered basetemps) use
``shutil.rmtree``, which on Python 3.11 recurses once per level: a folder chain deeper than the recursion limit (the
1,000-level chains the shared-cache tests plant) raises RecursionError in a test's teardown or at the session's end
and is left behind. :func:`install_deep_rmtree` makes them fall back to ``rm -rf``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: Inherited by every process the suite starts (clean_env keeps it: it starts with neither HF_ nor HFCACHE_).
SESSION_VAR = "PYTEST_HFCACHE_SESSION"
#: The pid of the process that owns the session: pytest's, or pytest-xdist's controller whose workers inherit both
#: variables (one session, one token: the controller judges what the whole session left, after its workers ended).
SESSION_PID_VAR = "PYTEST_HFCACHE_SESSION_PID"
#: What a passing run may leave behind, in bytes ("a few MB").
MAX_LEFT_BYTES = 4 * 2**20
#: Where make_runtime puts the folders other uids run from, and the marker naming the session that made one.
RUNTIME_ROOT = Path("/tmp")
RUNTIME_PREFIX = "hfcache-users-"
RUNTIME_MARKER = ".pytest-session"
#: The session's own HOME and TMPDIR (:func:`make_session_home`): a runtime folder too (marked, swept if killed).
SESSION_HOME_PREFIX = RUNTIME_PREFIX + "session-"
#: Cache and home settings a developer's shell may point outside the session: removed for the session (their
#: defaults then fall under its HOME, HF_HOME or XDG_CACHE_HOME).
UNSET_FOR_SESSION = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE",
                     "HUGGINGFACE_ASSETS_CACHE", "HF_MODULES_CACHE", "HF_DATASETS_CACHE", "HF_TOKEN_PATH",
                     "HF_STORED_TOKENS_PATH", "TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE",
                     "PYTORCH_PRETRAINED_BERT_CACHE", "TORCH_HOME", "SENTENCE_TRANSFORMERS_HOME", "PIP_CACHE_DIR",
                     "UV_CACHE_DIR", "TRITON_CACHE_DIR", "NUMBA_CACHE_DIR", "MPLCONFIGDIR")
#: An unmarked runtime folder (made before the markers existed) unchanged this long is a killed run's: the whole
#: suite takes a quarter of that on 2 cores, and a live session's runtime is marked.
UNMARKED_AGE = 2 * 3600


def remove_any_depth(path: str | os.PathLike, *args, **kwargs) -> None:
    """``shutil.rmtree(path, *args, **kwargs)``, finished with ``rm -rf`` (iterative, follows no link) when the
    tree is too deep for it (RecursionError on Python 3.11); other errors are handled as rmtree handles them."""
    import shutil

    try:
        shutil.rmtree(path, *args, **kwargs)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--", os.fspath(path)], check=False)


def install_deep_rmtree() -> None:
    """Make pytest's tmp_path and basetemp removals handle any depth (see the module docstring).

    A workaround for a gap of pytest 9 on Python 3.11: ``_pytest.tmpdir`` calls ``shutil.rmtree`` and
    ``_pytest.pathlib.rm_rf`` (both recursive), with no hook to replace them; the module attributes are patched.
    """
    import _pytest.pathlib
    import _pytest.tmpdir

    if _pytest.tmpdir.rmtree is remove_any_depth:  # installed already (conftest loaded as a plugin too)
        return
    original_rm_rf = _pytest.pathlib.rm_rf

    def rm_rf(path: Path) -> None:
        try:
            original_rm_rf(path)
        except RecursionError:
            subprocess.run(["rm", "-rf", "--", os.fspath(path)], check=False)

    _pytest.tmpdir.rmtree = remove_any_depth
    _pytest.tmpdir.rm_rf = rm_rf
    _pytest.pathlib.rm_rf = rm_rf


def new_token() -> str:
    """A fresh session token (hex, 32 characters)."""
    return secrets.token_hex(16)


def tree_bytes(path: Path) -> int:
    """The disk space ``path`` and everything below it takes, in bytes (``du -s -B1``: allocated blocks, hard
    links counted once, links not followed; any depth, so a 1,000-level chain is measured too); 0 when it does not
    exist. Entries that vanish or cannot be read while du runs are skipped."""
    if not os.path.lexists(path):
        return 0
    proc = subprocess.run(["du", "-s", "-B1", "--", str(path)], capture_output=True, text=True, timeout=300)
    try:
        return int(proc.stdout.split()[0])
    except (IndexError, ValueError):
        return 0


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (the start time in clock ticks since boot), or None if there is no such
    process: with the pid, it names one process even after the pid is reused."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return raw.rpartition(")")[2].split()[19]


def is_xdist_worker() -> bool:
    """Whether this process is a pytest-xdist worker (it sets ``PYTEST_XDIST_WORKER``, e.g. ``gw0``)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def session_pid() -> int:
    """The pid of the session's owner (:data:`SESSION_PID_VAR`), else this process's."""
    value = os.environ.get(SESSION_PID_VAR, "")
    return int(value) if value.isdigit() else os.getpid()


def mark_runtime(base: Path, token: str | None) -> None:
    """Write ``base/.pytest-session`` (``TOKEN PID STARTTIME``): which session made this runtime folder (PID: the
    session's owner, :func:`session_pid`, also when an xdist worker makes it).

    Args:
        base: the folder :func:`tests.users.make_runtime` made (root's, 0755: no other uid can plant the marker).
        token: this session's token (``os.environ[SESSION_VAR]``); None outside a session: nothing is written.
    """
    if not token:
        return
    pid = session_pid()
    fd = os.open(base / RUNTIME_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(f"{token} {pid} {_start_time(pid)}\n")


def make_session_home(token: str | None, root: Path = RUNTIME_ROOT) -> Path:
    """A fresh ``ROOT/hfcache-users-session-*`` folder (0755, marked with ``token`` like a runtime) holding ``home``
    (0700: the session's HOME) and ``tmp`` (1777 like /tmp: its TMPDIR, which other uids' processes use too; pytest's
    0700 basetemp could not be). The controller removes it at the session's end; the next session, if it was killed.
    """
    import tempfile

    base = Path(tempfile.mkdtemp(prefix=SESSION_HOME_PREFIX, dir=root))
    os.chmod(base, 0o755)
    mark_runtime(base, token)
    (base / "home").mkdir(mode=0o700)
    (base / "tmp").mkdir()
    os.chmod(base / "tmp", 0o1777)
    return base


def session_environment(base: Path) -> dict[str, str]:
    """What a session's processes get so that nothing they write by default lands outside ``base``
    (:func:`make_session_home`): HOME, the XDG base folders, HF_HOME (huggingface_hub's and transformers' caches
    and token, ``hf``'s update checks) below it, and TMPDIR (where hfcache puts a private HF_MODULES_CACHE, pip and
    podman their temporary files). :data:`UNSET_FOR_SESSION` is removed beside it."""
    home = base / "home"
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_STATE_HOME": str(home / ".local" / "state"),
            "HF_HOME": str(home / ".cache" / "huggingface"), "TMPDIR": str(base / "tmp")}


def _runtime_owner(base: Path) -> tuple[str, int, str] | None:
    """(token, pid, start time) from a runtime folder's marker, or None (no marker, a link, unreadable, garbled)."""
    try:
        fd = os.open(base / RUNTIME_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as marker:
        fields = marker.read(200).decode("ascii", "replace").split()
    if len(fields) != 3 or not fields[1].isdigit():
        return None
    return fields[0], int(fields[1]), fields[2]


def _own_folders(root: Path) -> list[tuple[Path, os.stat_result]]:
    """The ``hfcache-users-*`` folders under ``root`` (not links) that this uid owns: in a world-writable /tmp
    anyone can make one, and only ours are judged."""
    found = []
    for base in sorted(root.glob(f"{RUNTIME_PREFIX}*")):
        try:
            st = os.lstat(base)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            found.append((base, st))
    return found


def session_runtimes(token: str, root: Path = RUNTIME_ROOT) -> list[Path]:
    """The runtime folders under ``root`` that the session ``token`` made and that are still there."""
    return [base for base, _ in _own_folders(root) if (owner := _runtime_owner(base)) is not None
            and owner[0] == token]


def sweep_dead_runtimes(root: Path = RUNTIME_ROOT) -> list[Path]:
    """Remove the runtime folders whose session process is gone (a run that was killed before its teardown).

    Only this uid's folders are judged. One whose marker names a process (pid and start time) that still runs is
    a live session's and is left alone; an unmarked one only goes when it is older than :data:`UNMARKED_AGE` (its
    last change). Returns what was removed.
    """
    removed = []
    for base, st in _own_folders(root):
        owner = _runtime_owner(base)
        if owner is None:
            if time.time() - st.st_mtime < UNMARKED_AGE:
                continue
        elif _start_time(owner[1]) == owner[2]:
            continue
        subprocess.run(["rm", "-rf", "--", str(base)], check=False)  # any depth (tests/chains.py)
        removed.append(base)
    return removed


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as env:
            return needle in env.read().split(b"\0")
    except OSError:  # gone, or a kernel thread
        return False


def session_processes(token: str) -> list[tuple[int, str]]:
    """The processes (pid, command line) still running whose environment carries ``SESSION_VAR=token``, except
    this one: children of the session, and orphans they left (re-parented to init, found all the same)."""
    needle = f"{SESSION_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not _environ_has(int(entry), needle):
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append((int(entry), argv.strip()[:200]))
    return found


def stop_processes(token: str, settle: float = 2.0, grace: float = 5.0) -> list[tuple[int, str]]:
    """The processes :func:`session_processes` still finds after ``settle`` seconds (one that a teardown has just
    signalled may take a moment to exit), stopped: SIGTERM, after ``grace`` seconds SIGKILL (by pid, only those
    carrying ``token``). Returns them as (pid, command line)."""
    deadline = time.monotonic() + settle
    while (found := session_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and session_processes(token):
        time.sleep(0.1)
    for pid, _ in session_processes(token):
        _signal(pid, signal.SIGKILL)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def prune_base_cache(root: Path) -> list[Path]:
    """Keep the container tests' base cache (``$HFCACHE_TEST_CACHE``) to one base tarball: the newest
    ``base-*.tar``; older ones (an earlier recipe or CA bundle: their key no longer matches) are removed, each
    under its ``base-<key>.lock`` taken without waiting, so a run that uses one right now keeps it. Returns what
    was removed."""
    from filelock import FileLock, Timeout

    tarballs = sorted(root.glob("base-*.tar"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    removed = []
    for tarball in tarballs[:-1]:
        key = tarball.stem.rpartition("-")[2]
        try:
            with FileLock(str(root / f"base-{key}.lock"), timeout=0):
                tarball.unlink()
        except (Timeout, OSError):
            continue
        (root / f"base-{key}.lock").unlink(missing_ok=True)
        removed.append(tarball)
    return removed


def base_cache_bytes(root: Path) -> tuple[int, int]:
    """(bytes of the base tarballs, bytes of everything else) in the container tests' base cache ``root``."""
    tarballs = sum(tree_bytes(path) for path in root.glob("base-*.tar")) if root.is_dir() else 0
    return tarballs, max(tree_bytes(root) - tarballs, 0)


@dataclass(frozen=True)
class Leftovers:
    """What a session left behind: sizes in bytes, processes as (pid, command line)."""

    basetemp: Path | None
    basetemp_bytes: int
    base_cache: Path
    base_cache_bytes: int  #: the base tarballs
    base_other_bytes: int  #: the rest of base_cache: podman homes of container runs (running, or killed)
    processes: tuple[tuple[int, str], ...]
    runtimes: tuple[Path, ...]

    def summary(self) -> str:
        """One line for the terminal."""
        mib = 2**20
        size = f"{self.basetemp_bytes / mib:.1f} MiB" if self.basetemp_bytes >= mib // 10 else \
            f"{self.basetemp_bytes // 1024} KiB"
        temp = f"{size} in {self.basetemp}" if self.basetemp_bytes else "nothing"
        line = f"hfcache test cleanup: left {temp}"
        if self.base_cache_bytes:
            line += (f"; kept {self.base_cache_bytes / mib:.0f} MiB in {self.base_cache} (the container tests' base "
                     "rootfs cache: rm -rf it to reclaim)")
        if self.base_other_bytes > MAX_LEFT_BYTES:
            line += (f"; {self.base_other_bytes / mib:.0f} MiB more there (podman homes of container runs: running "
                     "now, or killed; a later container run removes those hours old)")
        if self.runtimes:
            line += f"; removed {len(self.runtimes)} runtime folder(s) its teardown left"
        if self.processes:
            line += f"; stopped {len(self.processes)} process(es) still running: " + "; ".join(
                f"{pid} {argv}" for pid, argv in self.processes)
        return line
