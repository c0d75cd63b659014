"""A hand-written OCI registry for the registry tests: one small valid image (:class:`Image`) served by
tests/hostile.py's :class:`~tests.hostile.PeerServer` (:func:`serve_image`), behind the registry's own auth when asked
(:func:`gate`: Basic credentials, or a Bearer token from :func:`token_service`).

The real registry (``docker-registry``, tests/registry.py) speaks the protocol as it should; this one answers what a
test scripts: redirects to another origin, challenges of its own, drips, hostile fields. :func:`pull` runs the command
against it and :func:`refused` reads its one error line.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.helpers import clean_env, run_hfcache
from tests.hostile import PeerServer, Route, body, send

NAME = "hf/evil"
FOLDER = "models--hostile--tiny"
COMMIT = "a" * 40
FILES = {"tokenizer_config.json": b'{"model_max_length": 8}\n', "vocab.txt": b"[UNK]\nhello\n"}
USER, PASSWORD = "bot", "pw-Registry-3"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
TOKEN = "registry-token-" + "x" * 16
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def repo_tar() -> bytes:
    """The tar of the one small repo (``FOLDER`` at ``COMMIT``: ``FILES``), as ``hfcache export`` lays it out."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes | None = None, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
            else:
                info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        for path, data in FILES.items():
            etag = hashlib.sha256(data).hexdigest()
            add(f"{FOLDER}/blobs/{etag}", data)
            add(f"{FOLDER}/snapshots/{COMMIT}/{path}", link=f"../../blobs/{etag}")
        add(f"{FOLDER}/refs/main", COMMIT.encode())
    return raw.getvalue()


class Image:
    """A valid single-layer image of one small repo; ``layer_size`` overrides the declared layer size."""

    def __init__(self, layer_size: int | None = None, diff_id: str | None = None) -> None:
        tar = repo_tar()
        self.layer = gzip.compress(tar, mtime=0)
        self.config = json.dumps({"architecture": "amd64", "os": "linux",
                                  "rootfs": {"type": "layers", "diff_ids": [diff_id or sha(tar)]}}).encode()
        self.manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(self.config),
                       "size": len(self.config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(self.layer),
                        "size": len(self.layer) if layer_size is None else layer_size}]}).encode()


def gate(route: Route, scheme: str, realm: str = "") -> Route:
    """``route`` behind the registry's own auth: Basic credentials, or a Bearer token from ``realm``."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        expected = f"Basic {BASIC}" if scheme == "basic" else f"Bearer {TOKEN}"
        if h.headers.get("Authorization") == expected:
            route(h)
            return
        challenge = 'Basic realm="hfcache-test"' if scheme == "basic" else \
            f'Bearer realm="{realm}",service="registry",scope="repository:{NAME}:pull"'
        send(h, 401, b"", {"Www-Authenticate": challenge})
    return answer


def token_service(h: BaseHTTPRequestHandler) -> None:
    if h.headers.get("Authorization") != f"Basic {BASIC}":
        send(h, 401)
        return
    send(h, 200, json.dumps({"token": TOKEN}).encode(), {"Content-Type": "application/json"})


def serve_image(registry: PeerServer, image: Image, auth: str | None = None, realm: str = "",
                layer: Route | None = None) -> str:
    """Routes of ``image`` on ``registry`` (behind ``auth``); ``layer`` replaces the layer's answer. Returns REF."""
    def wrap(route: Route) -> Route:
        return gate(route, auth, realm) if auth else route
    base = f"/v2/{NAME}"
    registry.routes["/v2/"] = wrap(body(b"{}"))
    headers = {"Content-Type": MANIFEST_TYPE, "Docker-Content-Digest": sha(image.manifest)}
    registry.routes[f"{base}/manifests/v1"] = wrap(body(image.manifest, **headers))
    registry.routes[f"{base}/blobs/{sha(image.config)}"] = wrap(body(image.config))
    registry.routes[f"{base}/blobs/{sha(image.layer)}"] = wrap(layer or body(image.layer))
    return f"{registry.host}/{NAME}:v1"


def environment(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment with HOME at ``home`` and no registry credentials, proxies or auth files of the machine's."""
    base = clean_env(HOME=str(home), **extra)
    for name in ("REGISTRY_AUTH_FILE", "DOCKER_CONFIG", "XDG_RUNTIME_DIR", "HTTP_PROXY", "http_proxy", "NO_PROXY"):
        if name not in extra:
            base.pop(name, None)
    return base


def pull(ref: str, target: Path, home: Path, *args: str, login: bool = False, **extra: str):
    """``hfcache pull REF --plain-http`` into ``target`` (logged in as USER with ``login``); ``elapsed`` is its time."""
    credentials = ["--username", USER, "--password-stdin"] if login else []
    started = time.monotonic()
    proc = run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", *credentials, *args],
                       env=environment(home, **extra), input_text=f"{PASSWORD}\n" if login else "", timeout=90)
    proc.elapsed = time.monotonic() - started
    return proc


def refused(proc, code: int, *needles: str) -> tuple[str, str]:
    """Exit ``code``; stderr ends with the one error line (holding every needle) and its hint, and no other line is
    an error, a hint or an "ok" (the progress display's last line may precede them). Returns (error, hint)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr
    assert len(lines) >= 2 and lines[-2].startswith("hfcache: error: "), proc.stderr
    assert all(needle in lines[-2] for needle in needles), proc.stderr
    assert lines[-1].startswith("hint: ") and "Traceback" not in proc.stderr
    assert not any(line.lstrip().startswith(("hfcache:", "hint:", "ok")) for line in lines[:-2]), proc.stderr
    return lines[-2], lines[-1]
