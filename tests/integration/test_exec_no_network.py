"""`hfcache exec --no-network`: the process-tree network filter, against real processes (docs/offline.md).

A TCP listener thread on 127.0.0.1 records every accept and every byte; under the filter it must see nothing, from
curl, an isolated Python, ctypes and a clean-environment grandchild, while AF_UNIX (multiprocessing) and an offline
AutoTokenizer load keep working. Each blocked case first runs under plain `hfcache exec` (the Python guard only) and
reaches the listener: the proof that the filter, not the guard, stops it. Where the kernel refuses the filter (an
outer seccomp filter that makes seccomp/prctl fail, or fake their success) hfcache exits 4 and the command never
runs. `--path` is resolved offline from the same cache.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import GOLDEN, LOAD_SCRIPT, clean_env, golden_ids, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "google-bert/bert-base-uncased"
FOLDER = "models--google-bert--bert-base-uncased"


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection accepted and every byte received."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[tuple[str, int]] = []
        self.received = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(peer)
            conn.settimeout(2)
            try:
                while chunk := conn.recv(4096):
                    self.received += chunk
            except OSError:
                pass
            conn.close()

    def settle(self) -> None:
        time.sleep(0.3)  # a connection the kernel completed is accepted within the 0.1 s poll

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("no-network") / "cache"
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(REPO)], cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos]
    return cache


def hfcache_exec(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
                 **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hfcache", "exec", *args], capture_output=True, text=True,
                          env=env or clean_env(), timeout=timeout, **kwargs)


def verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("hfcache: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


CONNECT_PY = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).sendall(b'py')"

#: socket() and connect() straight through libc: no Python socket object, no audit event for the guard to see.
CTYPES_PY = textwrap.dedent("""
    import ctypes, socket, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    if fd < 0:
        print("socket errno", ctypes.get_errno()); sys.exit(3)
    addr = struct.pack("=H", socket.AF_INET) + struct.pack("!H", int(sys.argv[1])) + socket.inet_aton("127.0.0.1")
    addr += bytes(8)
    if libc.connect(fd, addr, len(addr)) != 0:
        print("connect errno", ctypes.get_errno()); sys.exit(4)
    libc.write(fd, b"ctypes", 6)
""")

#: A Python child that starts a grandchild with a clean environment (env -i: no PYTHONPATH, so no guard).
GRANDCHILD_PY = textwrap.dedent("""
    import subprocess, sys
    code = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).sendall(b'gc')"
    sys.exit(subprocess.run(["env", "-i", sys.executable, "-c", code, sys.argv[1]]).returncode)
""")

CASES = {
    "curl": lambda port: ["curl", "-sS", "--max-time", "5", f"http://127.0.0.1:{port}/"],
    "python -I": lambda port: [sys.executable, "-I", "-c", CONNECT_PY, str(port)],
    "ctypes": lambda port: [sys.executable, "-I", "-c", CTYPES_PY, str(port)],
    "env -i grandchild": lambda port: [sys.executable, "-c", GRANDCHILD_PY, str(port)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_no_network_child_cannot_reach_a_loopback_listener(tmp_path: Path, listener: Listener, case: str) -> None:
    canary = Canary(tmp_path)
    command = CASES[case](listener.port)
    base = ["--cache-dir", str(tmp_path / "cache")]

    # Control: under the Python guard alone (today's exec) each of these reaches the listener.
    plain = hfcache_exec([*base, "--", *command])
    listener.settle()
    assert len(listener.accepted) == 1, (plain.returncode, plain.stdout, plain.stderr)
    listener.accepted.clear()
    listener.received.clear()

    blocked = hfcache_exec([*base, "--no-network", "--", *command])
    listener.settle()
    assert blocked.returncode != 0, blocked.stdout + blocked.stderr
    assert listener.accepted == [] and bytes(listener.received) == b""
    if case == "curl":
        assert blocked.returncode == 7, blocked.stderr  # curl: "Couldn't connect to server"
    elif case == "ctypes":
        assert f"socket errno {13}" in blocked.stdout, blocked.stdout  # EACCES from the filter
    else:
        assert "PermissionError: [Errno 13]" in blocked.stderr, blocked.stderr
    canary.assert_unchanged()


def test_no_network_child_cannot_use_an_inherited_tcp_connection(tmp_path: Path, listener: Listener) -> None:
    """The filter stops new sockets; a connected socket hfcache's parent leaves open above stderr is closed at the
    exec, so the command cannot write to it."""
    conn = socket.create_connection(("127.0.0.1", listener.port))
    try:
        fd = conn.fileno()
        script = f"import os; os.write({fd}, b'leak')"
        base = ["--cache-dir", str(tmp_path / "cache")]
        plain = hfcache_exec([*base, "--", sys.executable, "-I", "-c", script], pass_fds=(fd,))
        assert plain.returncode == 0, plain.stderr
        blocked = hfcache_exec([*base, "--no-network", "--", sys.executable, "-I", "-c", script], pass_fds=(fd,))
        assert blocked.returncode == 1 and "Bad file descriptor" in blocked.stderr, blocked.stderr
    finally:
        conn.close()
    listener.settle()
    assert bytes(listener.received) == b"leak"  # the control's write only


MULTIPROCESSING_PY = textwrap.dedent("""
    import json, multiprocessing, sys

    def square(x):
        return x * x

    if __name__ == "__main__":
        out = {"pool": multiprocessing.Pool(2).map(square, [1, 2, 3])}
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            out["spawn"] = pool.map(square, [4, 5])
        with multiprocessing.Manager() as manager:  # an AF_UNIX listener in a server process
            shared = manager.dict()
            shared["a"] = 7
            out["manager"] = shared["a"]
        left, right = multiprocessing.Pipe()
        left.send("pipe")
        out["pipe"] = right.recv()
        print(json.dumps(out))
