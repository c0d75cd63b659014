"""HubServer's Xet mode against the unmodified huggingface_hub 2.4 + hf_xet: real servers on loopback, real clients
in fresh subprocesses (huggingface_hub reads HF_* at import time), no mocks.

What the Hub does for Xet files and what the clients read: tests/testhub/xet/cas.py's docstring (huggingface/hub-docs
docs/xet/*.md; huggingface_hub utils/_xet.py, file_download.py, utils/_shared_blobs.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi

from tests.helpers import clean_env
from tests.testhub import HubServer, XetMode

REPO = "xet-org/weights"
BERT = "google-bert/bert-base-uncased"
#: LFS by name (*.safetensors, *.bin): these go through Xet; config.json stays a git file.
XET_FILES = ("model.safetensors", "shards/part.bin")

_DOWNLOAD = r"""
import json, sys
from huggingface_hub import hf_hub_download, snapshot_download
kind, repo = sys.argv[1], sys.argv[2]
if kind == "file":
    path = hf_hub_download(repo, sys.argv[3])
else:
    path = snapshot_download(repo, repo_type="dataset" if kind == "dataset" else None)
print(json.dumps({"path": path}))
"""


@pytest.fixture(scope="module")
def xet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder store with one repo: a 2.5 MiB pseudo-random weights file, a 300 kB .bin and a small config."""
    root = tmp_path_factory.mktemp("xet-hub")
    repo = root / REPO
    (repo / "shards").mkdir(parents=True)
    (repo / "model.safetensors").write_bytes(random.Random(1).randbytes(2_500_000))
    (repo / "shards" / "part.bin").write_bytes(random.Random(2).randbytes(300_000))
    (repo / "config.json").write_text('{"model_type": "bert"}\n')
    return root


def sha256_tree(folder: Path) -> dict[str, str]:
    """Repo path -> sha256 of every file below ``folder`` (links followed)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def download(endpoint: str, tmp_path: Path, *args: str, **env: str) -> tuple[Path, Path]:
    """Run huggingface_hub in a fresh process against ``endpoint``; (cache dir, the path it printed)."""
    cache = tmp_path / "cache"
    environment = clean_env(HF_HUB_CACHE=str(cache), HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"),
                            HF_HUB_DISABLE_TELEMETRY="1", **env)
    proc = subprocess.run([sys.executable, "-c", _DOWNLOAD, *args], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cache, Path(json.loads(proc.stdout.strip().splitlines()[-1])["path"])


def resolve_gets(log: list, path: str) -> list:
    """Plain GETs of ``path``'s resolve URL (main origin) and of any CDN (LFS bridge) URL in a request log."""
    return [r for r in log if r.method == "GET" and
            (r.origin == "hub" and "/resolve/" in r.path and r.path.endswith("/" + path) or r.origin == "cdn")]


def test_snapshot_download_goes_through_xet_into_the_shared_blob_store(xet_root, tmp_path):
    with HubServer(xet_root, xet=XetMode(max_xorb_bytes=1024 * 1024)) as server:
        # One file first: huggingface_hub 2.4 creates the shared store on its first publication, and two parallel
        # first publications race (utils/_shared_blobs.py `_ensure_shared_blobs_dir` removes the other's marker
        # temporary), so the loser keeps a regular blob; after that, parallel downloads all publish.
        download(server.endpoint, tmp_path, "file", REPO, XET_FILES[1])
        cache, snapshot = download(server.endpoint, tmp_path, "snapshot", REPO)
        log = server.requests
        xet_hashes = {path: _xet_hash(server, path) for path in XET_FILES}
    assert sha256_tree(snapshot) == sha256_tree(xet_root / REPO)

    cas = [r for r in log if r.origin == "cas"]
    reconstructions = [r for r in cas if "/reconstructions/" in r.path]
    xorb_gets = [r for r in cas if r.path.startswith("/xorbs/default/")]
    assert len(reconstructions) >= len(XET_FILES) and all(r.status == 200 for r in reconstructions)
    assert len(xorb_gets) >= 4 and all(r.status == 206 and r.range and r.bytes_sent > 0 for r in xorb_gets)
    assert not any(r.authorized for r in xorb_gets)  # presigned-like URLs: no token sent
    assert sum(r.bytes_sent for r in xorb_gets) > 2_800_000
    assert any("/xet-read-token/" in r.path for r in log if r.origin == "hub")
    for path in XET_FILES:
        assert resolve_gets(log, path) == [], path  # not one byte of a Xet file over the plain path

    # huggingface_hub 2.4's shared store (utils/_shared_blobs.py): <cache>/blobs/<2hex>/<xet hash>, marked, and
    # the repo's blobs/<etag> a relative link into it.
    store = cache / "blobs"
    assert (store / ".huggingface-shared-blobs").read_text() == "1\n"
    repo_blobs = cache / "models--xet-org--weights" / "blobs"
    for path in XET_FILES:
        data = (xet_root / REPO / path).read_bytes()
        xet_hash = xet_hashes[path]
        shared = store / xet_hash[:2] / xet_hash
        assert shared.is_file() and not shared.is_symlink() and shared.read_bytes() == data
        link = repo_blobs / hashlib.sha256(data).hexdigest()
        target = os.readlink(link)
        assert not os.path.isabs(target) and link.resolve() == shared.resolve()


