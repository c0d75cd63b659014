"""Benchmark: warming nine tokenizers with hfcache vs. the ways users do it otherwise.

What it measures, against a local Hub-compatible server (the test Hub, ``tests.testhub.HubServer``, over
``tests/data/hub``, no internet needed):

  A  hfcache            ONE subprocess: ``python -m hfcache warm <9 repos> --json -q`` (kind tokenizer).
  B  hf download        one ``hf download <repo> <files...>`` subprocess PER repo, in sequence
                        (a Dockerfile with one RUN per model), fetching exactly the files hfcache selected.
  A' hfcache --lock     ONE subprocess: ``python -m hfcache warm --lock hfcache.lock`` with a lock of the same
                        9 repos written once before timing (``hfcache lock``); on a warm cache it must make
                        zero requests (a stat-only check, no hashing, no HTTP client set up).
  C  snapshot_download  ONE python subprocess calling ``huggingface_hub.snapshot_download(repo,
                        allow_patterns=<same files>)`` for each repo in sequence.
  D  snapshot_download threads
                        ONE python subprocess calling the same ``snapshot_download`` for the nine repos in 8
                        threads (the best a script can do); its warm-again run is offline (HF_HUB_OFFLINE=1).

Then the issue-18 goals as ratios of medians measured in the same run: P1 ``warm --lock`` warm-again vs ``hf
download`` x9 warm-again (<= 0.05) and vs D offline (<= 0.5), with 0 requests; P2 hfcache cold vs D cold (wall <= 0.8,
requests <= 0.6). The anchors (B, C, D) run from a separate venv with the released huggingface_hub unless
``--anchors current`` (see benchmarks/anchors.py). The load average is printed before and after.

For each contender, on a fresh temporary cache ("cold") and then again on that now-warm cache
("warm again"): wall time (``time.perf_counter`` around the subprocess(es), so interpreter start-up
counts), HTTP requests and response-body bytes from the server's log (hub + CDN origins), and the
bytes in the resulting cache (unique inodes, so hardlinks/symlinks count once). With ``--repeat N``
every figure is the median over N rounds (each round uses new caches; the server hashes the fixture
repos once before the first timed run, so no contender pays for that). Every subprocess gets the same
environment: all inherited ``HF_*`` variables dropped, then HF_ENDPOINT=<server>, HF_HOME=<tmp dir>,
HF_HUB_DISABLE_TELEMETRY=1, HF_HUB_DISABLE_UPDATE_CHECK=1.

Run from anywhere, with the project's venv python:

    python benchmarks/bench_warm.py [--throttle-bps 5000000] [--latency-ms 50] [--repeat 3] [--anchors venv|current]
                                    [--json]

``--throttle-bps`` paces every file body to about N bytes/s per connection (default: unthrottled); ``--latency-ms``
delays every answer, as a remote Hub's round trip does (default: 0, the loopback's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # so `hfcache` imports even when the package is not installed

from anchors import anchor_python, anchor_version, clean_python_env, load_average, precompile
from tests.testhub import Faults, HubServer

REPOS = [
    "bert-base-uncased",
    "openai-community/gpt2",
    "google-bert/bert-base-chinese",
    "FacebookAI/roberta-base",
    "mistralai/Mistral-7B-v0.1",
    "sentence-transformers/all-MiniLM-L6-v2",
    "distilbert/distilbert-base-uncased",
    "google-t5/t5-small",
    "microsoft/Phi-3-mini-4k-instruct",
]
CONTENDERS = ["hfcache", "hfcache --lock", "hf download", "snapshot_download", "snapshot_download threads"]
ANCHOR_PYTHON = Path(sys.executable)  # set by main(): the anchors' interpreter (benchmarks/anchors.py)

# Contender C: one interpreter, snapshot_download per repo in sequence. argv[1] = JSON job description.
SNAPSHOT_SCRIPT = """
import json, sys
from huggingface_hub import snapshot_download
job = json.loads(sys.argv[1])
for repo, files in job["files"].items():
    snapshot_download(repo, allow_patterns=files, cache_dir=job["cache_dir"], endpoint=job["endpoint"])
"""

# Contender D: one interpreter, snapshot_download of the nine repos in 8 threads.
THREADED_SCRIPT = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from huggingface_hub import snapshot_download
job = json.loads(sys.argv[1])
def one(item):
    return snapshot_download(item[0], allow_patterns=item[1], cache_dir=job["cache_dir"], endpoint=job["endpoint"])
with ThreadPoolExecutor(8) as pool:
    list(pool.map(one, job["files"].items()))
"""


def hf_cli() -> str:
    """The ``hf`` executable next to the anchors' python, else the one on PATH."""
    sibling = ANCHOR_PYTHON.parent / "hf"
    found = str(sibling) if sibling.exists() else shutil.which("hf")
    if not found:
        sys.exit("bench_warm: cannot find the `hf` CLI (pip install huggingface_hub)")
    return found