""")


def test_no_network_keeps_af_unix_multiprocessing_working(tmp_path: Path) -> None:
    script = tmp_path / "mp.py"
    script.write_text(MULTIPROCESSING_PY, encoding="utf-8")
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "cache"), "--no-network", "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"pool": [1, 4, 9], "spawn": [16, 25], "manager": 7,
                                                         "pipe": "pipe"}


BYPASS_PY = textwrap.dedent("""
    import ctypes, errno, json, socket
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for name, family in (("inet6", socket.AF_INET6), ("packet", socket.AF_PACKET), ("netlink", socket.AF_NETLINK),
                         ("unix_high_bits", socket.AF_UNIX | (1 << 32))):
        fd = libc.syscall(ctypes.c_long(41), ctypes.c_long(family), ctypes.c_long(socket.SOCK_RAW if name == "packet"
                          else socket.SOCK_DGRAM), ctypes.c_long(0))
        out[name] = ctypes.get_errno() if fd < 0 else "created"
    pair = (ctypes.c_int * 2)()
    rc = libc.syscall(ctypes.c_long(53), ctypes.c_long(socket.AF_INET), ctypes.c_long(socket.SOCK_STREAM), 0, pair)
    out["socketpair_inet"] = ctypes.get_errno() if rc < 0 else "created"
    params = ctypes.create_string_buffer(120)
    rc = libc.syscall(ctypes.c_long(425), ctypes.c_long(8), params)  # io_uring_setup
    out["io_uring_setup"] = ctypes.get_errno() if rc < 0 else "created"
    print(json.dumps(out))
