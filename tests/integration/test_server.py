"""HubServer against huggingface_hub's own clients: real HTTP on loopback, real fixture files.

huggingface_hub reads HF_* variables at import time, so every call passes endpoint=, cache_dir= and
token= explicitly (docs/cache-layout.md, 'Traps the libraries leave').
"""

from __future__ import annotations

import hashlib
import http.client
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile, RepoFolder

from tests.testhub import HubServer

BERT = "google-bert/bert-base-uncased"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MISTRAL = "mistralai/Mistral-7B-v0.1"


# --- expectations computed from the fixture files, independently of the server ----------------------


def fixture_files(hub_root: Path, repo_id: str) -> dict[str, bytes]:
    repo = hub_root / repo_id
    return {p.relative_to(repo).as_posix(): p.read_bytes() for p in repo.rglob("*") if p.is_file()}


def folder_files(folder: str | Path) -> dict[str, bytes]:
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{digest}\nsize {len(data)}\n".encode()


def storage(cache_dir: Path, repo_id: str) -> Path:
    return cache_dir / f"models--{repo_id.replace('/', '--')}"


def raw_get(endpoint: str, target: str) -> tuple[int, bytes]:
    """GET a request target byte-for-byte (httpx would normalise '..' away before sending)."""
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --- downloads through huggingface_hub ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("repo_id", "canonical"),
    [(BERT, BERT), ("bert-base-uncased", BERT), (MINILM, MINILM), (MISTRAL, MISTRAL)],
)
def test_snapshot_download_matches_fixture_files(hub_server, hub_root, tmp_path, repo_id, canonical):
    path = snapshot_download(repo_id, cache_dir=tmp_path, endpoint=hub_server.endpoint, token=False)

    assert folder_files(path) == fixture_files(hub_root, canonical)
    commit = hub_server.commit_of(canonical)
    # The cache folder is named after the id as typed; refs/main holds the server's commit.
    assert (storage(tmp_path, repo_id) / "refs" / "main").read_text() == commit
    assert Path(path).name == commit


def test_legacy_id_is_redirected_and_cached_under_the_typed_id(hub_server, hub_root, tmp_path):
    path = hf_hub_download(
        "bert-base-uncased", "vocab.txt", cache_dir=tmp_path, endpoint=hub_server.endpoint, token=False
    )

    content = (hub_root / BERT / "vocab.txt").read_bytes()
    assert Path(path).read_bytes() == content
    folder = storage(tmp_path, "bert-base-uncased")
    assert (folder / "refs" / "main").read_text() == hub_server.commit_of(BERT)
    assert Path(path).resolve().name == git_sha1(content)  # blob named by the ETag of the canonical response
    assert [(r.method, r.status, r.path) for r in hub_server.requests] == [
        ("HEAD", 307, "/bert-base-uncased/resolve/main/vocab.txt"),
        ("HEAD", 200, f"/{BERT}/resolve/main/vocab.txt"),
        ("GET", 200, f"/{BERT}/resolve/main/vocab.txt"),
    ]
    assert hub_server.requests[-1].bytes_sent == len(content)


def test_file_in_subdirectory(hub_server, hub_root, tmp_path):
    path = hf_hub_download(
        MINILM, "1_Pooling/config.json", cache_dir=tmp_path, endpoint=hub_server.endpoint, token=False
    )

    assert Path(path).read_bytes() == (hub_root / MINILM / "1_Pooling" / "config.json").read_bytes()
    assert Path(path).parent.name == "1_Pooling"


