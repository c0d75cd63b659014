"""Registry access (docs/oci.md "Registry access", docs/security.md): a registry, or a host it
redirects to, cannot get credentials it was not given, hold ``pull``/``push`` forever, or print lines of its own.

Every registry here is a hand-written HTTP server on 127.0.0.1 that records what it was sent (method, path,
``Authorization``). "Another host" is a second server addressed as ``localhost:PORT``: another host and port, so
another origin. Each refusal is checked for its exit code and its one error line plus hint, for its time, for what
the other host saw, and for what it leaves: a canary outside the cache unchanged, the target cache as it was and
still passing ``hfcache verify``, or no target at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.canary import Canary
from tests.helpers import run_hfcache
from tests.hostile import PeerServer, body, drip, drip_headers, empty_gzip_members, send
from tests.oci_peer import (
    BASIC,
    MANIFEST_TYPE,
    NAME,
    PASSWORD,
    TOKEN,
    USER,
    Image,
    environment,
    gate,
    pull,
    refused,
    serve_image,
    sha,
    token_service,
)

#: A manifest whose headers never end.
DRIP_HEADERS = drip_headers(MANIFEST_TYPE)


# --- running hfcache ------------------------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder



def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root``: link target or content hash, and mode (the state a refusal must keep)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        content = os.readlink(path) if path.is_symlink() else \
            hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = (content, st.st_mode, st.st_uid, st.st_gid)
    return out


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    """The small repo pulled from an honest registry: the cache the hostile pulls target."""
    root = tmp_path_factory.mktemp("registry-access")
    (root / "home").mkdir()
    with PeerServer() as registry:
        ref = serve_image(registry, Image())
        proc = pull(ref, root / "cache", root / "home")
    assert proc.returncode == 0, proc.stderr
    assert run_hfcache(["verify", "--cache-dir", str(root / "cache")]).returncode == 0
    return root / "cache"


@contextlib.contextmanager
def guarded(seed: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of ``seed`` as the pull target, with a canary beside it: both must be as they were afterwards, and
    the target must still verify."""
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    canary = Canary(tmp_path)
    before = tree(target)
    yield target
    canary.assert_unchanged()
    assert tree(target) == before, "a refused pull changed the target cache"
    verified = run_hfcache(["verify", "--cache-dir", str(target)])
    assert verified.returncode == 0, verified.stdout + verified.stderr


# --- credentials bound to the registry's origin ----------------------------------------------------------------------


@pytest.mark.parametrize("auth", ["basic", "bearer", "auth-file"])
def test_a_redirect_targets_challenge_gets_no_credentials(seed, tmp_path, home, auth):
    """The registry redirects the layer GET to another host, which answers 401 with a Bearer realm of its own:
    before, hfcache sent the registry's Basic credentials to that realm. Now: exit 3 naming both hosts, and the
    other host never saw an Authorization header nor a token request."""
    with PeerServer() as registry, PeerServer("localhost") as other:
        image = Image()
        other.routes["/"] = lambda h: send(h, 401, b"", {
            "Www-Authenticate": f'Bearer realm="http://{other.host}/token",service="cdn",scope="blob:pull"'})
        other.routes["/token"] = token_service
        scheme = "bearer" if auth == "bearer" else "basic"
        ref = serve_image(registry, image, auth=scheme, realm=f"http://{registry.host}/token",
                          layer=gate(lambda h: send(h, 307, b"", {"Location": f"http://{other.host}/blob/x"}), scheme,
                                     f"http://{registry.host}/token"))
        registry.routes["/token"] = token_service
        extra = {}
        if auth == "auth-file":
            (tmp_path / "auth.json").write_text(json.dumps({"auths": {registry.host: {"auth": BASIC}}}))
            extra["REGISTRY_AUTH_FILE"] = str(tmp_path / "auth.json")
        with guarded(seed, tmp_path) as target:
            proc = pull(ref, target, home, login=auth != "auth-file", **extra)
            refused(proc, 3, f"registry {registry.host}", other.host, "redirected", "HTTP 401")
        assert [path for _, path, _ in other.log] == ["/blob/x"], other.log
        assert other.authorizations() == [], "credentials went to the redirect target"
        assert registry.authorizations(), "the registry itself was answered"
    assert PASSWORD not in proc.stderr + proc.stdout and BASIC not in proc.stderr + proc.stdout


