"""``hfcache serve --store s3://...``: a Hub-compatible mirror whose store is a bucket (moto's S3 server process,
tests/s3.py), run as real ``hfcache serve`` processes:

- what ``push s3://`` wrote is served: warm and huggingface_hub download through it (bodies: 302s to presigned URLs),
  the caches load offline, and no credential reaches an output or the access log;
- three replicas with ``--upstream`` and concurrent ``warm`` clients spread over them: every cache verifies, and the
  upstream sent each file's body at most once;
- a lease left by a replica that died mid-fetch is taken over once it expires; ``--allow`` refuses with 403.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, offline_load, run_hfcache
from tests.s3 import ACCESS_KEY, SECRET_KEY, moto_server
from tests.served import served
from tests.testhub import HubServer

pytestmark = pytest.mark.slow

HUB = Path(__file__).parent.parent / "data" / "hub"
GPT2, DISTIL, ROBERTA = "openai-community/gpt2", "distilbert/distilbert-base-uncased", "FacebookAI/roberta-base"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


def warm(endpoint: str, cache: Path, *repos: str) -> subprocess.CompletedProcess:
    return run_hfcache(["warm", *repos, "--endpoint", endpoint, "--cache-dir", str(cache), "--json"], timeout=300)


def test_a_pushed_bucket_is_served_to_warm_and_huggingface_hub(s3, tmp_path):
    seed = tmp_path / "seed"
    with HubServer(HUB) as hub:
        assert hfcache.warm([WarmRequest.parse(GPT2), WarmRequest.parse(DISTIL)], cache_dir=seed,
                            endpoint=hub.endpoint, token=False).ok
    s3.bucket("served")
    env = clean_env(**s3.env())
    assert run_hfcache(["push", "s3://served/hf", "--cache-dir", str(seed)], env=env).returncode == 0
    log = tmp_path / "access.log"
    with served("--store", "s3://served/hf", "--access-log", str(log), env=env) as (endpoint, proc):
        cache = tmp_path / "cache"
        got = warm(endpoint, cache, GPT2, DISTIL)
        assert got.returncode == 0, got.stdout + got.stderr
        loads = offline_load(cache, [GPT2, DISTIL])
        assert all("input_ids" in r for r in loads.values()), loads
        script = ("import sys; from huggingface_hub import hf_hub_download; "
                  "print(hf_hub_download(sys.argv[1], 'tokenizer.json'))")
        hub_env = clean_env(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path / "hf"), HF_HUB_DISABLE_XET="1")
        fetched = subprocess.run([sys.executable, "-c", script, GPT2], env=hub_env, capture_output=True, text=True,
                                 timeout=120)
        assert fetched.returncode == 0, fetched.stderr
        assert Path(fetched.stdout.strip()).read_bytes() == \
            (cache / "models--openai-community--gpt2" / "snapshots").glob("*/tokenizer.json").__next__().read_bytes()
        missing = run_hfcache(["warm", "acme/absent", "--endpoint", endpoint, "--cache-dir", str(tmp_path / "x")])
        assert missing.returncode == 3 and "not found" in missing.stderr, missing.stderr
    lines = log.read_text().splitlines()
    assert any(" 302 " in line for line in lines), "file bodies are redirects"
    for text in (log.read_text(), proc.stdout.read() if proc.stdout else "", got.stdout + got.stderr):
        assert ACCESS_KEY not in text and SECRET_KEY not in text and "Signature" not in text


def _bodies_per_file(upstream: HubServer) -> Counter:
    counts: Counter = Counter()
    for r in upstream.requests:
        if r.method == "GET" and r.status in (200, 206) and r.bytes_sent and ("/resolve/" in r.path or r.origin == "cdn"):
            counts[r.path] += 1
    return counts


def test_three_replicas_fetch_each_upstream_file_at_most_once(s3, tmp_path):
    s3.bucket("replicas")
    env = clean_env(**s3.env())
    args = ["--store", "s3://replicas/hf", "--upstream"]
    with HubServer(HUB) as upstream, ExitStack() as stack:
        endpoints = [stack.enter_context(served(*args, upstream.endpoint, env=env))[0] for _ in range(3)]
        repos = [GPT2, DISTIL, ROBERTA]

        def client(n: int) -> subprocess.CompletedProcess:
            return warm(endpoints[n % 3], tmp_path / f"client-{n}", repos[n % 3], repos[(n + 1) % 3])

        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(client, range(12)))
        for proc in results:
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        counts = _bodies_per_file(upstream)
        assert counts and max(counts.values()) == 1, counts
    for n in range(12):
        verified = run_hfcache(["verify", "--cache-dir", str(tmp_path / f"client-{n}")])
        assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_expired_lease_is_taken_over_and_allow_refuses(s3, tmp_path):
    s3.bucket("leases")
    env = clean_env(**s3.env())
    with HubServer(HUB) as upstream, served("--store", "s3://leases/hf", "--upstream", upstream.endpoint,
                                             "--allow", "openai-community/*", env=env) as (endpoint, _proc):
        info = json.loads(run_hfcache(["warm", GPT2, "--endpoint", endpoint, "--cache-dir", str(tmp_path / "a"),
                                       "--json"]).stdout)
        assert info["ok"], info
        etag = next(f["hash"].split(":", 1)[1] for f in info["repos"][0]["files"] if f["path"] == "merges.txt")
        client = s3.client()
        client.delete_object(Bucket="leases", Key=f"hf/blobs/{etag}")
        client.put_object(Bucket="leases", Key=f"hf/upstream/leases/{etag}",
                          Body=json.dumps({"owner": "dead", "expires": time.time() - 1}).encode())
        again = warm(endpoint, tmp_path / "b", GPT2)
        assert again.returncode == 0, again.stdout + again.stderr
        assert client.head_object(Bucket="leases", Key=f"hf/blobs/{etag}")["ContentLength"] > 0
        refused = run_hfcache(["warm", DISTIL, "--endpoint", endpoint, "--cache-dir", str(tmp_path / "c")])
        assert refused.returncode == 3 and "refused by the mirror" in refused.stderr and "--allow" in refused.stderr


def test_a_wrong_size_object_is_replaced_once_and_allow_covers_lost_blobs(s3, tmp_path):
    s3.bucket("repairs")
    env = clean_env(**s3.env())
    client = s3.client()
    with HubServer(HUB) as upstream:
        with served("--store", "s3://repairs/hf", "--upstream", upstream.endpoint, env=env) as (endpoint, _proc):
            info = json.loads(warm(endpoint, tmp_path / "a", GPT2).stdout)
            etag = next(f["hash"].split(":", 1)[1] for f in info["repos"][0]["files"] if f["path"] == "vocab.json")
            client.put_object(Bucket="repairs", Key=f"hf/blobs/{etag}", Body=b"truncated")
            before = _bodies_per_file(upstream)
            for n in range(3):
                again = warm(endpoint, tmp_path / f"b{n}", GPT2)
                assert again.returncode == 0, again.stdout + again.stderr
            fetched = _bodies_per_file(upstream) - before
            assert sum(n for path, n in fetched.items() if path.endswith("/vocab.json")) == 1, fetched
        pushed = run_hfcache(["push", "s3://repairs/hf", GPT2, "--cache-dir", str(tmp_path / "a")], env=env)
        assert pushed.returncode == 0, pushed.stderr
        client.delete_object(Bucket="repairs", Key=f"hf/blobs/{etag}")  # a lifecycle rule took it
        with served("--store", "s3://repairs/hf", "--upstream", upstream.endpoint, "--allow", "google-bert/*",
                    env=env) as (endpoint, _proc):
            before = len(upstream.requests)
            refused = warm(endpoint, tmp_path / "c", GPT2)
            assert refused.returncode == 3 and "--allow" in refused.stdout, refused.stdout + refused.stderr
            assert not [r for r in upstream.requests[before:] if "/resolve/" in r.path], "upstream was not asked"
