"""Bounds on what a Hub endpoint answers the Hub client: a whole metadata answer (headers included) within the deadline
and the next --endpoint tried, a whole tree listing bounded (entries, bytes, time), listing paths within the folder
bound the other commands enforce. Each test builds the hostile endpoint itself (a small Hub below, on
tests/hostile.py's ``PeerServer``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from urllib.parse import quote

import httpx2
import pytest

from hfcache.serve.pullthrough import PullThroughConfig
from tests.helpers import clean_env, run_hfcache
from tests.hostile import CONTENT, PeerServer, git_sha1
from tests.testhub import HubServer

REPO = "org/x"
C = "c" * 40


class Hub(PeerServer):
    """``org/x`` at commit ``C``. ``mode``: ``honest``; ``drip_headers`` (status line, then a header line every
    ``drip`` s, never done); ``tree_pages`` (names-only repo info, then tree pages of ``per_page`` entries linked
    for ever); ``deep`` (one file ``path`` listed). Dripped headers, endless listings and listed paths no folder holds
    are nothing the test Hub sends."""

    def __init__(self, mode: str = "honest", *, drip: float = 1.0, per_page: int = 1000,
                 path: str = "tokenizer.json") -> None:
        self.mode, self.drip, self.per_page, self.path = mode, drip, per_page, path
        self.pages = 0
        self.requests: list[str] = []
        super().__init__()

    def _record(self, h) -> None:
        self.requests.append(h.path)

    def _send(self, h, body: bytes, headers: dict[str, str] | None = None, head: bool = False,
              status: int = 200) -> None:
        h.send_response(status)
        for key, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
            h.send_header(key, value)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _drip_headers(self, h) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        h.wfile.flush()
        n = 0
        while not self.stop.wait(self.drip):
            n += 1
            h.wfile.write(b"X-Drip-%d: x\r\n" % n)
            h.wfile.flush()

    def _answer(self, h, head: bool) -> None:
        path = h.path.split("?")[0]
        if self.mode == "drip_headers":
            self._drip_headers(h)
            return
        if path.startswith(f"/api/models/{REPO}/revision/"):
            size = len(CONTENT) + (5 if self.mode == "badpath" else 0)  # badpath: the fetch fails its size check
            if self.mode == "tree_pages":
                siblings = [{"rfilename": "tokenizer.json"}]
            else:
                siblings = [{"rfilename": self.path, "size": size, "blobId": git_sha1(CONTENT)}]
            self._send(h, json.dumps({"id": REPO, "sha": C, "siblings": siblings}).encode(),
                       {"Content-Type": "application/json"})
            return
        if path.startswith(f"/api/models/{REPO}/tree/"):
            self.pages += 1
            entries = [{"type": "file", "path": f"d/f{self.pages}-{i}.bin", "size": 1, "oid": "a" * 40}
                       for i in range(self.per_page)]
            link = f'<{self.endpoint}/api/models/{REPO}/tree/{C}?cursor={self.pages}>; rel="next"'
            self._send(h, json.dumps(entries).encode(), {"Content-Type": "application/json", "Link": link})
            return
        if path.startswith(f"/{REPO}/resolve/"):
            self._send(h, CONTENT, {"X-Repo-Commit": C, "ETag": f'"{git_sha1(CONTENT)}"'}, head)
            return
        self._send(h, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, head, status=404)


def _error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hfcache: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------- header drip


def test_a_drip_of_response_headers_fails_at_the_metadata_deadline(tmp_path):
    cache = tmp_path / "cache"
    with Hub("drip_headers", drip=1.0) as hub:
        started = time.monotonic()
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint, "--retries", "0",
                            "--timeout", "10"], env=clean_env(HFCACHE_METADATA_DEADLINE="3"), timeout=60)
        elapsed = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    line = _error_line(proc)
    assert "no complete answer within 3 s" in line and hub.endpoint in line, line
    assert elapsed < 15, f"took {elapsed:.1f}s with HFCACHE_METADATA_DEADLINE=3"


def test_a_header_drip_moves_on_to_the_next_endpoint(tmp_path):
    cache = tmp_path / "cache"
    with Hub("drip_headers", drip=1.0) as bad, Hub() as good:
        started = time.monotonic()
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", bad.endpoint,
                            "--endpoint", good.endpoint, "--retries", "0", "--timeout", "10"],
                           env=clean_env(HFCACHE_METADATA_DEADLINE="3"), timeout=60)
        elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 15, f"took {elapsed:.1f}s"
    assert (cache / "models--org--x" / "snapshots" / C / "tokenizer.json").read_bytes() == CONTENT


def test_a_header_drip_on_head_requests_fails_at_the_metadata_deadline():
    """``describe`` (one HEAD per file, via ``get_hf_file_metadata``) is bounded too."""
    from hfcache.errors import EndpointUnreachable
    from hfcache.hub.client import HubClient
    from hfcache.hub.files import RepoRevision

    with Hub("drip_headers", drip=1.0) as hub:
        client = HubClient(hub.endpoint, timeout=10, retries=0)
        client.deadline = 2.0
        repo = RepoRevision(repo_id=REPO, canonical_id=REPO, repo_type="model", revision="main", commit_hash=C,
                            files=(), paths=("tokenizer.json",), metadata="head")
        started = time.monotonic()
        with pytest.raises(EndpointUnreachable) as caught:
            client.describe(repo, ["tokenizer.json"])
        assert time.monotonic() - started < 10
    assert "no complete answer within 2 s" in str(caught.value)


# ---------------------------------------------------------------------------------------------- tree pages


#: ``python -m hfcache`` with the listing's entry bound lowered (a million entries are too slow for a test).
LOWERED = ("import runpy, sys; import hfcache.hub.client as c; c.MAX_TREE_ENTRIES = 50_000; "
           "sys.argv[0] = 'hfcache'; runpy.run_module('hfcache', run_name='__main__')")


def test_an_endless_tree_listing_is_refused_at_the_entry_bound(tmp_path):
    cache = tmp_path / "cache"
    with Hub("tree_pages", per_page=20_000) as hub:
        proc = subprocess.run([sys.executable, "-c", LOWERED, "warm", REPO, "--cache-dir", str(cache),
                               "--endpoint", hub.endpoint, "--kind", "all"], capture_output=True, text=True,
                              env=clean_env(), timeout=120)
        pages = hub.pages
    assert proc.returncode == 3, proc.stderr
    line = _error_line(proc)
    assert "tree listing" in line and hub.endpoint in line and "more than 50000 entries" in line, line
    assert pages == 3, pages
    assert not list(cache.glob("*/snapshots/*"))


def test_the_tree_listing_entry_bound_holds_without_configuration():
    from hfcache.errors import HubError
    from hfcache.hub import client as hub_client

    with Hub("tree_pages", per_page=5_000) as hub:
        client = hub_client.HubClient(hub.endpoint, timeout=10, retries=0)
        old = hub_client.MAX_TREE_ENTRIES
        hub_client.MAX_TREE_ENTRIES = 12_000
        try:
            with pytest.raises(HubError) as caught:
                client.resolve(REPO)
        finally:
            hub_client.MAX_TREE_ENTRIES = old
    assert "more than 12000 entries" in str(caught.value) and hub.endpoint in str(caught.value)


def test_a_slow_endless_tree_listing_is_refused_at_the_listing_deadline():
    from hfcache.errors import EndpointUnreachable
    from hfcache.hub.client import HubClient

    with Hub("tree_pages", per_page=10) as hub:
        client = HubClient(hub.endpoint, timeout=10, retries=0)
        client.deadline = 0.5  # the whole listing: 0.5 s x LISTING_DEADLINE_PAGES
        started = time.monotonic()
        with pytest.raises(EndpointUnreachable) as caught:
            client.resolve(REPO)
        assert time.monotonic() - started < 30
    assert "tree listing" in str(caught.value) and hub.endpoint in str(caught.value)


# ---------------------------------------------------------------------------------------------- deep paths


@pytest.mark.parametrize("path", ["/".join(["d"] * 100) + "/f.json",
                                  "/".join(["n" * 200] * 30) + "/f.json",
                                  "a/" + "n" * 256 + "/f.json"])
def test_warm_refuses_a_listing_path_beyond_the_folder_bound(tmp_path, path):
    cache = tmp_path / "cache"
    with Hub("deep", path=path) as hub:
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint, "--kind", "all"],
                           env=clean_env(), timeout=60)
        resolves = [p for p in hub.requests if "/resolve/" in p]
    assert proc.returncode == 3, proc.stderr
    line = _error_line(proc)
    assert "unsafe repo file path" in line and hub.endpoint in line, line
    assert not resolves and not list(cache.glob("*/snapshots/*"))


def test_a_path_of_64_components_is_still_accepted():
    from hfcache.records import validate_repo_path

    path = "/".join(["d"] * 63) + "/f.json"
    assert validate_repo_path(path) == path


# ------------------------------------------------------------------------------------------ the mirror


def _mirror(cache, *upstreams: str, **options) -> HubServer:
    cache.mkdir(parents=True, exist_ok=True)
    return HubServer(cache, layout="cache", backend="uvicorn", lfs_redirect=False,
                     upstream=PullThroughConfig(upstreams=tuple(upstreams), **options))


def test_a_header_drip_upstream_frees_its_mirror_slots_at_the_deadline(tmp_path, monkeypatch):
    """Misses on an upstream dripping headers end at the deadline and free their slots; the next miss gets a
    slot and is served by the healthy second upstream."""
    monkeypatch.setenv("HFCACHE_METADATA_DEADLINE", "2")
    with Hub("drip_headers", drip=1.0) as drip, Hub() as good, \
            _mirror(tmp_path / "mirror", drip.endpoint, good.endpoint, timeout=10, upstream_slots=2) as server:
        first = [httpx2.get(f"{server.endpoint}/api/models/org/{name}/revision/main", timeout=30)
                 for name in ("a", "b")]
        time.sleep(3.0)  # the deadline (2 s) passed for both operations, plus a margin
        started = time.monotonic()
        late = httpx2.get(f"{server.endpoint}/api/models/{REPO}/revision/main", timeout=30)
        for _ in range(20):
            if late.status_code == 200:
                break
            time.sleep(0.5)
            late = httpx2.get(f"{server.endpoint}/api/models/{REPO}/revision/main", timeout=30)
        elapsed = time.monotonic() - started
    assert all(r.status_code in (503, 404) for r in first), [(r.status_code, r.text) for r in first]
    assert late.status_code == 200, (late.status_code, late.text)
    assert late.json()["sha"] == C
    assert elapsed < 15, elapsed


def test_the_mirror_error_body_carries_no_raw_control_character(tmp_path):
    name = "x\x1b[2K\rhfcache: ok: warmed all files\u2028\nhint: all good\n.json"
    with Hub("badpath", path=name) as hub, _mirror(tmp_path / "mirror", hub.endpoint, timeout=10) as server:
        listed = httpx2.get(f"{server.endpoint}/api/models/{REPO}/revision/main", timeout=30)
        answer = httpx2.get(f"{server.endpoint}/{REPO}/resolve/{C}/{quote(name)}", timeout=30)
    assert listed.status_code == 200, listed.text
    assert answer.status_code == 502, (answer.status_code, answer.text)
    error = answer.json()["error"]
    assert all(c.isprintable() and ord(c) < 128 for c in error), repr(error)
    assert "\\x1b[2K" in error, error  # escaped, as the header is
    assert all(0x20 <= b < 0x7f for b in answer.headers["x-error-message"].encode()), answer.headers
