"""Benchmark: planning a prune of a synthetic 10,000-repo cache, next to ``hf cache ls`` on the same cache.

The cache is ``bench_ls.py``'s (imported, not copied): per repo the five files of a BERT-style tokenizer as blobs
named by their git blob sha1, a snapshot of relative links and ``refs/main``; every tenth repo also has a file in a
subfolder and a second, detached revision. Planning a prune reads the same metadata as listing the cache, then
applies the policy; the budget here (``--max-size``, half the cache) makes it choose, in least-recently-used order,
the revisions of about half the repos, with every blob and lock file that goes with them (tens of thousands of plan
items, all printed as one JSON document).

In one run, each contender in a fresh subprocess (interpreter start-up counts for all), the script prints wall time,
peak RSS of the child (``getrusage(RUSAGE_CHILDREN)`` in a wrapper process, from ``bench_ls.py``) and the ratio to
``hf cache ls``:

  * ``hfcache prune --dry-run --json --max-size <half>`` - the plan a cron job would execute;
  * ``hf cache ls --format json`` - the reference: only lists the cache;
  * ``hf cache prune --dry-run --format json`` - what huggingface_hub plans (detached revisions only).

    python benchmarks/bench_prune.py [--repos 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ls import build_cache, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    here = Path(sys.executable).parent
    hf = str(here / "hf") if (here / "hf").exists() else shutil.which("hf")
    with tempfile.TemporaryDirectory(prefix="bench_prune_") as tmp:
        cache = Path(tmp) / "cache"
        t0 = time.perf_counter()
        build_cache(cache, args.repos)
        build_s = time.perf_counter() - t0
        listing = subprocess.run([sys.executable, "-m", "hfcache", "ls", "--cache-dir", str(cache), "--json"],
                                 capture_output=True, text=True, check=True)
        size = json.loads(listing.stdout)["size_on_disk"]
        budget = size // 2
        prune = [sys.executable, "-m", "hfcache", "prune", "--cache-dir", str(cache), "--dry-run", "--json",
                 "--max-size", str(budget)]
        contenders = {
            "hfcache prune --dry-run": prune,
            "hf cache ls": [hf, "cache", "ls", "--cache-dir", str(cache), "--format", "json"],
            "hf cache prune --dry-run": [hf, "cache", "prune", "--cache-dir", str(cache), "--dry-run", "--format",
                                         "json"],
        }
        results = {}
        for name, cmd in contenders.items():
            wall, rss = timed(cmd)
            results[name] = {"wall_s": wall, "peak_rss_mib": rss}
        # The plan itself (untimed, a second run): how much work the timed run did.
        plan = json.loads(subprocess.run(prune, capture_output=True, text=True, check=True).stdout)
    base = results["hf cache ls"]["wall_s"]
    for r in results.values():
        r["x_hf_cache_ls"] = r["wall_s"] / base
    summary = plan["summary"]
    facts = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "repos": args.repos,
             "build_s": round(build_s, 2), "cache_bytes": size, "max_size": budget,
             "plan_items": len(plan["items"]), "plan_revisions": summary["revisions_removed"],
             "plan_repos_removed": summary["repos_removed"], "plan_bytes_freed": summary["bytes_freed"]}
    if args.json:
        print(json.dumps({"machine": facts, "contenders": results}, indent=2))
        return
    print(f"python {facts['python']}, {facts['cpu_count']} CPUs, {args.repos} repos ({size} bytes, built in "
          f"{build_s:.1f}s), one run each")
    print(f"plan: --max-size {budget} -> {facts['plan_revisions']} revisions ({facts['plan_repos_removed']} whole "
          f"repos), {facts['plan_items']} items, {facts['plan_bytes_freed']} bytes freed")
    print(f"{'contender':26} {'wall s':>8} {'peak RSS MiB':>13} {'x hf cache ls':>14}")
    for name, r in results.items():
        print(f"{name:26} {r['wall_s']:8.2f} {r['peak_rss_mib']:13d} {r['x_hf_cache_ls']:14.2f}")


if __name__ == "__main__":
    main()
