"""Benchmark: time to a tokenizer's first ids in a fresh process, from a warm cache, offline.

Warms the fixture repo (``--repo``, default ``bert-base-uncased``) from the bundled test Hub into a temporary cache,
then times, in interleaved rounds (``--repeat``, median reported), a fresh ``python`` process that loads the tokenizer
and encodes one line, from interpreter start to the ids (wall time of the whole process, as a pod or a DataLoader
worker pays it):

  * (a) offline ``AutoTokenizer.from_pretrained`` (``HF_HUB_OFFLINE=1``), the tool users would otherwise use;
  * (b) ``hfcache.load_tokenizer(repo, backend="tokenizers")``;
  * (c) ``tokenizers.Tokenizer.from_file`` on the cached ``tokenizer.json`` (the floor: no checks, no set-up);

each process prints its ids, and the three must be identical (the benchmark fails otherwise). Then ``--workers`` N
DataLoader-style worker processes started at once (``multiprocessing`` spawn, each loading the tokenizer and
encoding a line): the wall time until all have their ids, per backend. Goal: (b) <= 0.1x (a) in the same run.

    PYTHONPATH=. python benchmarks/bench_tokenizer.py [--repo bert-base-uncased] [--repeat 5] [--workers 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import clean_python_env, load_average, precompile

ROOT = Path(__file__).resolve().parent.parent
TEXT = "Hello world, 深度学习技术正在改变世界 😀"

LOADERS = {
    "AutoTokenizer": (
        "from transformers import AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(REPO)\n"
        "ids = tok(TEXT)['input_ids']\n"),
    "hfcache fast path": (
        "import hfcache\n"
        "tok = hfcache.load_tokenizer(REPO, backend='tokenizers')\n"
        "ids = tok.encode(TEXT).ids\n"),
    "Tokenizer.from_file": (
        "import glob, os\n"
        "from tokenizers import Tokenizer\n"
        "folder = 'models--' + REPO.replace('/', '--')\n"
        "ref = open(os.path.join(CACHE, folder, 'refs', 'main')).read().strip()\n"
        "tok = Tokenizer.from_file(os.path.join(CACHE, folder, 'snapshots', ref, 'tokenizer.json'))\n"
        "ids = tok.encode(TEXT).ids\n"),
}

WORKERS = (
    "import multiprocessing as mp, sys\n"
    "def work(_):\n"
    "    REPO, TEXT, CACHE = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "{body}"
    "    return ids\n"
    "if __name__ == '__main__':\n"
    "    n = int(sys.argv[4])\n"
    "    with mp.get_context('spawn').Pool(n) as pool:\n"
    "        results = pool.map(work, range(n), chunksize=1)\n"
    "    assert all(r == results[0] for r in results)\n"
    "    print(results[0])\n"
)


def script(body: str) -> str:
    return "import sys\nREPO, TEXT, CACHE = sys.argv[1], sys.argv[2], sys.argv[3]\n" + body + "print(ids)\n"


def run(code: str, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of ``python SCRIPT args`` (``code`` in a file: a spawned worker imports its main module) and its
    last stdout line."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, f.name, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=300)
        seconds = time.perf_counter() - t0
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {proc.stderr.strip().splitlines()[-1:]}")
    return seconds, proc.stdout.strip().splitlines()[-1]


def warm(cache: Path, repo: str) -> None:
    sys.path.insert(0, str(ROOT))
    import hfcache
    from hfcache.records import WarmRequest
    from tests.testhub import HubServer

    with HubServer(ROOT / "tests" / "data" / "hub") as server:
        report = hfcache.warm([WarmRequest.parse(repo)], cache_dir=cache, endpoint=server.endpoint, token=False)
    if not report.ok:
        raise SystemExit(f"warm failed: {[r.error for r in report.repos]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="bert-base-uncased")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    precompile(ROOT)
    with tempfile.TemporaryDirectory(prefix="hfcache-bench-tok-") as tmp:
        cache = Path(tmp) / "cache"
        warm(cache, args.repo)
        env = clean_python_env({k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))})
        env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(Path(tmp) / "home"),
                   PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
        argv = [args.repo, TEXT, str(cache)]
        before = load_average()
        times: dict[str, list[float]] = {name: [] for name in LOADERS}
        ids: dict[str, set[str]] = {name: set() for name in LOADERS}
        for body in LOADERS.values():  # one untimed round: page cache and bytecode
            run(script(body), argv, env)
        for _ in range(args.repeat):
            for name, body in LOADERS.items():
                seconds, out = run(script(body), argv, env)
                times[name].append(seconds)
                ids[name].add(out)
        pool: dict[str, float] = {}
        for name, body in LOADERS.items():
            body = "".join("    " + line + "\n" for line in body.splitlines())
            seconds, out = run(WORKERS.format(body=body), [*argv, str(args.workers)], env)
            pool[name] = seconds
            ids[name].add(out)
        after = load_average()
    report(args, times, ids, pool, before, after)


def report(args, times, ids, pool, before, after) -> None:
    medians = {name: statistics.median(t) for name, t in times.items()}
    same = len(set().union(*ids.values())) == 1
    auto, fast, floor = medians["AutoTokenizer"], medians["hfcache fast path"], medians["Tokenizer.from_file"]
    doc = {"repo": args.repo, "repeat": args.repeat, "workers": args.workers, "median_seconds": medians,
           "pool_seconds": pool, "ratio_fast_to_auto": fast / auto, "ratio_floor_to_auto": floor / auto,
           "ids_identical": same, "goal_met": same and fast <= 0.1 * auto,
           "load_average": [before, after]}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{args.repo}: fresh process to first ids, median of {args.repeat} ({before})")
        for name, m in medians.items():
            print(f"  {name:22} {m * 1000:8.1f} ms  {m / auto:6.3f}x AutoTokenizer   "
                  f"{args.workers} spawned workers: {pool[name]:.2f} s")
        print(f"  ids identical: {same}; goal (fast path <= 0.1x AutoTokenizer): "
              f"{'met' if doc['goal_met'] else 'NOT met'} ({fast / auto:.3f}x) ({after})")
    if not same:
        raise SystemExit(f"ids differ: {ids}")


if __name__ == "__main__":
    main()