""")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 system call numbers")
def test_no_network_closes_the_other_ways_to_a_socket(tmp_path: Path) -> None:
    """Other families (AF_INET6, AF_PACKET, AF_NETLINK), AF_UNIX with high bits set in the register, socketpair
    and io_uring (IORING_OP_SOCKET) are refused."""
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "c"), "--no-network", "--", sys.executable, "-I", "-c",
                         BYPASS_PY])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"inet6": 13, "packet": 13, "netlink": 13, "unix_high_bits": 13,
                                       "socketpair_inet": 13, "io_uring_setup": 38}


#: An AF_INET socket through the 32-bit system call table (int 0x80, i386 socket = 359) from a 64-bit process.
INT80_PY = textwrap.dedent("""
    import ctypes, mmap
    code = bytes.fromhex("b867010000" "bb02000000" "b901000000" "31d2" "cd80" "c3")
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    print("fd", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))(), flush=True)
""")
#: An AF_INET socket through the x32 ABI (__X32_SYSCALL_BIT | 41).
X32_PY = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
          "print('rc', libc.syscall(ctypes.c_long(0x40000000 | 41), 2, 1, 0), ctypes.get_errno(), flush=True)")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 foreign ABIs")
@pytest.mark.parametrize("abi", ["int 0x80", "x32"])
def test_no_network_kills_a_foreign_abi_system_call(tmp_path: Path, abi: str) -> None:
    script = INT80_PY if abi == "int 0x80" else X32_PY
    plain = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=30)
    if abi == "int 0x80":
        if plain.returncode != 0:  # int 0x80 faults before any system call: nothing to filter
            pytest.skip(f"this kernel has no IA32 emulation (int 0x80 ended with {plain.returncode})")
        assert int(plain.stdout.split()[1]) >= 0  # without the filter the 32-bit call makes an AF_INET socket
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "c"), "--no-network", "--", sys.executable, "-I", "-c",
                         script])
    assert proc.returncode == -signal.SIGSYS, (proc.returncode, proc.stdout, proc.stderr, plain.stdout)
    assert proc.stdout == ""


def test_no_network_offline_autotokenizer_load_works(tmp_path: Path, warm_cache: Path, hub_server) -> None:
    canary = Canary(tmp_path)
    env = clean_env(HF_ENDPOINT=hub_server.endpoint)  # the Hub is up: only the layers stop a request
    proc = hfcache_exec(["--cache-dir", str(warm_cache), "--no-network", "--", sys.executable, "-c", LOAD_SCRIPT,
                         GOLDEN["text"], REPO], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded[REPO].get("input_ids") == golden_ids(REPO), loaded
    assert hub_server.requests == []
    verify_ok(warm_cache)
    canary.assert_unchanged()


HUB_DOWNLOAD_PY = textwrap.dedent("""
    import sys, time
    from huggingface_hub import hf_hub_download
    started = time.monotonic()
    try:
        hf_hub_download(sys.argv[1], "tokenizer_config.json", cache_dir=sys.argv[2])
    except Exception as exc:  # what the application sees, and how soon
        print(f"{time.monotonic() - started:.1f}", type(exc).__name__, exc)
        sys.exit(5)
""")


def test_no_network_python_clients_fail_at_once_naming_the_mode(tmp_path: Path, hub_server) -> None:
    """The kernel's EACCES is a PermissionError that HTTP clients retry (huggingface_hub for ~23 s, then "check your
    connection"); under --no-network the Python guard refuses the socket itself first, with its own message."""
    env = clean_env(HF_ENDPOINT=hub_server.endpoint)
    (tmp_path / "c").mkdir()
    command = ["env", "-u", "HF_HUB_OFFLINE", "-u", "TRANSFORMERS_OFFLINE", sys.executable, "-c", HUB_DOWNLOAD_PY,
               REPO, str(tmp_path / "online-cache")]
    started = time.monotonic()
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "c"), "--no-network", "--", *command], env=env, timeout=120)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "exec --no-network: AF_UNIX only" in proc.stdout, proc.stdout
    assert time.monotonic() - started < 15, proc.stdout
    assert hub_server.requests == []
    # the same child without the guard (python -I) still fails, only later and less clearly: the kernel is the floor
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "c"), "--no-network", "--", *command[:6], "-I",
                         *command[6:]], env=env, timeout=120)
    assert proc.returncode == 5 and hub_server.requests == [], proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------ fails closed

#: Runs the rest of its argv under an outer seccomp filter that makes seccomp(2) and prctl(2) fail with EPERM
#: ("eperm": a container profile that forbids them) or return 0 without doing anything ("fake"), then execs it.
LAUNCHER_PY = textwrap.dedent("""
    import errno, os, sys
    import pyseccomp as seccomp
    mode, argv = sys.argv[1], sys.argv[2:]
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for call in ("seccomp", "prctl"):
        rules.add_rule(seccomp.ERRNO(errno.EPERM if mode == "eperm" else 0), call)
    rules.load()
    os.execv(argv[0], argv)
""")


