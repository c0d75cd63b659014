"""Benchmark: mirror replicas sharing one bucket, pulling through from upstream, under many clients.

Three ``hfcache serve --store s3://... --upstream URL`` processes on one empty bucket (moto's S3 server process,
``tests/s3.py``), upstream the test Hub (in this process, every request recorded). ``--clients`` processes of
``hfcache warm --lock LOCK --endpoint REPLICA`` (the lock: four fixture tokenizers), ``--concurrency`` at a time,
spread round-robin over the replicas, each into its own empty cache.

Figures: p50/p99/max client wall time, total wall time, each replica's peak RSS (VmHWM), the upstream file bodies
sent per file (goal: each at most once), and every client's cache checked (``hfcache verify --lock``: 0 requests) plus
``--load`` of them loaded offline with transformers in a subprocess.

    python benchmarks/bench_serve_bucket.py [--clients 200] [--concurrency 16] [--load 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.anchors import load_average
from tests.helpers import clean_env, offline_load
from tests.s3 import moto_server
from tests.served import served
from tests.testhub import HubServer

HUB = ROOT / "tests" / "data" / "hub"
REPOS = ("openai-community/gpt2", "google-bert/bert-base-uncased", "FacebookAI/roberta-base",
         "distilbert/distilbert-base-uncased")


def _lock(folder: Path, endpoint: str) -> Path:
    body = "".join(f'[[repos]]\nrepo_id = "{r}"\n\n' for r in REPOS)
    (folder / "hfcache.toml").write_text(f'endpoint = "{endpoint}"\n\n{body}')
    subprocess.run([sys.executable, "-m", "hfcache", "lock"], cwd=folder, check=True, capture_output=True)
    return folder / "hfcache.lock"


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _bodies_per_file(upstream: HubServer, since: int) -> Counter:
    """Upstream file bodies sent from request ``since`` on (the lock step before it reads configs too)."""
    counts: Counter = Counter()
    for r in upstream.requests[since:]:
        if r.method == "GET" and r.status in (200, 206) and r.bytes_sent and ("/resolve/" in r.path or r.origin == "cdn"):
            counts[r.path] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--load", type=int, default=5, help="client caches loaded offline with transformers")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-bucket-") as tmp, moto_server(Path(tmp)) as s3, \
            HubServer(HUB) as upstream, ExitStack() as stack:
        work = Path(tmp)
        lock = _lock(work, upstream.endpoint)
        since = len(upstream.requests)  # `hfcache lock` read the configs: not the mirror's fetches
        s3.bucket("mirror")
        env = clean_env(**s3.env())
        replicas = [stack.enter_context(served("--store", "s3://mirror/hf", "--upstream", upstream.endpoint, env=env))
                    for _ in range(3)]

        def client(n: int) -> tuple[float, int]:
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "hfcache", "warm", "--lock", str(lock), "--endpoint",
                                   replicas[n % 3][0], "--cache-dir", str(work / f"c{n}"), "-q"], env=clean_env(),
                                  capture_output=True, text=True)
            if proc.returncode:
                print(f"client {n} failed: {proc.stderr.strip()[-400:]}", file=sys.stderr)
            return time.perf_counter() - started, proc.returncode

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=options.concurrency) as pool:
            results = list(pool.map(client, range(options.clients)))
        wall = time.perf_counter() - started
        rss = [_peak_rss_mib(proc.pid) for _, proc in replicas]
        bodies = _bodies_per_file(upstream, since)
        failed = [n for n, (_, code) in enumerate(results) if code != 0]
        twice = {path: n for path, n in bodies.items() if n > 1}
        if twice:
            print("sent more than once:", twice, file=sys.stderr)

        verified = 0
        for n in range(options.clients):
            proc = subprocess.run([sys.executable, "-m", "hfcache", "verify", "--lock", str(lock), "--cache-dir",
                                   str(work / f"c{n}")], env=clean_env(), capture_output=True, text=True)
            verified += proc.returncode == 0
            if proc.returncode and n not in failed:
                print(f"cache {n} failed verify: {(proc.stdout + proc.stderr).strip()[-600:]}", file=sys.stderr)
        loaded = sum(1 for n in range(min(options.load, options.clients))
                     if all("input_ids" in r for r in offline_load(work / f"c{n}", list(REPOS)).values()))
    times = sorted(t for t, _ in results)
    result = {
        "clients": options.clients, "concurrency": options.concurrency, "failed": len(failed),
        "p50_s": statistics.median(times), "p99_s": times[min(len(times) - 1, int(len(times) * 0.99))],
        "max_s": times[-1], "wall_s": wall, "replica_peak_rss_mib": rss,
        "upstream_files": len(bodies), "upstream_max_bodies_per_file": max(bodies.values(), default=0),
        "caches_verified": verified, "caches_loaded_offline": loaded, "load_average": load_average(),
    }
    if options.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{options.clients} clients, {options.concurrency} at a time, 3 replicas: {len(failed)} failed; "
          f"p50 {result['p50_s']:.2f} s, p99 {result['p99_s']:.2f} s, max {result['max_s']:.2f} s, "
          f"all in {wall:.1f} s")
    print(f"replica peak RSS: {', '.join(f'{x:.0f} MiB' for x in rss)}")
    print(f"upstream: {len(bodies)} files sent, at most {result['upstream_max_bodies_per_file']} time(s) each")
    print(f"caches verified: {verified}/{options.clients}; loaded offline: {loaded}/{min(options.load, options.clients)}"
          f" ({result['load_average']})")


if __name__ == "__main__":
    main()
