"""Kernel repos (huggingface_hub repo type ``kernel``): warm, lock, ls, verify, check, prune, serve, pull-through.

huggingface_hub 2.4 (constants.py ``REPO_TYPES_WITH_KERNEL``, ``REPO_TYPES_URL_PREFIXES``) caches a kernel repo as
``kernels--ORG--NAME`` and asks ``/api/kernels/...`` and ``/kernels/ORG/NAME/resolve/...``; transformers 5 fetches
such repos on demand (``transformers/integrations/hub_kernels.py``), so an offline container may need one. The
fixture is ``tests/data/hub/kernels/kernels-community/tiny`` (the folder store's ``kernels/`` subfolder); every
client here is the unmodified library in a fresh subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from hfcache.serve.pullthrough import PullThroughConfig
from tests.helpers import DATA, clean_env, run_hfcache
from tests.served import raw_request, served
from tests.testhub import HubServer
from tests.xet_caches import library_download, store_linked_blobs, xet_hub

KERNEL = "kernels-community/tiny"
FOLDER = "kernels--kernels-community--tiny"
SOURCE = DATA / "hub" / "kernels" / "kernels-community" / "tiny"
FILES = {p.relative_to(SOURCE).as_posix(): p.read_bytes() for p in sorted(SOURCE.rglob("*")) if p.is_file()}

#: snapshot_download of a kernel repo in a fresh process (huggingface_hub reads HF_* at import time); with
#: HF_HUB_OFFLINE=1 it must resolve from the cache alone. Prints {path: hex bytes} of the snapshot.
_DOWNLOAD = r"""
import json, pathlib, sys
from huggingface_hub import hf_hub_download, snapshot_download
repo_id = sys.argv[1]
if sys.argv[2] == "first-file":  # the shared Xet store is created by one publication first (see tests/xet_caches.py)
    hf_hub_download(repo_id, "build.toml", repo_type="kernel")
root = pathlib.Path(snapshot_download(repo_id, repo_type="kernel"))
print(json.dumps({"root": str(root), "files": {p.relative_to(root).as_posix(): p.read_bytes().hex()
                                                for p in sorted(root.rglob("*")) if p.is_file()}}))
"""


def library_snapshot(cache: Path, *, first_file: bool = False, **env: str) -> dict:
    environment = clean_env(HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf-home"), **env)
    proc = subprocess.run([sys.executable, "-c", _DOWNLOAD, KERNEL, "first-file" if first_file else "-"],
                          capture_output=True, text=True, env=environment, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"root": Path(found["root"]), "files": {p: bytes.fromhex(h) for p, h in found["files"].items()}}


def warm_kernel(endpoint: str, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["warm", KERNEL, "--repo-type", "kernel", "--kind", "all", "--cache-dir", str(cache),
                        "--endpoint", endpoint, "--json", *extra])


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """A cache hfcache warmed with the kernel repo (and gpt2), and the test Hub's request log of that warm."""
    cache = tmp_path_factory.mktemp("kernel") / "cache"
    with HubServer(DATA / "hub") as server:
        proc = warm_kernel(server.endpoint, cache)
        assert proc.returncode == 0, proc.stderr
        requests = server.requests
        assert run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint",
                            server.endpoint]).returncode == 0
    return cache, requests


def test_warm_writes_the_folder_huggingface_hub_resolves_offline(kernel_cache):
    cache, requests = kernel_cache
    assert (cache / FOLDER / "refs" / "main").is_file() and not (cache / "models--kernels-community--tiny").exists()
    paths = {r.path.split("?")[0] for r in requests}
    assert "/api/kernels/kernels-community/tiny/revision/main" in paths
    assert any(p.startswith("/kernels/kernels-community/tiny/resolve/") for p in paths)
    assert any(r.origin == "cdn" and r.path.startswith("/lfs/kernels/kernels-community/tiny/") for r in requests)
    offline = library_snapshot(cache, HF_HUB_OFFLINE="1")
    assert offline["root"].parent.parent.name == FOLDER
    assert offline["files"] == FILES  # every file, byte for byte, from the cache alone
    repos = {(r.repo_id, r.repo_type) for r in scan_cache_dir(cache).repos}  # the library's own scan agrees
    assert (KERNEL, "kernel") in repos


