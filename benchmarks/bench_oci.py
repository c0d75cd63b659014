"""Benchmark: a cache through an OCI registry (``hfcache push``/``pull``) vs ``hfcache export --format tar`` + copy.

The nine fixture repos (tests/data/hub, tokenizer files) are warmed from the bundled Hub server into a temporary
cache; a real registry (Debian's ``docker-registry``, the CNCF distribution registry) runs on 127.0.0.1. For each
layer split (``repo``: one layer per repo folder, ``single``: one layer) it measures, with real subprocesses:

  * push (cold registry): wall seconds, bytes sent, layers, compressed image size;
  * push again unchanged: bytes sent (the manifest only: same bytes -> same digests -> the registry has them);
  * pull into an empty cache: wall seconds, bytes received;
  * an update of one repo (openai-community/gpt2 moves to a new commit with one changed file, the old revision
    pruned, as ``warm --lock`` + ``prune`` leave it): bytes the push re-sends, bytes a runtime re-pulls (the new
    layers only: the kubelet and podman cache layers by digest), bytes ``hfcache pull`` reads (every layer: it
    checks all of them);

and next to it ``hfcache export --format tar`` + a copy of the tar (what an update re-transfers: the whole tar).

    python benchmarks/bench_oci.py [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hfcache
from hfcache.records import WarmRequest
from tests.registry import available, running_registry
from tests.testhub import HubServer

REPOS = sorted(json.loads((ROOT / "tests/data/golden.json").read_text())["repos"])
UPDATED = "models--openai-community--gpt2"


def hfcache_cli(*args: str) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HFCACHE_"))}
    env["PYTHONPATH"] = str(ROOT)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hfcache", *args, "--json"], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"hfcache {' '.join(args)} failed: {proc.stderr}")
    return json.loads(proc.stdout), elapsed


def update_one_repo(cache: Path) -> None:
    """gpt2 gets a new commit whose tokenizer_config.json changed; the old revision is removed (warm + prune)."""
    repo = cache / UPDATED
    old = (repo / "refs" / "main").read_text()
    new = hashlib.sha1(old.encode()).hexdigest()  # a made-up commit id
    shutil.copytree(repo / "snapshots" / old, repo / "snapshots" / new, symlinks=True)
    link = repo / "snapshots" / new / "tokenizer_config.json"
    content = link.read_bytes() + b"\n"
    etag = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # git blob id
    (repo / "blobs" / etag).write_bytes(content)
    link.unlink()
    link.symlink_to(f"../../blobs/{etag}")
    (repo / "refs" / "main").write_text(new)
    old_etag = os.readlink(repo / "snapshots" / old / "tokenizer_config.json").rsplit("/", 1)[1]
    shutil.rmtree(repo / "snapshots" / old)
    (repo / "blobs" / old_etag).unlink()
    if (repo / ".no_exist" / old).is_dir():  # the markers move with the revision
        (repo / ".no_exist" / old).rename(repo / ".no_exist" / new)


def measure_split(split: str, cache: Path, host: str, work: Path) -> dict:
    ref = f"{host}/bench/{split}"
    push1, t_push = hfcache_cli("push", f"{ref}:v1", "--cache-dir", str(cache), "--plain-http", "--layers", split)
    push2, _ = hfcache_cli("push", f"{ref}:v1b", "--cache-dir", str(cache), "--plain-http", "--layers", split)
    pull1, t_pull = hfcache_cli("pull", f"{ref}:v1", "--cache-dir", str(work / f"pull-{split}"), "--plain-http")
    updated = work / f"updated-{split}"
    shutil.copytree(cache, updated, symlinks=True)
    update_one_repo(updated)
    push3, _ = hfcache_cli("push", f"{ref}:v2", "--cache-dir", str(updated), "--plain-http", "--layers", split)
    pull2, _ = hfcache_cli("pull", f"{ref}:v2", "--cache-dir", str(work / f"pull-{split}"), "--plain-http",
                           "--move-refs")  # an update moves refs/main: asked for, as a CronJob would
    old_layers = {layer["digest"] for layer in push1["layers"]}
    return {
        "split": split, "layers": len(push1["layers"]), "image_bytes": push1["bytes_total"],
        "push_s": round(t_push, 2), "push_bytes": push1["bytes_uploaded"],
        "repush_unchanged_bytes": push2["bytes_uploaded"], "same_digest": push1["digest"] == push2["digest"],
        "pull_s": round(t_pull, 2), "pull_bytes": pull1["bytes_downloaded"],
        "update_push_bytes": push3["bytes_uploaded"],
        "update_runtime_pull_bytes": sum(x["size"] for x in push3["layers"] if x["digest"] not in old_layers),
        "update_hfcache_pull_bytes": pull2["bytes_downloaded"],
    }


def measure_tar(cache: Path, work: Path) -> dict:
    started = time.perf_counter()
    report, _ = hfcache_cli("export", str(work / "cache.tar"), "--cache-dir", str(cache), "--format", "tar")
    shutil.copyfile(work / "cache.tar", work / "copied.tar")
    elapsed = time.perf_counter() - started
    size = (work / "cache.tar").stat().st_size
    return {"split": "export tar + copy", "layers": 1, "image_bytes": size, "push_s": round(elapsed, 2),
            "push_bytes": size, "repush_unchanged_bytes": size, "same_digest": bool(report["sha256"]),
            "pull_s": None, "pull_bytes": size, "update_push_bytes": size, "update_runtime_pull_bytes": size,
            "update_hfcache_pull_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    if available():
        raise SystemExit(available())
    with tempfile.TemporaryDirectory(prefix="bench-oci-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        with HubServer(ROOT / "tests/data/hub") as server:
            report = hfcache.warm([WarmRequest.parse(r) for r in REPOS], cache_dir=cache, endpoint=server.endpoint,
                                  token=False)
        assert report.ok
        with running_registry(work / "registry") as registry:
            rows = [measure_split(split, cache, registry.host, work) for split in ("repo", "single")]
        rows.append(measure_tar(cache, work))
    if args.json:
        print(json.dumps({"repos": len(REPOS), "results": rows}, indent=2))
        return
    columns = ["split", "layers", "image_bytes", "push_s", "push_bytes", "repush_unchanged_bytes", "pull_s",
               "pull_bytes", "update_push_bytes", "update_runtime_pull_bytes", "update_hfcache_pull_bytes"]
    print(f"{len(REPOS)} fixture repos (tokenizer files)")
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    repo, single = rows[0], rows[1]
    print(f"update of one repo re-sent: repo split {repo['update_push_bytes']} B vs single layer "
          f"{single['update_push_bytes']} B ({single['update_push_bytes'] / repo['update_push_bytes']:.1f}x) vs tar "
          f"{rows[2]['update_push_bytes']} B; image size repo/single = "
          f"{repo['image_bytes'] / single['image_bytes']:.2f}")


if __name__ == "__main__":
    main()