def test_lfs_file_comes_from_the_cdn_without_the_token(hub_root, tmp_path):
    content = (hub_root / MISTRAL / "tokenizer.model").read_bytes()
    with HubServer(hub_root, token="secret") as server:
        path = hf_hub_download(MISTRAL, "tokenizer.model", cache_dir=tmp_path, endpoint=server.endpoint, token="secret")
        log = server.requests

    assert Path(path).read_bytes() == content
    assert Path(path).resolve().name == hashlib.sha256(content).hexdigest()  # LFS blobs are named by sha256
    hub = [r for r in log if r.origin == "hub"]
    cdn = [r for r in log if r.origin == "cdn"]
    assert [(r.method, r.status, r.authorized) for r in hub] == [("HEAD", 302, True)]
    assert [(r.method, r.status, r.authorized) for r in cdn] == [("GET", 200, False)]
    assert cdn[0].path == f"/lfs/{MISTRAL}/{hashlib.sha256(content).hexdigest()}"
    assert cdn[0].bytes_sent == len(content)


# --- API: repo info and tree listing -----------------------------------------------------------------


def test_model_info_files_metadata(hub_server, hub_root):
    api = HfApi(endpoint=hub_server.endpoint, token=False)

    info = api.model_info(MINILM, files_metadata=True)
    files = fixture_files(hub_root, MINILM)
    assert info.id == MINILM and info.sha == hub_server.commit_of(MINILM)
    assert {s.rfilename: (s.size, s.blob_id, s.lfs) for s in info.siblings} == {
        path: (len(data), git_sha1(data), None) for path, data in files.items()
    }

    (sibling,) = api.model_info(MISTRAL, files_metadata=True).siblings
    content = (hub_root / MISTRAL / "tokenizer.model").read_bytes()
    assert sibling.size == sibling.lfs.size == len(content)
    assert sibling.lfs.sha256 == hashlib.sha256(content).hexdigest()
    # As on the Hub, an LFS file's blob id is the git id of its pointer, not of the content.
    assert sibling.blob_id == git_sha1(lfs_pointer(content))
    assert sibling.lfs.pointer_size == len(lfs_pointer(content))


def test_model_info_by_legacy_id_answers_the_canonical_id(hub_server):
    info = HfApi(endpoint=hub_server.endpoint, token=False).model_info("bert-base-uncased")

    assert info.id == BERT
    assert info.sha == hub_server.commit_of(BERT)
    assert {s.rfilename for s in info.siblings} >= {"vocab.txt", "config.json"}


