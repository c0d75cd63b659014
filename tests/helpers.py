"""Helpers shared by the integration tests: run hfcache and transformers in real subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))

#: The script an application container would run: load tokenizers by repo id from the cache, offline.
LOAD_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
text, ids = sys.argv[1], sys.argv[2:]
out = {}
for repo_id in ids:
    try:
        tok = AutoTokenizer.from_pretrained(repo_id)
        out[repo_id] = {"class": type(tok).__name__, "input_ids": tok(text)["input_ids"]}
    except Exception as exc:
        out[repo_id] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The process environment without HF_*/HFCACHE_*/TRANSFORMERS_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HFCACHE_", "TRANSFORMERS_"))}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_UPDATE_CHECK="1", NO_COLOR="1")
    env.update(extra)
    return env


def run_hfcache(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
                home: Path | None = None, cwd: Path | None = None,
                input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hfcache ARGS`` as a real subprocess and return the completed process (text mode);
    ``input_text`` is its stdin (else the stdin of the tests)."""
    environment = env if env is not None else clean_env()
    if home is not None:
        environment = {**environment, "HF_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hfcache", *args], capture_output=True, text=True,
                          env=environment, timeout=timeout, cwd=cwd, input=input_text)


def offline_load(cache_dir: Path, repo_ids: Sequence[str], *, timeout: float = 300) -> dict[str, dict]:
    """Load each repo id with ``AutoTokenizer`` in a fresh offline subprocess; return id -> class/input_ids/error."""
    env = clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache_dir), HF_HOME=str(cache_dir.parent / "hf-home"))
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], *repo_ids], capture_output=True,
                          text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def golden_ids(repo_id: str, canonical: str | None = None) -> list[int]:
    return GOLDEN["repos"][canonical or repo_id]["input_ids"]


@contextmanager
def silent_server() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never answers (the kernel completes the handshake)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def refused_endpoint() -> str:
    """An endpoint on a loopback port nothing listens on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"



def visible_entries(cache_dir: Path) -> set[str]:
    """Relative paths of everything a loader can see: snapshot entries and refs (not blobs or locks)."""
    found = set()
    for repo in cache_dir.glob("*--*"):
        for sub in ("snapshots", "refs"):
            found |= {f"{repo.name}/{sub}/{p.relative_to(repo / sub)}" for p in (repo / sub).rglob("*")
                      if (repo / sub).exists()}
    return found
