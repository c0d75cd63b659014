"""hfcache serve: a warmed cache (or plain repo folders) served as a Hub mirror, to unmodified clients.

The mirror runs as a real `python -m hfcache serve` subprocess (uvicorn, one origin) wherever the CLI matters;
protocol details are also checked in-process on both server stacks (werkzeug and uvicorn).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, hf_hub_download, scan_cache_dir
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile as HubRepoFile

import hfcache
from hfcache import WarmRequest
from tests.helpers import GOLDEN, clean_env, golden_ids, offline_load, run_hfcache
from tests.served import ACCESS_LINE, TRAVERSALS, raw_request, served
from tests.testhub import HubServer

PROJECT = Path(__file__).parents[2]
BERT = "google-bert/bert-base-uncased"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MISTRAL = "mistralai/Mistral-7B-v0.1"
CANONICAL_IDS = sorted(GOLDEN["repos"])  # the nine fixture repos
LEGACY = json.loads((PROJECT / "tests" / "data" / "hub" / "legacy_ids.json").read_text())  # legacy -> canonical
SECRET = "TOP SECRET do not serve"


# --- fixtures and helpers -----------------------------------------------------------------------------


def warm_fixture_cache(hub_root: Path, cache: Path) -> None:
    """Warm every fixture repo (canonical and legacy ids; MiniLM as a model, with its subfolder) from HubServer."""
    requests = [WarmRequest(r) for r in CANONICAL_IDS if r != MINILM]
    requests += [WarmRequest(legacy) for legacy in sorted(LEGACY)]
    requests.append(WarmRequest(MINILM, kind="model"))
    with HubServer(hub_root) as server:
        report = hfcache.warm(requests, cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [(r.request.repo_id, r.error) for r in report.repos if r.error]


@pytest.fixture(scope="module")
def warmed_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache warmed from the fixture Hub: what the mirror's volume holds. Read-only for the tests."""
    cache = tmp_path_factory.mktemp("mirror") / "cache"
    warm_fixture_cache(PROJECT / "tests" / "data" / "hub", cache)
    return cache



def fixture_bytes(repo_id: str, path: str) -> bytes:
    return (PROJECT / "tests" / "data" / "hub" / repo_id / path).read_bytes()


def folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def commit_of(cache: Path, repo_id: str) -> str:
    return (folder(cache, repo_id) / "refs" / "main").read_text()


#: Run in a client subprocess, as an application would: HF_ENDPOINT -> the mirror, online, fresh caches.
CLIENT_SCRIPT = r"""
import json, sys
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from transformers import AutoTokenizer
text, snap_cache, file_cache, ids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
out = {}
for repo_id in ids:
    tok = AutoTokenizer.from_pretrained(repo_id)  # HF_HUB_CACHE
    snapshot = snapshot_download(repo_id, cache_dir=snap_cache)
    first = HfApi().model_info(repo_id).siblings[0].rfilename
    vocab = hf_hub_download(repo_id, first, cache_dir=file_cache)
    out[repo_id] = {"class": type(tok).__name__, "input_ids": tok(text)["input_ids"], "snapshot": snapshot,
                    "file": vocab}
print(json.dumps(out))
"""


# --- the must-show path: warmed cache -> serve -> clients online -> verify -> offline -------------------


