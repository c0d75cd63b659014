"""A real S3-protocol server for the bucket tests: moto's standalone server (``moto[server]``, ``python -m
moto.server``) as a separate process on 127.0.0.1, its request log (one line per request, as werkzeug writes it) in a
file the tests read. The client code under test is hfcache's own (boto3, presigned GETs over HTTP)."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Credentials the tests give hfcache: moto accepts any; the tests assert neither leaves the process.
ACCESS_KEY = "AKIAHFCACHETESTKEY01"
SECRET_KEY = "hfcache-test-secret-Zq81xV"


@dataclass
class S3Server:
    endpoint: str
    log: Path
    pid: int

    def env(self, **extra: str) -> dict[str, str]:
        """The AWS settings a client process reads (no profile or config file of the machine's)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
                "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", **extra}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def bucket(self, name: str) -> str:
        """Create bucket ``name``; return it."""
        self.client().create_bucket(Bucket=name)
        return name

    def requests(self, since: int = 0) -> list[str]:
        """The request lines logged (``METHOD /path?query``) from line ``since`` on."""
        lines = self.log.read_text(errors="replace").splitlines()[since:]
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]  # werkzeug colours some status lines
        return [m.group(1) for line in lines if (m := re.search(r'"([A-Z]+ \S+) HTTP/1\.[01]"', line))]

    def mark(self) -> int:
        return len(self.log.read_text(errors="replace").splitlines())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def moto_server(folder: Path) -> Iterator[S3Server]:
    """Run moto's server until the block ends; :class:`S3Server` describes it."""
    port = _free_port()
    log = folder / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}", log, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