def _xet_hash(server: HubServer, path: str) -> str:
    """The X-Xet-Hash the server answers for ``path`` of REPO (HEAD, redirect not followed)."""
    response = httpx2.head(f"{server.endpoint}/{REPO}/resolve/main/{path}", follow_redirects=False)
    return response.headers["X-Xet-Hash"]


def test_head_answer_carries_the_hubs_xet_headers(xet_root):
    hf_xet = pytest.importorskip("hf_xet")
    with HubServer(xet_root, xet=True) as server:
        response = httpx2.head(f"{server.endpoint}/{REPO}/resolve/main/model.safetensors", follow_redirects=False)
        commit = server.commit_of(REPO)
        config = httpx2.head(f"{server.endpoint}/{REPO}/resolve/main/config.json")
    data_path = xet_root / REPO / "model.safetensors"
    sha256 = hashlib.sha256(data_path.read_bytes()).hexdigest()
    assert response.status_code == 302 and response.headers["Location"].startswith(server.cdn_endpoint)
    assert response.headers["X-Xet-Hash"] == hf_xet.hash_files([str(data_path)])[0].hash
    assert response.headers["X-Repo-Commit"] == commit
    assert response.headers["X-Linked-Etag"] == f'"{sha256}"'
    assert response.headers["X-Linked-Size"] == str(data_path.stat().st_size)
    links = response.links
    assert links["xet-auth"]["url"] == f"{server.endpoint}/api/models/{REPO}/xet-read-token/{commit}"
    assert links["xet-reconstruction-info"]["url"].startswith(f"{server.cas_endpoint}/v1/reconstructions/")
    assert "X-Xet-Hash" not in config.headers  # a git file is not a Xet file by default


def test_hf_hub_download_by_branch_heads_then_reconstructs(xet_root, tmp_path):
    with HubServer(xet_root, xet=True) as server:
        _, path = download(server.endpoint, tmp_path, "file", REPO, "model.safetensors")
        log = server.requests
    assert path.read_bytes() == (xet_root / REPO / "model.safetensors").read_bytes()
    heads = [r for r in log if r.method == "HEAD" and r.path.endswith("/model.safetensors")]
    assert heads and heads[0].status == 302
    assert resolve_gets(log, "model.safetensors") == []
    assert any("/reconstructions/" in r.path for r in log if r.origin == "cas")


def test_disable_xet_downloads_the_same_bytes_over_the_plain_path(xet_root, tmp_path):
    with HubServer(xet_root, xet=True) as server:
        cache, snapshot = download(server.endpoint, tmp_path, "snapshot", REPO, HF_HUB_DISABLE_XET="1")
        log = server.requests
    assert sha256_tree(snapshot) == sha256_tree(xet_root / REPO)
    assert not [r for r in log if r.origin == "cas"]
    assert {r.path.rsplit("/", 1)[-1] for r in log if r.origin == "cdn" and r.method == "GET"} == {
        hashlib.sha256((xet_root / REPO / p).read_bytes()).hexdigest() for p in XET_FILES}
    assert not (cache / "blobs" / ".huggingface-shared-blobs").exists()


def test_fixture_repo_files_all_go_through_xet_with_a_min_size(hub_root, tmp_path):
    with HubServer(hub_root, xet=XetMode(min_size=1)) as server:
        _, snapshot = download(server.endpoint, tmp_path, "snapshot", BERT)
        log = server.requests
    assert sha256_tree(snapshot) == sha256_tree(hub_root / BERT)
    assert not [r for r in log if r.method == "GET" and "/resolve/" in r.path]
    rebuilt = {r.path.split("/")[-1] for r in log if r.origin == "cas" and "/reconstructions/" in r.path}
    assert len(rebuilt) == len(sha256_tree(hub_root / BERT))


