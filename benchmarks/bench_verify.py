"""Benchmark: ``hfcache verify`` hashing throughput vs ``sha256sum`` on the same blobs, and peak memory.

Builds a cache in a temporary folder: ``--blobs`` LFS-style blobs of ``--blob-mib`` MiB of random bytes each,
named by their sha256 and linked from one snapshot, plus (``--big-gib``) one more repo holding a single large blob
for the memory measurement. Every file is read once before timing, so all contenders hash from the page cache
(the comparison is of hashing, not of the disk). In one run it prints:

  * ``sha256sum`` over the blobs (coreutils, single core) - the reference;
  * ``hfcache verify --max-workers 1`` (one core) and ``hfcache verify`` (one thread per core);
  * the throughput of each in MiB/s and the ratio to ``sha256sum``;
  * peak RSS of ``hfcache verify`` on the repo with the large blob (goal: under 100 MiB).

    python benchmarks/bench_verify.py [--blobs 8] [--blob-mib 128] [--big-gib 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "sys.stderr.write(f'{p.returncode} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
)
COMMIT = "0" * 39 + "1"


def write_blob(repo: Path, size: int, path_in_repo: str) -> Path:
    """Write ``size`` random bytes as ``blobs/<sha256>`` (streamed) and link it from the snapshot."""
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / "tmp"
    digest = hashlib.sha256()
    chunk = 8 * 1024 * 1024
    with open(tmp, "wb") as f:
        left = size
        while left:
            data = os.urandom(min(chunk, left))
            digest.update(data)
            f.write(data)
            left -= len(data)
    blob = blobs / digest.hexdigest()
    tmp.rename(blob)
    link = repo / "snapshots" / COMMIT / path_in_repo
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return blob


def timed(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS MiB) of ``cmd`` in a fresh process; exits if it fails."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    code, rss = proc.stderr.strip().splitlines()[-1].split()
    if code != "0":
        sys.exit(f"bench_verify: {' '.join(cmd[:3])} ... exited {code}")
    return wall, int(rss) // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=8)
    parser.add_argument("--blob-mib", type=int, default=128)
    parser.add_argument("--big-gib", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_verify_", dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        cache = Path(tmp) / "cache"
        repo = cache / "models--bench--many"
        blobs = [write_blob(repo, args.blob_mib * 1024 * 1024, f"model-{i:05d}.safetensors")
                 for i in range(args.blobs)]
        big_cache = Path(tmp) / "big"
        big = write_blob(big_cache / "models--bench--big", int(args.big_gib * 1024 ** 3), "model.safetensors")
        total = sum(b.stat().st_size for b in blobs)
        subprocess.run(["cat", *map(str, blobs), str(big)], stdout=subprocess.DEVNULL, check=True)  # page cache

        contenders = {
            "sha256sum (1 core)": ["sha256sum", *map(str, blobs)],
            "hfcache verify --max-workers 1": [sys.executable, "-m", "hfcache", "verify", "--cache-dir", str(cache),
                                               "--json", "--max-workers", "1"],
            f"hfcache verify ({os.cpu_count()} workers)": [sys.executable, "-m", "hfcache", "verify",
                                                           "--cache-dir", str(cache), "--json"],
        }
        results = {}
        for name, cmd in contenders.items():
            walls = [timed(cmd)[0] for _ in range(args.repeat)]
            results[name] = statistics.median(walls)
        big_wall, big_rss = timed([sys.executable, "-m", "hfcache", "verify", "--cache-dir", str(big_cache), "--json"])

    mib = total / 1024 ** 2
    base = results["sha256sum (1 core)"]
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {args.blobs} blobs x {args.blob_mib} MiB "
          f"= {mib:.0f} MiB from the page cache, median of {args.repeat} (wall time includes start-up)")
    print(f"{'contender':34} {'wall s':>7} {'MiB/s':>8} {'x sha256sum throughput':>23}")
    for name, wall in results.items():
        print(f"{name:34} {wall:7.2f} {mib / wall:8.0f} {base / wall:23.2f}")
    print(f"hfcache verify of one {args.big_gib:g} GiB blob: {big_wall:.2f} s, peak RSS {big_rss} MiB "
          f"(goal: under 100 MiB)")


if __name__ == "__main__":
    main()