@pytest.mark.parametrize("mode", ["eperm", "fake"])
def test_no_network_refuses_to_run_the_command_where_the_filter_cannot_be_installed(tmp_path: Path, mode: str) -> None:
    canary = Canary(tmp_path)
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER_PY, encoding="utf-8")
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    hfcache_cmd = [sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path / "c")]

    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(launcher), mode, *hfcache_cmd, *args, "--", *command],
                              capture_output=True, text=True, env=clean_env(), timeout=60)

    control = launch()  # hfcache itself runs fine under the launcher; only the filter cannot be installed
    assert control.returncode == 0 and marker.exists(), control.stderr
    marker.unlink()

    refused = launch("--no-network")
    assert refused.returncode == 4, refused.stderr
    assert not marker.exists()  # the command never ran
    line = one_error_line(refused.stderr)
    assert "exec --no-network:" in line and "the command was not started" in line
    if mode == "eperm":
        # libseccomp 2.5.4 reports the refused prctl/seccomp pair as EFAULT; others say EPERM or ECANCELED
        assert re.search(r"the kernel refused the network filter \(E[A-Z]+: ", line), line
    else:
        assert "not in force after loading it: an AF_INET socket could still be created" in line, line
    assert "hint:" in refused.stderr
    canary.assert_unchanged()


def test_no_network_refuses_when_libseccomp_is_missing(tmp_path: Path) -> None:
    """pyseccomp raises RuntimeError at import when ctypes finds no libseccomp: a stand-in module that does the
    same (first on the path of hfcache itself) must stop the command."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pyseccomp.py").write_text('raise RuntimeError("Unable to find libseccomp")\n', encoding="utf-8")
    marker = tmp_path / "started"
    path = os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")]))
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "c"), "--no-network", "--", sys.executable, "-c",
                         f"open({str(marker)!r}, 'w').close()"], env=clean_env(PYTHONPATH=path))
    assert proc.returncode == 4 and not marker.exists(), proc.stderr
    assert "libseccomp is not available (Unable to find libseccomp)" in one_error_line(proc.stderr)


def test_no_network_with_allow_host_is_a_usage_error(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    proc = hfcache_exec(["--cache-dir", str(tmp_path / "c"), "--no-network", "--allow-host", "redis:6379", "--",
                         sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    assert proc.returncode == 2 and not marker.exists(), proc.stderr
    assert "--allow-host cannot be combined with --no-network" in one_error_line(proc.stderr)


# ------------------------------------------------------------------------------------------------ --path

PRINT_PY = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get(sys.argv[1])}))"


def test_path_substitutes_the_snapshot_and_one_file_into_argv_and_env(tmp_path: Path, warm_cache: Path) -> None:
    canary = Canary(tmp_path)
    [snapshot] = (warm_cache / FOLDER / "snapshots").iterdir()
    proc = hfcache_exec(["--cache-dir", str(warm_cache), "--no-network", "--path", f"MODEL={REPO}",
                         "--path", f"VOCAB={REPO}@main:vocab.txt", "--", sys.executable, "-c", PRINT_PY, "VOCAB",
                         "--model={MODEL}", "{VOCAB}", "{OTHER}", "{}"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"argv": ["VOCAB", f"--model={snapshot}", str(snapshot / "vocab.txt"), "{OTHER}", "{}"],
                   "env": str(snapshot / "vocab.txt")}
    # A non-Python consumer of the resolved file, under the filter.
    digest = hfcache_exec(["--cache-dir", str(warm_cache), "--no-network", "--path", f"V={REPO}:vocab.txt", "--",
                           "sha256sum", "{V}"])
    assert digest.returncode == 0, digest.stderr
    assert digest.stdout.split()[1] == str(snapshot / "vocab.txt")
    verify_ok(warm_cache)
    canary.assert_unchanged()


@pytest.mark.parametrize("spec, code, words", [
    ("M=org/not-cached", 1, ["org/not-cached@main is not in the cache", "hint: fetch it: hfcache warm org/not-cached"]),
    (f"M={REPO}:*.json", 1, ["files match '*.json'", "expected exactly one", "tokenizer.json"]),
    (f"M={REPO}:nothing*.gguf", 1, ["no file matching 'nothing*.gguf'", "hint: fetch it: hfcache warm"]),
    (f"HF_HUB_CACHE={REPO}", 2, ["HF_HUB_CACHE is set by hfcache exec itself"]),
    ("1M=x", 2, ["is not a variable name"]),
    (f"PATH={REPO}", 2, ["PATH is read by the shell, the loader or a library"]),
    (f"LD_PRELOAD={REPO}", 2, ["LD_PRELOAD is read by the shell, the loader or a library"]),
])
def test_path_that_cannot_be_resolved_stops_the_command(tmp_path: Path, warm_cache: Path, spec: str, code: int,
                                                         words: list[str]) -> None:
    marker = tmp_path / "started"
    proc = hfcache_exec(["--cache-dir", str(warm_cache), "--path", spec, "--", sys.executable, "-c",
                         f"open({str(marker)!r}, 'w').close()"])
    assert proc.returncode == code, proc.stderr
    assert not marker.exists()
    line = one_error_line(proc.stderr)
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)
    assert line
    verify_ok(warm_cache)


def test_path_to_a_file_planted_as_a_link_out_of_the_cache_stops_the_command(tmp_path: Path, warm_cache: Path) -> None:
    """A group member plants `snapshots/<commit>/model.gguf -> <canary>/secret`: exec must not hand the command a
    path that reads the secret (exit 5, the command never runs, nothing outside the cache changes)."""
    import shutil

    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache, symlinks=True)
    [snapshot] = (cache / FOLDER / "snapshots").iterdir()
    (snapshot / "model.gguf").symlink_to(canary.secret)
    marker = tmp_path / "started"
    proc = hfcache_exec(["--cache-dir", str(cache), "--no-network", "--path", f"M={REPO}:*.gguf", "--",
                         sys.executable, "-c", f"open({str(marker)!r}, 'w').close()", "{M}"])
    assert proc.returncode == 5, proc.stderr
    assert not marker.exists()
    assert "model.gguf" in one_error_line(proc.stderr)
    (snapshot / "model.gguf").unlink()
    verify_ok(cache)
    canary.assert_unchanged()


# ------------------------------------------------------------------------------ ways around the socket rule

#: Each way around the socket rule found so far: a live socket copied out of another process (pidfd_getfd),
#: a TUN device (root writes its own IP packets), request_key (the kernel runs /sbin/request-key outside the filter).
OTHER_ROUTES_PY = textwrap.dedent("""
    import ctypes, errno, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out = {}
    pidfd = os.pidfd_open(os.getppid())
    out["pidfd_getfd"] = libc.syscall(ctypes.c_long(438), pidfd, 0, 0) < 0 and ctypes.get_errno()
    try:
        tun = os.open("/dev/net/tun", os.O_RDWR)
    except OSError as exc:
        out["tunsetiff"] = "no /dev/net/tun: " + exc.strerror
    else:
        ifr = ctypes.create_string_buffer(b"hfc0".ljust(16, b"\\0") + (1).to_bytes(2, "little") + bytes(22))
        out["tunsetiff"] = libc.ioctl(tun, ctypes.c_ulong(0x400454CA), ifr) < 0 and ctypes.get_errno()
    out["request_key"] = libc.syscall(ctypes.c_long(249), b"user", b"hfcache-test", b"x", 0) < 0 and ctypes.get_errno()
    out["ptrace"] = libc.syscall(ctypes.c_long(101), 0, 0, 0, 0) < 0 and ctypes.get_errno()  # PTRACE_TRACEME
    print(json.dumps(out))