def test_a_redirect_to_another_host_carries_no_authorization(tmp_path, home):
    """The ordinary CDN case: the registry redirects the layer to another host that serves it. The pull works, and
    that host got no Authorization header (neither the Basic credentials nor a token)."""
    with PeerServer() as registry, PeerServer("localhost") as cdn:
        image = Image()
        cdn.routes["/"] = body(image.layer)
        ref = serve_image(registry, image, auth="basic",
                          layer=gate(lambda h: send(h, 302, b"", {"Location": f"http://{cdn.host}/layer"}), "basic"))
        canary = Canary(tmp_path)
        proc = pull(ref, tmp_path / "pulled", home, "--json", login=True)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["ok"] is True
        assert cdn.log == [("GET", "/layer", None)], cdn.log
    canary.assert_unchanged()
    assert run_hfcache(["verify", "--cache-dir", str(tmp_path / "pulled")]).returncode == 0


def test_the_registrys_own_token_realm_on_another_host_is_the_protocol(tmp_path, home):
    """Docker Hub's case: the registry's own 401 names a realm on another host (auth.docker.io). The credentials go
    to that realm (that is the token flow), the token only to the registry."""
    with PeerServer() as registry, PeerServer("localhost") as auth_host:
        auth_host.routes["/token"] = token_service
        ref = serve_image(registry, Image(), auth="bearer", realm=f"http://{auth_host.host}/token")
        proc = pull(ref, tmp_path / "pulled", home, login=True)
        assert proc.returncode == 0, proc.stderr
        assert auth_host.authorizations() == [f"Basic {BASIC}"], auth_host.log
        assert set(registry.authorizations()) == {f"Bearer {TOKEN}"}, registry.log


def test_push_sends_no_credentials_to_an_upload_location_on_another_host(seed, tmp_path, home):
    """``push``: the registry's upload Location names another host. The blob goes there without Authorization; the
    registry's manifest answer naming a digest with terminal escapes is printed escaped, on one line."""
    with PeerServer() as registry, PeerServer("localhost") as uploads:
        uploads.routes["/upload"] = lambda h: send(h, 201)
        registry.routes["/v2/"] = gate(body(b"{}"), "basic")
        registry.routes[f"/v2/{NAME}/blobs/sha256:"] = gate(lambda h: send(h, 404), "basic")
        registry.routes[f"/v2/{NAME}/blobs/uploads/"] = gate(
            lambda h: send(h, 202, b"", {"Location": f"http://{uploads.host}/upload/1"}), "basic")
        registry.routes[f"/v2/{NAME}/manifests/v1"] = gate(
            lambda h: send(h, 201, b"", {"Docker-Content-Digest": "sha256:\x1b[32mok\x1b[0m"}), "basic")
        canary = Canary(tmp_path)
        proc = run_hfcache(["push", f"{registry.host}/{NAME}:v1", "--cache-dir", str(seed), "--plain-http",
                            "--username", USER, "--password-stdin"], env=environment(home),
                           input_text=f"{PASSWORD}\n", timeout=90)
        refused(proc, 3, "stored the manifest as sha256:\\x1b[32mok\\x1b[0m")
        assert "\x1b" not in proc.stderr
        assert [method for method, _, _ in uploads.log] == ["PUT", "PUT"], uploads.log
        assert uploads.authorizations() == [], "credentials went to the upload host"
    canary.assert_unchanged()


# --- deadlines for metadata, a floor for bodies, compressed bytes counted -------------------------------------------


@pytest.mark.parametrize("fault", ["manifest-drip", "header-drip", "gzip-members-manifest", "token-drip"])
def test_a_dripping_metadata_answer_ends_at_the_deadline(seed, tmp_path, home, fault):
    """A manifest dripped at 1 B/s (before: 48 days for 4 MiB, every byte within --timeout), headers dripped, a
    gzip-encoded manifest of endless empty members (urllib3 inflates in a loop of its own), a token answer dripped:
    with HFCACHE_METADATA_DEADLINE=3 each ends within seconds, exit 3 naming the registry."""
    with PeerServer() as registry:
        image = Image()
        ref = serve_image(registry, image, auth="bearer" if fault == "token-drip" else None,
                          realm=f"http://{registry.host}/token")
        manifest = f"/v2/{NAME}/manifests/v1"
        if fault == "manifest-drip":
            registry.routes[manifest] = drip(image.manifest, 1.0, {"Content-Type": MANIFEST_TYPE})
        elif fault == "header-drip":
            registry.routes[manifest] = DRIP_HEADERS
        elif fault == "gzip-members-manifest":
            registry.routes[manifest] = empty_gzip_members({"Content-Type": MANIFEST_TYPE, "Content-Encoding": "gzip",
                                                            "Content-Length": str(1 << 40)})
        else:
            registry.routes["/token"] = drip(json.dumps({"token": TOKEN}).encode() + b" " * 4096, 1.0)
        with guarded(seed, tmp_path) as target:
            proc = pull(ref, target, home, login=fault == "token-drip", HFCACHE_METADATA_DEADLINE="3")
            refused(proc, 3, f"registry {registry.host}", "no complete answer within 3 s")
    assert proc.elapsed < 20, f"took {proc.elapsed:.0f} s"
    assert "HFCACHE_METADATA_DEADLINE" in refused(proc, 3)[1]