def test_ls_verify_and_check_know_kernel_repos(kernel_cache, tmp_path):
    cache, _ = kernel_cache
    listing = json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)
    [kernel] = [r for r in listing["repos"] if r["folder"] == FOLDER]
    assert (kernel["repo_id"], kernel["repo_type"], kernel["health"]) == (KERNEL, "kernel", "ok")
    assert run_hfcache(["ls", "--cache-dir", str(cache)]).stdout.count("kernel") >= 1
    verified = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    assert verified.returncode == 0, verified.stdout + verified.stderr

    for args in ([], [KERNEL]):  # the whole cache, or the kernel named: skipped with the reason, never a failure
        proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", *args])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results = {r["repo_id"]: r for r in json.loads(proc.stdout)["tokenizers"]}
        assert results[KERNEL]["repo_type"] == "kernel" and results[KERNEL]["ok"]
        assert "kernel repo has no tokenizer" in results[KERNEL]["skipped"]
        assert ("openai-community/gpt2" in results) == (not args)
    human = run_hfcache(["check", KERNEL, "--cache-dir", str(cache)])
    assert human.returncode == 0 and "skipped: a kernel repo has no tokenizer" in human.stdout
    assert "0 failed, 1 skipped" in human.stdout

    broken = tmp_path / "broken"
    subprocess.run(["cp", "-a", str(cache), str(broken)], check=True)
    blob = next(p for p in (broken / FOLDER / "blobs").iterdir() if p.stat().st_size == len(FILES["README.md"]))
    blob.chmod(0o644)
    blob.write_bytes(b"X" * len(FILES["README.md"]))  # same size: only hashing finds it
    proc = run_hfcache(["verify", "--cache-dir", str(broken), "--json"])
    assert proc.returncode == 1, proc.stdout
    assert [(p["repo_id"], p["kind"]) for p in json.loads(proc.stdout)["problems"]] == [(KERNEL, "blob_mismatch")]


def test_export_and_import_carry_a_kernel_repo(kernel_cache, tmp_path):
    cache, _ = kernel_cache
    tar = tmp_path / "kernel.tar"
    exported = run_hfcache(["export", str(tar), f"{KERNEL}@main", "--cache-dir", str(cache)])
    assert exported.returncode == 0, exported.stderr
    target = tmp_path / "imported"
    assert run_hfcache(["import", str(tar), "--cache-dir", str(target)]).returncode == 0
    assert sorted(p.name for p in target.iterdir() if "--" in p.name) == [FOLDER]  # the kernel alone, as a kernel
    assert run_hfcache(["verify", "--cache-dir", str(target)]).returncode == 0
    assert library_snapshot(target, HF_HUB_OFFLINE="1")["files"] == FILES


def test_default_kind_names_kind_all_for_a_kernel(hub_server, tmp_path):
    proc = run_hfcache(["warm", KERNEL, "--repo-type", "kernel", "--cache-dir", str(tmp_path / "c"),
                        "--endpoint", hub_server.endpoint])
    assert proc.returncode == 2 and "--kind all" in proc.stderr, proc.stderr
    bad = run_hfcache(["warm", KERNEL, "--repo-type", "space", "--cache-dir", str(tmp_path / "c")])
    assert bad.returncode == 2 and "kernel" in bad.stderr  # the choices name it
    (tmp_path / "hfcache.toml").write_text(f'[[repos]]\nrepo_id = "{KERNEL}"\nrepo_type = "space"\n')
    bad = run_hfcache(["lock"], cwd=tmp_path)  # a manifest's repo_type is checked against the same list
    assert bad.returncode == 2 and "repo_type" in bad.stderr and "kernel" in bad.stderr, bad.stderr


