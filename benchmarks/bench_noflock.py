"""Lock files left by a flock-based run, on a filesystem where flock fails: huggingface_hub vs. hfcache.

A cache warmed where flock works keeps empty ``.locks/**/*.lock`` files (filelock never deletes them). Where flock
fails with ENOSYS (Lustre, some FUSE/CIFS mounts), huggingface_hub's WeakFileLock falls back to filelock's
SoftFileLock, which takes an empty file for a live holder: it waits until its timeout (forever without one).
hfcache's soft lock takes such a file over at once (hfcache/cache/locking.py). flock is made to fail the way the library
sees it on such a mount: tests/sitecustom/sitecustomize.py makes ``fcntl.flock`` raise the errno.

    python benchmarks/bench_noflock.py [--errno ENOSYS|ENOLCK] [--hf-timeout 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.testhub import HubServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--errno", default="ENOSYS", choices=["ENOSYS", "ENOLCK", "EOPNOTSUPP"])
    parser.add_argument("--hf-timeout", type=float, default=20.0, help="seconds huggingface_hub may wait")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HFCACHE_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
    noflock = {**base, "HFCACHE_TEST_FLOCK_ERRNO": args.errno,
               "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "sitecustom"), base["PYTHONPATH"]])}
    with tempfile.TemporaryDirectory() as tmp, HubServer(REPO / "tests" / "data" / "hub") as hub:
        cache = Path(tmp) / "cache"

        def hfcache(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "hfcache", *argv], env=env, capture_output=True, text=True)
            return proc.returncode, time.monotonic() - started

        assert hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint", hub.endpoint],
                       base)[0] == 0
        then = time.time() - 120  # an earlier run's leftovers
        locks = list((cache / ".locks").rglob("*.lock"))
        for path in locks:
            os.utime(path, (then, then))
        for blob in (cache / "models--openai-community--gpt2" / "blobs").iterdir():
            blob.unlink()  # the re-warm takes every blob lock
        started = time.monotonic()
        hf = subprocess.run([sys.executable, "-c", "import sys\nfrom huggingface_hub.utils import WeakFileLock\n"
                             f"with WeakFileLock(sys.argv[1], timeout={args.hf_timeout}): pass", str(locks[0])],
                            env=noflock, capture_output=True, text=True)
        hf_seconds = time.monotonic() - started
        last = (hf.stderr.strip().splitlines() or [""])[-1]
        hf_result = "timed out" if "Timeout" in hf.stderr else (f"failed ({last})" if hf.returncode else "acquired")
        warm = hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint", hub.endpoint], noflock)
        prune = hfcache(["prune", "--cache-dir", str(cache), "--max-size", "0", "--yes"], noflock)
    print(f"flock failing with {args.errno}; {len(locks)} empty lock files left by a flock-based warm")
    print(f"  huggingface_hub WeakFileLock on one of them : {hf_result} after {hf_seconds:.1f} s "
          f"(given timeout {args.hf_timeout:g} s; hf_hub_download gives none)")
    print(f"  hfcache warm (repo lock + every blob lock)  : exit {warm[0]} in {warm[1]:.1f} s")
    print(f"  hfcache prune --max-size 0                  : exit {prune[0]} in {prune[1]:.1f} s")


if __name__ == "__main__":
    main()