@pytest.mark.slow
def test_clients_download_and_load_every_fixture_repo_from_a_served_cache(warmed_cache, tmp_path):
    ids = [*CANONICAL_IDS, *sorted(LEGACY)]
    app_cache, snap_cache, file_cache = tmp_path / "app", tmp_path / "snap", tmp_path / "file"
    access = tmp_path / "access.log"
    with served("--cache-dir", str(warmed_cache), "--access-log", str(access)) as (endpoint, _):
        env = clean_env(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(app_cache), HF_HOME=str(tmp_path / "home"))
        proc = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT, GOLDEN["text"], str(snap_cache),
                               str(file_cache), *ids], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    online = json.loads(proc.stdout.strip().splitlines()[-1])

    for repo_id in ids:
        canonical = LEGACY.get(repo_id, repo_id)
        assert online[repo_id]["input_ids"] == golden_ids(repo_id, canonical), repo_id
        # The snapshot holds exactly what the mirror's cache holds, byte for byte, at the mirror's commit.
        snapshot = Path(online[repo_id]["snapshot"])
        assert snapshot.name == commit_of(warmed_cache, canonical)
        held = folder(warmed_cache, canonical) / "snapshots" / snapshot.name
        assert {p.relative_to(snapshot).as_posix(): p.read_bytes() for p in snapshot.rglob("*") if p.is_file()} == {
            p.relative_to(held).as_posix(): p.read_bytes() for p in held.rglob("*") if p.is_file()}
        assert Path(online[repo_id]["file"]).is_file()
    assert (Path(online[MINILM]["snapshot"]) / "1_Pooling" / "config.json").read_bytes() == fixture_bytes(
        MINILM, "1_Pooling/config.json")

    # Every request was logged; nothing failed on the server side.
    lines = access.read_text().splitlines()
    assert lines and all(ACCESS_LINE.match(line) for line in lines)
    assert not [line for line in lines if line.split()[3].startswith("5")]

    for cache in (app_cache, snap_cache, file_cache):
        verified = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert not scan_cache_dir(cache).warnings
    # The application's cache, filled online through the mirror, loads every tokenizer offline. (A bare
    # snapshot_download cache would not load FacebookAI/roberta-base: it has no config.json and snapshot_download
    # writes no .no_exist markers, docs/cache-layout.md; the mirror passes on the markers it knows to clients that ask.)
    loaded = offline_load(app_cache, ids)
    for repo_id in ids:
        assert loaded[repo_id].get("input_ids") == golden_ids(repo_id, LEGACY.get(repo_id)), repo_id


@pytest.mark.slow
def test_serve_plain_repo_folders(hub_root, tmp_path):
    with served("--repos", str(hub_root)) as (endpoint, _):
        path = hf_hub_download("bert-base-uncased", "vocab.txt", cache_dir=tmp_path, endpoint=endpoint, token=False)
        model = hf_hub_download(MISTRAL, "tokenizer.model", cache_dir=tmp_path, endpoint=endpoint, token=False)

    assert Path(path).read_bytes() == fixture_bytes(BERT, "vocab.txt")
    assert Path(model).read_bytes() == fixture_bytes(MISTRAL, "tokenizer.model")
    assert Path(model).resolve().name == hashlib.sha256(Path(model).read_bytes()).hexdigest()


# --- what a served cache answers -----------------------------------------------------------------------


@pytest.fixture(params=["werkzeug", "uvicorn"])
def cache_server(request, warmed_cache) -> Iterator[HubServer]:
    with HubServer(warmed_cache, layout="cache", backend=request.param, lfs_redirect=False) as server:
        yield server


def test_listing_and_hashes_match_the_upstream_hub(cache_server, hub_root):
    """For every file the cache holds, size, blob id and LFS sha256 are what the original Hub publishes."""
    mirror = HfApi(endpoint=cache_server.endpoint, token=False)
    with HubServer(hub_root) as upstream:
        hub = HfApi(endpoint=upstream.endpoint, token=False)
        for repo_id in CANONICAL_IDS:
            ours = mirror.model_info(repo_id, files_metadata=True)
            theirs = {s.rfilename: s for s in hub.model_info(repo_id, files_metadata=True).siblings}
            assert ours.id == repo_id and ours.sha == upstream.commit_of(repo_id)
            assert ours.siblings and {s.rfilename for s in ours.siblings} <= set(theirs)
            for s in ours.siblings:
                t = theirs[s.rfilename]
                assert (s.size, s.blob_id) == (t.size, t.blob_id), (repo_id, s.rfilename)
                if t.lfs:
                    assert (s.lfs.sha256, s.lfs.size, s.lfs.pointer_size) == (
                        t.lfs.sha256, t.lfs.size, t.lfs.pointer_size)
                else:
                    assert s.lfs is None
            tree = {e.path: (e.size, e.blob_id, e.lfs) for e in mirror.list_repo_tree(repo_id, recursive=True)
                    if isinstance(e, HubRepoFile)}
            assert tree == {s.rfilename: (s.size, s.blob_id, s.lfs) for s in ours.siblings}