""")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 system call numbers")
def test_no_network_refuses_the_routes_through_other_processes_and_the_kernel(tmp_path: Path) -> None:
    proc = hfcache_exec(["--cache-dir", str(tmp_path), "--no-network", "--", sys.executable, "-I", "-c",
                         OTHER_ROUTES_PY])
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["pidfd_getfd"] == errno_of("EPERM")
    assert found["request_key"] == errno_of("EPERM")
    assert found["ptrace"] == errno_of("EPERM")
    assert found["tunsetiff"] == errno_of("EACCES") or str(found["tunsetiff"]).startswith("no /dev/net/tun")
    # control: without the filter, none of them is EPERM/EACCES from seccomp (request_key: ENOKEY etc.)
    plain = hfcache_exec(["--cache-dir", str(tmp_path), "--", sys.executable, "-I", "-c", OTHER_ROUTES_PY])
    unfiltered = json.loads(plain.stdout.strip().splitlines()[-1])
    assert unfiltered["ptrace"] is False and unfiltered["request_key"] != errno_of("EPERM"), unfiltered


def errno_of(name: str) -> int:
    import errno

    return getattr(errno, name)


def test_no_network_closes_inherited_rings_pidfds_and_devices_and_keeps_pipes(tmp_path: Path) -> None:
    """An inherited descriptor that could reach the network (a pidfd, a TUN device, an io_uring ring whose owner
    polls it) is closed at the exec; pipes, eventfds and /dev/null stay."""
    read_end, write_end = os.pipe()
    kept = [read_end, os.eventfd(0), os.open("/dev/null", os.O_RDONLY)]
    closed = [os.pidfd_open(os.getpid())]
    if os.path.exists("/dev/net/tun"):
        closed.append(os.open("/dev/net/tun", os.O_RDWR))
    script = "import os, sys; print(' '.join(a for a in sys.argv[1:] if os.path.exists(f'/proc/self/fd/{a}')))"
    try:
        for fd in kept + closed:
            os.set_inheritable(fd, True)
        proc = hfcache_exec(["--cache-dir", str(tmp_path), "--no-network", "--", sys.executable, "-I", "-c", script,
                             *map(str, kept + closed)], pass_fds=kept + closed)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [str(fd) for fd in kept], (proc.stdout, kept, closed)
    finally:
        for fd in kept + closed + [write_end]:
            os.close(fd)


def test_a_pool_worker_that_hits_the_guard_fails_the_map_at_once(tmp_path: Path) -> None:
    """NetworkBlocked must survive pickling back from a worker (it made Pool.map hang for ever)."""
    script = textwrap.dedent("""
        import multiprocessing, socket
        def reach(port):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        if __name__ == "__main__":
            with multiprocessing.Pool(2) as pool:
                try:
                    pool.map(reach, [9, 9])
                except RuntimeError as exc:
                    print("refused:", type(exc).__name__)
    """)
    (tmp_path / "pool.py").write_text(script)
    for flags in ([], ["--no-network"]):
        # an empty cache folder: tmp_path holds the script, so it is no cache (refused: the one --cache-dir rule)
        (tmp_path / "cache").mkdir(exist_ok=True)
        proc = hfcache_exec(["--cache-dir", str(tmp_path / "cache"), *flags, "--", sys.executable,
                             str(tmp_path / "pool.py")], timeout=60)
        assert proc.returncode == 0 and "refused: NetworkBlocked" in proc.stdout, (flags, proc.stdout, proc.stderr)


def test_an_empty_command_name_is_a_usage_error(tmp_path: Path) -> None:
    proc = hfcache_exec(["--cache-dir", str(tmp_path), "--no-network", "--", ""])
    assert proc.returncode == 2, proc.stderr
    assert "the command name is empty" in one_error_line(proc.stderr)


TIOCSTI_PY = textwrap.dedent("""
    import ctypes, fcntl, sys
    try:
        fcntl.ioctl(0, 0x5412, b"x")
        print("pushed")
    except OSError as exc:
        print("errno", exc.errno)