def test_manifest_lock_and_warm_lock_with_zero_requests_then_prune(hub_server, tmp_path):
    (tmp_path / "hfcache.toml").write_text(
        f'endpoint = "{hub_server.endpoint}"\ncache_dir = "cache"\n\n'
        f'[[repos]]\nrepo_id = "{KERNEL}"\nkind = "all"\nrepo_type = "kernel"\n\n'
        '[[repos]]\nrepo_id = "openai-community/gpt2"\n')
    assert run_hfcache(["lock"], cwd=tmp_path).returncode == 0
    lock = (tmp_path / "hfcache.lock").read_text()
    assert 'repo_type = "kernel"' in lock and "build/torch-universal/tiny/__init__.py" in lock
    first = run_hfcache(["warm", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "cache" / FOLDER / "snapshots").is_dir()
    hub_server.clear_log()
    again = run_hfcache(["warm", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
    assert again.returncode == 0 and hub_server.requests == []  # already warm: zero HTTP requests
    checked = run_hfcache(["check", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert {r["repo_id"]: bool(r["skipped"]) for r in json.loads(checked.stdout)["tokenizers"]} == \
        {KERNEL: True, "openai-community/gpt2": False}

    cache = tmp_path / "cache"
    pruned = run_hfcache(["prune", "--cache-dir", str(cache), "--max-size", "1", "--keep", KERNEL, "--yes"])
    assert pruned.returncode == 0, pruned.stderr
    assert (cache / FOLDER / "refs" / "main").exists() and not (cache / "models--openai-community--gpt2").exists()
    pruned = run_hfcache(["prune", "--cache-dir", str(cache), "--max-size", "1", "--yes"])
    assert pruned.returncode == 0 and not (cache / FOLDER).exists(), pruned.stderr


def test_test_hub_routes_kernels_under_their_prefix(hub_server):
    status, headers, body = raw_request(hub_server.endpoint, f"/api/kernels/{KERNEL}")
    assert status == 200 and json.loads(body)["id"] == KERNEL
    status, _, body = raw_request(hub_server.endpoint, f"/kernels/{KERNEL}/resolve/main/build.toml")
    assert status == 200 and body == FILES["build.toml"]
    for target in (f"/api/models/{KERNEL}", f"/{KERNEL}/resolve/main/build.toml", f"/api/datasets/{KERNEL}",
                   "/api/models/kernels/kernels-community"):  # one type is never answered as another
        status, headers, _ = raw_request(hub_server.endpoint, target)
        assert status in (401, 404), target


def test_serve_answers_a_warmed_kernel_repo(kernel_cache, tmp_path):
    cache, _ = kernel_cache
    with served("--cache-dir", str(cache)) as (endpoint, _):
        status, _, body = raw_request(endpoint, f"/api/kernels/{KERNEL}/revision/main")
        assert status == 200 and json.loads(body)["sha"] == (cache / FOLDER / "refs" / "main").read_text()
        assert raw_request(endpoint, f"/api/models/{KERNEL}")[0] == 404
        client = library_snapshot(tmp_path / "client", HF_ENDPOINT=endpoint)
        assert client["files"] == FILES
        proc = warm_kernel(endpoint, tmp_path / "rewarmed")
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rewarmed" / FOLDER / "refs" / "main").read_text() == \
        (cache / FOLDER / "refs" / "main").read_text()


def test_pull_through_mirror_fetches_a_kernel_repo(hub_server, tmp_path):
    mirror_cache = tmp_path / "mirror"
    mirror_cache.mkdir()
    config = PullThroughConfig(upstreams=(hub_server.endpoint,))
    with HubServer(mirror_cache, layout="cache", backend="uvicorn", lfs_redirect=False, upstream=config) as mirror:
        client = library_snapshot(tmp_path / "client", HF_ENDPOINT=mirror.endpoint)
    assert client["files"] == FILES
    assert (mirror_cache / FOLDER / "refs" / "main").is_file()
    assert any(r.path.startswith(f"/api/kernels/{KERNEL}") for r in hub_server.requests)
    assert run_hfcache(["verify", "--cache-dir", str(mirror_cache)]).returncode == 0


def test_a_kernel_repo_the_library_wrote_through_xet(tmp_path):
    """The library's own kernel download through Xet (repo blobs linking into the shared store): hfcache reads it as
    it reads a model repo the library wrote the same way, beside it in the same store."""
    cache = tmp_path / "cache"
    with xet_hub() as server:
        library_snapshot(cache, first_file=True, HF_ENDPOINT=server.endpoint)
        library_download(server.endpoint, cache, ["openai-community/gpt2"])
    assert any(FOLDER in str(p) for p in store_linked_blobs(cache))
    listing = json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)
    kinds = {r["repo_id"]: (r["repo_type"], r["health"] == "ok") for r in listing["repos"]}
    assert kinds[KERNEL] == ("kernel", kinds["openai-community/gpt2"][1])
    assert kinds["openai-community/gpt2"][0] == "model"
    codes = {repo: run_hfcache(["verify", repo, "--cache-dir", str(cache)]).returncode
             for repo in (KERNEL, "openai-community/gpt2")}
    assert codes[KERNEL] == codes["openai-community/gpt2"], codes
    offline = library_snapshot(cache, HF_HUB_OFFLINE="1")
    assert offline["files"] == FILES
