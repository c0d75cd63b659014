"""Benchmark: warming a model at the speed of the wire: 1 GiB in 4 safetensors shards over plain HTTP, and resume.

Contenders, in interleaved rounds in one run, each on an empty cache, against the same test Hub (``tests.testhub``,
in this process, its LFS bodies served by the CDN origin as the Hub's are):

  floor        one ``curl`` per shard, in parallel, into a folder: no hashing, no cache layout (the wire's speed)
  hf download  ``hf download acme/model`` with ``HF_HUB_DISABLE_XET=1`` (huggingface_hub's CLI: the installed one,
               or the anchors venv's with ``--anchors pypi``)
  hfcache      ``python -m hfcache warm acme/model --kind all`` (every byte hashed against its etag)

Figures: wall time (interpreter start-up counts), peak RSS (``os.wait4``), the ratios of the goals in
docs/benchmarks.md (hfcache <= 1.5x the floor and <= 0.5x ``hf download``; peak RSS <= 64 MiB). Then the resume row: a warm over
connections paced to ``--resume-bps`` each, SIGKILLed after ``--kill-after`` seconds, rerun unpaced; the bytes the
server sent on the rerun against the bytes missing on disk at the kill (goal: <= missing + 4 MiB).

    python benchmarks/bench_model.py [--shard-mib 256] [--shards 4] [--repeat 3] [--anchors current|pypi] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.anchors import anchor_python, load_average, precompile
from tests.testhub import HubServer

REPO = "acme/model"
GOALS = {"floor_ratio_max": 1.5, "hf_ratio_max": 0.5, "rss_mib_max": 64, "resume_extra_mib_max": 4}


def make_hub(root: Path, shards: int, shard_mib: int) -> list[str]:
    repo = root / REPO
    repo.mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "bert"}\n')
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    chunk = os.urandom(1024 * 1024)
    for n, name in enumerate(names):
        with open(repo / name, "wb") as f:
            for i in range(shard_mib):
                f.write(bytes([n, i % 256]) + chunk[2:])  # distinct shards, cheap to make
    return names


def clean_env(home: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HFCACHE_"))}
    env.update(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1",
               HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def timed(argvs: list[list[str]], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, largest peak RSS MiB) of ``argvs`` run at once; exits the benchmark if one fails."""
    started = time.perf_counter()
    procs = [subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for a in argvs]
    rss = 0.0
    for proc, argv in zip(procs, argvs, strict=True):
        _, status, usage = os.wait4(proc.pid, 0)
        rss = max(rss, usage.ru_maxrss / 1024)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"bench_model: {' '.join(argv[:4])} failed: {proc.stderr.read().decode()[-2000:]}")
    return time.perf_counter() - started, rss


