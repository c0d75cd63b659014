"""Benchmark: a model through an S3 bucket (``hfcache push/pull s3://``) against boto3's own transfer manager.

A real S3-protocol server process (moto's, ``tests/s3.py``) on loopback; a cache holding one repo with a
``--blob-mib`` weight file and gpt2's tokenizer files, warmed from the test Hub. Contenders, in interleaved rounds:

  boto3 upload   ``upload_file`` of the weight file (s3transfer, 10 threads: what ``aws s3 cp`` runs), no hashing
  hfcache push   ``python -m hfcache push s3://...`` of the repo into an empty prefix (every blob hashed while read)
  boto3 download ``download_file`` of the weight object (s3transfer, 10 threads), no hashing
  hfcache pull   ``python -m hfcache pull s3://...`` into an empty cache (parallel ranges, hashed, published)

Figures: median wall time of ``--repeat`` rounds (interpreter start-up counts for hfcache), the ratios hfcache /
boto3, and the load average. The server is the bottleneck on loopback (moto keeps objects in memory behind
werkzeug's development server): read the ratios, not the absolute speed.

    python benchmarks/bench_bucket.py [--blob-mib 256] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.anchors import load_average
from tests.s3 import moto_server
from tests.testhub import HubServer

HUB = ROOT / "tests" / "data" / "hub"


def _seed(work: Path, blob_mib: int) -> tuple[Path, Path]:
    """(cache holding acme/model, the weight file's blob path)."""
    import hfcache
    from hfcache.records import WarmRequest

    hub = work / "hub"
    shutil.copytree(HUB / "openai-community" / "gpt2", hub / "acme" / "model")
    (hub / "acme" / "model" / "model.safetensors").write_bytes(os.urandom(blob_mib * 1024 * 1024))
    cache = work / "seed"
    with HubServer(hub) as server:
        assert hfcache.warm([WarmRequest("acme/model", kind="all")], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok
    blob = max((cache / "models--acme--model" / "blobs").iterdir(), key=lambda p: p.stat().st_size)
    return cache, blob


def _timed(args: list[str], env: dict) -> float:
    started = time.perf_counter()
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{args[:4]} failed: {proc.stderr[-500:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blob-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    from boto3.s3.transfer import TransferConfig

    rows: dict[str, list[float]] = {"boto3 upload": [], "hfcache push": [], "boto3 download": [], "hfcache pull": []}
    with tempfile.TemporaryDirectory(prefix="bench-bucket-") as tmp, moto_server(Path(tmp)) as s3:
        work = Path(tmp)
        cache, blob = _seed(work, options.blob_mib)
        env = {**os.environ, **s3.env()}
        client = s3.client()
        transfer = TransferConfig(max_concurrency=10)
        for n in range(options.repeat):
            bucket = s3.bucket(f"bench-{n}")
            started = time.perf_counter()
            client.upload_file(str(blob), bucket, "boto3/weights", Config=transfer)
            rows["boto3 upload"].append(time.perf_counter() - started)
            rows["hfcache push"].append(_timed([sys.executable, "-m", "hfcache", "push", f"s3://{bucket}/hf",
                                                "--cache-dir", str(cache)], env))
            target = work / f"get-{n}"
            started = time.perf_counter()
            client.download_file(bucket, "boto3/weights", str(target), Config=transfer)
            rows["boto3 download"].append(time.perf_counter() - started)
            rows["hfcache pull"].append(_timed([sys.executable, "-m", "hfcache", "pull", f"s3://{bucket}/hf",
                                                "--cache-dir", str(work / f"pulled-{n}")], env))
            target.unlink()
            shutil.rmtree(work / f"pulled-{n}")
    medians = {name: statistics.median(times) for name, times in rows.items()}
    result = {"blob_mib": options.blob_mib, "repeat": options.repeat, "load_average": load_average(),
              "seconds": medians, "push_ratio": medians["hfcache push"] / medians["boto3 upload"],
              "pull_ratio": medians["hfcache pull"] / medians["boto3 download"]}
    if options.json:
        print(json.dumps(result, indent=2))
        return
    for name, seconds in medians.items():
        print(f"{name:15} {seconds:7.2f} s  {options.blob_mib / seconds:7.0f} MiB/s")
    print(f"hfcache push / boto3 upload   {result['push_ratio']:.2f}x")
    print(f"hfcache pull / boto3 download {result['pull_ratio']:.2f}x   ({result['load_average']})")


if __name__ == "__main__":
    main()
