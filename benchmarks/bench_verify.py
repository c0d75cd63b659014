"""Benchmark: ``hfcache verify`` hashing throughput vs sha256sum, openssl and Python's hashlib, and peak memory.

Builds a cache in a temporary folder shaped like goal P3 (docs/benchmarks.md) (1 GiB by default): ``--large`` LFS-style blobs of
``--large-mib`` MiB and ``--small`` blobs of ``--small-kib`` KiB, random bytes named by their sha256 and linked from
one snapshot, plus (``--big-gib``) one more repo holding a single large blob for the memory measurement. Every file is
read once before timing, so all contenders hash from the page cache (hashing, not the disk, is compared). Rounds are
interleaved (each round runs every contender once; medians reported) and the load average is printed before and
after, because the machine may be shared. Contenders:

  * ``sha256sum`` and ``openssl dgst -sha256`` over the blobs (one core each; wall time includes start-up);
  * Python's hashlib on one core (a child reading 4 MiB at a time; timed inside the child: the best one Python
    thread does);
  * ``hfcache verify --max-workers 1`` and ``hfcache verify`` (one thread per core): MB/s from the report's own
    ``seconds`` (the scan and the hashing, not the interpreter's start-up) and the wall time of the whole process;
  * ``hfcache verify --fast`` after a recorded ``--fast`` run (nothing changed: every blob skipped).

Goal P3 (docs/benchmarks.md): ``hfcache verify`` >= 80% of two cores' hashing, i.e. >= 0.8 x 2 x this machine's one-core Python
hashlib figure (the issue's 2800 MB/s is that on its machine, 1764 MB/s per core); both forms printed as met or not.

    python benchmarks/bench_verify.py [--large 4] [--large-mib 192] [--small 1024] [--small-kib 256] [--big-gib 2]
                                      [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import clean_python_env, load_average, precompile

ROOT = Path(__file__).resolve().parent.parent

RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], stderr=subprocess.DEVNULL)\n"
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


HASHLIB_SCRIPT = """
import hashlib, sys, time
buf = bytearray(4 * 1024 * 1024); view = memoryview(buf); total = 0
start = time.perf_counter()
for path in sys.argv[1:]:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n]); total += n
print(total / (time.perf_counter() - start))
"""


def timed(cmd: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS MiB, stdout) of ``cmd`` in a fresh process; exits if it fails (exit 1 of verify is a
    failure here too: the blobs are healthy)."""
    env = clean_python_env(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    *_, last = proc.stderr.strip().splitlines()
    code, rss = last.split()
    if code != "0":
        sys.exit(f"bench_verify: {' '.join(cmd[:3])} ... exited {code}")
    return wall, int(rss) // 1024, proc.stdout


def build(tmp: Path, args) -> tuple[Path, list[Path], Path | None]:
    cache = tmp / "cache"
    repo = cache / "models--bench--many"
    blobs = [write_blob(repo, args.large_mib * 1024 * 1024, f"model-{i:05d}.safetensors") for i in range(args.large)]
    blobs += [write_blob(repo, args.small_kib * 1024, f"small/{i:05d}.bin") for i in range(args.small)]
    big = None
    if args.big_gib > 0:
        big = tmp / "big"
        write_blob(big / "models--bench--big", int(args.big_gib * 1024 ** 3), "model.safetensors")
    return cache, blobs, big


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=192)
    parser.add_argument("--small", type=int, default=1024)
    parser.add_argument("--small-kib", type=int, default=256)
    parser.add_argument("--big-gib", type=float, default=2.0, help="0: skip the memory measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    precompile(ROOT)
    before = load_average()
    verify = [sys.executable, "-m", "hfcache", "verify", "--json", "--cache-dir"]
    with tempfile.TemporaryDirectory(prefix="bench_verify_", dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        cache, blobs, big = build(Path(tmp), args)
        total = sum(b.stat().st_size for b in blobs)
        subprocess.run(["cat", *map(str, blobs)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        timed([*verify, str(cache), "--fast"])  # the record the --fast row skips by (untimed)
        contenders = {
            "sha256sum (1 core)": ["sha256sum", *map(str, blobs)],
            "openssl dgst -sha256 (1 core)": ["openssl", "dgst", "-sha256", *map(str, blobs)],
            "python hashlib (1 core)": [sys.executable, "-c", HASHLIB_SCRIPT, *map(str, blobs)],
            "hfcache verify --max-workers 1": [*verify, str(cache), "--max-workers", "1"],
            f"hfcache verify ({os.cpu_count()} workers)": [*verify, str(cache)],
            "hfcache verify --fast (recorded)": [*verify, str(cache), "--fast"],
        }
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, cmd in contenders.items():
                wall, _, out = timed(cmd)
                if name.startswith("python hashlib"):
                    inner = total / float(out)
                elif name.startswith("hfcache"):
                    inner = json.loads(out)["seconds"]
                else:
                    inner = wall
                runs[name].append((wall, inner))
        big_wall = big_rss = None
        if big is not None:
            subprocess.run(["cat", *map(str, big.rglob("blobs/*"))], stdout=subprocess.DEVNULL, check=True)
            big_wall, big_rss, _ = timed([*verify, str(big)])
    results = {name: {"wall_s": statistics.median(w for w, _ in rs), "hash_s": statistics.median(i for _, i in rs)}
               for name, rs in runs.items()}
    for r in results.values():
        r["mb_s"] = total / r["hash_s"] / 1e6
    ours = results[f"hfcache verify ({os.cpu_count()} workers)"]
    # The issue's goal is 80% of two cores' hashing: 2800 MB/s = 0.8 x 2 x the 1764 MB/s its machine's Python hashlib
    # did on one core. Both forms are printed: the absolute figure only means something on a CPU as fast.
    cores = min(2, os.cpu_count() or 1)
    ratio = ours["mb_s"] / (cores * results["python hashlib (1 core)"]["mb_s"])
    goals = [
        {"goal": f"P3 hfcache verify / ({cores} x python hashlib 1 core)", "value": round(ratio, 3), "at_least": 0.8,
         "met": ratio >= 0.8},
        {"goal": "P3 hfcache verify MB/s (1 GiB hot)", "value": round(ours["mb_s"]), "at_least": 2800,
         "met": ours["mb_s"] >= 2800},
    ]
    facts = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "bytes": total, "blobs": len(blobs),
             "repeat": args.repeat, "load_before": before, "load_after": load_average()}
    if args.json:
        print(json.dumps({"machine": facts, "contenders": results, "goals": goals,
                          "big": {"gib": args.big_gib, "wall_s": big_wall, "peak_rss_mib": big_rss}}, indent=2))
        return
    print(f"python {facts['python']}, {facts['cpu_count']} CPUs, {args.large} x {args.large_mib} MiB + {args.small} x "
          f"{args.small_kib} KiB = {total / 1e6:.0f} MB from the page cache, median of {args.repeat} interleaved rounds")
    print(f"{facts['load_before']} before, {facts['load_after']} after")
    base = results["python hashlib (1 core)"]["mb_s"]
    print(f"{'contender':36} {'wall s':>7} {'hash s':>7} {'MB/s':>7} {'x python 1 core':>16}")
    for name, r in results.items():
        print(f"{name:36} {r['wall_s']:7.2f} {r['hash_s']:7.2f} {r['mb_s']:7.0f} {r['mb_s'] / base:16.2f}")
    print("(hash s: in the child for python hashlib, the report's seconds for hfcache, the wall time otherwise)")
    for goal in goals:
        print(f"{goal['goal']:<48} {goal['value']:>7}  goal >= {goal['at_least']:<5} "
              f"{'met' if goal['met'] else 'NOT met'}")
    if big is not None:
        print(f"hfcache verify of one {args.big_gib:g} GiB blob: {big_wall:.2f} s, peak RSS {big_rss} MiB "
              f"(goal: under 100 MiB)")


if __name__ == "__main__":
    main()
