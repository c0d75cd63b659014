"""warm on a cache huggingface_hub 2.4 wrote through Xet: a file the shared store already holds is not downloaded
again, and the library's store links stay in place (huggingface_hub utils/_shared_blobs.py).

The caches are written by the unmodified huggingface_hub + hf_xet through the project's Xet test Hub
(tests/xet_caches.py), never by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache
from tests.xet_caches import LEGACY_IDS, library_download, store_linked_blobs, store_payloads, xet_hub

REPOS = ["bert-base-uncased", "openai-community/gpt2"]


def _body_requests(log) -> list:
    """GETs that carry file bytes: resolve/CDN bodies and CAS xorb ranges."""
    return [r for r in log if r.method == "GET" and (
        "/resolve/" in r.path or r.origin == "cdn" or r.path.startswith("/xorbs/"))]


def _links(cache: Path) -> dict[str, tuple[str, int]]:
    """Repo blob link -> (link text, payload inode)."""
    return {str(p.relative_to(cache)): (os.readlink(p), p.stat().st_ino) for p in store_linked_blobs(cache)}


def test_warm_after_the_library_downloads_nothing_and_keeps_the_store_links(tmp_path):
    cache = tmp_path / "cache"
    with xet_hub() as server:
        library_download(server.endpoint, cache, REPOS)
        links_before = _links(cache)
        payloads_before = {p: p.stat().st_ino for p in store_payloads(cache)}
        assert links_before and payloads_before
        mark = len(server.requests)
        proc = run_hfcache(["warm", *REPOS, "--endpoint", server.endpoint, "--cache-dir", str(cache), "--json"],
                           env=clean_env(HF_HOME=str(tmp_path / "home")))
        log = server.requests[mark:]
    assert proc.returncode == 0, proc.stderr
    assert _body_requests(log) == []  # not one file body: the store held every byte
    assert _links(cache) == links_before  # same link text, same payload inode
    assert {p: p.stat().st_ino for p in store_payloads(cache)} == payloads_before
    loaded = offline_load(cache, REPOS)
    for repo_id in REPOS:
        assert loaded[repo_id]["input_ids"] == golden_ids(repo_id, LEGACY_IDS.get(repo_id)), loaded[repo_id]


def test_a_legacy_id_warmed_beside_the_canonical_repo_shares_the_payloads(tmp_path):
    """The library wrote google-bert/bert-base-uncased through Xet; warm of the legacy id ``bert-base-uncased``
    takes the same bytes from the store (a hardlink of each payload: one copy on disk) instead of downloading."""
    cache = tmp_path / "cache"
    with xet_hub() as server:
        library_download(server.endpoint, cache, ["google-bert/bert-base-uncased"])
        payload_inodes = {p.stat().st_ino for p in store_payloads(cache)}
        mark = len(server.requests)
        proc = run_hfcache(["warm", "bert-base-uncased", "--endpoint", server.endpoint, "--cache-dir", str(cache)],
                           env=clean_env(HF_HOME=str(tmp_path / "home")))
        log = server.requests[mark:]
    assert proc.returncode == 0, proc.stderr
    assert _body_requests(log) == []
    legacy_blobs = [p for p in (cache / "models--bert-base-uncased" / "blobs").iterdir()]
    assert legacy_blobs and {p.stat().st_ino for p in legacy_blobs} <= payload_inodes
    assert offline_load(cache, ["bert-base-uncased"])["bert-base-uncased"]["input_ids"] == golden_ids(
        "bert-base-uncased", LEGACY_IDS["bert-base-uncased"])


def test_a_store_payload_of_the_wrong_size_is_not_trusted_and_the_file_is_downloaded(tmp_path):
    cache = tmp_path / "cache"
    with xet_hub() as server:
        library_download(server.endpoint, cache, ["google-bert/bert-base-uncased"])
        for payload in store_payloads(cache):
            payload.chmod(0o644)
            payload.write_bytes(payload.read_bytes()[:-1])  # one byte short: hf_xet's size check would refuse it
        mark = len(server.requests)
        proc = run_hfcache(["warm", "bert-base-uncased", "--endpoint", server.endpoint, "--cache-dir", str(cache)],
                           env=clean_env(HF_HOME=str(tmp_path / "home")))
        log = server.requests[mark:]
    assert proc.returncode == 0, proc.stderr
    assert _body_requests(log)  # downloaded, hashed, published as regular blobs
    legacy = cache / "models--bert-base-uncased" / "blobs"
    assert all(p.is_file() and not p.is_symlink() for p in legacy.iterdir())
    assert offline_load(cache, ["bert-base-uncased"])["bert-base-uncased"]["input_ids"] == golden_ids(
        "bert-base-uncased", LEGACY_IDS["bert-base-uncased"])


def test_warm_from_a_xet_endpoint_hashes_every_byte_and_loads_offline(tmp_path):
    """hfcache itself downloads over the plain path (the bridge redirect of a Xet endpoint), hashes every byte
    against its sha256 / git-sha1 before publishing, and a second warm --lock makes no request."""
    cache = tmp_path / "cache"
    env = clean_env(HF_HOME=str(tmp_path / "home"))
    with xet_hub() as server:
        proc = run_hfcache(["warm", *REPOS, "--endpoint", server.endpoint, "--cache-dir", str(cache)], env=env)
        assert proc.returncode == 0, proc.stderr
        assert run_hfcache(["verify", "--cache-dir", str(cache)], env=env).returncode == 0
    loaded = offline_load(cache, REPOS)
    for repo_id in REPOS:
        assert loaded[repo_id]["input_ids"] == golden_ids(repo_id, LEGACY_IDS.get(repo_id))


def test_a_pull_through_mirror_of_a_xet_endpoint_answers_without_xet_headers(tmp_path):
    """Clients behind a mirror that passes Xet headers through go to a CAS they may not reach and hang or fail
    (huggingface_hub#4475, padeoe/hf-mirror-site#64): the mirror answers with its own bytes and no Xet header, so
    the unmodified huggingface_hub + hf_xet behind it download over the plain path."""
    from hfcache.serve.pullthrough import PullThroughConfig
    from tests.testhub import HubServer

    (tmp_path / "mirror").mkdir()
    with xet_hub() as upstream, HubServer(tmp_path / "mirror", layout="cache",
                                          upstream=PullThroughConfig(upstreams=(upstream.endpoint,))) as mirror:
        import httpx2
        head = httpx2.head(f"{mirror.endpoint}/google-bert/bert-base-uncased/resolve/main/vocab.txt",
                           follow_redirects=False)
        assert head.status_code in (200, 302, 307) and not [h for h in head.headers if h.lower().startswith("x-xet")]
        assert "xet-auth" not in head.headers.get("link", "")
        mark = len(upstream.requests)
        library_download(mirror.endpoint, tmp_path / "client", ["google-bert/bert-base-uncased"])
        mirror_log = mirror.requests
    assert not any("xet-read-token" in r.path for r in mirror_log)
    assert not [r for r in upstream.requests[mark:] if r.origin == "cas"]  # the mirror fetched over the plain path
    assert not (tmp_path / "client" / "blobs").exists()  # no Xet download, so no shared store on the client
    assert offline_load(tmp_path / "client", ["google-bert/bert-base-uncased"])[
        "google-bert/bert-base-uncased"]["input_ids"] == golden_ids("google-bert/bert-base-uncased")


def test_lock_and_warm_lock_from_a_xet_endpoint_then_zero_requests(tmp_path):
    """The lock records every file's size and sha256 / git-sha1 from a Xet endpoint's listing; warm --lock installs
    it with every byte hashed, and a second warm --lock on the complete cache asks nothing."""
    cache = tmp_path / "cache"
    env = clean_env(HF_HOME=str(tmp_path / "home"))
    with xet_hub() as server:
        (tmp_path / "hfcache.toml").write_text(
            f'endpoint = "{server.endpoint}"\ncache_dir = "{cache}"\n[[repos]]\nrepo_id = "openai-community/gpt2"\n')
        proc = run_hfcache(["lock"], env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        lock = (tmp_path / "hfcache.lock").read_text()
        assert "sha256:" in lock or "git-sha1:" in lock
        first = run_hfcache(["warm", "--lock", "hfcache.lock", "--locked"], env=env, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        mark = len(server.requests)
        again = run_hfcache(["warm", "--lock", "hfcache.lock", "--locked"], env=env, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert server.requests[mark:] == []
    assert run_hfcache(["verify", "--cache-dir", str(cache)], env=env).returncode == 0