def test_legacy_folder_answers_as_its_canonical_id(cache_server, warmed_cache, tmp_path):
    api = HfApi(endpoint=cache_server.endpoint, token=False)

    info = api.model_info("bert-base-uncased")
    head = httpx2.head(f"{cache_server.endpoint}/bert-base-uncased/resolve/main/vocab.txt")
    path = hf_hub_download("gpt2", "vocab.json", cache_dir=tmp_path, endpoint=cache_server.endpoint, token=False)

    assert (info.id, info.sha) == (BERT, commit_of(warmed_cache, BERT))
    assert (head.status_code, head.headers["location"]) == (307, f"/{BERT}/resolve/main/vocab.txt")
    assert Path(path).read_bytes() == fixture_bytes("openai-community/gpt2", "vocab.json")
    assert (tmp_path / "models--gpt2" / "refs" / "main").read_text() == commit_of(warmed_cache, "openai-community/gpt2")


def test_legacy_folder_alone_is_a_repo_of_its_own(warmed_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(folder(warmed_cache, "bert-base-uncased"), folder(cache, "bert-base-uncased"), symlinks=True)
    with HubServer(cache, layout="cache", lfs_redirect=False) as server:
        info = HfApi(endpoint=server.endpoint, token=False).model_info("bert-base-uncased")
        path = hf_hub_download("bert-base-uncased", "vocab.txt", cache_dir=tmp_path / "client",
                               endpoint=server.endpoint, token=False)
        with pytest.raises(RepositoryNotFoundError):  # the canonical id is not in that cache
            HfApi(endpoint=server.endpoint, token=False).model_info(BERT)

    assert info.id == "bert-base-uncased"
    assert Path(path).read_bytes() == fixture_bytes(BERT, "vocab.txt")


def test_no_exist_markers_are_entry_not_found_with_the_commit(cache_server, warmed_cache, tmp_path):
    roberta = "FacebookAI/roberta-base"
    commit = commit_of(warmed_cache, roberta)
    assert (folder(warmed_cache, roberta) / ".no_exist" / commit / "config.json").is_file()
    client = {"cache_dir": tmp_path, "endpoint": cache_server.endpoint, "token": False}

    with pytest.raises(EntryNotFoundError):
        hf_hub_download(roberta, "config.json", **client)
    with pytest.raises(EntryNotFoundError):  # in the upstream repo, but not warmed: not held, not "absent"
        hf_hub_download(MINILM, "README.md", **client)
    known = httpx2.head(f"{cache_server.endpoint}/{roberta}/resolve/main/config.json")
    unknown = httpx2.head(f"{cache_server.endpoint}/{MINILM}/resolve/main/README.md")

    assert (known.status_code, known.headers["x-error-code"], known.headers["x-repo-commit"]) == (
        404, "EntryNotFound", commit)
    assert (unknown.status_code, unknown.headers["x-error-code"]) == (404, "EntryNotFound")
    assert "x-repo-commit" not in unknown.headers  # the client must not record a permanent "absent"
    assert (folder(tmp_path, roberta) / ".no_exist" / commit / "config.json").is_file()
    assert not (folder(tmp_path, MINILM) / ".no_exist").exists()


def test_revisions_are_refs_and_snapshot_commits(warmed_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(folder(warmed_cache, BERT), folder(cache, BERT), symlinks=True)
    commit = commit_of(cache, BERT)
    (folder(cache, BERT) / "refs" / "v1.0").write_text(commit)
    (folder(cache, BERT) / "refs" / "refs" / "pr").mkdir(parents=True)
    (folder(cache, BERT) / "refs" / "refs" / "pr" / "1").write_text(commit)
    (folder(cache, BERT) / "refs" / "dangling").write_text("f" * 40)  # no such snapshot
    with HubServer(cache, layout="cache", lfs_redirect=False) as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        shas = [api.model_info(BERT, revision=r).sha for r in ("main", "v1.0", "refs/pr/1", commit)]
        for bad in ("dangling", "v2.0", "0" * 40, commit[:12], "../main"):
            with pytest.raises(RevisionNotFoundError):
                api.model_info(BERT, revision=bad)
        path = hf_hub_download(BERT, "vocab.txt", revision="refs/pr/1", cache_dir=tmp_path / "client",
                               endpoint=server.endpoint, token=False)
        with pytest.raises(RepositoryNotFoundError):
            api.model_info("nobody/nothing")

    assert shas == [commit] * 4
    assert Path(path).read_bytes() == fixture_bytes(BERT, "vocab.txt")


def test_range_etag_and_head(cache_server):
    url = f"{cache_server.endpoint}/{BERT}/resolve/main/vocab.txt"
    vocab = fixture_bytes(BERT, "vocab.txt")
    etag = '"' + hashlib.sha1(b"blob %d\0" % len(vocab) + vocab).hexdigest() + '"'

    head = httpx2.head(url)
    part = httpx2.get(url, headers={"Range": "bytes=100-199"})
    suffix = httpx2.get(url, headers={"Range": "bytes=-10"})
    beyond = httpx2.get(url, headers={"Range": f"bytes={len(vocab)}-"})
    same = httpx2.get(url, headers={"If-None-Match": etag})
    stale_range = httpx2.get(url, headers={"Range": "bytes=0-9", "If-Range": '"other"'})

    assert (head.status_code, head.headers["etag"], int(head.headers["content-length"])) == (200, etag, len(vocab))
    assert head.content == b""
    assert (part.status_code, part.content, part.headers["content-range"]) == (
        206, vocab[100:200], f"bytes 100-199/{len(vocab)}")
    assert (suffix.status_code, suffix.content) == (206, vocab[-10:])
    assert (beyond.status_code, beyond.headers["content-range"]) == (416, f"bytes */{len(vocab)}")
    assert (same.status_code, same.content) == (304, b"")
    assert (stale_range.status_code, stale_range.content) == (200, vocab)


def test_lfs_file_is_served_by_the_one_origin(cache_server, tmp_path):
    model = fixture_bytes(MISTRAL, "tokenizer.model")
    sha256 = hashlib.sha256(model).hexdigest()

    head = httpx2.head(f"{cache_server.endpoint}/{MISTRAL}/resolve/main/tokenizer.model")
    path = hf_hub_download(MISTRAL, "tokenizer.model", cache_dir=tmp_path, endpoint=cache_server.endpoint,
                           token=False)

    assert head.status_code == 200 and not cache_server.cdn_endpoint
    assert head.headers["x-linked-etag"] == head.headers["etag"] == f'"{sha256}"'
    assert head.headers["x-linked-size"] == str(len(model))
    assert "x-xet-hash" not in head.headers
    assert Path(path).read_bytes() == model and Path(path).resolve().name == sha256


def test_many_concurrent_clients(warmed_cache):
    files = [(repo, p.relative_to(folder(warmed_cache, repo) / "snapshots" / commit_of(warmed_cache, repo)).as_posix())
             for repo in CANONICAL_IDS
             for p in (folder(warmed_cache, repo) / "snapshots" / commit_of(warmed_cache, repo)).rglob("*")
             if p.is_file()]
    expected = {f: hashlib.sha256(fixture_bytes(*f)).hexdigest() for f in files}

    def client(endpoint: str) -> dict[tuple[str, str], str]:
        got = {}
        with httpx2.Client(base_url=endpoint, timeout=30) as http:
            for repo, path in files:
                response = http.get(f"/{repo}/resolve/main/{path}")
                response.raise_for_status()
                got[(repo, path)] = hashlib.sha256(response.content).hexdigest()
        return got

    with served("--cache-dir", str(warmed_cache)) as (endpoint, _), ThreadPoolExecutor(48) as pool:
        results = list(pool.map(client, [endpoint] * 48))

    assert all(r == expected for r in results)


# --- nothing outside the served directory --------------------------------------------------------------


def hostile_cache(warmed_cache: Path, base: Path) -> Path:
    """A copy of the warmed cache with symlinks pointing outside it, planted the ways a volume could hold them."""
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    cache = base / "cache"
    shutil.copytree(warmed_cache, cache, symlinks=True)
    bert, commit = folder(cache, BERT), commit_of(cache, BERT)
    vocab_blob = (bert / "snapshots" / commit / "vocab.txt").resolve()
    vocab_blob.unlink()
    vocab_blob.symlink_to(outside / "secret.txt")  # a blob that is a symlink to a file outside
    (bert / "snapshots" / commit / "absolute.txt").symlink_to(outside / "secret.txt")
    (bert / "snapshots" / commit / "relative.txt").symlink_to(os.path.relpath(outside / "secret.txt",
                                                                             bert / "snapshots" / commit))
    # A whole repo folder that is a symlink to a repo-shaped folder outside.
    fake = outside / "fake-repo"
    (fake / "blobs").mkdir(parents=True)
    (fake / "blobs" / ("a" * 40)).write_text(SECRET)
    (fake / "snapshots" / ("b" * 40)).mkdir(parents=True)
    (fake / "snapshots" / ("b" * 40) / "config.json").symlink_to(f"../../blobs/{'a' * 40}")
    (fake / "refs").mkdir()
    (fake / "refs" / "main").write_text("b" * 40)
    (cache / "models--evil--repo").symlink_to(fake)
    # A real repo folder whose blobs/ is a symlink to that outside folder.
    shadow = cache / "models--evil--shadow"
    (shadow / "snapshots" / ("b" * 40)).mkdir(parents=True)
    (shadow / "snapshots" / ("b" * 40) / "config.json").symlink_to(f"../../blobs/{'a' * 40}")
    (shadow / "refs").mkdir()
    (shadow / "refs" / "main").write_text("b" * 40)
    (shadow / "blobs").symlink_to(fake / "blobs")
    return cache



@pytest.mark.slow
def test_no_path_reaches_outside_the_served_cache(warmed_cache, tmp_path):
    cache = hostile_cache(warmed_cache, tmp_path)
    with served("--cache-dir", str(cache)) as (endpoint, _):
        answers = {target: raw_request(endpoint, target) for target in TRAVERSALS}
        listing = raw_request(endpoint, f"/api/models/{BERT}/tree/main?recursive=true")
        healthy = raw_request(endpoint, f"/{BERT}/resolve/main/tokenizer.json")

    wrong = {t: (status, body[:80]) for t, (status, _, body) in answers.items()
             if not 400 <= status < 500 or SECRET.encode() in body or b"root:" in body}
    assert not wrong
    assert SECRET.encode() not in listing[2]
    assert {e["path"] for e in json.loads(listing[2])} == {"config.json", "tokenizer.json", "tokenizer_config.json"}
    assert healthy[0] == 200 and healthy[2] == fixture_bytes(BERT, "tokenizer.json")


# --- token, access log, shutdown, CLI errors ---------------------------------------------------------


@pytest.mark.slow
def test_token_protected_mirror_and_a_log_without_the_token(warmed_cache, tmp_path):
    token = "hf_mirror_s3cr3t_token_value"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    access = tmp_path / "access.log"
    with served("--cache-dir", str(warmed_cache), "--token-file", str(token_file), "--access-log", str(access)) \
            as (endpoint, proc):
        anonymous = httpx2.get(f"{endpoint}/{BERT}/resolve/main/vocab.txt")
        wrong = httpx2.get(f"{endpoint}/api/models/{BERT}", headers={"Authorization": "Bearer nope"})
        health = httpx2.get(f"{endpoint}/healthz")
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download(BERT, "vocab.txt", cache_dir=tmp_path / "denied", endpoint=endpoint, token=False)
        path = hf_hub_download(BERT, "vocab.txt", cache_dir=tmp_path / "client", endpoint=endpoint, token=token)
        model = hf_hub_download(MISTRAL, "tokenizer.model", cache_dir=tmp_path / "client", endpoint=endpoint,
                                token=token)
        warm = run_hfcache(["warm", "gpt2", "--cache-dir", str(tmp_path / "warmed"), "--endpoint", endpoint,
                            "--token-file", str(token_file), "--json"])
    output = proc.stdout.read() + proc.stderr.read()

    assert (anonymous.status_code, anonymous.headers["x-error-code"]) == (401, "RepoNotFound")
    assert wrong.status_code == 401 and health.status_code == 200
    assert Path(path).read_bytes() == fixture_bytes(BERT, "vocab.txt")
    assert Path(model).read_bytes() == fixture_bytes(MISTRAL, "tokenizer.model")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    log = access.read_text()
    statuses = [line.split()[3] for line in log.splitlines()]
    assert "401" in statuses and "200" in statuses
    assert all(ACCESS_LINE.match(line) for line in log.splitlines())
    assert token not in log and token not in output and "Bearer" not in log


@pytest.mark.slow
def test_sigterm_lets_a_download_in_flight_finish(tmp_path):
    repos = tmp_path / "repos"
    (repos / "acme" / "big").mkdir(parents=True)
    content = os.urandom(48 * 1024 * 1024)
    (repos / "acme" / "big" / "weights.bin").write_bytes(content)
    access = tmp_path / "access.log"
    with served("--repos", str(repos), "--access-log", str(access)) as (endpoint, proc):
        host, port = endpoint.removeprefix("http://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"GET /acme/big/resolve/main/weights.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        received = sock.recv(64 * 1024)  # the response is under way, far from complete
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        with pytest.raises(httpx2.ConnectError):  # no new connection is accepted
            httpx2.get(f"{endpoint}/healthz", timeout=2)
        assert proc.poll() is None  # still serving the download in flight
        while chunk := sock.recv(1024 * 1024):
            received += chunk
        sock.close()
        assert proc.wait(timeout=15) == 0
    header, _, body = received.partition(b"\r\n\r\n")

    assert header.startswith(b"HTTP/1.1 200")
    assert len(body) == len(content), (len(body), header.decode(errors="replace"))
    assert hashlib.sha256(body).digest() == hashlib.sha256(content).digest()
    assert "stopped on SIGTERM" in proc.stderr.read()
    (line,) = access.read_text().splitlines()
    assert line.split()[1:5] == ["GET", "/acme/big/resolve/main/weights.bin", "200", str(len(content))]


def test_stop_with_grace_zero_cuts_transfers_on_uvicorn(tmp_path):
    repos = tmp_path / "repos"
    (repos / "acme" / "big").mkdir(parents=True)
    (repos / "acme" / "big" / "weights.bin").write_bytes(os.urandom(32 * 1024 * 1024))
    server = HubServer(repos, backend="uvicorn", lfs_redirect=False).start()
    url = f"{server.endpoint}/acme/big/resolve/main/weights.bin"
    with pytest.raises(httpx2.RemoteProtocolError), httpx2.stream("GET", url) as response:
        chunks = response.iter_raw(64 * 1024)
        next(chunks)
        start = time.monotonic()
        cut = server.stop()
        stop_took = time.monotonic() - start
        for _ in chunks:
            pass

    assert stop_took < 5 and cut == 1
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{server.endpoint}/healthz")


def test_serve_cli_errors(warmed_cache, hub_root, tmp_path):
    empty_token = tmp_path / "empty"
    empty_token.write_text("")
    both = run_hfcache(["serve", "--cache-dir", str(warmed_cache), "--repos", str(hub_root)])
    missing = run_hfcache(["serve", "--cache-dir", str(tmp_path / "nope"), "--port", "0"])
    no_token = run_hfcache(["serve", "--cache-dir", str(warmed_cache), "--token-file", str(empty_token)])
    log_dir = run_hfcache(["serve", "--cache-dir", str(warmed_cache), "--access-log", str(tmp_path), "--port", "0"])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = run_hfcache(["serve", "--cache-dir", str(warmed_cache), "--port", str(busy.getsockname()[1])])

    assert (both.returncode, missing.returncode, no_token.returncode) == (2, 5, 2)
    assert (log_dir.returncode, taken.returncode) == (2, 2)
    assert "cannot listen on 127.0.0.1" in taken.stderr
    assert all("Traceback" not in p.stderr for p in (both, missing, no_token, log_dir, taken))


def test_serve_binds_loopback_by_default(warmed_cache):
    with served("--cache-dir", str(warmed_cache)) as (endpoint, _):
        assert endpoint.startswith("http://127.0.0.1:")


def test_mirror_serve_api_stops_on_event(warmed_cache, tmp_path):
    from hfcache.serve.mirror import serve

    stop = threading.Event()
    ready: list = []
    runs: list = []
    thread = threading.Thread(target=lambda: runs.append(serve(cache_dir=warmed_cache, port=0, ready=ready.append,
                                                               stop=stop, access_log=str(tmp_path / "log"))))
    thread.start()
    deadline = time.monotonic() + 10
    while not ready and time.monotonic() < deadline:
        time.sleep(0.02)
    info = ready[0]
    sha = httpx2.get(f"{info.endpoint}/api/models/{BERT}").json()["sha"]
    stop.set()
    thread.join(timeout=15)

    assert info.layout == "cache" and info.host == "127.0.0.1" and not info.token_required
    assert sha == commit_of(warmed_cache, BERT)
    assert runs[0].signal == "stop" and runs[0].cut_short == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 1


@pytest.mark.slow
def test_idle_keep_alive_connection_outlives_the_clients_expiry(warmed_cache):
    """httpx drops idle connections after 5 s; the server must not close them at the same moment (a request sent
    into a closing connection gets a reset, and huggingface_hub does not retry a HEAD)."""
    with served("--cache-dir", str(warmed_cache)) as (endpoint, _):
        host, port = endpoint.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        first.read()
        time.sleep(6)
        conn.request("GET", "/healthz")  # the same connection: http.client would raise if it had been closed
        second = conn.getresponse()
        body = second.read()
        conn.close()

    assert (first.status, second.status, body) == (200, 200, b"ok")


def test_access_log_lines_keep_the_target_as_sent(warmed_cache):
    log = io.StringIO()
    with HubServer(warmed_cache, layout="cache", lfs_redirect=False, access_log=log, token="s3cret") as server:
        raw_request(server.endpoint, f"/api/models/{BERT}/revision/refs%2Fpr%2F1",
                    headers={"Authorization": "Bearer s3cret"})
        raw_request(server.endpoint, "/healthz")

    lines = log.getvalue().splitlines()
    error_bytes = str(len(json.dumps({"error": "Invalid rev id: refs/pr/1"})))
    assert [line.split()[1:5] for line in lines] == [
        ["GET", f"/api/models/{BERT}/revision/refs%2Fpr%2F1", "404", error_bytes],
        ["GET", "/healthz", "200", "2"],
    ]
    assert all(ACCESS_LINE.match(line) for line in lines) and "s3cret" not in log.getvalue()
