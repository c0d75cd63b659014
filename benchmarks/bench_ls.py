"""Benchmark: ``hfcache ls --json`` vs ``hf cache ls --format json`` on one synthetic 10,000-repo cache.

The cache is built in a temporary folder in huggingface_hub's layout, shaped like a cache of warmed tokenizers:
per repo the five files of a BERT-style tokenizer (``config.json``, ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, ``vocab.txt``) as blobs named by their git blob sha1, a snapshot of relative symlinks,
``refs/main``; every tenth repo also has a ``1_Pooling/config.json`` in a subfolder and a second, detached
revision. Both tools then list it, in one run, each in a fresh subprocess (so interpreter
start-up counts for both); the script prints wall time (median of ``--repeat``), peak RSS of the child
(``getrusage(RUSAGE_CHILDREN)`` in a wrapper process) and the ratio. The contenders run interleaved in each round
(a shared machine's load drifts); the load average is printed before and after. Goal P4 (docs/benchmarks.md): at most a
quarter of ``hf cache ls``'s wall time and at most 64 MiB peak RSS. ``find -printf`` over the same tree is printed as
the floor (a C program doing the lstat calls, no Python). ``hf`` comes from a separate venv with the released
huggingface_hub unless ``--anchors current`` (benchmarks/anchors.py).

    python benchmarks/bench_ls.py [--repos 10000] [--repeat 3] [--anchors venv|current] [--json]
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
from anchors import anchor_python, anchor_version, clean_python_env, load_average, precompile

ROOT = Path(__file__).resolve().parent.parent

# Runs `argv` and prints its peak RSS (KiB on Linux) as the last line of stderr.
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "sys.stderr.write(f'{p.returncode} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
)


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


def build_cache(root: Path, repos: int) -> None:
    """Write ``repos`` repo folders in the HF cache layout under ``root``."""
    root.mkdir(parents=True)
    (root / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    for i in range(repos):
        repo = root / f"models--org{i % 97}--repo-{i}"
        files = {
            "config.json": b'{"model_type": "bert", "i": %d}' % i,
            "tokenizer.json": b"{}" * (50 + i % 400),
            "tokenizer_config.json": b'{"do_lower_case": true, "n": %d}' % (i % 7),
            "special_tokens_map.json": b'{"unk_token": "[UNK]"}',
            "vocab.txt": b"[PAD]\n[UNK]\n" * (10 + i % 50),
        }
        if i % 10 == 0:
            files["1_Pooling/config.json"] = b'{"word_embedding_dimension": 384}'
        commits = [hashlib.sha1(b"commit-%d" % i).hexdigest()]
        if i % 10 == 0:
            commits.append(hashlib.sha1(b"old-%d" % i).hexdigest())
        (repo / "blobs").mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commits[0])
        for commit in commits:
            for path, data in files.items():
                etag = git_sha1(data)
                blob = repo / "blobs" / etag
                if not blob.exists():
                    blob.write_bytes(data)
                link = repo / "snapshots" / commit / path
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(blob, link.parent))


def timed(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MiB) of ``cmd`` run in a fresh process."""
    start = time.perf_counter()
    env = clean_python_env(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    code, rss_kib = proc.stderr.strip().splitlines()[-1].split()
    if code != "0":
        sys.exit(f"bench_ls: {' '.join(cmd)} exited {code}")
    return wall, int(rss_kib) // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--anchors", choices=["venv", "current"], default="venv",
                        help="hf from a separate venv made once (default) or this interpreter's")
    args = parser.parse_args()
    hf = str(anchor_python(args.anchors).parent / "hf")
    precompile(ROOT)
    env_note = {k: v for k, v in os.environ.items() if k.startswith("HF_")}
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench_ls_") as tmp:
        cache = Path(tmp) / "cache"
        t0 = time.perf_counter()
        build_cache(cache, args.repos)
        build_s = time.perf_counter() - t0
        contenders = {
            "hfcache ls --json": [sys.executable, "-m", "hfcache", "ls", "--cache-dir", str(cache), "--json"],
            "hf cache ls --format json": [hf, "cache", "ls", "--cache-dir", str(cache), "--format", "json"],
            "find -printf (floor)": ["find", str(cache), "-printf", "%p %s %l\\n"],
        }
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in contenders}
        for _ in range(args.repeat):  # interleaved: each round runs every contender once
            for name, cmd in contenders.items():
                runs[name].append(timed(cmd))
        results = {name: {"wall_s": statistics.median(w for w, _ in rs), "peak_rss_mib": statistics.median_low(
            [r for _, r in rs])} for name, rs in runs.items()}
    base = results["hf cache ls --format json"]["wall_s"]
    for r in results.values():
        r["x_hf_cache_ls"] = r["wall_s"] / base
    ours = results["hfcache ls --json"]
    goals = [{"goal": "P4 ls --json / hf cache ls --format json", "value": round(ours["x_hf_cache_ls"], 3),
              "at_most": 0.25, "met": ours["x_hf_cache_ls"] <= 0.25},
             {"goal": "P4 ls --json peak RSS MiB", "value": ours["peak_rss_mib"], "at_most": 64,
              "met": ours["peak_rss_mib"] <= 64}]
    facts = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "repos": args.repos,
             "repeat": args.repeat, "build_s": round(build_s, 2), "hf_env": sorted(env_note),
             "huggingface_hub": anchor_version(Path(hf).parent / "python"), "load_before": before,
             "load_after": load_average()}
    if args.json:
        print(json.dumps({"machine": facts, "contenders": results, "goals": goals}, indent=2))
        return
    print(f"python {facts['python']}, {facts['cpu_count']} CPUs, {args.repos} repos (built in {build_s:.1f}s), "
          f"huggingface_hub {facts['huggingface_hub']}, median of {args.repeat} interleaved rounds")
    print(f"{facts['load_before']} before, {facts['load_after']} after")
    print(f"{'contender':28} {'wall s':>8} {'peak RSS MiB':>13} {'x hf cache ls':>14}")
    for name, r in results.items():
        print(f"{name:28} {r['wall_s']:8.2f} {r['peak_rss_mib']:13d} {r['x_hf_cache_ls']:14.2f}")
    for g in goals:
        print(f"{g['goal']:<45} {g['value']:>8}  goal <= {g['at_most']:<5} {'met' if g['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
