"""``hfcache push s3://`` and ``hfcache pull s3://`` against a real S3-protocol server process (moto's, tests/s3.py),
with the real command and its request log:

- a round trip loads offline and verifies, and a second pull of it sends no request;
- a second push of overlapping repos uploads only the blobs the bucket lacks;
- an object altered in the bucket is refused on pull, and the repo is not published;
- a pull killed with SIGKILL mid-blob resumes from the bytes on disk; a large blob goes up as a multipart upload;
- the credentials appear in no output, no object of the bucket and no file of the cache;
- bad URLs, registry options and missing credentials are one-line errors with their exit codes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, offline_load, run_hfcache
from tests.s3 import ACCESS_KEY, SECRET_KEY, moto_server
from tests.testhub import HubServer

pytestmark = pytest.mark.slow

HUB = Path(__file__).parent.parent / "data" / "hub"
GPT2, BERT, DISTIL = "openai-community/gpt2", "google-bert/bert-base-uncased", "distilbert/distilbert-base-uncased"
MiB = 1024 * 1024
BIG = 96 * MiB


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    """A cache warmed from the test Hub: gpt2, bert (legacy id and canonical folders), distilbert, and acme/big with
    a 96 MiB weight file."""
    hub = tmp_path_factory.mktemp("s3hub")
    for org in ("openai-community", "google-bert", "distilbert"):
        shutil.copytree(HUB / org, hub / org)
    shutil.copy(HUB / "legacy_ids.json", hub / "legacy_ids.json")
    shutil.copytree(HUB / "openai-community" / "gpt2", hub / "acme" / "big")
    (hub / "acme" / "big" / "model.safetensors").write_bytes(os.urandom(BIG))
    root = tmp_path_factory.mktemp("s3seed") / "cache"
    with HubServer(hub) as server:
        requests = [WarmRequest.parse(r) for r in (GPT2, "bert-base-uncased", DISTIL)]
        requests.append(WarmRequest("acme/big", kind="all"))
        assert hfcache.warm(requests, cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


def run(s3, args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return run_hfcache(args, env=clean_env(**s3.env(**extra)), timeout=180)


def ok_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def refused(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    for needle in needles:
        assert needle in first, proc.stderr


def blob_puts(lines: list[str]) -> list[str]:
    """The blob keys written (single PUTs and multipart completions), from request lines."""
    keys = []
    for line in lines:
        method, target = line.split(" ", 1)
        path, _, query = target.partition("?")
        if "/blobs/" in path and ((method == "PUT" and "partNumber" not in query) or
                                  (method == "POST" and "uploadId" in query)):
            keys.append(path.rsplit("/", 1)[1])
    return keys


def test_round_trip_loads_offline_and_a_second_pull_sends_nothing(s3, seed, tmp_path):
    bucket = s3.bucket("round-trip")
    pushed = ok_json(run(s3, ["push", f"s3://{bucket}/hf", GPT2, BERT, "bert-base-uncased", DISTIL,
                              "--cache-dir", str(seed), "--json"]))
    assert pushed["blobs_uploaded"] > 0 and pushed["blobs_present"] == 0
    assert "models--openai-community--gpt2/main" in pushed["refs"]
    target = tmp_path / "cache"
    mark = s3.mark()
    pulled = ok_json(run(s3, ["pull", f"s3://{bucket}/hf", "--cache-dir", str(target), "--json"]))
    assert pulled["ok"] and len(pulled["repos"]) == 4
    gets = [r for r in s3.requests(mark) if r.startswith("GET ") and "/blobs/" in r]
    assert gets, "the blobs came from the bucket"
    verified = run(s3, ["verify", "--cache-dir", str(target), "--json"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    loads = offline_load(target, [GPT2, "bert-base-uncased", BERT, DISTIL])
    assert all("input_ids" in r for r in loads.values()), loads
    mark = s3.mark()
    again = ok_json(run(s3, ["pull", f"s3://{bucket}/hf", "--cache-dir", str(target), "--json"]))
    assert again["ok"] and not [r for r in s3.requests(mark) if "/blobs/" in r], "a satisfied pull fetched a blob"


def test_one_repo_by_ref_and_by_commit(s3, seed, tmp_path):
    bucket = s3.bucket("by-ref")
    ok_json(run(s3, ["push", f"s3://{bucket}", GPT2, DISTIL, "--cache-dir", str(seed), "--json"]))
    commit = (seed / "models--openai-community--gpt2" / "refs" / "main").read_text()
    target = tmp_path / "cache"
    ok_json(run(s3, ["pull", f"s3://{bucket}", f"{GPT2}@main", "--cache-dir", str(target), "--json"]))
    assert (target / "models--openai-community--gpt2" / "refs" / "main").read_text() == commit
    assert not (target / "models--distilbert--distilbert-base-uncased").exists()
    other = tmp_path / "other"
    ok_json(run(s3, ["pull", f"s3://{bucket}", f"{GPT2}@{commit}", "--cache-dir", str(other), "--json"]))
    assert (other / "models--openai-community--gpt2" / "snapshots" / commit / "tokenizer.json").is_file()
    assert not (other / "models--openai-community--gpt2" / "refs" / "main").exists()
    refused(run(s3, ["pull", f"s3://{bucket}", f"{GPT2}@v9", "--cache-dir", str(other)]), 3, "no ref or snapshot")
    refused(run(s3, ["pull", f"s3://{bucket}", "acme/none", "--cache-dir", str(other)]), 3, "no snapshot of acme/none")


def test_a_second_push_of_overlapping_repos_uploads_only_new_blobs(s3, seed):
    bucket = s3.bucket("overlap")
    first = ok_json(run(s3, ["push", f"s3://{bucket}/p", "bert-base-uncased", "--cache-dir", str(seed), "--json"]))
    mark = s3.mark()
    second = ok_json(run(s3, ["push", f"s3://{bucket}/p", "bert-base-uncased", BERT, DISTIL,
                              "--cache-dir", str(seed), "--json"]))
    sent = blob_puts(s3.requests(mark))
    bert_blobs = {p.name for p in (seed / "models--bert-base-uncased" / "blobs").iterdir()}
    distil_blobs = {p.name for p in (seed / "models--distilbert--distilbert-base-uncased" / "blobs").iterdir()}
    assert first["blobs_uploaded"] == len(bert_blobs)
    assert set(sent) == distil_blobs - bert_blobs, "only the blobs the bucket lacked were written"
    assert second["blobs_uploaded"] == len(sent) and second["blobs_present"] == len(bert_blobs)


def test_a_tampered_blob_is_refused_and_nothing_is_published(s3, seed, tmp_path):
    bucket = s3.bucket("tampered")
    ok_json(run(s3, ["push", f"s3://{bucket}", GPT2, "--cache-dir", str(seed), "--json"]))
    folder = seed / "models--openai-community--gpt2"
    blob = next(p for p in (folder / "blobs").iterdir() if p.stat().st_size > 1000)
    data = bytearray(blob.read_bytes())
    data[100] ^= 1
    s3.client().put_object(Bucket=bucket, Key=f"blobs/{blob.name}", Body=bytes(data))
    target = tmp_path / "cache"
    proc = run(s3, ["pull", f"s3://{bucket}", "--cache-dir", str(target), "--json"])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["repos"][0]
    assert "hash" in result["error"] and result["error_type"] == "IntegrityError", result
    gpt2 = target / "models--openai-community--gpt2"
    assert not (gpt2 / "refs").exists() and not any((gpt2 / "snapshots").glob("*/*")), "nothing is published"
    assert not (gpt2 / "blobs" / blob.name).exists()


def test_a_manifest_about_another_repo_is_refused(s3, seed, tmp_path):
    bucket = s3.bucket("foreign-manifest")
    ok_json(run(s3, ["push", f"s3://{bucket}", GPT2, "--cache-dir", str(seed), "--json"]))
    client = s3.client()
    commit = (seed / "models--openai-community--gpt2" / "refs" / "main").read_text()
    key = f"snapshots/models--openai-community--gpt2/{commit}.json"
    manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    client.put_object(Bucket=bucket, Key=f"snapshots/models--acme--victim/{commit}.json",
                      Body=json.dumps(manifest).encode())
    proc = run(s3, ["pull", f"s3://{bucket}", "acme/victim", "--cache-dir", str(tmp_path / "c")])
    refused(proc, 3, "not its key's")
    assert not (tmp_path / "c" / "models--acme--victim").exists()


def test_a_killed_pull_resumes_and_a_large_blob_goes_up_in_parts(s3, seed, tmp_path):
    bucket = s3.bucket("resume")
    mark = s3.mark()
    ok_json(run(s3, ["push", f"s3://{bucket}", "acme/big", "--cache-dir", str(seed), "--json"]))
    assert any("uploadId" in r and r.startswith("POST") for r in s3.requests(mark)), "a multipart upload"
    etag = next(p.name for p in (seed / "models--acme--big" / "blobs").iterdir() if p.stat().st_size == BIG)
    target = tmp_path / "cache"
    record = target / ".locks" / "models--acme--big" / f"{etag}.extents.json"
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "pull", f"s3://{bucket}", "--cache-dir", str(target),
                             "--json"], env=clean_env(**s3.env()), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and _recorded(record) < MiB:
            time.sleep(0.002)
        os.kill(s3.pid, signal.SIGSTOP)  # the server stalls: the pull cannot finish before it is killed
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        os.kill(s3.pid, signal.SIGCONT)
    kept = _recorded(record)
    assert not (target / "models--acme--big" / "refs").exists(), "a killed pull published nothing"
    mark = s3.mark()
    again = ok_json(run(s3, ["pull", f"s3://{bucket}", "--cache-dir", str(target), "--json"]))
    assert again["ok"]
    downloaded = again["repos"][0]["bytes_downloaded"]
    assert kept > 0 and downloaded < BIG + 2 * MiB - kept // 2, (kept, downloaded)
    ranges = [r for r in s3.requests(mark) if f"/blobs/{etag}" in r]
    assert ranges, "the rest of the blob came from the bucket"
    blob = target / "models--acme--big" / "blobs" / etag
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == etag


def _recorded(record: Path) -> int:
    """Bytes the extent record beside a download says are on disk (0: none yet)."""
    try:
        return sum(end - start for start, end in json.loads(record.read_text())["extents"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def test_credentials_appear_in_no_output_object_or_cache_file(s3, seed, tmp_path):
    bucket = s3.bucket("secrets")
    outputs = [run(s3, ["push", f"s3://{bucket}/x", GPT2, "--cache-dir", str(seed), "--json"]),
               run(s3, ["push", f"s3://{bucket}/x", GPT2, "--cache-dir", str(seed)]),
               run(s3, ["pull", f"s3://{bucket}/x", "--cache-dir", str(tmp_path / "c")]),
               run(s3, ["pull", f"s3://{bucket}/x", "--cache-dir", str(tmp_path / "c"), "--json"]),
               run(s3, ["pull", f"s3://{bucket}/missing", "--cache-dir", str(tmp_path / "d")]),
               run(s3, ["pull", "s3://no-such-bucket-here/x", "--cache-dir", str(tmp_path / "d")])]
    assert outputs[0].returncode == 0 and outputs[2].returncode == 0
    client = s3.client()
    for proc in outputs:
        for secret in (ACCESS_KEY, SECRET_KEY, "X-Amz-Signature", "X-Amz-Credential"):
            assert secret not in proc.stdout + proc.stderr
    for item in client.list_objects_v2(Bucket=bucket)["Contents"]:
        body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        assert ACCESS_KEY.encode() not in body and SECRET_KEY.encode() not in body
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file() and not path.is_symlink():
            content = path.read_bytes()
            assert ACCESS_KEY.encode() not in content and SECRET_KEY.encode() not in content, path


def test_bad_input_is_one_line_with_its_exit_code(s3, seed, tmp_path):
    cache = ["--cache-dir", str(seed)]
    refused(run(s3, ["push", "s3://Bad_Bucket/x", GPT2, *cache]), 2, "not a valid bucket name")
    refused(run(s3, ["push", "s3://good-bucket/a/../b", GPT2, *cache]), 2, "prefix")
    refused(run(s3, ["push", "s3://good-bucket/x", GPT2, "--base", "img", *cache]), 2, "--base applies to a registry")
    refused(run(s3, ["pull", "s3://good-bucket/x", "--verify-key", __file__, *cache]), 2, "--verify-key")
    refused(run(s3, ["pull", "localhost:5000/x:1", GPT2, *cache]), 2, "from a bucket (s3://) only")
    refused(run(s3, ["push", "s3://no-such-bucket-here/x", GPT2, *cache]), 3, "no such bucket")
    env = {k: v for k, v in clean_env(**s3.env()).items() if not k.startswith("AWS_ACCESS") and "SECRET" not in k}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    proc = run_hfcache(["push", "s3://good-bucket/x", GPT2, *cache], env=env, timeout=120)
    refused(proc, 2, "no usable S3 credentials")


def test_a_bad_endpoint_an_empty_prefix_and_a_clashing_manifest(s3, seed, tmp_path):
    bucket = s3.bucket("odd-inputs")
    target = ["--cache-dir", str(tmp_path / "c")]
    refused(run(s3, ["pull", f"s3://{bucket}/hf", *target], AWS_ENDPOINT_URL="notaurl"), 2, "not a URL")
    refused(run(s3, ["pull", f"s3://{bucket}/nothing-here", *target]), 3, "holds no snapshot")
    ok_json(run(s3, ["push", f"s3://{bucket}", GPT2, "--cache-dir", str(seed), "--json"]))
    client = s3.client()
    commit = (seed / "models--openai-community--gpt2" / "refs" / "main").read_text()
    key = f"snapshots/models--openai-community--gpt2/{commit}.json"
    manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    manifest["absent"] = sorted([*manifest["absent"], "config.json"])
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest).encode())
    refused(run(s3, ["pull", f"s3://{bucket}", *target]), 3, "both a file and absent")
    assert not (tmp_path / "c" / "models--openai-community--gpt2" / "refs").exists()