def test_dripped_headers_over_tls_end_at_the_deadline(seed, tmp_path, home):
    """The deadline's timer shuts the connection down under TLS too (an HTTPS registry with a test CA, trusted through
    REQUESTS_CA_BUNDLE): dripped headers end within seconds, exit 3."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with PeerServer() as registry:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        registry.socket = context.wrap_socket(registry.socket, server_side=True)
        ref = serve_image(registry, Image())
        registry.routes[f"/v2/{NAME}/manifests/v1"] = DRIP_HEADERS
        with guarded(seed, tmp_path) as target:
            started = time.monotonic()
            proc = run_hfcache(["pull", ref, "--cache-dir", str(target)], timeout=90,
                               env=environment(home, HFCACHE_METADATA_DEADLINE="3", REQUESTS_CA_BUNDLE=str(cert)))
            elapsed = time.monotonic() - started
            refused(proc, 3, f"registry {registry.host}", "no complete answer within 3 s")
    assert elapsed < 20, f"took {elapsed:.0f} s"


@pytest.mark.parametrize("fault", ["header-drip", "manifest-answer-drip"])
def test_push_ends_at_the_deadline_when_the_registry_drips(seed, tmp_path, home, fault):
    """``push``: a registry dripping the headers of its blob check, or the answer to the manifest PUT, is stopped at
    the metadata deadline (exit 3), as pull is."""
    with PeerServer() as registry:
        registry.routes[f"/v2/{NAME}/blobs/sha256:"] = DRIP_HEADERS if fault == "header-drip" else \
            (lambda h: send(h, 200))
        registry.routes[f"/v2/{NAME}/manifests/v1"] = drip(b"{}" + b" " * 4096, 1.0)
        canary = Canary(tmp_path)
        started = time.monotonic()
        proc = run_hfcache(["push", f"{registry.host}/{NAME}:v1", "--cache-dir", str(seed), "--plain-http"],
                           env=environment(home, HFCACHE_METADATA_DEADLINE="3"), timeout=90)
        refused(proc, 3, f"registry {registry.host}", "no complete answer within 3 s",
                "HEAD" if fault == "header-drip" else "PUT")
    assert time.monotonic() - started < 20
    canary.assert_unchanged()


def test_a_dripping_layer_falls_below_the_throughput_floor(seed, tmp_path, home):
    """A layer at 1 B/s: each byte arrives within --timeout, so before it ran for days. With a floor of 1 KB/s over
    2 s it ends within seconds: exit 3 naming the registry and the floor."""
    with PeerServer() as registry:
        image = Image()
        ref = serve_image(registry, image, layer=drip(image.layer, 0.5))
        with guarded(seed, tmp_path) as target:
            proc = pull(ref, target, home, HFCACHE_MIN_RATE="1KB", HFCACHE_RATE_WINDOW="2")
            refused(proc, 3, f"registry {registry.host}", f"layer {sha(image.layer)}", "below the floor")
    assert proc.elapsed < 20, f"took {proc.elapsed:.0f} s"


@pytest.mark.parametrize("max_size", ["1MB", None])
def test_a_layer_of_endless_empty_gzip_members_is_refused_by_its_compressed_size(seed, tmp_path, home, max_size):
    """A layer declared as 10 TB of endless empty gzip members inflates to nothing: only uncompressed bytes counted,
    so it was read forever even with --max-size 1MB. Compressed bytes count now: refused at once, exit 2 for
    --max-size, exit 5 for the free space, and nothing of the layer is read."""
    with PeerServer() as registry:
        image = Image(layer_size=10 ** 13)
        ref = serve_image(registry, image, layer=empty_gzip_members({"Content-Length": str(10 ** 13)}))
        with guarded(seed, tmp_path) as target:
            if max_size:
                proc = pull(ref, target, home, "--max-size", max_size)
                refused(proc, 2, "downloads more than --max-size (1000000 bytes)")
            else:
                proc = pull(ref, target, home)
                refused(proc, 5, "downloads more than the", "bytes free")
        assert not any(path.endswith(sha(image.layer)) for _, path, _ in registry.log), registry.log
    assert proc.elapsed < 20, f"took {proc.elapsed:.0f} s"


def test_a_fresh_pull_of_an_endless_layer_leaves_no_cache(tmp_path, home):
    """The same layer, declared within --max-size but streaming past it: the declared size stops it (exit 3), no
    target folder is left, and it ends within seconds."""
    with PeerServer() as registry:
        image = Image(layer_size=900_000)
        ref = serve_image(registry, image, layer=empty_gzip_members({"Content-Length": str(10 ** 13)}))
        canary = Canary(tmp_path)
        proc = pull(ref, tmp_path / "fresh" / "hub", home, "--max-size", "1MB")
        refused(proc, 3, "larger than the 900000 bytes its manifest declares")
    canary.assert_unchanged()
    assert not (tmp_path / "fresh").exists() and proc.elapsed < 20


# --- registry text is inert -----------------------------------------------------------------------------------------


HOSTILE_TEXT = "\x1b[32mok\x1b[0m\nhint: all good\r\u2028fake line\u0085\u202e"


@pytest.mark.parametrize("status", [400, 403, 500])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_registry_error_message_is_escaped_on_one_line(seed, tmp_path, home, status, as_json):
    """A registry error whose code and message hold ANSI escapes, CR/LF, U+2028/U+0085 and a bidi override (a fake
    "ok" and "hint:" line before): stderr is one escaped error line and hfcache's hint, and --json's error too."""
    with PeerServer() as registry:
        errors = {"errors": [{"code": "DENIED\x1b[2K", "message": HOSTILE_TEXT + "x" * 2000}]}
        ref = serve_image(registry, Image())
        registry.routes[f"/v2/{NAME}/manifests/v1"] = lambda h: send(h, status, json.dumps(errors).encode(),
                                                                      {"Content-Type": "application/json"})
        with guarded(seed, tmp_path) as target:
            proc = pull(ref, target, home, *(["--json"] if as_json else []))
    assert proc.returncode == 3, proc.stderr
    message = json.loads(proc.stdout)["error"] if as_json else refused(proc, 3, f"HTTP {status}")[0]
    assert "\\x1b[32mok\\x1b[0m\\x0ahint: all good\\x0d\\u2028fake line\\x85\\u202e" in message, message
    assert not any(c in proc.stdout + proc.stderr for c in "\x1b\r\u2028\u2029\u0085\u202e")
    assert len(message) < 500


def test_a_redirect_to_a_non_http_address_is_named_escaped(seed, tmp_path, home):
    """A Location header holding terminal escapes and a non-HTTP scheme: one escaped line, exit 3."""
    with PeerServer() as registry:
        ref = serve_image(registry, Image())
        registry.routes[f"/v2/{NAME}/manifests/v1"] = lambda h: send(h, 302, b"", {
            "Location": "ftp://evil/\x1b[31mok\x1b[0m"})
        with guarded(seed, tmp_path) as target:
            proc = pull(ref, target, home)
            refused(proc, 3, "non-HTTP address", "\\x1b[31mok")
    assert "\x1b" not in proc.stderr


@pytest.mark.parametrize("char", ["\n", "\r", "\x1b", "\x00", "\x7f", "\x85", "\x9b", "\u2028", "\u2029", "\u202e",
                                  "\ufeff", "\u00a0"])
def test_registry_text_escapes_every_line_break_and_control(char):
    """The sanitiser every registry value goes through: one printable line, capped."""
    from hfcache.oci.registry import registry_text

    out = registry_text(f"ok{char}hint: x" * 100)
    assert out.isprintable() and char not in out and len(out) <= 200
    assert out.startswith(f"ok\\{'x' if ord(char) < 0x100 else 'u'}{ord(char):0{2 if ord(char) < 0x100 else 4}x}")
    assert registry_text("plain text") == "plain text"
