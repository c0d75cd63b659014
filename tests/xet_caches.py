"""Caches as huggingface_hub 2.4 itself writes them through Xet: the unmodified library and hf_xet download from the
project's Xet-speaking test Hub (``HubServer(xet=XetMode(...))``) in fresh subprocesses, so the shared blob store
(``<cache>/blobs/<2hex>/<xet_hash>``, repo ``blobs/<etag>`` links into it) is made by the library's own code, never
by hand (huggingface_hub ``utils/_shared_blobs.py``, ``file_download.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import DATA, clean_env
from tests.testhub import HubServer, XetMode

#: The fixture repos whose every file goes through Xet under ``xet_hub()`` (min_size=1), with their legacy ids.
LEGACY_IDS = {"bert-base-uncased": "google-bert/bert-base-uncased", "gpt2": "openai-community/gpt2"}

_DOWNLOAD = r"""
import json, sys
from huggingface_hub import hf_hub_download, snapshot_download
repos = json.loads(sys.argv[1])
paths = {}
for i, repo in enumerate(repos):
    if i == 0:
        # huggingface_hub 2.4 creates the store on its first publication; two parallel first publications race
        # (_shared_blobs.py `_ensure_shared_blobs_dir` removes the other's marker temporary). One file first.
        from huggingface_hub import list_repo_files
        first = sorted(list_repo_files(repo))[0]
        hf_hub_download(repo, first)
    paths[repo] = snapshot_download(repo)
print(json.dumps(paths))
"""


@contextmanager
def xet_hub(root: Path = DATA / "hub", *, min_size: int = 1, **kwargs) -> Iterator[HubServer]:
    """A test Hub over ``root`` that serves every file of at least ``min_size`` bytes through Xet."""
    with HubServer(root, legacy_ids=kwargs.pop("legacy_ids", LEGACY_IDS), xet=XetMode(min_size=min_size),
                   **kwargs) as server:
        yield server


def library_download(endpoint: str, cache: Path, repo_ids: Sequence[str], **env: str) -> dict[str, Path]:
    """``snapshot_download`` each repo into ``cache`` with the unmodified huggingface_hub in a fresh process (it
    reads HF_* at import time); ``env`` adds variables (``HF_HUB_DISABLE_XET="1"`` writes plain blobs). Returns
    repo id -> snapshot path."""
    environment = clean_env(HF_HUB_CACHE=str(cache), HF_ENDPOINT=endpoint, HF_HOME=str(cache.parent / "hf-home"),
                            **env)
    proc = subprocess.run([sys.executable, "-c", _DOWNLOAD, json.dumps(list(repo_ids))], capture_output=True,
                          text=True, env=environment, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {repo: Path(path) for repo, path in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def store_payloads(cache: Path) -> set[Path]:
    """Every payload file of the cache's shared store (``blobs/<2hex>/<64 hex>``)."""
    return {p for p in (cache / "blobs").glob("??/*") if len(p.name) == 64 and p.is_file() and not p.is_symlink()}


def store_linked_blobs(cache: Path) -> set[Path]:
    """Every repo blob that is a link into the shared store."""
    return {p for p in cache.glob("*--*/blobs/*") if p.is_symlink() and "/blobs/" in str(p.readlink())}
