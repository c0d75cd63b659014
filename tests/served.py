"""``hfcache serve`` as a user runs it, for the tests of the server and its mirror: the command in a subprocess
(:func:`served`), requests sent byte for byte (:func:`raw_request`), and what its access log lines and a traversal
attempt look like."""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import clean_env

PROJECT = Path(__file__).parents[1]
BERT = "google-bert/bert-base-uncased"


ACCESS_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (GET|HEAD|POST) \S+ \d{3} \d+ \d+\.\d{3}$")


@contextmanager
def served(*args: str, env: dict[str, str] | None = None,
           check_exit: bool = True) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run ``python -m hfcache serve ARGS --port 0``; yield (endpoint, process); SIGTERM it afterwards."""
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "serve", *args, "--port", "0"], cwd=PROJECT,
                            env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        match = re.search(r" at (http://\S+)$", line.strip())
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        yield match.group(1), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        if check_exit:
            assert code == 0, proc.stderr.read()


def raw_request(endpoint: str, target: str, method: str = "GET", headers: dict[str, str] | None = None
                ) -> tuple[int, dict[str, str], bytes]:
    """Send a request target byte for byte (httpx would normalise '..' away); (status, headers, body)."""
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, target, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


TRAVERSALS = [
    f"/{BERT}/resolve/main/../../../../outside/secret.txt",
    f"/{BERT}/resolve/main/%2e%2e/%2e%2e/%2e%2e/%2e%2e/outside/secret.txt",
    f"/{BERT}/resolve/main/..%2F..%2F..%2F..%2Foutside%2Fsecret.txt",
    f"/{BERT}/resolve/main/..%5C..%5C..%5Coutside%5Csecret.txt",
    f"/{BERT}/resolve/main//etc/passwd",
    f"/{BERT}/resolve/main/%2Fetc%2Fpasswd",
    f"/{BERT}/resolve/..%2F..%2F..%2F..%2Fetc/passwd",
    f"/{BERT}/resolve/refs%2F..%2F..%2F..%2F..%2Fetc/passwd",
    "/google-bert/..%2F..%2F..%2Foutside/resolve/main/secret.txt",
    "/%2e%2e/%2e%2e/resolve/main/outside/secret.txt",
    "/..%2F..%2Foutside/resolve/main/secret.txt",
    "/api/models/..%2F..%2F..%2Fetc/tree/main",
    f"/api/models/{BERT}/tree/main/..%2F..%2F..?recursive=true",
    f"/api/models/{BERT}/revision/..%2F..%2F..%2Fetc%2Fpasswd",
    "/http://example.invalid/etc/passwd",
    f"/{BERT}/resolve/main/vocab.txt",  # its blob is a symlink to the secret
    f"/{BERT}/resolve/main/absolute.txt",
    f"/{BERT}/resolve/main/relative.txt",
    "/evil/repo/resolve/main/config.json",
    "/api/models/evil/repo",
    "/evil/shadow/resolve/main/config.json",
    "/api/models/evil/shadow/tree/main",
]
