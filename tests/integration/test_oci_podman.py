"""What a container runtime sees of a pushed cache image: ``podman pull`` from a local registry, then
``podman image mount`` exposes the image's root filesystem on the host, and transformers loads from it offline.

Root only (rootful podman with a private storage, as tests/integration/test_container.py, whose helpers it uses);
skipped without root, podman or docker-registry outside CI. The registry speaks plain HTTP on 127.0.0.1, so
podman pulls with ``--tls-verify=false``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import GOLDEN, LOAD_SCRIPT, clean_env, golden_ids, run_hfcache
from tests.podman import RunLog, cache_root, make_podman, remove_home, unavailable
from tests.registry import available, running_registry
from tests.testhub import HubServer

pytestmark = pytest.mark.container

HUB = Path(__file__).parent.parent / "data" / "hub"
REPOS = ["google-bert/bert-base-uncased", "openai-community/gpt2", "FacebookAI/roberta-base"]


def _skip_reason() -> str | None:
    reason = unavailable() or available() or (None if shutil.which("podman") else "podman not installed")
    if reason and os.environ.get("CI") and os.geteuid() == 0:
        pytest.fail(f"CI must run the podman image test: {reason}", pytrace=False)
    return reason


def test_podman_pulls_and_mounts_the_pushed_cache_and_it_loads_offline(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(r) for r in REPOS], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok
    log = RunLog(tmp_path / "podman.log")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    engine = make_podman(Path(tempfile.mkdtemp(prefix="hfcache-podman-", dir=root)), log)
    with running_registry(tmp_path / "registry") as registry:
        ref = f"{registry.host}/hf/cache:v1"
        pushed = run_hfcache(["push", ref, "--cache-dir", str(cache), "--plain-http", "--json"])
        assert pushed.returncode == 0, pushed.stderr
        digest = json.loads(pushed.stdout)["digest"]
        try:
            engine("pull", "--tls-verify=false", ref)
            inspect = json.loads(engine("image", "inspect", ref).stdout)[0]
            assert inspect["Os"] == "linux" and digest in inspect["RepoDigests"][0]
            assert inspect["Labels"]["io.hfcache.repos"]
            mounted = Path(engine("image", "mount", ref).stdout.strip())
            try:
                assert sorted(p.name for p in mounted.iterdir()) == sorted(
                    ["CACHEDIR.TAG", *(p.name for p in cache.glob("models--*"))])
                env = clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(mounted), HF_HOME=str(tmp_path / "hf-home"))
                proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], *REPOS],
                                      capture_output=True, text=True, env=env, timeout=300)
                assert proc.returncode == 0, proc.stderr
                loaded = json.loads(proc.stdout.strip().splitlines()[-1])
                for repo_id in REPOS:
                    assert loaded[repo_id].get("input_ids") == golden_ids(repo_id), loaded[repo_id]
                verify = run_hfcache(["verify", "--cache-dir", str(mounted)])
                assert verify.returncode == 0, verify.stdout + verify.stderr
            finally:
                engine("image", "unmount", ref, check=False)
        finally:
            remove_home(engine)