def test_dataset_repo_through_xet(tmp_path):
    root = tmp_path / "hub"
    corpus = root / "datasets" / "acme" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "data.zip").write_bytes(random.Random(5).randbytes(200_000))  # LFS by pattern
    with HubServer(root, xet=True) as server:
        _, snapshot = download(server.endpoint, tmp_path, "dataset", "acme/corpus")
        log = server.requests
    assert sha256_tree(snapshot) == sha256_tree(corpus)
    assert any(r.path.startswith("/api/datasets/acme/corpus/xet-read-token/") for r in log)
    assert any(r.origin == "cas" and r.path.startswith("/xorbs/") for r in log)
    assert resolve_gets(log, "data.zip") == []


def test_tree_entries_carry_the_xet_hash(xet_root):
    with HubServer(xet_root, xet=True) as server:
        entries = {e.path: e for e in HfApi(endpoint=server.endpoint, token=False).list_repo_tree(REPO, recursive=True)
                   if hasattr(e, "size")}
        expected = {p: _xet_hash(server, p) for p in XET_FILES}
    assert {p: entries[p].xet_hash for p in XET_FILES} == expected
    assert entries["config.json"].xet_hash is None


def test_token_and_cas_answers(xet_root):
    with HubServer(xet_root, xet=True) as server:
        commit = server.commit_of(REPO)
        token = httpx2.get(f"{server.endpoint}/api/models/{REPO}/xet-read-token/main")
        missing = httpx2.get(f"{server.endpoint}/api/models/xet-org/nope/xet-read-token/main")
        info = token.json()
        auth = {"Authorization": f"Bearer {info['accessToken']}"}
        file_hash = _xet_hash(server, "model.safetensors")
        url = f"{info['casUrl']}/v1/reconstructions/{file_hash}"
        unauthorized = httpx2.get(url)
        ranged = httpx2.get(url, headers={**auth, "Range": "bytes=1000000-1000099"}).json()
        past_end = httpx2.get(url, headers={**auth, "Range": "bytes=9999999-"})
        v2 = httpx2.get(url.replace("/v1/", "/v2/"), headers=auth).json()
        fetch = ranged["fetch_info"][ranged["terms"][0]["hash"]][0]
        first, last = fetch["url_range"]["start"], fetch["url_range"]["end"]
        xorb = httpx2.get(fetch["url"], headers={"Range": f"bytes={first}-{last}"})
        outside = httpx2.get(fetch["url"], headers={"Range": f"bytes={first}-{last + 1}"})
        size = httpx2.head(f"{info['casUrl']}/v1/files/{file_hash}", headers=auth)
    assert token.status_code == 200 and info["casUrl"] == server.cas_endpoint and info["exp"] > 0
    assert token.headers["X-Xet-Cas-Url"] == info["casUrl"]
    assert token.headers["X-Xet-Access-Token"] == info["accessToken"]
    assert int(token.headers["X-Xet-Token-Expiration"]) == info["exp"]
    assert missing.status_code == 404 and commit
    assert unauthorized.status_code == 401 and past_end.status_code == 416
    assert len(ranged["terms"]) == 1 and 0 <= ranged["offset_into_first_range"] < 128 * 1024
    assert xorb.status_code == 206 and len(xorb.content) == last - first + 1
    assert xorb.content[0] == 0 and xorb.content[4] == 0  # version 0, compression none
    assert outside.status_code == 403
    assert sum(t["unpacked_length"] for t in v2["terms"]) == 2_500_000 and set(v2["xorbs"]) == {
        t["hash"] for t in v2["terms"]}
    assert int(size.headers["Content-Length"]) == 2_500_000


def test_default_mode_speaks_no_xet(xet_root):
    with HubServer(xet_root) as server:
        head = httpx2.head(f"{server.endpoint}/{REPO}/resolve/main/model.safetensors")
        token = httpx2.get(f"{server.endpoint}/api/models/{REPO}/xet-read-token/main")
    assert "X-Xet-Hash" not in head.headers and "xet-auth" not in head.headers.get("Link", "")
    assert token.status_code == 404 and server.cas_endpoint == ""


def test_cli_xet_flag_starts_a_cas_origin(xet_root):
    proc = subprocess.Popen([sys.executable, "-m", "tests.testhub", str(xet_root), "--port", "0", "--xet",
                             "--xet-min-size", "1"], stdout=subprocess.PIPE, text=True, env=clean_env(),
                            cwd=Path(__file__).parents[2])
    try:
        hub = proc.stdout.readline().split(" at ")[-1].strip()
        cas = proc.stdout.readline().split(" at ")[-1].strip()
        head = httpx2.head(f"{hub}/{REPO}/resolve/main/config.json")
        token = httpx2.get(f"{hub}/api/models/{REPO}/xet-read-token/main").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert cas.startswith("http://127.0.0.1:") and token["casUrl"] == cas
    assert len(head.headers["X-Xet-Hash"]) == 64  # --xet-min-size 1: git files too
    assert proc.returncode == 0