def child_env(endpoint: str, hf_home: Path) -> dict[str, str]:
    """The same clean environment for every contender: no inherited HF_* (tokens, caches, offline mode)."""
    env = {k: v for k, v in clean_python_env(dict(os.environ)).items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1",
    )
    return env


def run(cmd: list[str], env: dict[str, str]) -> str:
    """Run one subprocess; return its stdout, or stop the benchmark with its stderr if it failed."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_warm: command failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return proc.stdout


def write_lock(endpoint: str, folder: Path) -> Path:
    """Write a manifest of REPOS and lock it with ``hfcache lock`` (untimed); return the lock's path."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "hfcache.toml"
    manifest.write_text("".join(f'[[repos]]\nrepo_id = "{repo}"\n\n' for repo in REPOS))
    run([sys.executable, "-m", "hfcache", "lock", "--manifest", str(manifest), "--endpoint", endpoint, "--json"],
        child_env(endpoint, folder / "home"))
    return folder / "hfcache.lock"


LOCK_PATH: Path | None = None


def commands(contender: str, files: dict[str, list[str]], cache: Path, endpoint: str) -> list[list[str]]:
    """The subprocess command lines one run of ``contender`` consists of."""
    if contender == "hfcache --lock":
        return [[sys.executable, "-m", "hfcache", "warm", "--lock", str(LOCK_PATH), "--cache-dir", str(cache),
                 "--endpoint", endpoint, "--json", "-q"]]
    if contender == "hfcache":
        return [[sys.executable, "-m", "hfcache", "warm", *REPOS, "--cache-dir", str(cache),
                 "--endpoint", endpoint, "--json", "-q"]]
    if contender == "hf download":
        return [[hf_cli(), "download", repo, *files[repo], "--cache-dir", str(cache)] for repo in REPOS]
    job = {"files": {repo: files[repo] for repo in REPOS}, "cache_dir": str(cache), "endpoint": endpoint}
    script = THREADED_SCRIPT if contender == "snapshot_download threads" else SNAPSHOT_SCRIPT
    return [[str(ANCHOR_PYTHON), "-c", script, json.dumps(job)]]


def cache_bytes(cache: Path) -> int:
    """Bytes stored under ``cache``, each inode counted once, symlinks not followed."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _dirs, names in os.walk(cache):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if not stat.S_ISLNK(st.st_mode):
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def measure(server: HubServer, cmds: list[list[str]], env: dict[str, str]) -> tuple[float, int, int, list[str]]:
    """(wall seconds, requests, body bytes, stdouts) for running ``cmds`` one after another."""
    server.clear_log()
    start = time.perf_counter()
    outputs = [run(cmd, env) for cmd in cmds]
    wall = time.perf_counter() - start
    log = server.requests
    return wall, len(log), sum(r.bytes_sent for r in log), outputs


def one_round(server: HubServer, contender: str, files: dict[str, list[str]] | None, workdir: Path) -> dict:
    """A cold run on a fresh cache, then the same run again on that cache. ``files`` None: take them from A."""
    cache, home = workdir / "cache", workdir / "home"
    env = child_env(server.endpoint, home)
    cold_wall, cold_req, cold_bytes, out = measure(server, commands(contender, files or {}, cache, server.endpoint), env)
    result = {"cold_wall_s": cold_wall, "cold_requests": cold_req, "body_bytes": cold_bytes,
              "cache_bytes": cache_bytes(cache)}
    if contender == "hfcache":
        report = json.loads(out[0])
        result["files"] = {r["repo_id"]: [f["path"] for f in r["files"]] for r in report["repos"]}
        files = result["files"]
    if contender == "snapshot_download threads":
        env = {**env, "HF_HUB_OFFLINE": "1"}  # the anchor of P1: the best a script can do on a complete cache
    warm_wall, warm_req, _, _ = measure(server, commands(contender, files, cache, server.endpoint), env)
    result.update(warm_wall_s=warm_wall, warm_requests=warm_req)
    return result


def benchmark(throttle_bps: int | None, repeat: int, latency_ms: int = 0) -> dict:
    """Run every contender ``repeat`` times against one server; return medians per contender."""
    rounds: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    files: dict[str, list[str]] | None = None
    faults = Faults(latency_ms=latency_ms) if latency_ms else None
    with HubServer(ROOT / "tests" / "data" / "hub", throttle_bps=throttle_bps, faults=faults) as server, \
            tempfile.TemporaryDirectory(prefix="bench_warm_") as tmp:
        for repo in REPOS:  # the server hashes a repo on first sight: do it now, not inside the first timed run
            server.commit_of(repo)
        global LOCK_PATH
        LOCK_PATH = write_lock(server.endpoint, Path(tmp) / "lock")
        for i in range(repeat):
            for contender in CONTENDERS:
                workdir = Path(tmp) / f"{i}-{contender.replace(' ', '_')}"
                result = one_round(server, contender, files, workdir)
                files = result.pop("files", files)  # hfcache's selection drives B and C
                rounds[contender].append(result)
                shutil.rmtree(workdir)
    medians = {
        c: {k: (statistics.median if k.endswith("_s") else statistics.median_low)([r[k] for r in rs])
            for k in rs[0]}
        for c, rs in rounds.items()
    }
    base = medians["hfcache"]
    for m in medians.values():
        m["cold_x_hfcache"] = m["cold_wall_s"] / base["cold_wall_s"]
        m["warm_x_hfcache"] = m["warm_wall_s"] / base["warm_wall_s"]
    return {"machine": machine_facts(throttle_bps, repeat, latency_ms), "files": files, "contenders": medians,
            "goals": goals(medians)}


def goals(medians: dict) -> list[dict]:
    """Goals P1 and P2 (docs/benchmarks.md) as ratios of this run's medians: (name, ratio, goal, met)."""
    lock, threads = medians["hfcache --lock"], medians["snapshot_download threads"]
    rows = [
        ("P1 warm --lock requests (complete cache)", lock["warm_requests"], 0),
        ("P1 warm --lock / hf download x9 (warm again)", lock["warm_wall_s"] / medians["hf download"]["warm_wall_s"],
         0.05),
        ("P1 warm --lock / threaded snapshot_download offline", lock["warm_wall_s"] / threads["warm_wall_s"], 0.5),
        ("P2 warm cold wall / threaded snapshot_download", medians["hfcache"]["cold_wall_s"] / threads["cold_wall_s"],
         0.8),
        ("P2 warm cold requests / threaded snapshot_download",
         medians["hfcache"]["cold_requests"] / max(1, threads["cold_requests"]), 0.6),
    ]
    return [{"goal": name, "value": round(value, 3), "at_most": limit, "met": value <= limit}
            for name, value, limit in rows]


