"""Benchmark: a cold warm of a large model from a Xet-speaking Hub, ``hfcache warm`` vs. ``hf download``.

The Hub serves large files through Xet (huggingface/hub-docs docs/xet/): huggingface_hub 2.4 with hf_xet downloads
them from the CAS (reconstruction terms, xorb ranges), other clients through the plain ``resolve`` bridge. This
measures, side by side in one run, on an empty cache each:

  A  hfcache              ``python -m hfcache warm acme/xet-model --kind all`` (plain path, every byte hashed)
  B  hf download (Xet)    ``hf download acme/xet-model`` (hf_xet; writes the shared blob store)
  C  hf download (HTTP)   the same with ``HF_HUB_DISABLE_XET=1``

and then a second repo, ``acme/xet-model-ft``, whose weights share all but ``--changed-mib`` with the first, warmed
into the cache that already holds the first (what a fine-tune of a cached base costs).

Set-up, generated at run time (nothing from the internet): ``--size-mib`` (default 128) of random bytes as
``model.safetensors`` plus a config; ``HubServer(xet=XetMode())`` over it, every file of the repos indexed (chunked and
hashed) before the timed runs. Figures: wall time around the subprocess (interpreter start-up counts) and the body
bytes the server sent (CDN bridge + CAS xorb ranges). No peak RSS: the server runs in this process, and a forked
child's ``ru_maxrss`` starts at the parent's size, so it would measure the server. Goal (docs/benchmarks.md): A <=
0.5x B.

    python benchmarks/bench_xet.py [--size-mib 128] [--changed-mib 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_large import ROOT, clean_env, hf_cli, run

sys.path.insert(0, str(ROOT))
from tests.testhub import HubServer, XetMode

BASE, TUNED = "acme/xet-model", "acme/xet-model-ft"
GOAL_RATIO = 0.5


def make_hub(root: Path, size_mib: int, changed_mib: int) -> None:
    """Two repos: random weights, and the same weights with ``changed_mib`` MiB in the middle rewritten."""
    weights = bytearray(os.urandom(size_mib * 2**20))
    for repo in (BASE, TUNED):
        folder = root / repo
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "bert"}\n')
        if repo == TUNED:
            middle = len(weights) // 2
            weights[middle:middle + changed_mib * 2**20] = os.urandom(changed_mib * 2**20)
        (folder / "model.safetensors").write_bytes(bytes(weights))


def _body_bytes(server: HubServer) -> int:
    return sum(r.bytes_sent for r in server.requests if r.method == "GET" and (
        r.origin == "cdn" or r.path.startswith("/xorbs/") or "/resolve/" in r.path))


def _contenders(server: HubServer, cache: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    hf = hf_cli()
    return {
        "hfcache": ([sys.executable, "-m", "hfcache", "warm", "{repo}", "--kind", "all", "--cache-dir",
                     str(cache / "hfcache"), "--endpoint", server.endpoint, "--json", "-q"], {}),
        "hf download (Xet)": ([hf, "download", "{repo}", "--cache-dir", str(cache / "hf-xet"), "--quiet"], {}),
        "hf download (HTTP)": ([hf, "download", "{repo}", "--cache-dir", str(cache / "hf-http"), "--quiet"],
                               {"HF_HUB_DISABLE_XET": "1"}),
    }


def measure(tmp: Path, server: HubServer) -> dict[str, dict]:
    results: dict[str, dict] = {}
    for name, (argv, extra) in _contenders(server, tmp / "caches").items():
        row = {}
        for phase, repo in (("cold", BASE), ("second repo", TUNED)):
            server.clear_log()
            env = {**clean_env(tmp / f"home-{name.split()[0]}-{phase[0]}", server.endpoint), **extra}
            wall, _ = run([a.replace("{repo}", repo) for a in argv], env)
            row[phase] = {"wall_s": round(wall, 2), "body_mib": round(_body_bytes(server) / 2**20, 1)}
        results[name] = row
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--changed-mib", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-xet-") as tmp:
        tmp_path = Path(tmp)
        make_hub(tmp_path / "hub", args.size_mib, args.changed_mib)
        with HubServer(tmp_path / "hub", xet=XetMode()) as server:
            for repo in (BASE, TUNED):  # chunk and hash once, before any timed run
                server.commit_of(repo)
                clean = clean_env(tmp_path / "warmup", server.endpoint)
                run([hf_cli(), "download", repo, "--cache-dir", str(tmp_path / "warmup-cache"), "--quiet"], clean)
            results = measure(tmp_path, server)
    ratio = results["hfcache"]["cold"]["wall_s"] / results["hf download (Xet)"]["cold"]["wall_s"]
    document = {"size_mib": args.size_mib, "changed_mib": args.changed_mib, "contenders": results,
                "ratio_cold_vs_hf_xet": round(ratio, 3), "goal": GOAL_RATIO, "met": ratio <= GOAL_RATIO}
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{args.size_mib} MiB model; second repo shares all but {args.changed_mib} MiB")
    print(f"{'contender':<20} {'cold s':>8} {'body MiB':>9} {'2nd repo s':>11} {'body MiB':>9}")
    for name, row in results.items():
        cold, second = row["cold"], row["second repo"]
        print(f"{name:<20} {cold['wall_s']:>8.2f} {cold['body_mib']:>9.1f} "
              f"{second['wall_s']:>11.2f} {second['body_mib']:>9.1f}")
    print(f"ratio hfcache / hf download (Xet), cold: {ratio:.3f}x (goal <= {GOAL_RATIO}x: "
          f"{'met' if document['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
