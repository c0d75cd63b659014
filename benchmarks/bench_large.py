"""Benchmark: one large file over a per-connection-throttled link, ``hfcache warm`` vs. ``hf download``.

Where a CDN or proxy caps each connection's bandwidth, one stream per file leaves most of the link idle; hfcache
fetches a large file as parallel ``Range`` parts (``hfcache.hub.transfer``). This measures it, side by side in one run:

  A  hfcache      ``python -m hfcache warm acme/large --kind all --json -q`` (default --max-workers 8)
  B  hf download  ``hf download acme/large`` (huggingface_hub's CLI, one stream per file)

Set-up, generated at run time in a temporary folder (nothing is downloaded from the internet): a repo
``acme/large`` holding ``model.safetensors`` (``--size-mib``, default 128 MiB of random bytes: an LFS file, served
through the CDN origin like the Hub's) and a small ``config.json``; the test Hub (``tests.testhub.HubServer``) over
it with every file body paced to ``--throttle-bps`` per connection (default 10 MB/s). Each contender starts on an empty cache.

Figures: wall time (``time.perf_counter`` around the subprocess: interpreter start-up counts), peak RSS of the
process (``os.wait4`` rusage), body requests the server logged, and the ratio hfcache / hf download.
Goals (docs/benchmarks.md): ratio <= 0.3 and hfcache peak RSS <= 150 MiB.

    python benchmarks/bench_large.py [--size-mib 128] [--throttle-bps 10000000] [--max-workers 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # so `hfcache` imports even when the package is not installed

from tests.testhub import HubServer

REPO = "acme/large"
GOAL_RATIO = 0.3
GOAL_RSS_MIB = 150


def make_hub(root: Path, size_mib: int) -> None:
    repo = root / REPO
    repo.mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "bert"}\n')
    with open(repo / "model.safetensors", "wb") as f:
        for _ in range(size_mib):
            f.write(os.urandom(1024 * 1024))


def clean_env(home: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HFCACHE_"))}
    env.update(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one subprocess; exits the benchmark if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench_large: {' '.join(argv[:4])} failed ({proc.returncode}): {stderr[-2000:]}")
    return wall, usage.ru_maxrss / 1024  # Linux: KiB


def hf_cli() -> str:
    sibling = Path(sys.executable).parent / "hf"
    found = str(sibling) if sibling.exists() else shutil.which("hf")
    if not found:
        sys.exit("bench_large: cannot find the `hf` CLI (pip install huggingface_hub)")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--throttle-bps", type=int, default=10_000_000, help="per-connection pace (bytes/s)")
    parser.add_argument("--max-workers", type=int, default=8, help="hfcache --max-workers")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-large-") as tmp:
        tmp_path = Path(tmp)
        make_hub(tmp_path / "hub", args.size_mib)
        results: dict[str, dict] = {}
        with HubServer(tmp_path / "hub", throttle_bps=args.throttle_bps) as server:
            server.commit_of(REPO)  # hash the file once, before any timed run
            contenders = {
                "hfcache": [sys.executable, "-m", "hfcache", "warm", REPO, "--kind", "all", "--cache-dir",
                            str(tmp_path / "c-hfcache"), "--endpoint", server.endpoint, "--max-workers",
                            str(args.max_workers), "--json", "-q"],
                "hf download": [hf_cli(), "download", REPO, "--cache-dir", str(tmp_path / "c-hf"), "--quiet"],
            }
            for name, argv in contenders.items():
                server.clear_log()
                wall, rss = run(argv, clean_env(tmp_path / f"home-{name.replace(' ', '-')}", server.endpoint))
                body_requests = [r for r in server.requests if r.method == "GET" and r.origin == "cdn"]
                results[name] = {"wall_s": round(wall, 2), "peak_rss_mib": round(rss, 1),
                                 "body_requests": len(body_requests),
                                 "body_bytes": sum(r.bytes_sent for r in body_requests)}
        ratio = results["hfcache"]["wall_s"] / results["hf download"]["wall_s"]
        document = {
            "file_mib": args.size_mib, "throttle_bps": args.throttle_bps, "max_workers": args.max_workers,
            "contenders": results, "ratio": round(ratio, 3),
            "goals": {"ratio_max": GOAL_RATIO, "rss_mib_max": GOAL_RSS_MIB,
                      "ratio_met": ratio <= GOAL_RATIO, "rss_met": results["hfcache"]["peak_rss_mib"] <= GOAL_RSS_MIB},
        }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{args.size_mib} MiB file, {args.throttle_bps / 1e6:g} MB/s per connection, "
          f"hfcache --max-workers {args.max_workers}")
    print(f"{'contender':<12} {'wall s':>8} {'peak RSS MiB':>13} {'body reqs':>10} {'body MiB':>9}")
    for name, r in results.items():
        print(f"{name:<12} {r['wall_s']:>8.2f} {r['peak_rss_mib']:>13.1f} {r['body_requests']:>10} "
              f"{r['body_bytes'] / 2**20:>9.1f}")
    goals = document["goals"]
    print(f"ratio hfcache / hf download: {ratio:.3f}x (goal <= {GOAL_RATIO}x: {'met' if goals['ratio_met'] else 'NOT met'})")
    print(f"hfcache peak RSS: {results['hfcache']['peak_rss_mib']:.1f} MiB (goal <= {GOAL_RSS_MIB} MiB: "
          f"{'met' if goals['rss_met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
