"""A real OCI registry for tests and benchmarks: Debian's ``docker-registry`` (the CNCF distribution registry,
``/usr/bin/docker-registry``) serving a tmp dir on a free loopback port, optionally with htpasswd (bcrypt) auth.

CI installs it (``.ci/run``: ``docker-registry apache2-utils``); elsewhere the tests skip when it is missing.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def available() -> str | None:
    """Why the registry cannot run here (a skip reason), or None."""
    missing = [tool for tool in ("docker-registry", "htpasswd") if shutil.which(tool) is None]
    return f"{', '.join(missing)} not installed (apt-get install docker-registry apache2-utils)" if missing else None


@dataclass(frozen=True)
class Registry:
    """A running registry: ``host`` is ``127.0.0.1:PORT``; blobs live under ``root``."""

    host: str
    root: Path

    def blob_path(self, digest: str) -> Path:
        """Where the distribution registry's filesystem driver stores a blob (registry/storage/paths.go)."""
        algorithm, hexdigest = digest.split(":")
        return self.root / "docker/registry/v2/blobs" / algorithm / hexdigest[:2] / hexdigest / "data"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_registry(workdir: Path, users: dict[str, str] | None = None) -> Iterator[Registry]:
    """Start ``docker-registry serve`` on 127.0.0.1 (htpasswd auth when ``users`` is given); stop it afterwards."""
    workdir.mkdir(parents=True, exist_ok=True)
    root, port = workdir / "storage", _free_port()
    auth = ""
    if users:
        htpasswd = workdir / "htpasswd"
        for i, (user, password) in enumerate(users.items()):
            subprocess.run(["htpasswd", "-B", "-b", *(["-c"] if i == 0 else []), str(htpasswd), user, password],
                           check=True, capture_output=True)
        auth = f"auth:\n  htpasswd:\n    realm: hfcache-test\n    path: {htpasswd}\n"
    config = workdir / "config.yml"
    config.write_text("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
                      f"storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n{auth}", encoding="utf-8")
    log = (workdir / "registry.log").open("wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)  # noqa: S310 - loopback only
                break
            except urllib.error.HTTPError:
                break  # 401 with auth: it answers
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start: {(workdir / 'registry.log').read_text()}")
                time.sleep(0.1)
        yield Registry(host=f"127.0.0.1:{port}", root=root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