def test_list_repo_tree_follows_pages(hub_root):
    files = fixture_files(hub_root, MINILM)
    with HubServer(hub_root, page_size=3) as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        entries = list(api.list_repo_tree(MINILM, recursive=True))
        pages = [r for r in server.requests if "/tree/" in r.path]
        top = list(api.list_repo_tree(MINILM))
        pooling = list(api.list_repo_tree(MINILM, path_in_repo="1_Pooling"))

    assert {e.path: (e.size, e.blob_id) for e in entries if isinstance(e, RepoFile)} == {
        path: (len(data), git_sha1(data)) for path, data in files.items()
    }
    assert [e.path for e in entries if isinstance(e, RepoFolder)] == ["1_Pooling"]
    assert len(pages) == -(-(len(files) + 1) // 3) > 1  # every page was fetched through Link headers
    assert "1_Pooling" in {e.path for e in top} and "1_Pooling/config.json" not in {e.path for e in top}
    assert [e.path for e in pooling] == ["1_Pooling/config.json"]


def test_snapshot_download_across_tree_pages(hub_root, tmp_path):
    with HubServer(hub_root, page_size=2) as server:
        path = snapshot_download(MINILM, cache_dir=tmp_path, endpoint=server.endpoint, token=False)

    assert folder_files(path) == fixture_files(hub_root, MINILM)


# --- errors ------------------------------------------------------------------------------------------


def test_missing_file_raises_entry_not_found_and_writes_no_exist(hub_server, tmp_path):
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(BERT, "chat_template.jinja", cache_dir=tmp_path, endpoint=hub_server.endpoint, token=False)

    commit = hub_server.commit_of(BERT)
    assert (storage(tmp_path, BERT) / ".no_exist" / commit / "chat_template.jinja").is_file()
    assert (storage(tmp_path, BERT) / "refs" / "main").read_text() == commit


def test_unknown_repo_and_revision(hub_server, tmp_path):
    api = HfApi(endpoint=hub_server.endpoint, token=False)
    download = {"cache_dir": tmp_path, "endpoint": hub_server.endpoint, "token": False}

    with pytest.raises(RepositoryNotFoundError):
        api.model_info("nobody/nothing")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/nothing", "config.json", **download)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(BERT, revision="v2.0")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(BERT, "config.json", revision="refs/pr/1", **download)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(BERT, revision="0" * 40, **download)
    # The quoted revision stayed one path segment (huggingface_hub quotes it with safe="").
    assert any(r.path == f"/{BERT}/resolve/refs%2Fpr%2F1/config.json" for r in hub_server.requests)


def test_old_commit_is_gone_once_files_change(hub_root, tmp_path):
    shutil.copytree(hub_root / BERT, tmp_path / "hub" / BERT)
    with HubServer(tmp_path / "hub") as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        old = server.commit_of(BERT)
        assert server.commit_of(BERT) == old  # stable while nothing changes
        (tmp_path / "hub" / BERT / "config.json").write_text('{"model_type": "bert", "edited": true}\n')
        new = server.commit_of(BERT)

        assert new != old
        assert api.model_info(BERT, revision=new).sha == new
        with pytest.raises(RevisionNotFoundError):
            api.model_info(BERT, revision=old)


def test_token_mode_requires_the_token_on_the_main_origin(hub_root):
    with HubServer(hub_root, token="secret") as server:
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=server.endpoint, token=False).model_info(BERT)
        wrong = httpx2.get(f"{server.endpoint}/api/models/{BERT}", headers={"Authorization": "Bearer nope"})
        right = HfApi(endpoint=server.endpoint, token="secret").model_info(BERT)
        health = httpx2.get(f"{server.endpoint}/healthz")

    assert (wrong.status_code, wrong.headers["X-Error-Code"]) == (401, "RepoNotFound")
    assert right.sha == HubServer(hub_root).commit_of(BERT)
    assert (health.status_code, health.text) == (200, "ok")  # liveness probes carry no credentials


def test_gated_repo(hub_root, tmp_path):
    with HubServer(hub_root, gated={"openai-community/gpt2"}) as server:
        with pytest.raises(GatedRepoError):
            HfApi(endpoint=server.endpoint, token=False).model_info("gpt2")  # legacy id of a gated repo
        with pytest.raises(GatedRepoError):
            hf_hub_download(
                "openai-community/gpt2", "config.json", cache_dir=tmp_path, endpoint=server.endpoint, token=False
            )
        head = httpx2.head(f"{server.endpoint}/openai-community/gpt2/resolve/main/config.json")

    assert (head.status_code, head.headers["X-Error-Code"]) == (403, "GatedRepo")
    assert head.headers["X-Error-Message"].startswith("Access to model openai-community/gpt2 is restricted")


# --- raw protocol: headers, Range, traversal ---------------------------------------------------------


def test_resolve_headers(hub_server, hub_root):
    vocab = (hub_root / BERT / "vocab.txt").read_bytes()
    head = httpx2.head(f"{hub_server.endpoint}/{BERT}/resolve/main/vocab.txt")
    lfs = httpx2.head(f"{hub_server.endpoint}/{MISTRAL}/resolve/main/tokenizer.model")
    model = (hub_root / MISTRAL / "tokenizer.model").read_bytes()

    assert head.status_code == 200
    assert head.headers["ETag"] == f'"{git_sha1(vocab)}"'
    assert head.headers["X-Repo-Commit"] == hub_server.commit_of(BERT)
    assert (head.headers["Content-Length"], head.headers["Accept-Ranges"]) == (str(len(vocab)), "bytes")
    assert lfs.status_code == 302
    assert lfs.headers["Location"].startswith(f"{hub_server.cdn_endpoint}/lfs/{MISTRAL}/")
    assert lfs.headers["X-Linked-Etag"] == lfs.headers["ETag"] == f'"{hashlib.sha256(model).hexdigest()}"'
    assert lfs.headers["X-Linked-Size"] == str(len(model))
    assert "X-Xet-Hash" not in head.headers and "X-Xet-Hash" not in lfs.headers


