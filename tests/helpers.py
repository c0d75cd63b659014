"""Helpers shared by the integration tests: run hfcache and transformers in real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

DATA = Path(__file__).parent / "data"
HUB = DATA / "hub"  # the fixture repos the test Hub serves (tests/data/README.md)
REPO = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))

#: The script an application container would run: load tokenizers by repo id from the cache, offline.
LOAD_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
text, ids = sys.argv[1], sys.argv[2:]
out = {}
for repo_id in ids:
    try:
        tok = AutoTokenizer.from_pretrained(repo_id)
        out[repo_id] = {"class": type(tok).__name__, "input_ids": tok(text)["input_ids"]}
    except Exception as exc:
        out[repo_id] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The process environment without HF_*/HFCACHE_*/TRANSFORMERS_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HFCACHE_", "TRANSFORMERS_"))}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_UPDATE_CHECK="1", NO_COLOR="1")
    env.update(extra)
    return env


def run_hfcache(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
                home: Path | None = None, cwd: Path | None = None,
                input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hfcache ARGS`` as a real subprocess and return the completed process (text mode);
    ``input_text`` is its stdin (else the stdin of the tests)."""
    environment = env if env is not None else clean_env()
    if home is not None:
        environment = {**environment, "HF_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hfcache", *args], capture_output=True, text=True,
                          env=environment, timeout=timeout, cwd=cwd, input=input_text)


def offline_load(cache_dir: Path, repo_ids: Sequence[str], *, timeout: float = 300) -> dict[str, dict]:
    """Load each repo id with ``AutoTokenizer`` in a fresh offline subprocess; return id -> class/input_ids/error."""
    env = clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache_dir), HF_HOME=str(cache_dir.parent / "hf-home"))
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], *repo_ids], capture_output=True,
                          text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def golden_ids(repo_id: str, canonical: str | None = None) -> list[int]:
    return GOLDEN["repos"][canonical or repo_id]["input_ids"]


@contextmanager
def silent_server() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never answers (the kernel completes the handshake)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def refused_endpoint() -> str:
    """An endpoint on a loopback port nothing listens on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"



def visible_entries(cache_dir: Path) -> set[str]:
    """Relative paths of everything a loader can see: snapshot entries and refs (not blobs or locks)."""
    found = set()
    for repo in cache_dir.glob("*--*"):
        for sub in ("snapshots", "refs"):
            found |= {f"{repo.name}/{sub}/{p.relative_to(repo / sub)}" for p in (repo / sub).rglob("*")
                      if (repo / sub).exists()}
    return found


#: Build output in a checkout (what .gitignore leaves out: the quickstart's wheel in examples/dist/, build/,
#: egg-info, caches): no test reads it, so a test's outcome does not depend on what was built before it.
ARTIFACT_NAMES = ("dist", "build", "__pycache__", ".pytest_cache", ".venv")


def is_artifact(path: Path, root: Path = REPO) -> bool:
    """Whether ``path`` (below ``root``) is build output: a part of it relative to ``root`` is one of
    :data:`ARTIFACT_NAMES` or ends with ``.egg-info``."""
    return any(part in ARTIFACT_NAMES or part.endswith(".egg-info") for part in path.relative_to(root).parts)


def source_files(folder: Path, root: Path = REPO) -> list[Path]:
    """The files below ``folder`` (in the checkout ``root``) that are not build output (:func:`is_artifact`),
    sorted; links to files count."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not is_artifact(p, root))


def build_wheel(outdir: Path, work: Path) -> Path:
    """Build hfcache's wheel into ``outdir`` as README "Install" says (``python -m build --wheel``), from a copy in
    ``work`` of what a build needs (pyproject.toml, README.md, hfcache/: what docker/Dockerfile.dockerignore lets
    in), so the checkout gets no build/ or egg-info. --no-isolation: the test extra installs build and setuptools,
    so no package index is needed. Returns the wheel's path."""
    source = work / "hfcache-src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "hfcache", source / "hfcache", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(outdir),
                           str(source)], capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [wheel] = outdir.glob("hfcache-*.whl")
    return wheel


def one_error_line(proc, code: int, *needles: str) -> str:
    """The one ``hfcache: error:`` line of a command that exited ``code`` (no traceback), holding every needle and
    followed by its hint."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    error = next(line for line in lines if line.startswith("hfcache: error: "))
    assert all(needle in error for needle in needles), (needles, error)
    assert lines[lines.index(error) + 1].startswith("hint: "), proc.stderr
    return error


@contextmanager
def listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener and a UDP socket on the same 127.0.0.1 port (and [::1] is not used); yields (port, arrivals)."""
    tcp = socket.socket()
    tcp.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_FASTOPEN", 23), 16)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    port = tcp.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", port))
    arrivals: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        tcp.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = tcp.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(2)
            try:
                arrivals.append(f"tcp:{conn.recv(100)!r}")
            except OSError:
                arrivals.append("tcp:connection")
            conn.close()

    def receive() -> None:
        udp.settimeout(0.2)
        while not stop.is_set():
            try:
                arrivals.append(f"udp:{udp.recv(100)!r}")
            except (TimeoutError, OSError):
                continue

    threads = [threading.Thread(target=accept, daemon=True), threading.Thread(target=receive, daemon=True)]
    for t in threads:
        t.start()
    try:
        yield port, arrivals
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        tcp.close()
        udp.close()


def warm(cache: Path, *specs: str, root: Path = HUB) -> None:
    """Warm ``specs`` (``REPO[@REV]``) into ``cache`` from a test Hub over ``root``, in-process; they must succeed."""
    import hfcache
    from hfcache.records import WarmRequest
    from tests.testhub import HubServer

    with HubServer(root) as server:
        report = hfcache.warm([WarmRequest.parse(s) for s in specs], cache_dir=cache, endpoint=server.endpoint,
                              token=False)
    assert report.ok, [r.error for r in report.repos]


def many_repos_cache(root: Path, repos: int) -> Path:
    """``repos`` small repo folders (one blob, one snapshot link, a ref): enough for ls to take a while."""
    cache = root / "cache"
    commit = "1" * 40
    for i in range(repos):
        repo = cache / f"models--org--r{i}"
        (repo / "blobs").mkdir(parents=True)
        (repo / "blobs" / ("a" * 40)).write_text(str(i))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").symlink_to("../../blobs/" + "a" * 40)
    return cache


def user_namespaces() -> bool:
    """Whether this machine lets an unprivileged process mount in its own user namespace (``unshare --user
    --map-root-user --mount``): the tmpfs tests (a full disk, a read-only mount) need it."""
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