def resume_row(tmp: Path, hub: Path, bps: int, kill_after: float) -> dict:
    """Kill a paced warm after ``kill_after`` s; rerun unpaced; what was sent against what was missing."""
    cache = tmp / "c-resume"
    with HubServer(hub, throttle_bps=bps) as server:
        env = clean_env(tmp / "home-resume", server.endpoint)
        proc = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", REPO, "--kind", "all", "--cache-dir",
                                 str(cache), "--endpoint", server.endpoint, "-q"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        sent_before = sum(r.bytes_sent for r in server.requests if r.origin == "cdn")
    on_disk = 0
    for incomplete in cache.rglob("*.incomplete"):
        with open(incomplete, "rb") as f:  # the bytes on disk: data extents, holes excluded
            fd, pos, end = f.fileno(), 0, os.fstat(f.fileno()).st_size
            while pos < end:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError:
                    break
                hole = os.lseek(fd, data, os.SEEK_HOLE)
                on_disk += hole - data
                pos = hole
    published = sum(p.stat().st_size for p in (cache / "models--acme--model" / "blobs").glob("*")
                    if not p.name.endswith(".incomplete"))
    total = sum(p.stat().st_size for p in (hub / REPO).iterdir())
    missing = total - published - on_disk
    with HubServer(hub) as server:
        wall, _ = timed([[sys.executable, "-m", "hfcache", "warm", REPO, "--kind", "all", "--cache-dir", str(cache),
                          "--endpoint", server.endpoint, "-q"]], clean_env(tmp / "home-resume", server.endpoint))
        resent = sum(r.bytes_sent for r in server.requests if r.origin == "cdn" or "/resolve/" in r.path)
    return {"sent_before_kill_mib": round(sent_before / 2**20, 1), "on_disk_mib": round((on_disk + published) / 2**20, 1),
            "missing_mib": round(missing / 2**20, 1), "resent_mib": round(resent / 2**20, 1),
            "extra_mib": round((resent - missing) / 2**20, 2), "rerun_s": round(wall, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard-mib", type=int, default=256)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--anchors", choices=("current", "pypi"), default="current")
    parser.add_argument("--resume-bps", type=int, default=8_000_000, help="per-connection pace of the killed warm")
    parser.add_argument("--kill-after", type=float, default=6.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    precompile(ROOT / "hfcache")
    hf = str(Path(anchor_python(args.anchors)).parent / "hf")
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp_name:
        tmp = Path(tmp_name)
        names = make_hub(tmp / "hub", args.shards, args.shard_mib)
        runs: dict[str, list[tuple[float, float]]] = {"floor": [], "hf download": [], "hfcache": []}
        with HubServer(tmp / "hub", record_requests=False) as server:
            commit = server.commit_of(REPO)  # hashes every file once, before any timed run
            for n in range(args.repeat):
                for name in runs:  # interleaved: each round runs every contender once
                    out = tmp / f"{name.replace(' ', '-')}-{n}"
                    env = clean_env(tmp / f"home-{name.replace(' ', '-')}-{n}", server.endpoint)
                    if name == "floor":
                        out.mkdir()
                        argvs = [["curl", "-sfL", "-o", str(out / f), f"{server.endpoint}/{REPO}/resolve/{commit}/{f}"]
                                 for f in names]
                    elif name == "hf download":
                        argvs = [[hf, "download", REPO, "--cache-dir", str(out), "--quiet"]]
                    else:
                        argvs = [[sys.executable, "-m", "hfcache", "warm", REPO, "--kind", "all", "--cache-dir",
                                  str(out), "--endpoint", server.endpoint, "-q"]]
                    runs[name].append(timed(argvs, env))
                    shutil.rmtree(out, ignore_errors=True)
        resume = resume_row(tmp, tmp / "hub", args.resume_bps, args.kill_after)
    med = {name: (statistics.median(w for w, _ in r), max(m for _, m in r)) for name, r in runs.items()}
    floor_ratio = med["hfcache"][0] / med["floor"][0]
    hf_ratio = med["hfcache"][0] / med["hf download"][0]
    doc = {"model_mib": args.shards * args.shard_mib, "shards": args.shards, "repeat": args.repeat,
           "contenders": {n: {"wall_s": round(w, 3), "peak_rss_mib": round(m, 1)} for n, (w, m) in med.items()},
           "ratios": {"hfcache/floor": round(floor_ratio, 3), "hfcache/hf download": round(hf_ratio, 3)},
           "resume": resume, "goals": GOALS,
           "met": {"floor": floor_ratio <= GOALS["floor_ratio_max"], "hf": hf_ratio <= GOALS["hf_ratio_max"],
                   "rss": med["hfcache"][1] <= GOALS["rss_mib_max"],
                   "resume": resume["extra_mib"] <= GOALS["resume_extra_mib_max"]},
           "load_average": {"before": load_before, "after": load_average()}}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{doc['model_mib']} MiB in {args.shards} shards, plain HTTP, median of {args.repeat} interleaved rounds")
    print(f"{'contender':<12} {'wall s':>8} {'peak RSS MiB':>13}")
    for name, (wall, rss) in med.items():
        print(f"{name:<12} {wall:>8.2f} {rss:>13.1f}")
    ok = doc["met"]
    print(f"hfcache / floor:       {floor_ratio:.2f}x (goal <= {GOALS['floor_ratio_max']}x: "
          f"{'met' if ok['floor'] else 'NOT met'})")
    print(f"hfcache / hf download: {hf_ratio:.2f}x (goal <= {GOALS['hf_ratio_max']}x: {'met' if ok['hf'] else 'NOT met'})")
    print(f"hfcache peak RSS:      {med['hfcache'][1]:.1f} MiB (goal <= {GOALS['rss_mib_max']}: "
          f"{'met' if ok['rss'] else 'NOT met'})")
    print(f"resume after SIGKILL:  missing {resume['missing_mib']} MiB, re-sent {resume['resent_mib']} MiB "
          f"(+{resume['extra_mib']} MiB; goal <= +{GOALS['resume_extra_mib_max']}: {'met' if ok['resume'] else 'NOT met'})")
    print(f"load average: before {load_before}, after {doc['load_average']['after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
