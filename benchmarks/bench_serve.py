"""Benchmark the mirror: concurrent clients downloading the fixture tokenizers from a served, warmed cache.

Contenders (each a server subprocess on 127.0.0.1, serving the same bytes):

- ``hfcache serve``   uvicorn running HubServer over the warmed cache (what the CLI runs);
- ``werkzeug``        the same HubServer and cache on werkzeug's threaded server (``python -m tests.testhub
                      --layout cache --backend werkzeug --no-cdn``), the stack the tests use;
- ``http.server``     ``python -m http.server`` over a plain copy of the same files at the same URL paths
                      (``<repo>/resolve/main/<path>``): the standard library's static file server, the floor.

Two workloads, ``--clients`` concurrent client processes each (default 16):

1. ``files``: every client GETs every file of the nine repos, ``--rounds`` times, with ``http.client`` on a
   keep-alive connection (http.server speaks HTTP/1.0: one connection per request). Per-request latency.
2. ``snapshot_download``: every client runs ``huggingface_hub.snapshot_download`` of each of the nine repos into a
   fresh cache, ``--rounds`` times (API call, tree listing, HEAD and GET per file: what a pod starting does).
   http.server cannot answer the Hub API, so its row is the same files fetched with plain GETs per repo.

3. ``storm``: ``--storm`` connections (default 1000) are opened at once, each sending an incomplete request and
   holding it (pods starting together, slow or stalled clients); reported: seconds until all are accepted, the
   server's threads and RSS while they are held, and the latency of a normal download meanwhile.

4. ``pull-through``: ``hfcache serve --upstream`` over an EMPTY cache, the fixture Hub (an in-process HubServer
   that logs every request) as its upstream. ``--clients`` processes start together (a shared start time) and each
   runs ``snapshot_download`` of the nine repos: the cold wave (every file a miss, fetched once, verified). Then
   the same clients again (the later wave: all hits), and the same workload on the static ``hfcache serve`` of a
   warmed cache. Reported: per-repo latency (p50/p99/max) and requests/s of each wave, and the upstream's file
   bodies per file (goal: exactly one) and resolutions per repo. ``--only pull-through`` runs just this.

Printed per contender and workload: requests/s, MB/s, p50/p99 latency (per request, or per repo download), and
the server's peak RSS (``VmHWM`` of its process). Every figure is the median of ``--repeat`` runs (default 3), the
contenders interleaved within each run, because a shared machine's load drifts. Run:
``python benchmarks/bench_serve.py [--clients 16] [--rounds 3] [--repeat 3] [--storm 1000] [--json]``.
Clients and server share this machine's cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HUB = ROOT / "tests" / "data" / "hub"
REPOS = [
    "FacebookAI/roberta-base", "distilbert/distilbert-base-uncased", "google-bert/bert-base-chinese",
    "google-bert/bert-base-uncased", "google-t5/t5-small", "microsoft/Phi-3-mini-4k-instruct",
    "mistralai/Mistral-7B-v0.1", "openai-community/gpt2", "sentence-transformers/all-MiniLM-L6-v2",
]  # fmt: skip


def warm_cache(cache: Path) -> None:
    import hfcache
    from tests.testhub import HubServer

    requests = [hfcache.WarmRequest(r, kind="model" if "MiniLM" in r else "tokenizer") for r in REPOS]
    with HubServer(HUB) as server:
        report = hfcache.warm(requests, cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos if r.error]


def served_files(cache: Path) -> dict[str, list[tuple[str, Path]]]:
    """repo -> [(path, file in the snapshot)] of what the cache holds at refs/main."""
    out = {}
    for repo in REPOS:
        folder = cache / ("models--" + repo.replace("/", "--"))
        snapshot = folder / "snapshots" / (folder / "refs" / "main").read_text()
        out[repo] = sorted((p.relative_to(snapshot).as_posix(), p) for p in snapshot.rglob("*") if p.is_file())
    return out


def static_copy(files: dict[str, list[tuple[str, Path]]], dest: Path) -> None:
    for repo, entries in files.items():
        for path, source in entries:
            target = dest / repo / "resolve" / "main" / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def start(name: str, cache: Path, static: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "NO_COLOR": "1"}
    if name == "hfcache serve":
        cmd = [sys.executable, "-m", "hfcache", "serve", "--cache-dir", str(cache), "--port", "0"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        endpoint = re.search(r" at (http://\S+)$", proc.stderr.readline().strip()).group(1)
    elif name == "werkzeug":
        cmd = [sys.executable, "-m", "tests.testhub", str(cache), "--layout", "cache", "--backend", "werkzeug",
               "--no-cdn", "--port", "0"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        endpoint = proc.stdout.readline().rsplit(" at ", 1)[1].strip()
    else:
        port = _free_port()
        cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(static), str(port)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = f"http://127.0.0.1:{port}"
        _wait_port(port)
    return proc, endpoint


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int) -> None:
    import socket

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- client workers (run in separate processes) --------------------------------------------------------


def _get_all(endpoint: str, paths: list[str]) -> tuple[list[float], int]:
    """GET every path on one keep-alive connection (reconnecting when the server closes); latencies, bytes."""
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    conn, latencies, total = None, [], 0
    for path in paths:
        started = time.perf_counter()
        if conn is None:
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("GET", path)
        response = conn.getresponse()
        while chunk := response.read(1 << 20):
            total += len(chunk)
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status}")
        if response.will_close:
            conn.close()
            conn = None
        latencies.append(time.perf_counter() - started)
    if conn is not None:
        conn.close()
    return latencies, total


def files_client(args: tuple[str, list[str], int]) -> tuple[list[float], int, int]:
    endpoint, paths, rounds = args
    latencies, total = [], 0
    for _ in range(rounds):
        lat, n = _get_all(endpoint, paths)
        latencies += lat
        total += n
    return latencies, total, len(latencies)


def snapshot_client(args: tuple[str, dict[str, list[str]], int, bool]) -> tuple[list[float], int, int]:
    """Per repo: snapshot_download into a fresh cache (hub) or plain GETs of its files (static)."""
    endpoint, files, rounds, static = args
    latencies, total, requests = [], 0, 0
    for _ in range(rounds):
        for repo, paths in files.items():
            started = time.perf_counter()
            if static:
                lat, n = _get_all(endpoint, [f"/{repo}/resolve/main/{p}" for p in paths])
                requests += len(lat)
            else:
                from huggingface_hub import snapshot_download

                with tempfile.TemporaryDirectory() as tmp:
                    folder = snapshot_download(repo, cache_dir=tmp, endpoint=endpoint, token=False)
                    n = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
                requests += 2 + 2 * len(paths)  # repo info, tree, HEAD + GET per file
            latencies.append(time.perf_counter() - started)
            total += n
    return latencies, total, requests


def snapshot_client_at(args: tuple[float, str, dict[str, list[str]]]) -> tuple[list[float], int, int]:
    """snapshot_client, started at the wall-clock time ``start_at`` (every client of a wave at once)."""
    start_at, endpoint, files = args
    time.sleep(max(0.0, start_at - time.time()))
    return snapshot_client((endpoint, files, 1, False))


def pull_through(pool: ProcessPoolExecutor, clients: int, base: Path, warmed: Path,
                 rel: dict[str, list[str]]) -> dict:
    """The pull-through workload (module docstring, 4): cold wave, later wave, static mirror; upstream counts."""
    from tests.testhub import HubServer

    env = {**os.environ, "NO_COLOR": "1"}
    rows: dict = {}
    with HubServer(HUB) as upstream:
        cmd = [sys.executable, "-m", "hfcache", "serve", "--cache-dir", str(base / "pull-cache"), "--port", "0",
               "--upstream", upstream.endpoint]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            endpoint = re.search(r" at (http://\S+)$", proc.stderr.readline().strip()).group(1)
            for wave in ("cold", "later"):
                rows[wave] = _wave(pool, clients, endpoint, rel)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        bodies: dict[str, int] = {}
        resolutions: dict[str, int] = {}
        for r in upstream.requests:
            if r.method == "GET" and r.status == 200 and r.bytes_sent and ("/resolve/" in r.path or r.origin == "cdn"):
                bodies[r.path] = bodies.get(r.path, 0) + 1
            elif r.path.startswith("/api/models/"):
                key = r.path.split("?")[0].split("/revision/")[0]
                resolutions[key] = resolutions.get(key, 0) + 1
        rows["upstream"] = {"requests": len(upstream.requests), "files": len(bodies),
                            "bodies_per_file_max": max(bodies.values()), "bodies_per_file_min": min(bodies.values()),
                            "resolutions_per_repo_max": max(resolutions.values())}
    proc, endpoint = start("hfcache serve", warmed, base)
    try:
        rows["static"] = _wave(pool, clients, endpoint, rel)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return rows


def _wave(pool: ProcessPoolExecutor, clients: int, endpoint: str, rel: dict[str, list[str]]) -> dict:
    start_at = time.time() + 1.0  # every client process is idle in the pool by then
    results = list(pool.map(snapshot_client_at, [(start_at, endpoint, rel)] * clients))
    wall = time.time() - start_at
    latencies = sorted(lat for r in results for lat in r[0])
    firsts = sorted(r[0][0] for r in results)  # each client's first repo download
    requests = sum(r[2] for r in results)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000

    return {"wall_s": wall, "req_per_s": requests / wall, "p50_ms": pct(latencies, 0.5),
            "p99_ms": pct(latencies, 0.99), "max_ms": latencies[-1] * 1000, "first_repo_p50_ms": pct(firsts, 0.5)}


def storm(endpoint: str, connections: int, probe: str) -> dict:
    """Hold ``connections`` incomplete requests open; time to open them, and a normal download meanwhile."""
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < connections + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, connections + 256), hard))
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    held = []
    started = time.perf_counter()
    try:
        for _ in range(connections):
            sock = socket.create_connection((host, int(port)), timeout=60)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: storm\r\n")  # no blank line: never complete
            held.append(sock)
        opened = time.perf_counter() - started
        time.sleep(1.0)
        latencies, _ = _get_all(endpoint, [probe] * 20)
        return {"open_s": opened, "probe_p50_ms": sorted(latencies)[len(latencies) // 2] * 1000}
    finally:
        for sock in held:
            sock.close()


def _proc_status(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            fields[key] = int(value.split()[0])
    return {"threads": fields.get("Threads", 0), "rss_mib": fields.get("VmRSS", 0) / 1024}


def _warm_worker(_: int) -> None:
    pass  # import once per worker, outside the timings


def run(pool: ProcessPoolExecutor, fn, tasks: list) -> dict:
    started = time.perf_counter()
    results = list(pool.map(fn, tasks))
    wall = time.perf_counter() - started
    latencies = sorted(lat for r in results for lat in r[0])
    total = sum(r[1] for r in results)
    requests = sum(r[2] for r in results)

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    return {"wall_s": wall, "requests": requests, "req_per_s": requests / wall, "mb_per_s": total / wall / 1e6,
            "bytes": total, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "samples": len(latencies)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--storm", type=int, default=1000, help="connections held open in the storm workload")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", choices=["pull-through"], help="run only this workload")
    args = parser.parse_args()
    os.environ.update(HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_UPDATE_CHECK="1")

    import huggingface_hub
    import uvicorn
    import werkzeug

    with tempfile.TemporaryDirectory() as tmp:
        cache, static = Path(tmp) / "cache", Path(tmp) / "static"
        warm_cache(cache)
        files = served_files(cache)
        static_copy(files, static)
        rel = {repo: [p for p, _ in entries] for repo, entries in files.items()}
        paths = [f"/{repo}/resolve/main/{p}" for repo, ps in rel.items() for p in ps]
        size = sum(src.stat().st_size for entries in files.values() for _, src in entries)
        probe = "/google-bert/bert-base-uncased/resolve/main/vocab.txt"
        runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
        load = []
        with ProcessPoolExecutor(args.clients) as pool:
            list(pool.map(_warm_worker, range(args.clients * 2)))
            pulled = pull_through(pool, args.clients, Path(tmp), cache, rel)
            if args.only == "pull-through":
                print_pull_through(pulled, args.clients, as_json=args.json)
                return 0
            for repeat in range(args.repeat):
                for name in CONTENDERS:
                    print(f"run {repeat + 1}/{args.repeat}: {name}", file=sys.stderr, flush=True)
                    load.append(os.getloadavg()[0])
                    proc, endpoint = start(name, cache, static)
                    try:
                        run(pool, files_client, [(endpoint, paths, 1)] * args.clients)  # warm-up, untimed
                        files_row = run(pool, files_client, [(endpoint, paths, args.rounds)] * args.clients)
                        snap_row = run(pool, snapshot_client, [(endpoint, rel, max(1, args.rounds - 1),
                                                                name == "http.server")] * args.clients)
                        storm_row = storm(endpoint, args.storm, probe) if args.storm else {}
                        if args.storm:
                            storm_row.update(_proc_status(proc.pid))
                        rss = peak_rss_mib(proc.pid)
                    finally:
                        proc.send_signal(signal.SIGTERM)
                        try:
                            proc.wait(timeout=30)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                    runs[name].append({"files": files_row, "snapshot_download": snap_row, "storm": storm_row,
                                       "peak_rss_mib": rss})
        rows = [_median_row(name, runs[name]) for name in CONTENDERS]

    facts = {"python": platform.python_version(), "cpus": os.cpu_count(), "clients": args.clients,
             "rounds": args.rounds, "repeat": args.repeat, "files": len(paths), "bytes_per_round": size,
             "load_avg_1m": f"{min(load):.1f}-{max(load):.1f}", "uvloop": _has("uvloop"),
             "httptools": _has("httptools"),
             "huggingface_hub": huggingface_hub.__version__, "uvicorn": uvicorn.__version__,
             "werkzeug": werkzeug.__version__ if hasattr(werkzeug, "__version__") else _version("werkzeug"),
             "platform": platform.platform()}
    if args.json:
        print(json.dumps({"machine": facts, "results": rows, "pull_through": pulled}, indent=2))
        return 0
    print(" ".join(f"{k}={v}" for k, v in facts.items()))
    base = {w: next(r for r in rows if r["server"] == "http.server")[w]["mb_per_s"]
            for w in ("files", "snapshot_download")}
    header = f"{'workload':<18} {'server':<14} {'req/s':>8} {'MB/s':>8} {'x static':>8} {'p50 ms':>8} {'p99 ms':>8} " \
             f"{'peak RSS MiB':>12}"
    print(header)
    print("-" * len(header))
    for workload in ("files", "snapshot_download"):
        for row in rows:
            r = row[workload]
            print(f"{workload:<18} {row['server']:<14} {r['req_per_s']:>8.0f} {r['mb_per_s']:>8.1f} "
                  f"{r['mb_per_s'] / base[workload]:>8.2f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                  f"{row['peak_rss_mib']:>12.1f}")
    print("latency: per request (files) or per repo download (snapshot_download: one snapshot_download call; "
          "http.server: plain GETs of the same files)")
    if args.storm:
        header = f"{'storm':<18} {'server':<14} {'open s':>8} {'threads':>8} {'RSS MiB':>8} {'probe p50 ms':>12}"
        print()
        print(header)
        print("-" * len(header))
        for row in rows:
            r = row["storm"]
            print(f"{args.storm:<18} {row['server']:<14} {r['open_s']:>8.2f} {r['threads']:>8.0f} {r['rss_mib']:>8.1f} "
                  f"{r['probe_p50_ms']:>12.1f}")
        print(f"storm: {args.storm} connections each holding an incomplete request; open s = until all accepted; "
              "threads/RSS of the server while held; probe = a 231 kB download meanwhile")
    print()
    print_pull_through(pulled, args.clients, as_json=False)
    return 0


def print_pull_through(rows: dict, clients: int, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"clients": clients, "pull_through": rows}, indent=2))
        return
    header = f"{'pull-through':<28} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'1st repo p50':>12}"
    print(header)
    print("-" * len(header))
    for key, label in (("cold", "cold mirror (first clients)"), ("later", "same mirror (later clients)"),
                       ("static", "static mirror (warmed)")):
        r = rows[key]
        print(f"{label:<28} {r['req_per_s']:>8.0f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} "
              f"{r['first_repo_p50_ms']:>12.1f}")
    up = rows["upstream"]
    print(f"{clients} snapshot_download clients starting together per wave; latency per repo download. Upstream: "
          f"{up['requests']} requests, {up['files']} files, bodies per file {up['bodies_per_file_min']}-"
          f"{up['bodies_per_file_max']} (goal 1), resolutions per repo <= {up['resolutions_per_repo_max']}")


CONTENDERS = ("hfcache serve", "werkzeug", "http.server")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median_row(name: str, runs: list[dict]) -> dict:
    row: dict = {"server": name, "peak_rss_mib": max(r["peak_rss_mib"] for r in runs)}
    for workload in ("files", "snapshot_download", "storm"):
        keys = runs[0][workload].keys()
        row[workload] = {k: _median([r[workload][k] for r in runs]) for k in keys}
    return row


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    raise SystemExit(main())