def test_range_requests(hub_server, hub_root):
    vocab = (hub_root / BERT / "vocab.txt").read_bytes()
    model = (hub_root / MISTRAL / "tokenizer.model").read_bytes()
    part = httpx2.get(f"{hub_server.endpoint}/{BERT}/resolve/main/vocab.txt", headers={"Range": "bytes=10-19"})
    tail = httpx2.get(
        f"{hub_server.endpoint}/{MISTRAL}/resolve/main/tokenizer.model",
        headers={"Range": "bytes=-100"},
        follow_redirects=True,
    )
    beyond = httpx2.get(f"{hub_server.endpoint}/{BERT}/resolve/main/vocab.txt", headers={"Range": "bytes=99999999-"})

    assert (part.status_code, part.content) == (206, vocab[10:20])
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(vocab)}"
    assert (tail.status_code, tail.content) == (206, model[-100:])  # served by the CDN origin
    assert beyond.status_code == 416


@pytest.mark.parametrize(
    ("origin", "target"),
    [
        ("hub", f"/{BERT}/resolve/main/../../../legacy_ids.json"),
        ("hub", f"/{BERT}/resolve/main/%2e%2e/%2e%2e/%2e%2e/legacy_ids.json"),
        ("hub", f"/{BERT}/resolve/main/..%2F..%2F..%2Flegacy_ids.json"),
        ("hub", f"/{BERT}/resolve/main/..%5C..%5C..%5Clegacy_ids.json"),
        ("hub", f"/{BERT}/resolve/main//etc/passwd"),
        ("hub", f"/{BERT}/resolve/main/%2Fetc%2Fpasswd"),
        ("hub", "/google-bert/..%2F..%2F..%2F..%2F..%2Fetc/resolve/main/passwd"),
        ("hub", "/%2e%2e/%2e%2e/resolve/main/legacy_ids.json"),
        ("hub", "/api/models/..%2F..%2F..%2Fetc/tree/main"),
        ("hub", f"/api/models/{BERT}/tree/main/..%2F..%2F..?recursive=true"),
        ("cdn", "/lfs/../../../etc/passwd"),
        ("cdn", f"/lfs/%2e%2e/%2e%2e/{'0' * 64}"),
    ],
)
def test_path_traversal_is_refused(hub_server, origin, target):
    endpoint = hub_server.endpoint if origin == "hub" else hub_server.cdn_endpoint
    status, body = raw_get(endpoint, target)

    assert 400 <= status < 500
    assert b"google-bert/bert-base-chinese" not in body and b"root:" not in body


def test_symlinks_out_of_root_are_invisible(tmp_path):
    outside = tmp_path / "outside"
    (outside / "repo").mkdir(parents=True)
    (outside / "secret.txt").write_text("TOP SECRET")
    (outside / "repo" / "config.json").write_text("{}")
    repo = tmp_path / "hub" / "acme" / "tiny"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text('{"ok": true}')
    (repo / "alias.json").symlink_to(repo / "config.json")  # inside root: served
    (repo / "leak.txt").symlink_to(outside / "secret.txt")
    (repo / "leak_dir").symlink_to(outside)
    (tmp_path / "hub" / "evil").symlink_to(outside)  # an "org" folder leaving root

    with HubServer(tmp_path / "hub") as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        listed = {e.path for e in api.list_repo_tree("acme/tiny", recursive=True)}
        leaks = [
            httpx2.get(f"{server.endpoint}/acme/tiny/resolve/main/{p}") for p in ("leak.txt", "leak_dir/secret.txt")
        ]
        with pytest.raises(RepositoryNotFoundError):
            api.model_info("evil/repo")

    assert listed == {"config.json", "alias.json"}
    assert [(r.status_code, r.headers.get("X-Error-Code")) for r in leaks] == [(404, "EntryNotFound")] * 2
    assert all(b"TOP SECRET" not in r.content for r in leaks)


