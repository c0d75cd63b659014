"""warm's visible proof of what it asked: ``requests`` per repo and in total, equal to what the servers logged.

Every HTTP request warm sends (repo info, tree pages, HEADs, file bodies, each retry and each redirect hop to the
CDN origin) is counted for its repo (``hfcache/hub/retry.py`` ``count_request``); the test Hub keeps its own log of
every request it answered (``HubServer.requests``), so the two must agree. A lock the cache already satisfies asks
nothing: 0 requests, no endpoint named, and a summary line that says so. The endpoint that served a commit is
recorded in warm's published record, without credentials.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hfcache.cache.published import read_record, write_record
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.testhub import Faults, HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
TOKEN = "hf_n2RequestCountTokenNeverWritten"


def _warm(cache: Path, endpoints: list[str], *args: str, env: dict | None = None, json_out: bool = True):
    argv = ["warm", *args, "--cache-dir", str(cache), *(["--json"] if json_out else [])]
    for e in endpoints:
        argv += ["--endpoint", e]
    return run_hfcache(argv, env=env)


def _verified(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _mentions(server: HubServer, fragment: str) -> int:
    return sum(fragment in r.path for r in server.requests)


def test_every_request_is_counted_retries_redirects_and_heads_included(model_repos_root, tmp_path):
    """A repo of weights (LFS: each body is a redirect to the CDN origin, then the body) from a Hub that lists
    names only (one HEAD per file), rate-limits its first answers (429: retried) and fails the first body (503:
    retried): the count warm reports is exactly the number of requests the server logged."""
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    faults = Faults(no_blobs=True, no_tree=True, rate_limit=2, retry_after=0, failing_bodies=1)
    with HubServer(model_repos_root, faults=faults) as hub:
        proc = _warm(cache, [hub.endpoint], "hfcache-test/tiny-bert", "--kind", "model")
        seen = hub.requests
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    [repo] = report["repos"]
    assert {r.status for r in seen} >= {429, 503, 302}  # retries and redirects happened: each one is a request
    assert any(r.method == "HEAD" for r in seen) and any(r.origin == "cdn" for r in seen)
    assert repo["requests"] == report["requests"] == len(seen)
    assert repo["retries"] >= 3 and repo["endpoint"] == hub.endpoint
    canary.assert_unchanged()
    _verified(cache)


def test_two_endpoints_each_repo_names_the_one_that_served_it_and_counts_the_404(tmp_path):
    """The mirror holds gpt2 only: bert's 404 there counts as its request, the Hub serves it and is named."""
    canary = Canary(tmp_path)
    mirror_root = tmp_path / "mirror-hub"
    shutil.copytree(HUB / "openai-community" / "gpt2", mirror_root / "openai-community" / "gpt2")
    cache = tmp_path / "cache"
    with HubServer(mirror_root) as mirror, HubServer(HUB) as hub:
        proc = _warm(cache, [mirror.endpoint, hub.endpoint], "openai-community/gpt2", "google-bert/bert-base-uncased")
        mirror_log, hub_log = mirror.requests, hub.requests
        gpt2_on_mirror, bert_on_mirror = (sum(n in r.path for r in mirror_log) for n in ("gpt2", "bert"))
        bert_on_hub, gpt2_on_hub = (sum(n in r.path for r in hub_log) for n in ("bert", "gpt2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    rows = {r["repo_id"]: r for r in report["repos"]}
    gpt2, bert = rows["openai-community/gpt2"], rows["google-bert/bert-base-uncased"]
    assert gpt2["endpoint"] == mirror.endpoint and bert["endpoint"] == hub.endpoint
    assert any(r.status == 404 and "bert" in r.path for r in mirror_log)
    assert gpt2_on_hub == 0 and gpt2["requests"] == gpt2_on_mirror
    assert bert["requests"] == bert_on_mirror + bert_on_hub
    assert report["requests"] == len(mirror_log) + len(hub_log) == gpt2["requests"] + bert["requests"]
    # warm's record of each commit names the endpoint that served it (verify --repair fetches from there)
    for row, served in ((gpt2, mirror.endpoint), (bert, hub.endpoint)):
        folder = "models--" + row["repo_id"].replace("/", "--")
        assert read_record(cache, folder, row["commit_hash"]).endpoint == served
    canary.assert_unchanged()
    _verified(cache)


def test_table_and_summary_line_show_the_requests(tmp_path):
    cache = tmp_path / "cache"
    with HubServer(HUB) as hub:
        proc = _warm(cache, [hub.endpoint], "gpt2", json_out=False)
        seen = len(hub.requests)
    assert proc.returncode == 0, proc.stderr
    assert "requests" in proc.stdout.splitlines()[2]  # the table's header row
    assert f"0 failed; 2.7 MiB downloaded, {seen} requests in " in proc.stdout
    _verified(cache)


def test_a_satisfied_lock_asks_nothing_and_says_so(tmp_path):
    """warm --lock on a cache that holds the lock: 0 requests (the servers' logs stay empty), no endpoint named,
    and the summary line says the cache alone satisfied it; the same again with every endpoint gone."""
    canary = Canary(tmp_path)
    mirror_root = tmp_path / "mirror-hub"
    shutil.copytree(HUB / "google-t5" / "t5-small", mirror_root / "google-t5" / "t5-small")
    with HubServer(mirror_root) as mirror, HubServer(HUB) as hub:
        (tmp_path / "hfcache.toml").write_text(
            f'endpoint = ["{mirror.endpoint}", "{hub.endpoint}"]\ncache_dir = "cache"\n'
            '[[repos]]\nrepo_id = "google-t5/t5-small"\n[[repos]]\nrepo_id = "gpt2"\n')
        assert run_hfcache(["lock"], cwd=tmp_path).returncode == 0
        mirror.clear_log()
        hub.clear_log()
        first = run_hfcache(["warm", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        fetched = json.loads(first.stdout)
        assert fetched["requests"] == len(mirror.requests) + len(hub.requests) > 0
        assert not fetched["satisfied_by_cache"]
        mirror.clear_log()
        hub.clear_log()
        again = run_hfcache(["warm", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
        assert mirror.requests == [] and hub.requests == []
    report = json.loads(again.stdout)
    assert again.returncode == 0 and report["requests"] == 0 and report["satisfied_by_cache"]
    assert [(r["requests"], r["endpoint"]) for r in report["repos"]] == [(0, None), (0, None)]
    assert report["endpoints"] == [mirror.endpoint, hub.endpoint]  # configured, not asked
    text = run_hfcache(["warm", "--lock", "hfcache.lock"], cwd=tmp_path)  # both servers are gone now
    assert text.returncode == 0, text.stderr
    assert "2 ok; lock satisfied by the cache: 0 requests, 0 B downloaded in " in text.stdout
    canary.assert_unchanged()
    _verified(tmp_path / "cache")


def test_the_record_names_the_endpoint_but_never_a_token_or_credentials(tmp_path):
    """A warm with a token records the endpoint that served it and no token, anywhere in the cache; an endpoint
    with userinfo, a query or a fragment is recorded without them (the CLI refuses such an endpoint already: the
    record's writer strips them too, whoever calls it)."""
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    with HubServer(HUB) as hub:
        proc = _warm(cache, [hub.endpoint], "gpt2", env=clean_env(HF_TOKEN=TOKEN))
        authorized = [r.authorized for r in hub.requests if r.origin == "hub"]
    assert proc.returncode == 0, proc.stderr
    assert authorized and all(authorized)  # the token was sent to the endpoint it was given for...
    for path in cache.rglob("*"):  # ...and written nowhere
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path
    commit = json.loads(proc.stdout)["repos"][0]["commit_hash"]
    folder = "models--openai-community--gpt2"
    assert read_record(cache, folder, commit).endpoint == hub.endpoint
    rec = read_record(cache, folder, commit)
    write_record(cache, folder, commit, [], (), endpoint=f"https://user:{TOKEN}@mirror.example:8443/hub/?t={TOKEN}#x")
    raw = (cache / ".locks" / folder / "hfcache" / f"{commit}.json").read_text()
    assert TOKEN not in raw and "user" not in raw and json.loads(raw)["endpoint"] == "https://mirror.example:8443/hub"
    assert read_record(cache, folder, commit).files == rec.files
    canary.assert_unchanged()
    _verified(cache)
