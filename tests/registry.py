"""A real OCI registry for tests and benchmarks: Debian's ``docker-registry`` (the CNCF distribution registry,
``/usr/bin/docker-registry``) serving a tmp dir on a free loopback port, optionally with htpasswd (bcrypt) auth;
and raw distribution-API calls (urllib) that push hand-made, hostile images without hfcache's own client.

CI installs it (``.ci/run``: ``docker-registry apache2-utils``); elsewhere the tests skip when it is missing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
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
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)  # loopback only
                break
            except urllib.error.HTTPError:
                break  # 401 with auth: it answers
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start: {(workdir / 'registry.log').read_text()}") \
                        from None
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


# --- raw distribution API calls (urllib only): hostile images are pushed without hfcache's client -----------------


def _request(method: str, address: str, data: bytes | None = None, headers: dict[str, str] | None = None):
    request = urllib.request.Request(address, data=data, method=method, headers=headers or {})
    return urllib.request.urlopen(request, timeout=60)  # loopback registry only


def put_blob(host: str, name: str, data: bytes) -> str:
    """Upload ``data`` as a blob of ``name`` (POST, then PUT with the digest); return its ``sha256:`` digest."""
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    with _request("POST", f"http://{host}/v2/{name}/blobs/uploads/", b"") as started:
        location = started.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    separator = "&" if "?" in location else "?"
    with _request("PUT", f"{location}{separator}digest={digest}", data,
                  {"Content-Type": "application/octet-stream"}) as done:
        assert done.status == 201, done.status
    return digest


def put_manifest(host: str, name: str, ref: str, body: bytes, media_type: str) -> str:
    """PUT ``body`` as the manifest ``name:ref``; return the digest the registry answered."""
    with _request("PUT", f"http://{host}/v2/{name}/manifests/{ref}", body, {"Content-Type": media_type}) as done:
        assert done.status == 201, done.status
        return done.headers["Docker-Content-Digest"]


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]], trailer: bytes = b"") -> bytes:
    """A PAX tar of ``members`` (content given for files), then ``trailer`` after the end-of-archive blocks."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue() + trailer


def push_image(host: str, name: str, tag: str, layers: list[bytes], *, declared_sizes: list[int] | None = None,
               layer_type: str = "application/vnd.oci.image.layer.v1.tar+gzip") -> str:
    """Push an image whose layers are the tars ``layers`` (gzipped unless ``layer_type`` is plain tar), with a
    correct config (diff_ids) and manifest unless ``declared_sizes`` overrides the descriptors' sizes.

    Returns:
        ``host/name:tag``.
    """
    plain = layer_type.endswith(".tar")
    blobs = [tar if plain else gzip.compress(tar, mtime=0) for tar in layers]
    diff_ids = [f"sha256:{hashlib.sha256(tar).hexdigest()}" for tar in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    descriptors = []
    for i, blob in enumerate(blobs):
        size = declared_sizes[i] if declared_sizes else len(blob)
        descriptors.append({"mediaType": layer_type, "digest": put_blob(host, name, blob), "size": size})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": put_blob(host, name, config), "size": len(config)},
                "layers": descriptors}
    put_manifest(host, name, tag, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    return f"{host}/{name}:{tag}"


def member(name: str, data: bytes | None = None, *, link: str | None = None, hardlink: str | None = None):
    """A tar member (TarInfo, content) for :func:`tar_bytes`: a file of ``data``, a symlink or a hardlink."""
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif hardlink is not None:
        info.type, info.linkname = tarfile.LNKTYPE, hardlink
    else:
        info.size = len(data or b"")
    return info, (data if link is None and hardlink is None else None)


def push_tar(host: str, name: str, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> str:
    """:func:`push_image` of one layer, the tar of ``members``, as ``name:v1``; returns the ref."""
    return push_image(host, name, "v1", [tar_bytes(members)])


@contextmanager
def logged_registry(workdir: Path) -> Iterator[tuple[Registry, Path]]:
    """``docker-registry serve`` on 127.0.0.1 with its access log on (tests/registry.py turns it off)."""
    workdir.mkdir(parents=True, exist_ok=True)
    root, port, log_path = workdir / "storage", _free_port(), workdir / "access.log"
    config = workdir / "config.yml"
    config.write_text("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\n"
                      f"storage:\n  filesystem:\n    rootdirectory: {root}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n", encoding="utf-8")
    log = log_path.open("wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)  # loopback only
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start: {log_path.read_text()}") from None
                time.sleep(0.1)
        yield Registry(host=f"127.0.0.1:{port}", root=root), log_path
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def push_shell_base(registry: Registry, name: str) -> tuple[str, str, dict]:
    """A base image with a shell (this machine's dash and the libraries it loads) pushed by hand to ``name:v1``,
    its config holding Env/Entrypoint/Cmd and the fields push drops (history, created). Returns (layer digest,
    diff_id, config)."""
    members = []
    for path in ("/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
        real = Path(os.path.realpath(path))
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode = real.stat().st_size, 0o755
        members.append((info, real.read_bytes()))
    link = tarfile.TarInfo("bin/sh")
    link.type, link.linkname = tarfile.SYMTYPE, "dash"
    members.append((link, None))
    tar = tar_bytes(members)
    layer = gzip.compress(tar, mtime=0)
    from hfcache.oci.image import architecture  # the machine's, as push --base reads it

    config = {"architecture": architecture(), "os": "linux", "created": "2024-01-01T00:00:00Z",
              "history": [{"created_by": "hand"}],
              "config": {"Env": ["PATH=/bin", "SHELL_BASE=1"], "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "true"]},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]}}
    raw = json.dumps(config).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": put_blob(registry.host, name, raw), "size": len(raw)},
                "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                            "digest": put_blob(registry.host, name, layer), "size": len(layer)}]}
    put_manifest(registry.host, name, "v1", json.dumps(manifest).encode(),
                 "application/vnd.docker.distribution.manifest.v2+json")
    return manifest["layers"][0]["digest"], config["rootfs"]["diff_ids"][0], config
