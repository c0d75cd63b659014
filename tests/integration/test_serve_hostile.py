"""serve against hostile clients (docs/security.md): odd names on error paths, and connections that never finish.

The mirror's protocol runs in-process on both stacks (uvicorn is what ``hfcache serve`` runs); the clients are real
sockets and huggingface_hub itself.
"""

from __future__ import annotations

import io
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError

import hfcache
from hfcache.records import WarmRequest
from hfcache.serve import asgi
from tests.helpers import run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
REPO = "google-bert/bert-base-uncased"


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("serve-hostile") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=cache, endpoint=server.endpoint, token=False).ok
    return cache


@pytest.mark.parametrize("backend", ["uvicorn", "werkzeug"])
@pytest.mark.parametrize("name", ["日本語.txt", "a%0D%0AX-Evil: 1", "é\u2028\u0085.json"])
def test_a_missing_file_with_any_name_gets_the_protocols_404(warmed, tmp_path, backend, name):
    log = io.StringIO()
    with HubServer(warmed, layout="cache", backend=backend, lfs_redirect=False, access_log=log) as server:
        quoted = urllib.parse.quote(name, safe="%")
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(f"{server.endpoint}/{REPO}/resolve/main/{quoted}", timeout=30)
        assert raised.value.code == 404
        assert raised.value.headers["X-Error-Code"] == "EntryNotFound"
        assert "X-Evil" not in raised.value.headers
        # huggingface_hub sees the Hub's error, not a server failure
        with pytest.raises(EntryNotFoundError):
            hf_hub_download(REPO, name.replace("%0D%0A", "\r\n"), endpoint=server.endpoint,
                            cache_dir=tmp_path / "client", token=False)
    lines = log.getvalue().splitlines()
    assert lines and all(line.split(" ")[3] == "404" for line in lines), lines
    assert run_hfcache(["verify", "--cache-dir", str(warmed)]).returncode == 0


def test_unfinished_requests_are_closed_and_connections_capped(warmed, monkeypatch):
    monkeypatch.setattr(asgi, "HEADER_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(asgi, "MAX_CONNECTIONS", 50)
    with HubServer(warmed, layout="cache", backend="uvicorn", lfs_redirect=False) as server:
        port = int(server.endpoint.rsplit(":", 1)[1])
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
            socks.append(s)
        started = time.monotonic()
        closed_at = []
        for s in socks:
            try:
                data = s.recv(100)
            except ConnectionResetError:
                data = b""
            closed_at.append(time.monotonic() - started)
            assert data == b"", data  # closed without an answer: no request was ever complete
            s.close()
        assert max(closed_at) < 20, max(closed_at)  # the whole storm is gone after the header timeout
        # A client that finishes its headers in time is served, and a keep-alive client between requests is not cut.
        with urllib.request.urlopen(f"{server.endpoint}/healthz", timeout=30) as response:
            assert response.status == 200
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(1000).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # idle past the header timeout, but between requests: keep-alive rules
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(1000).startswith(b"HTTP/1.1 200")
        s.close()


def test_the_defaults_are_bounded():
    assert asgi.HEADER_TIMEOUT_SECONDS <= 60
    assert 64 <= asgi.MAX_CONNECTIONS <= 4096
    assert asgi.MAX_REQUEST_HEAD_BYTES <= 64 * 1024


def _status_of(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("shape", ["one 100,000-byte header", "3,000 small headers"])
def test_a_request_head_over_16_kib_gets_431(warmed, shape):
    """uvicorn's h11 limit only bounds an incomplete head; a complete one of any size reached the app (200)."""
    with HubServer(warmed, layout="cache", backend="uvicorn", lfs_redirect=False) as server:
        port = int(server.endpoint.rsplit(":", 1)[1])
        path = f"/{REPO}/resolve/main/config.json"
        extra = (b"X-Big: " + b"a" * 100_000 + b"\r\n" if shape.startswith("one")
                 else b"".join(b"X-H%d: v\r\n" % i for i in range(3000)))
        head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
        assert _status_of(port, head + extra + b"\r\n") == b"HTTP/1.1 431 Request Header Fields Too Large"
        # a head just under the limit is served, so the bound is the documented one, not lower
        filler = b"X-Fill: " + b"a" * (asgi.MAX_REQUEST_HEAD_BYTES - len(head) - 200) + b"\r\n"
        assert _status_of(port, head + filler + b"\r\n") == b"HTTP/1.1 200 OK"


def test_a_thousand_level_marker_chain_never_breaks_serving(tmp_path):
    """``.no_exist/<commit>/`` is walked iteratively and to 64 levels (``cache/fsops.py``): a chain a cache
    member planted (Python 3.11's os.walk recursed per level: RecursionError) changes no answer."""
    cache = tmp_path / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(REPO)], cache_dir=cache, endpoint=server.endpoint, token=False).ok
    folder = cache / "models--google-bert--bert-base-uncased"
    commit = next((folder / "snapshots").iterdir()).name
    import os

    (folder / ".no_exist" / commit).mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".no_exist" / commit, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1000):  # relative to each new folder: no path ever grows past PATH_MAX
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    try:
        with HubServer(cache, layout="cache", backend="uvicorn", lfs_redirect=False) as served:
            path = hf_hub_download(REPO, "vocab.txt", cache_dir=tmp_path / "client", endpoint=served.endpoint,
                                   token=False)
            assert Path(path).read_bytes() == (folder / "snapshots" / commit / "vocab.txt").read_bytes()
    finally:  # remove the chain without recursion (pytest's cleanup would recurse): rm is iterative
        import subprocess

        subprocess.run(["rm", "-rf", str(folder / ".no_exist")], check=True)