# --- test hooks: overrides, throttling, shutdown, CLI ------------------------------------------------


def test_overrides_serve_other_bytes_under_the_published_hash(hub_root, tmp_path):
    real = (hub_root / BERT / "config.json").read_bytes()
    fake = b'{"tampered": true}\n'
    with HubServer(hub_root, overrides={(BERT, "config.json"): fake}) as server:
        info = HfApi(endpoint=server.endpoint, token=False).model_info(BERT, files_metadata=True)
        path = hf_hub_download(BERT, "config.json", cache_dir=tmp_path, endpoint=server.endpoint, token=False)

    assert {s.rfilename: s.blob_id for s in info.siblings}["config.json"] == git_sha1(real)
    assert Path(path).read_bytes() == fake
    # huggingface_hub stored the wrong bytes under the real blob id: it never hashes downloads (docs/cache-layout.md, 'Traps the libraries leave').
    assert Path(path).resolve().name == git_sha1(real)


def test_throttle_paces_file_bodies(hub_root):
    vocab = (hub_root / BERT / "vocab.txt").read_bytes()
    with HubServer(hub_root, throttle_bps=50_000) as server:
        start = time.monotonic()
        r = httpx2.get(f"{server.endpoint}/{BERT}/resolve/main/vocab.txt", headers={"Range": "bytes=0-24999"})
        elapsed = time.monotonic() - start

    assert r.content == vocab[:25_000]
    assert elapsed >= 0.4  # 25 kB at 50 kB/s


def test_stop_cuts_a_transfer_short(hub_root):
    server = HubServer(hub_root, throttle_bps=20_000).start()
    url = f"{server.endpoint}/{BERT}/resolve/main/vocab.txt"
    with pytest.raises(httpx2.RemoteProtocolError), httpx2.stream("GET", url) as response:
        chunks = response.iter_raw()
        next(chunks)  # the transfer is under way
        start = time.monotonic()
        server.stop()
        stop_took = time.monotonic() - start
        for _ in chunks:
            pass

    assert stop_took < 2
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{server.endpoint}/healthz")


def test_cli_serves_until_sigterm(hub_root):
    project = Path(__file__).parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.testhub", str(hub_root), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=project,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {hub_root} at http://127.0.0.1:")
        endpoint = line.rsplit(" at ", 1)[1].strip()
        assert httpx2.get(f"{endpoint}/healthz").text == "ok"
        assert httpx2.get(f"{endpoint}/api/models/{BERT}").json()["sha"] == HubServer(hub_root).commit_of(BERT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_org_less_and_dataset_repos(tmp_path):
    root = tmp_path / "hub"
    (root / "solo").mkdir(parents=True)
    (root / "solo" / "config.json").write_text('{"solo": true}')
    (root / "datasets" / "acme" / "corpus").mkdir(parents=True)
    (root / "datasets" / "acme" / "corpus" / "train.txt").write_text("hello\n")
    (root / "datasets" / "acme" / "corpus" / "data.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # LFS by pattern

    with HubServer(root) as server:
        solo = snapshot_download("solo", cache_dir=tmp_path / "cache", endpoint=server.endpoint, token=False)
        corpus = snapshot_download(
            "acme/corpus", repo_type="dataset", cache_dir=tmp_path / "cache", endpoint=server.endpoint, token=False
        )
        with pytest.raises(RepositoryNotFoundError):  # a dataset is not a model
            HfApi(endpoint=server.endpoint, token=False).model_info("acme/corpus")

    assert folder_files(solo) == folder_files(root / "solo")
    assert folder_files(corpus) == folder_files(root / "datasets" / "acme" / "corpus")
    assert any(r.origin == "cdn" and r.path.startswith("/lfs/datasets/acme/corpus/") for r in server.requests)
