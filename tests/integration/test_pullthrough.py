"""hfcache serve --upstream: a pull-through mirror, verified, with the fixture Hub (HubServer) as its upstream.

Every count of upstream traffic is read from the upstream server's own request log. The end-to-end paths run the
mirror as a real ``python -m hfcache serve`` subprocess and the clients (transformers, huggingface_hub) in real
subprocesses; the protocol details run the same HubServer in-process (uvicorn backend, what ``serve`` runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from prometheus_client.parser import text_string_to_metric_families

from hfcache.serve.pullthrough import PullThroughConfig
from tests.helpers import GOLDEN, clean_env, golden_ids, run_hfcache, silent_server
from tests.served import ACCESS_LINE, TRAVERSALS, raw_request, served
from tests.testhub import Faults, HubServer

PROJECT = Path(__file__).parents[2]
HUB = PROJECT / "tests" / "data" / "hub"
BERT = "google-bert/bert-base-uncased"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MISTRAL = "mistralai/Mistral-7B-v0.1"
GPT2 = "openai-community/gpt2"

#: A client subprocess, as an application: AutoTokenizer and snapshot_download through HF_ENDPOINT (the mirror).
CLIENT = r"""
import json, sys
from huggingface_hub import snapshot_download
from transformers import AutoTokenizer
text, snap_cache, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
out = {}
for repo_id in ids:
    tok = AutoTokenizer.from_pretrained(repo_id)
    snapshot = snapshot_download(repo_id, cache_dir=snap_cache)
    out[repo_id] = {"input_ids": tok(text)["input_ids"], "snapshot": snapshot}