def machine_facts(throttle_bps: int | None, repeat: int, latency_ms: int = 0) -> dict:
    return {"python": platform.python_version(), "cpu_count": os.cpu_count(), "throttle_bps": throttle_bps,
            "latency_ms": latency_ms,
            "repeat": repeat, "huggingface_hub": anchor_version(ANCHOR_PYTHON), "anchors": str(ANCHOR_PYTHON),
            "platform": platform.platform()}


def print_table(results: dict) -> None:
    m = results["machine"]
    throttle = f"{m['throttle_bps']} B/s per connection" if m["throttle_bps"] else "none"
    print(f"python {m['python']}, {m['cpu_count']} CPUs, throttle {throttle}, latency {m['latency_ms']} ms, "
          "huggingface_hub "
          f"{m['huggingface_hub']} ({m['anchors']}), {m['platform']}, median of {m['repeat']}")
    print(f"{m['load_before']} before, {m['load_after']} after")
    nfiles = sum(len(f) for f in results["files"].values())
    print(f"{len(REPOS)} repos, {nfiles} files (hfcache's tokenizer selection)\n")
    header = ["contender", "cold wall s", "cold reqs", "body bytes", "cache bytes",
              "warm-again wall s", "warm-again reqs", "cold x hfcache", "warm-again x hfcache"]
    rows = [header] + [
        [name, f"{r['cold_wall_s']:.2f}", str(r["cold_requests"]), str(r["body_bytes"]), str(r["cache_bytes"]),
         f"{r['warm_wall_s']:.2f}", str(r["warm_requests"]), f"{r['cold_x_hfcache']:.2f}",
         f"{r['warm_x_hfcache']:.2f}"]
        for name, r in results["contenders"].items()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for g in results["goals"]:
        print(f"{g['goal']:<52} {g['value']:>8}  goal <= {g['at_most']:<5} {'met' if g['met'] else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throttle-bps", type=int, default=None, metavar="N",
                        help="pace file bodies to about N bytes/s per connection (default: unthrottled)")
    parser.add_argument("--latency-ms", type=int, default=0, metavar="MS",
                        help="delay every answer by MS milliseconds, as a remote Hub's round trip (default: 0)")
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="rounds; medians are reported (default 3)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    parser.add_argument("--anchors", choices=["venv", "current"], default="venv",
                        help="huggingface_hub from a separate venv made once (default) or this interpreter's")
    args = parser.parse_args()
    if args.repeat < 1 or (args.throttle_bps is not None and args.throttle_bps < 1) or args.latency_ms < 0:
        parser.error("--repeat and --throttle-bps must be positive, --latency-ms not negative")
    global ANCHOR_PYTHON
    ANCHOR_PYTHON = anchor_python(args.anchors)
    precompile(ROOT)
    before = load_average()
    results = benchmark(args.throttle_bps, args.repeat, args.latency_ms)
    results["machine"].update(load_before=before, load_after=load_average())
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