""")


def test_no_network_refuses_typing_into_the_callers_terminal(tmp_path: Path) -> None:
    """TIOCSTI pushed a line into the controlling terminal that the user's unfiltered shell ran after exec ended."""
    import errno
    import pty

    leader, follower = pty.openpty()
    try:
        proc = hfcache_exec(["--cache-dir", str(tmp_path), "--no-network", "--", sys.executable, "-I", "-c",
                             TIOCSTI_PY], stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["errno", str(errno.EACCES)], proc.stdout


def test_no_network_does_not_trust_a_fake_proc_listing(tmp_path: Path, listener: Listener) -> None:
    """A tmpfs over /proc listing only 0, 1, 2 hid an inherited socket; without /proc, a socket above the lowered
    descriptor limit sat above any scan. Both are closed at the exec."""
    script = textwrap.dedent(f"""
        exec 300<>/dev/tcp/127.0.0.1/{listener.port}
        exec 3000<>/dev/tcp/127.0.0.1/{listener.port}
        mount -t tmpfs none /proc && mkdir -p /proc/self/fd && touch /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2
        ulimit -n 200
        {sys.executable} -m hfcache exec --cache-dir {tmp_path} --no-network -- bash -c \\
            'for fd in 300 3000; do (echo leak >&$fd) 2>/dev/null && echo "open $fd"; done; echo done'
    """)
    proc = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=str(Path(hfcache.__file__).parent.parent)), timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["done"], (proc.stdout, proc.stderr)
    time.sleep(0.3)
    assert listener.received == b"", listener.received