print(json.dumps(out))
"""


def run_client(endpoint: str, base: Path, ids: list[str]) -> dict[str, dict]:
    env = clean_env(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(base / "app"), HF_HOME=str(base / "home"))
    proc = subprocess.run([sys.executable, "-c", CLIENT, GOLDEN["text"], str(base / "snap"), *ids],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextmanager
def mirror(cache: Path, *upstreams: str, **options) -> Iterator[HubServer]:
    """The pull-through server in-process (uvicorn, one origin, as ``hfcache serve`` runs it)."""
    config = PullThroughConfig(upstreams=tuple(upstreams), **options)
    cache.mkdir(parents=True, exist_ok=True)
    with HubServer(cache, layout="cache", backend="uvicorn", lfs_redirect=False, upstream=config) as server:
        yield server


def bodies_per_file(upstream: HubServer) -> Counter:
    """Upstream file bodies sent, by URL (repo, commit and path; an LFS file's CDN URL names its sha256)."""
    counts: Counter = Counter()
    for r in upstream.requests:
        if r.method == "GET" and r.status == 200 and r.bytes_sent and ("/resolve/" in r.path or r.origin == "cdn"):
            counts[r.path] += 1
    return counts


def folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def verify(cache: Path) -> None:
    verified = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert not scan_cache_dir(cache).warnings


def metrics(endpoint: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client's own parser: (name, sorted labels) -> value."""
    text = httpx2.get(f"{endpoint}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# --- the must-show path: cold mirror -> real clients -> second client costs nothing upstream ----------------


@pytest.mark.slow
def test_clients_load_repos_the_mirror_lacks_and_a_second_client_costs_no_upstream_request(tmp_path):
    ids = ["bert-base-uncased", MINILM, MISTRAL]
    cache, access = tmp_path / "mirror", tmp_path / "access.log"
    with HubServer(HUB) as upstream, \
            served("--cache-dir", str(cache), "--upstream", upstream.endpoint, "--access-log", str(access)) \
            as (endpoint, _):
        first = run_client(endpoint, tmp_path / "first", ids)
        fetched = bodies_per_file(upstream)
        upstream.clear_log()
        second = run_client(endpoint, tmp_path / "second", ids)
        assert upstream.requests == []  # everything the second client needed was in the mirror's cache
        health = httpx2.get(f"{endpoint}/healthz").json()

    for out in (first, second):
        for repo_id in ids:
            canonical = {"bert-base-uncased": BERT}.get(repo_id)
            assert out[repo_id]["input_ids"] == golden_ids(repo_id, canonical), repo_id
    # The subfolder repo arrived whole, byte for byte.
    snapshot = Path(second[MINILM]["snapshot"])
    assert (snapshot / "1_Pooling" / "config.json").read_bytes() == (HUB / MINILM / "1_Pooling/config.json").read_bytes()
    assert {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()} == {
        p.relative_to(HUB / MINILM).as_posix() for p in (HUB / MINILM).rglob("*") if p.is_file()}
    assert fetched and set(fetched.values()) == {1}  # each file crossed the upstream link once
    assert health["upstream_reachable"] is True
    # The legacy id got its own folder, as warm writes it, and the cache answers it as the canonical id.
    assert (folder(cache, "bert-base-uncased") / "refs" / "main").read_text() == upstream.commit_of(BERT)
    assert all(ACCESS_LINE.match(line) for line in access.read_text().splitlines())
    verify(cache)


def test_concurrent_clients_cause_one_upstream_body_per_file(tmp_path):
    with HubServer(HUB) as upstream, mirror(tmp_path / "mirror", upstream.endpoint) as server:
        def client(n: int) -> str:
            return snapshot_download(MISTRAL, cache_dir=tmp_path / f"client{n}", endpoint=server.endpoint, token=False)

        with ThreadPoolExecutor(8) as pool:
            snapshots = list(pool.map(client, range(8)))
        resolutions = [r for r in upstream.requests if r.path.startswith(f"/api/models/{MISTRAL}")]

    files = sorted(p.relative_to(HUB / MISTRAL).as_posix() for p in (HUB / MISTRAL).rglob("*") if p.is_file())
    for snapshot in snapshots:
        assert sorted(p.name for p in Path(snapshot).iterdir()) == files
        assert (Path(snapshot) / "tokenizer.model").read_bytes() == (HUB / MISTRAL / "tokenizer.model").read_bytes()
    counts = bodies_per_file(upstream)
    assert sum(counts.values()) == len(files) and set(counts.values()) == {1}, counts
    assert len(resolutions) == 1  # one resolution of main for eight clients at once


def test_an_upstream_listing_names_only_is_described_by_head_and_serves_verified_files(tmp_path):
    """An upstream like many mirrors (repo info without ?blobs=true sizes and hashes, no tree API, bare ETags): the
    mirror resolves through warm's fallbacks (one HEAD per file) and still serves hash-checked bytes."""
    faults = Faults(no_blobs=True, no_tree=True, unquoted_etags=True)
    with HubServer(HUB, faults=faults) as upstream, mirror(tmp_path / "mirror", upstream.endpoint) as server:
        snapshot = Path(snapshot_download(MINILM, cache_dir=tmp_path / "client", endpoint=server.endpoint,
                                          token=False))
        info = httpx2.get(f"{server.endpoint}/api/models/{MINILM}/revision/main", params={"blobs": "true"}).json()
        heads = {r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in upstream.requests
                 if r.method == "HEAD" and "/resolve/" in r.path}
        trees = [r.status for r in upstream.requests if "/tree/" in r.path]

    files = {p.relative_to(HUB / MINILM).as_posix() for p in (HUB / MINILM).rglob("*") if p.is_file()}
    assert {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()} == files
    for path in files:
        assert (snapshot / path).read_bytes() == (HUB / MINILM / path).read_bytes(), path
    assert heads == files and trees and set(trees) == {404}  # every file described by HEAD, the tree API refused
    # The mirror itself answers the full metadata its upstream lacked.
    assert all(s.get("size") is not None and s.get("blobId") for s in info["siblings"])
    verify(tmp_path / "mirror")


def test_a_warm_of_the_same_cache_at_the_same_time_shares_the_fetches(tmp_path):
    """warm and the mirror take the same repo and blob locks: between them, each file crosses the link once."""
    cache = tmp_path / "mirror"
    with HubServer(HUB) as upstream, mirror(cache, upstream.endpoint) as server:
        warm = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", MINILM, "--kind", "all", "--cache-dir",
                                 str(cache), "--endpoint", upstream.endpoint, "--json"], cwd=PROJECT, env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with ThreadPoolExecutor(4) as pool:
            snapshots = list(pool.map(lambda n: snapshot_download(
                MINILM, cache_dir=tmp_path / f"client{n}", endpoint=server.endpoint, token=False), range(4)))
        out, err = warm.communicate(timeout=300)

    assert warm.returncode == 0, err
    files = {p.relative_to(HUB / MINILM).as_posix() for p in (HUB / MINILM).rglob("*") if p.is_file()}
    for snapshot in snapshots:
        assert {p.relative_to(snapshot).as_posix() for p in Path(snapshot).rglob("*") if p.is_file()} == files
    counts = bodies_per_file(upstream)
    assert len(counts) == len(files) and set(counts.values()) == {1}, counts
    verify(cache)


# --- revisions: revalidation, commits never re-asked, upstream down ---------------------------------------


def test_a_branch_is_revalidated_per_interval_and_a_commit_is_never_re_asked(tmp_path):
    hub = tmp_path / "hub"
    (hub / "acme").mkdir(parents=True)
    (hub / "acme" / "tok").mkdir()
    (hub / "acme" / "tok" / "vocab.txt").write_text("one\n")
    with HubServer(hub) as upstream:
        with mirror(tmp_path / "slow", upstream.endpoint, revalidate=3600) as server:
            first = httpx2.get(f"{server.endpoint}/api/models/acme/tok").json()["sha"]
            (hub / "acme" / "tok" / "vocab.txt").write_text("two\n")  # upstream moves main
            again = httpx2.get(f"{server.endpoint}/api/models/acme/tok").json()["sha"]
            by_commit = httpx2.get(f"{server.endpoint}/acme/tok/resolve/{first}/vocab.txt")
            asked = len(upstream.requests)
        with mirror(tmp_path / "eager", upstream.endpoint, revalidate=0) as server:
            a = httpx2.get(f"{server.endpoint}/api/models/acme/tok").json()["sha"]
            b = httpx2.get(f"{server.endpoint}/api/models/acme/tok").json()["sha"]
            latest = httpx2.get(f"{server.endpoint}/acme/tok/resolve/main/vocab.txt")
            upstream.clear_log()
            for _ in range(3):
                httpx2.get(f"{server.endpoint}/api/models/acme/tok/revision/{a}")
            commit_requests = len(upstream.requests)

    assert again == first  # within --revalidate the branch is not asked again
    assert asked == 2  # one resolution, one body ("one\n": the first commit's, which upstream no longer has)
    assert by_commit.status_code == 502 and "vocab.txt" in by_commit.headers["x-error-message"]
    assert a == b != first and latest.content == b"two\n"
    assert commit_requests == 0


def test_upstream_stopped_cached_repos_are_served_and_a_new_repo_gets_503(tmp_path):
    upstream = HubServer(HUB).start()
    try:
        with mirror(tmp_path / "mirror", upstream.endpoint, revalidate=0, timeout=3) as server:
            warm = hf_hub_download("bert-base-uncased", "vocab.txt", cache_dir=tmp_path / "c1",
                                   endpoint=server.endpoint, token=False)
            upstream.stop()
            cached = hf_hub_download(BERT, "vocab.txt", cache_dir=tmp_path / "c2", endpoint=server.endpoint,
                                     token=False)
            legacy = hf_hub_download("bert-base-uncased", "vocab.txt", cache_dir=tmp_path / "c3",
                                     endpoint=server.endpoint, token=False)
            # (huggingface_hub retries a 503 five times over 23 s: the answers are checked with plain requests.)
            new = httpx2.get(f"{server.endpoint}/api/models/{GPT2}")
            new_file = httpx2.head(f"{server.endpoint}/{GPT2}/resolve/main/vocab.json")
            uncached = httpx2.get(f"{server.endpoint}/{BERT}/resolve/main/tokenizer.json")
            health = httpx2.get(f"{server.endpoint}/healthz")
            samples = metrics(server.endpoint)
    finally:
        upstream.stop()

    vocab = (HUB / BERT / "vocab.txt").read_bytes()
    assert Path(warm).read_bytes() == Path(cached).read_bytes() == Path(legacy).read_bytes() == vocab
    assert (new.status_code, new.headers["x-error-code"]) == (503, "UpstreamUnavailable")
    assert "cannot connect" in new.headers["x-error-message"]
    assert (new_file.status_code, new_file.headers["x-error-code"]) == (503, "UpstreamUnavailable")
    # A file of a cached repo that the cache lacks (the last listing names it): 503 naming it, no "absent" lie.
    assert (uncached.status_code, uncached.headers["x-error-code"]) == (503, "UpstreamUnavailable")
    assert "tokenizer.json" in uncached.headers["x-error-message"] and "x-repo-commit" not in uncached.headers
    assert health.status_code == 200 and health.json()["upstream_reachable"] is False
    assert samples[("hfcache_upstream_up", (("endpoint", upstream.endpoint),))] == 0


def test_probes_answer_within_a_second_while_every_worker_waits_on_a_silent_upstream(tmp_path):
    """An upstream that accepts connections and never answers: 40 requests for new repos hold every worker thread
    for the whole 6 s timeout, yet /healthz and /metrics answer at once from their own threads (the server waits at
    most 0.5 s for a health check; the bound below leaves room for this test's 40 client threads sharing the GIL
    with the in-process server, and stays far below the 6 s a probe queued behind the workers would take)."""
    with (silent_server() as silent, mirror(tmp_path / "mirror", silent, timeout=6) as server,
          ThreadPoolExecutor(40) as pool):
        pending = [pool.submit(httpx2.get, f"{server.endpoint}/api/models/acme/repo{n}", timeout=60)
                   for n in range(40)]
        time.sleep(0.5)
        started = time.monotonic()
        health = httpx2.get(f"{server.endpoint}/healthz", timeout=10)
        health_s = time.monotonic() - started
        started = time.monotonic()
        scrape = httpx2.get(f"{server.endpoint}/metrics", timeout=10)
        scrape_s = time.monotonic() - started
        still_waiting = sum(not f.done() for f in pending)
        answers = [f.result() for f in pending]

    assert health.status_code == 200 and health.json()["upstreams"][0]["reachable"] in (None, False)
    assert scrape.status_code == 200 and health_s < 3.0 and scrape_s < 3.0, (health_s, scrape_s)
    assert still_waiting >= 30  # the probes did not simply come after the storm
    assert {(a.status_code, a.headers["x-error-code"]) for a in answers} == {(503, "UpstreamUnavailable")}


# --- verification, --allow, token ---------------------------------------------------------------------


def test_a_tampered_upstream_byte_is_a_502_and_nothing_is_kept(tmp_path):
    vocab = (HUB / BERT / "vocab.txt").read_bytes()
    tampered = vocab[:100] + bytes([vocab[100] ^ 1]) + vocab[101:]
    cache = tmp_path / "mirror"
    with HubServer(HUB, overrides={(BERT, "vocab.txt"): tampered}) as bad, \
            mirror(cache, bad.endpoint) as server:
        head = httpx2.head(f"{server.endpoint}/{BERT}/resolve/main/vocab.txt")
        got = httpx2.get(f"{server.endpoint}/{BERT}/resolve/main/vocab.txt")
        with pytest.raises(HfHubHTTPError):
            hf_hub_download(BERT, "vocab.txt", cache_dir=tmp_path / "client", endpoint=server.endpoint, token=False)
        config = httpx2.get(f"{server.endpoint}/{BERT}/resolve/main/config.json")  # an honest file still comes
        samples = metrics(server.endpoint)
    blob = hashlib.sha1(b"blob %d\0" % len(vocab) + vocab).hexdigest()

    assert head.status_code == 200  # metadata from the listing; no bytes fetched for a HEAD
    assert (got.status_code, got.headers["x-error-code"]) == (502, "UpstreamIntegrityError")
    assert "vocab.txt" in got.headers["x-error-message"] and "hash" in got.headers["x-error-message"]
    assert got.json()["error"] == got.headers["x-error-message"]
    assert config.status_code == 200
    assert not (folder(cache, BERT) / "blobs" / blob).exists()
    assert not list(cache.rglob("*.incomplete")) and not list(cache.rglob("vocab.txt"))
    assert not (tmp_path / "client" / f"models--{BERT.replace('/', '--')}" / "blobs" / blob).exists()
    assert samples[("hfcache_verification_failures_total", ())] >= 2  # the GET and the client's GET
    verify(cache)


def test_the_next_upstream_serves_what_the_first_one_corrupts(tmp_path):
    vocab = (HUB / BERT / "vocab.txt").read_bytes()
    with HubServer(HUB, overrides={(BERT, "vocab.txt"): b"x" * len(vocab)}) as bad, HubServer(HUB) as good, \
            mirror(tmp_path / "mirror", bad.endpoint, good.endpoint) as server:
        got = httpx2.get(f"{server.endpoint}/{BERT}/resolve/main/vocab.txt")

    assert got.status_code == 200 and got.content == vocab
    verify(tmp_path / "mirror")


def test_a_repo_outside_allow_is_refused_without_contacting_upstream(tmp_path):
    with HubServer(HUB) as upstream:
        with mirror(tmp_path / "m1", upstream.endpoint, allow=("google-bert/*", "sentence-transformers/*")) as server:
            refused = httpx2.get(f"{server.endpoint}/api/models/{MISTRAL}")
            refused_file = httpx2.get(f"{server.endpoint}/{MISTRAL}/resolve/main/tokenizer.model")
            legacy = httpx2.get(f"{server.endpoint}/api/models/bert-base-uncased")  # the id asked must match
            assert upstream.requests == []
            allowed = httpx2.get(f"{server.endpoint}/api/models/{BERT}")
        with mirror(tmp_path / "m2", upstream.endpoint, allow=("bert-base-uncased",)) as server:
            path = hf_hub_download("bert-base-uncased", "vocab.txt", cache_dir=tmp_path / "client",
                                   endpoint=server.endpoint, token=False)
            canonical_alone = httpx2.get(f"{server.endpoint}/api/models/google-bert/bert-base-chinese")

    for answer in (refused, refused_file, legacy, canonical_alone):
        assert (answer.status_code, answer.headers["x-error-code"]) == (403, "RepoNotAllowed"), answer.text
    assert "--allow" in refused.json()["error"]
    assert allowed.status_code == 200 and allowed.json()["id"] == BERT
    assert Path(path).read_bytes() == (HUB / BERT / "vocab.txt").read_bytes()


@pytest.mark.slow
def test_the_upstream_token_goes_upstream_only(tmp_path):
    token = "hf_upstream_S3CRET_value_42"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    access = tmp_path / "access.log"
    with HubServer(HUB, token=token) as upstream, \
            served("--cache-dir", str(tmp_path / "mirror"), "--upstream", upstream.endpoint, "--upstream-token-file",
                   str(token_file), "--access-log", str(access)) as (endpoint, proc):
        answers = [
            httpx2.get(f"{endpoint}/api/models/{BERT}?blobs=true"),
            httpx2.get(f"{endpoint}/{BERT}/resolve/main/vocab.txt"),
            httpx2.head(f"{endpoint}/{MISTRAL}/resolve/main/tokenizer.model"),
            httpx2.get(f"{endpoint}/{MISTRAL}/resolve/main/tokenizer.model"),
            httpx2.get(f"{endpoint}/api/models/nobody/nothing"),
            httpx2.get(f"{endpoint}/healthz"),
            httpx2.get(f"{endpoint}/metrics"),
        ]
        hub_requests = [r for r in upstream.requests if r.origin == "hub"]
    output = proc.stdout.read() + proc.stderr.read()

    assert [a.status_code for a in answers] == [200, 200, 200, 200, 404, 200, 200]
    assert answers[3].content == (HUB / MISTRAL / "tokenizer.model").read_bytes()
    # The upstream needs the token and got it with every repo request; the health check (HEAD /) sends none.
    assert all(r.authorized for r in hub_requests if r.path != "/")
    assert {r.path.split("?")[0] for r in hub_requests if r.authorized} >= {f"/api/models/{BERT}/revision/main"}
    assert [r.authorized for r in hub_requests if r.path == "/"] == [False]
    for answer in answers:
        assert token not in answer.text and token not in str(answer.headers)
    log = access.read_text()
    assert len(log.splitlines()) == len(answers) and token not in log and token not in output


def test_no_request_reaches_outside_the_cache_or_fetches_junk(tmp_path):
    base = tmp_path / "base"
    with HubServer(HUB) as upstream, mirror(base / "cache", upstream.endpoint) as server:
        answers = {target: raw_request(server.endpoint, target) for target in TRAVERSALS}
        odd = {target: raw_request(server.endpoint, target) for target in (
            "/api/models/google-bert/bert-base-uncased/revision/..%2F..%2Fmain",
            "/api/models/a--b/c", "/api/models/x/y/z/revision/main", "/google-bert/bert-base-uncased/resolve/main/",
        )}
        asked = [r.path for r in upstream.requests]

    wrong = {t: (status, body[:120]) for t, (status, _, body) in {**answers, **odd}.items()
             if not 400 <= status < 500 and t != f"/{BERT}/resolve/main/vocab.txt"}
    assert not wrong
    assert answers[f"/{BERT}/resolve/main/vocab.txt"][0] == 200  # the one honest request among them
    assert sorted(p.name for p in base.iterdir()) == ["cache"]  # nothing written beside the cache
    assert all(".." not in p and "etc" not in p for p in asked), asked  # junk never went upstream


def test_after_a_restart_with_upstream_down_the_kept_listing_answers_and_a_commit_is_not_re_asked(tmp_path):
    cache = tmp_path / "mirror"
    with HubServer(HUB) as upstream:
        with mirror(cache, upstream.endpoint) as server:
            hf_hub_download(BERT, "vocab.txt", cache_dir=tmp_path / "c1", endpoint=server.endpoint, token=False)
        port = int(upstream.endpoint.rsplit(":", 1)[1])
    # A new mirror process over the same cache, its upstream down: it answers from the cache alone.
    down = HubServer(HUB, port=port).start()
    down.stop()
    with mirror(cache, down.endpoint, revalidate=0, timeout=3) as server:
        info = httpx2.get(f"{server.endpoint}/api/models/{BERT}").json()
        with HubServer(HUB, port=port) as back:  # upstream returns on the same address
            config = httpx2.get(f"{server.endpoint}/{BERT}/resolve/{info['sha']}/config.json")
            asked = [r.path for r in back.requests]

    assert {s["rfilename"] for s in info["siblings"]} >= {"vocab.txt", "config.json", "tokenizer.json"}
    assert config.status_code == 200 and config.content == (HUB / BERT / "config.json").read_bytes()
    # The commit's listing was kept (trees/<commit>.json) with the first fetch: only the missing body is asked.
    assert asked == [f"/{BERT}/resolve/{info['sha']}/config.json"]
    verify(cache)


# --- /metrics ---------------------------------------------------------------------------------------------


def test_metrics_parse_and_count_the_requests_made(tmp_path):
    vocab = (HUB / BERT / "vocab.txt").read_bytes()
    with HubServer(HUB) as upstream, mirror(tmp_path / "mirror", upstream.endpoint) as server:
        base = server.endpoint
        received = 0
        for _ in range(2):
            received += len(httpx2.get(f"{base}/api/models/{BERT}").content)
        received += len(httpx2.get(f"{base}/api/models/{BERT}/tree/main").content)
        httpx2.head(f"{base}/{BERT}/resolve/main/vocab.txt")
        for _ in range(3):
            received += len(httpx2.get(f"{base}/{BERT}/resolve/main/vocab.txt").content)
        received += len(httpx2.get(f"{base}/{BERT}/resolve/main/nothing.bin").content)
        received += len(httpx2.get(f"{base}/healthz").content)
        samples = metrics(base)
        after = metrics(base)

    def requests(route: str, status: str) -> float:
        return samples.get(("hfcache_serve_requests_total", (("route", route), ("status", status))), 0)

    assert requests("repo_info", "200") == 2 and requests("tree", "200") == 1
    assert requests("resolve", "200") == 4 and requests("resolve", "404") == 1 and requests("healthz", "200") == 1
    assert requests("metrics", "200") == 0  # a scrape is counted once it is over
    assert after[("hfcache_serve_requests_total", (("route", "metrics"), ("status", "200")))] == 1
    assert samples[("hfcache_serve_bytes_served_total", ())] == received
    assert samples[("hfcache_serve_cache_misses_total", ())] == 1
    assert samples[("hfcache_serve_cache_hits_total", ())] == 2
    assert samples[("hfcache_upstream_resolutions_total", ())] == 1
    assert samples[("hfcache_upstream_fetches_total", ())] == 1
    assert samples[("hfcache_upstream_bytes_total", ())] == len(vocab)
    assert samples[("hfcache_verification_failures_total", ())] == 0
    assert samples[("hfcache_cache_bytes", ())] == len(vocab)
    assert samples[("hfcache_upstream_up", (("endpoint", upstream.endpoint),))] == 1
    assert sum(1 for r in upstream.requests if r.bytes_sent and "/resolve/" in r.path) == 1


# --- --max-size -------------------------------------------------------------------------------------------


def test_max_size_prunes_the_least_recently_served_revision(tmp_path):
    cache = tmp_path / "mirror"
    sizes = {repo: (HUB / repo / "vocab.txt").stat().st_size for repo in (BERT, "google-bert/bert-base-chinese")}
    gpt2 = (HUB / GPT2 / "vocab.json").stat().st_size
    budget = sizes[BERT] + gpt2 + 1000  # room for two of the three files
    with HubServer(HUB) as upstream, mirror(cache, upstream.endpoint, max_size=budget) as server:
        def get(repo: str, path: str) -> None:
            assert httpx2.get(f"{server.endpoint}/{repo}/resolve/main/{path}").status_code == 200

        get(BERT, "vocab.txt")
        time.sleep(1.2)
        get("google-bert/bert-base-chinese", "vocab.txt")
        time.sleep(1.2)
        get(BERT, "vocab.txt")  # served again: now the most recently used
        time.sleep(1.2)
        get(GPT2, "vocab.json")
        deadline = time.monotonic() + 20
        while folder(cache, "google-bert/bert-base-chinese").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    assert not folder(cache, "google-bert/bert-base-chinese").exists()
    assert (folder(cache, BERT) / "refs" / "main").exists() and (folder(cache, GPT2) / "refs" / "main").exists()
    verify(cache)


# --- CLI --------------------------------------------------------------------------------------------------


def test_pull_through_cli_errors(tmp_path):
    cache = str(tmp_path / "cache")
    allow_alone = run_hfcache(["serve", "--cache-dir", cache, "--allow", "x/*"])
    bad_url = run_hfcache(["serve", "--cache-dir", cache, "--upstream", "ftp://example.invalid", "--port", "0"])
    with_repos = run_hfcache(["serve", "--repos", str(HUB), "--upstream", "http://127.0.0.1:1"])
    bad_size = run_hfcache(["serve", "--cache-dir", cache, "--upstream", "http://127.0.0.1:1", "--max-size", "lots"])
    empty = tmp_path / "empty"
    empty.write_text("")
    empty_token = run_hfcache(["serve", "--cache-dir", cache, "--upstream", "http://127.0.0.1:1",
                               "--upstream-token-file", str(empty)])

    for proc in (allow_alone, bad_url, with_repos, bad_size, empty_token):
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
    assert "--upstream" in allow_alone.stderr and "invalid endpoint" in bad_url.stderr
    assert "--upstream-token-file" in empty_token.stderr
    assert not os.path.exists(cache)  # refused before anything was created
