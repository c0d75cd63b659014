"""The untrusted-cache tests' ground: a cache warmed with two repos (bert and roberta) from the test Hub, a canary
folder outside it whose every byte must stay as it was, and ``hfcache verify``'s verdict on the cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent / "data" / "hub"
REPO = "google-bert/bert-base-uncased"
FOLDER = "models--google-bert--bert-base-uncased"
OTHER = "FacebookAI/roberta-base"


def tree_state(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry below ``root`` (links not followed): relative path -> (type, bytes or link target)."""
    state: dict[str, tuple[str, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                state[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                state[rel] = ("dir", b"")
            else:
                state[rel] = ("file", p.read_bytes())
    return state


def make_canary(tmp_path: Path) -> Path:
    """A folder outside the cache with a file that looks like an orphan blob (prune would remove it) and others."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "precious.txt").write_bytes(b"do not touch\n")
    return canary


def warm_two(cache: Path) -> None:
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(REPO), WarmRequest.parse(OTHER)], cache_dir=cache,
                              endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos]


def verify(cache: Path) -> tuple[int, dict]:
    # --allow-empty: a refused warm leaves a cache that holds nothing, and that must verify too
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json", "--allow-empty"])
    return proc.returncode, json.loads(proc.stdout)
