"""``hfcache pull``/``push`` as an attacker and as a new user would try them (docs/oci.md, docs/security.md).

Hostile images are pushed with raw distribution-API calls (tests/registry.py, urllib) to a real registry on
127.0.0.1, all digests correct unless a test alters them. Every refusal is checked for its exit code and its one
error line plus hint, and for what it leaves: the target cache exactly as it was (or not created at all), and a
canary file beside it untouched.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import urllib.request
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, run_hfcache, silent_server
from tests.hostile import PeerServer, forward, send
from tests.registry import available, push_image, put_manifest, running_registry, tar_bytes
from tests.testhub import HubServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(available() is not None and not os.environ.get("CI"),
                                                   reason=str(available()))]

HUB = Path(__file__).parent.parent / "data" / "hub"
GPT2 = "models--openai-community--gpt2"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CANARY = b"canary: nothing may touch this file\n"


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    """openai-community/gpt2 (tokenizer files) warmed from the test Hub server."""
    root = tmp_path_factory.mktemp("oci-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("openai-community/gpt2")], cache_dir=root, endpoint=server.endpoint,
                            token=False).ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("auth-registry"), users={"bot": "pw-Registry-1"}) as reg:
        yield reg


@pytest.fixture
def home(tmp_path) -> Path:
    """An empty HOME: no ~/.docker/config.json of the machine running the tests."""
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def env(home: Path, **extra: str) -> dict[str, str]:
    base = clean_env(HOME=str(home), **extra)
    for name in ("REGISTRY_AUTH_FILE", "DOCKER_CONFIG", "XDG_RUNTIME_DIR"):
        if name not in extra:
            base.pop(name, None)
    return base


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its link target, content hash or "dir" (the state a refusal must keep)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else
                                       hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def canary(tmp_path: Path) -> Path:
    path = tmp_path / "canary"
    path.write_bytes(CANARY)
    return path


def refused(proc: subprocess.CompletedProcess, code: int, needle: str) -> None:
    """Exit ``code``, and stderr ends with the one error line (containing ``needle``) and its hint line."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) >= 2 and lines[-2].startswith("hfcache: error: ") and needle in lines[-2], proc.stderr
    assert lines[-1].startswith("hint: ") and len(lines[-1]) > 10, proc.stderr
    assert "Traceback" not in proc.stderr


# --- building hostile layers -------------------------------------------------------------------------------------


def member(name: str, data: bytes | None = None, link: str | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    else:
        info.size = len(data or b"")
    return info, (data if link is None else None)


def repo_members(folder: str, commit: str, files: dict[str, bytes], ref: str | None = "main") -> list:
    """A repo folder as huggingface_hub writes it: blobs by sha256, relative snapshot links, a ref."""
    out = []
    for path, data in files.items():
        etag = hashlib.sha256(data).hexdigest()
        out.append(member(f"{folder}/blobs/{etag}", data))
        out.append(member(f"{folder}/snapshots/{commit}/{path}", link="../" * (2 + path.count("/")) + f"blobs/{etag}"))
    if ref:
        out.append(member(f"{folder}/refs/{ref}", commit.encode()))
    return out


def commit_of(cache: Path, folder: str = GPT2) -> str:
    return (cache / folder / "refs" / "main").read_text()


def copy_cache(seed: Path, tmp_path: Path) -> Path:
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    return target


def pull(ref: str, target: Path, home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", *args], env=env(home, **extra))


# --- 1: what the target has is never replaced ---------------------------------------------------------------------


def test_an_image_cannot_repoint_a_file_the_target_has(seed, registry, tmp_path, home):
    target, guard = copy_cache(seed, tmp_path), canary(tmp_path)
    commit = commit_of(target)
    evil = b'{"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": "evil.EvilTokenizer"}}'
    ref = push_image(registry.host, "hostile/repoint", "v1",
                     [tar_bytes(repo_members(GPT2, commit, {"tokenizer_config.json": evil}))])
    before = tree(target)
    refused(pull(ref, target, home), 1, "already has it with other content")
    assert tree(target) == before and guard.read_bytes() == CANARY
    assert run_hfcache(["verify", "--cache-dir", str(target)], env=env(home)).returncode == 0

    # Moving refs/main to a commit of the image's choosing is refused too, unless --move-refs is asked for.
    moved = push_image(registry.host, "hostile/moveref", "v1",
                       [tar_bytes(repo_members(GPT2, "f" * 40, {"tokenizer_config.json": evil}))])
    refused(pull(moved, target, home), 1, "pass --move-refs")
    assert tree(target) == before


def test_a_ref_without_its_snapshot_is_refused(registry, tmp_path, home):
    target, guard = tmp_path / "new" / "hub", canary(tmp_path)
    ref = push_image(registry.host, "hostile/dangling", "v1", [tar_bytes([member(f"{GPT2}/refs/main", b"e" * 40)])])
    refused(pull(ref, target, home), 1, "neither the source nor the target has")
    assert not (tmp_path / "new").exists() and guard.read_bytes() == CANARY


# --- 2: all or nothing: refused in the check phase, exit 2, nothing written ---------------------------------------

_OK = repo_members("models--a--ok", "1" * 40, {"config.json": b"{}"})
_C = "2" * 40


@pytest.mark.parametrize("bad, needle", [
    (repo_members("models--b--bad", _C, {"a": b"one", "a/b": b"two"}), "a file and a folder at once"),
    (repo_members("models--b--bad", _C, {"x" * 300: b"long"}), "longer than 255 bytes"),
    (repo_members("models--b--bad", _C, {"/".join(["d"] * 300) + "/f": b"deep"}), "more than 256 levels"),
    (repo_members("models--b--bad", _C, {"/".join(["p" * 250] * 17): b"long path"}), "longer than 4095 bytes"),
    (repo_members("models--b--bad", _C, {"f": b"x"}, ref="r" * 250), "a ref name longer than"),
], ids=["file-and-folder", "long-name", "deep", "long-path", "long-ref"])
def test_an_image_the_filesystem_cannot_hold_is_refused_before_anything_is_written(seed, registry, tmp_path, home,
                                                                                   bad, needle):
    guard = canary(tmp_path)
    ref = push_image(registry.host, f"hostile/shape-{abs(hash(needle))}", "v1", [tar_bytes(_OK), tar_bytes(bad)])
    fresh = tmp_path / "fresh" / "hub"
    refused(pull(ref, fresh, home), 2, needle)
    assert not (tmp_path / "fresh").exists(), "a refused pull leaves no cache root behind"

    target = copy_cache(seed, tmp_path)
    before = tree(target)
    refused(pull(ref, target, home), 2, needle)
    assert tree(target) == before and guard.read_bytes() == CANARY


# --- 3: a manifest altered in the registry's storage, pulled by tag ----------------------------------------------


def test_a_manifest_altered_in_storage_is_refused_when_pulled_by_tag(seed, registry, tmp_path, home):
    pushed = run_hfcache(["push", f"{registry.host}/hf/altered:v1", "--cache-dir", str(seed), "--plain-http",
                          "--json"], env=env(home))
    digest = json.loads(pushed.stdout)["digest"]
    stored = registry.blob_path(digest)
    original = stored.read_bytes()
    try:  # same length, other content: the registry still answers Docker-Content-Digest: <the original digest>
        stored.write_bytes(original.replace(b"Hugging Face hub cache\"", b"Hugging Face hub cachX\""))
        assert stored.read_bytes() != original
        target = tmp_path / "target"
        refused(pull(f"{registry.host}/hf/altered:v1", target, home), 3, f"does not match its digest {digest}")
        assert not target.exists()
    finally:
        stored.write_bytes(original)


# --- 4: auth files: read only when the registry asks, a broken one named -----------------------------------------


def test_a_broken_auth_file_is_ignored_without_auth_and_named_with_it(seed, registry, auth_registry, tmp_path, home):
    (home / ".docker").mkdir()
    broken = home / ".docker" / "config.json"
    broken.write_text('{"auths": {', encoding="utf-8")
    ref = f"{registry.host}/hf/anon:v1"
    pushed = run_hfcache(["push", ref, "--cache-dir", str(seed), "--plain-http"], env=env(home))
    assert pushed.returncode == 0, pushed.stderr
    assert pull(ref, tmp_path / "pulled", home).returncode == 0

    private = f"{auth_registry.host}/hf/private:v1"
    refused(pull(private, tmp_path / "denied", home), 2, str(broken))
    other = tmp_path / "auth.json"
    other.write_text("[1, 2]", encoding="utf-8")
    refused(pull(private, tmp_path / "denied", home, REGISTRY_AUTH_FILE=str(other)), 2, str(other))
    assert not (tmp_path / "denied").exists()


def test_a_missing_credential_helper_prints_nothing_of_its_own(seed, registry, auth_registry, tmp_path, home):
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_text(json.dumps({
        "credHelpers": {registry.host: "hfcache-test-missing", auth_registry.host: "hfcache-test-missing"}}))
    ref = f"{registry.host}/hf/helper:v1"
    assert run_hfcache(["push", ref, "--cache-dir", str(seed), "--plain-http"], env=env(home)).returncode == 0
    ok = pull(ref, tmp_path / "pulled", home, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    assert "helper" not in ok.stderr.lower(), ok.stderr

    denied = pull(f"{auth_registry.host}/hf/private:v1", tmp_path / "denied", home)
    refused(denied, 3, "requires authentication")
    assert denied.stderr.lower().count("docker-credential-hfcache-test-missing") == 1, denied.stderr
    assert "is not installed" in denied.stderr.splitlines()[-1]


# --- 5, 6: disk: nothing in TMPDIR on pull, bounded unpacking, full filesystems -----------------------------------


def test_pull_writes_nothing_to_tmpdir_and_max_size_bounds_what_it_unpacks(seed, registry, tmp_path, home):
    ref = f"{registry.host}/hf/sized:v1"
    assert run_hfcache(["push", ref, "--cache-dir", str(seed), "--plain-http"], env=env(home)).returncode == 0
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    ok = pull(ref, tmp_path / "pulled", home, "--json", TMPDIR=str(tmpdir))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["bytes_unpacked"] > json.loads(ok.stdout)["bytes_downloaded"]
    assert not list(tmpdir.iterdir()), "pull stages on the cache's filesystem only"

    # A 64 MiB file of zeros is a 64 KiB gzip layer: refused by its declared size before a byte is staged.
    zeros = b"\0" * (64 << 20)
    bomb = push_image(registry.host, "hostile/bomb", "v1", [tar_bytes(repo_members(GPT2, "3" * 40, {"big": zeros}))])
    target = copy_cache(seed, tmp_path)
    before = tree(target)
    refused(pull(bomb, target, home, "--max-size", "16MiB"), 2, "more than --max-size")
    assert tree(target) == before
    # Bytes after the tar's end count too (they are read to check the diff_id).
    trailer = push_image(registry.host, "hostile/trailer", "v1",
                         [tar_bytes(repo_members(GPT2, "4" * 40, {"f": b"x"}), trailer=zeros)])
    refused(pull(trailer, target, home, "--max-size", "16MiB"), 2, "more than --max-size")
    assert tree(target) == before
    refused(pull(ref, target, home, "--max-size", "many"), 2, "invalid size")


def _userns() -> str | None:
    try:
        proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if proc.returncode == 0 else proc.stderr.decode(errors="replace")


def in_tmpfs(mount: Path, options: str, args: list[str], environment: dict[str, str]) -> tuple[int, str, list[str]]:
    """Run ``hfcache ARGS`` with a small tmpfs at ``mount`` (a private mount namespace: no root needed).

    Returns:
        (exit code, stderr, what is left under the mount point after the run).
    """
    mount.mkdir(exist_ok=True)
    listing = mount.parent / f"{mount.name}.listing"
    script = ('m="$2"; mount -t tmpfs -o "$1" tmpfs "$m" || exit 99; shift 2; "$@" 2>"$0.err"; rc=$?; '
              'find "$m" -mindepth 1 > "$0"; exit $rc')
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(listing),
                           options, str(mount), sys.executable, "-m", "hfcache", *args],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 99, proc.stderr
    return proc.returncode, Path(f"{listing}.err").read_text(), listing.read_text().split()


@pytest.mark.skipif(_userns() is not None, reason="no user namespaces to mount a small tmpfs")
def test_full_filesystems_exit_5_and_leave_no_cache_root(seed, registry, tmp_path, home):
    ref = f"{registry.host}/hf/full:v1"
    assert run_hfcache(["push", ref, "--cache-dir", str(seed), "--plain-http"], env=env(home)).returncode == 0
    mount = tmp_path / "tmpfs"

    # TMPDIR full: push cannot write its layers (exit 5, says TMPDIR); pull does not use TMPDIR at all.
    code, err, _ = in_tmpfs(mount, "size=64k", ["push", ref, "--cache-dir", str(seed), "--plain-http"],
                            env(home, TMPDIR=str(mount)))
    assert code == 5 and "TMPDIR" in err and err.splitlines()[-1].startswith("hint: "), err
    code, err, _ = in_tmpfs(mount, "size=64k", ["pull", ref, "--cache-dir", str(tmp_path / "c1"), "--plain-http"],
                            env(home, TMPDIR=str(mount)))
    assert code == 0, err

    # The cache's filesystem too small for the image: refused before staging, no cache root left.
    code, err, left = in_tmpfs(mount, "size=512k", ["pull", ref, "--cache-dir", str(mount / "new" / "hub"),
                                                    "--plain-http"], env(home))
    assert code == 5 and "free on" in err and left == [], (err, left)
    # Out of inodes while staging (ENOSPC from the filesystem itself): exit 5, no cache root left.
    code, err, left = in_tmpfs(mount, "size=64m,nr_inodes=12", ["pull", ref, "--cache-dir", str(mount / "new" / "hub"),
                                                                "--plain-http"], env(home))
    assert code == 5 and "no space left" in err and left == [], (err, left)
    assert err.splitlines()[-1].startswith("hint: ")


# --- 7: multi-platform indexes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("media_type", ["application/vnd.oci.image.index.v1+json",
                                        "application/vnd.docker.distribution.manifest.list.v2+json"])
def test_an_image_index_is_refused_with_a_clear_message(seed, registry, tmp_path, home, media_type):
    name = f"hf/index-{media_type.split('.')[2]}"
    pushed = run_hfcache(["push", f"{registry.host}/{name}:single", "--cache-dir", str(seed), "--plain-http",
                          "--json"], env=env(home))
    digest = json.loads(pushed.stdout)["digest"]
    size = len(urllib.request.urlopen(urllib.request.Request(  # loopback registry
        f"http://{registry.host}/v2/{name}/manifests/{digest}", headers={"Accept": MANIFEST})).read())
    child = MANIFEST if "oci" in media_type else "application/vnd.docker.distribution.manifest.v2+json"
    index = {"schemaVersion": 2, "mediaType": media_type, "manifests": [
        {"mediaType": child, "digest": digest, "size": size, "platform": {"architecture": "amd64", "os": "linux"}}]}
    put_manifest(registry.host, name, "multi", json.dumps(index).encode(), media_type)
    refused(pull(f"{registry.host}/{name}:multi", tmp_path / "t", home), 2, "multi-platform image index")
    assert not (tmp_path / "t").exists()


# --- 8, 9, 10: usage errors with hints, before any network -------------------------------------------------------


def test_every_usage_and_registry_error_is_one_line_with_a_hint(seed, registry, tmp_path, home):
    lock = Path(__file__).parents[2] / "examples" / "hfcache.lock"
    reg = registry.host
    cases = [
        (["push", f"{reg}/hf/x:v1", "openai-community/gpt2", "--lock", str(lock)], 2, "not both"),
        (["push", f"{reg}/hf/x:v1", "--username", "u"], 2, "--username needs --password-stdin"),
        (["pull", f"{reg}/hf/x:v1", "--password-stdin"], 2, "--password-stdin needs --username"),
        (["pull", f"{reg}/hf/x@sha256:abc"], 2, "sha256:<64 lowercase hex>"),
        (["push", f"{reg}/hf/x:v1", "--arch", "X86"], 2, "--arch"),
        (["pull", f"{reg}/HF/x:v1"], 2, "repository name 'HF/x'"),
        (["pull", f"{reg}/hf/x:-bad"], 2, "tag"),
        (["pull", f"{reg}/hf/x:v1", "--timeout", "nan"], 2, "invalid timeout"),
        (["push", f"{reg}/hf/x:v1", "openai-community/gpt2@" + "0" * 40], 2, "not in the cache"),
        (["pull", f"{reg}/hf/nothing:v1"], 3, "not found"),
    ]
    for args, code, needle in cases:
        refused(run_hfcache([*args, "--cache-dir", str(seed), "--plain-http"], env=env(home), input_text=""),
                code, needle)
        as_json = run_hfcache([*args, "--cache-dir", str(seed), "--plain-http", "--json"], env=env(home),
                              input_text="")
        document = json.loads(as_json.stdout)
        assert as_json.returncode == code and document["ok"] is False and document["exit_code"] == code
        assert document["hint"], (args, document)
    with silent_server() as address:
        silent = address.removeprefix("http://")
        refused(pull(f"{silent}/hf/x:v1", tmp_path / "t", home, "--timeout", "1"), 3, "no answer within the timeout")
    assert not (tmp_path / "t").exists()


def test_push_and_pull_json_say_ok(seed, registry, tmp_path, home):
    ref = f"{registry.host}/hf/ok:v1"
    pushed = run_hfcache(["push", ref, "--cache-dir", str(seed), "--plain-http", "--json"], env=env(home))
    pulled = pull(ref, tmp_path / "t", home, "--json")
    assert json.loads(pushed.stdout)["ok"] is True and json.loads(pulled.stdout)["ok"] is True


# --- 12: Ctrl-C during pull --json --------------------------------------------------------------------------------


class _StallingProxy(PeerServer):
    """Forwards GETs to the registry, but sends only the first half of a layer blob and then stalls (docker-registry
    sends whole blobs at disk speed)."""

    def __init__(self, upstream: str, stall: set[str]) -> None:
        self.upstream, self.stall, self.stalled, self.release = upstream, stall, threading.Event(), threading.Event()
        super().__init__()

    def _answer(self, h, head: bool) -> None:
        if h.command != "GET":
            return h.send_error(501)
        _, headers, body = forward(h, self.upstream, headers={"Accept": h.headers.get("Accept", "*/*")})
        h.send_response(200)
        for name, value in headers:
            if name.lower() in ("content-type", "docker-content-digest"):
                h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.path.rsplit("/", 1)[-1] in self.stall:
            h.wfile.write(body[:len(body) // 2])
            h.wfile.flush()
            self.stalled.set()
            self.release.wait(60)
            return
        h.wfile.write(body)


def test_ctrl_c_during_pull_json_prints_one_document_and_leaves_nothing(seed, registry, tmp_path, home):
    ref = f"{registry.host}/hf/slow:v1"
    pushed = json.loads(run_hfcache(["push", ref, "--cache-dir", str(seed), "--plain-http", "--json"],
                                    env=env(home)).stdout)
    proxy = _StallingProxy(registry.host, {pushed["layers"][-1]["digest"]})
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    target = tmp_path / "new" / "hub"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "hfcache", "pull", f"127.0.0.1:{proxy.server_port}/hf/slow:v1",
                                 "--cache-dir", str(target), "--plain-http", "--json"], env=env(home),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proxy.stalled.wait(60), "the pull never reached the layer"
        assert (target / ".locks").is_dir(), "staging had begun"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proxy.release.set()
        proxy.shutdown()
    assert proc.returncode == 130, err
    document = json.loads(out)
    assert document["ok"] is False and document["exit_code"] == 130 and document["hint"]
    assert not (tmp_path / "new").exists(), "an interrupted pull into a new cache leaves nothing"


# --- Bearer token flow (a token service in front of the registry), bounded and with credentials -----------------


class _TokenGate(PeerServer):
    """A registry front that wants ``Bearer <token>`` (401 with a token realm otherwise) and its token service:
    ``/token`` gives the token for the right Basic credentials, or ``flood`` bytes of junk when set (the tests'
    docker-registry has Basic auth only)."""

    def __init__(self, upstream: str, basic: str, flood: int = 0) -> None:
        self.upstream, self.basic, self.flood, self.token = upstream, basic, flood, "t0k3n-" + "x" * 20
        super().__init__()

    def _answer(self, h, head: bool) -> None:
        if h.command != "GET":
            return h.send_error(501)
        if h.path.startswith("/token"):
            if self.flood:
                h.send_response(200)
                h.send_header("Content-Length", str(self.flood))
                h.end_headers()
                with contextlib.suppress(ConnectionError):  # the client stops reading at its bound
                    h.wfile.write(b"[" * self.flood)
                return
            if h.headers.get("Authorization") != f"Basic {self.basic}":
                return send(h, 401)
            return send(h, 200, json.dumps({"token": self.token}).encode())
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            return send(h, 401, b"", {"Www-Authenticate": f'Bearer realm="http://127.0.0.1:{self.server_port}/token",'
                                                           'service="gate",scope="repository:hf/gated:pull"'})
        _, headers, body = forward(h, self.upstream, headers={"Accept": h.headers.get("Accept", "*/*")})
        send(h, 200, body, {name: value for name, value in headers
                            if name.lower() in ("content-type", "docker-content-digest")})


@pytest.mark.parametrize("flood", [0, 8 << 20], ids=["token", "flooding-token-service"])
def test_bearer_token_flow_with_credentials_from_the_auth_file(seed, registry, tmp_path, home, flood):
    assert run_hfcache(["push", f"{registry.host}/hf/gated:v1", "--cache-dir", str(seed), "--plain-http"],
                       env=env(home)).returncode == 0
    basic = base64.b64encode(b"bot:pw").decode()
    gate = _TokenGate(registry.host, basic, flood)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    ref = f"127.0.0.1:{gate.server_port}/hf/gated:v1"
    try:
        refused(pull(ref, tmp_path / "anon", home), 3, "token endpoint gave no token" if flood else
                "requires authentication")
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps({"auths": {f"127.0.0.1:{gate.server_port}": {"auth": basic}}}))
        proc = pull(ref, tmp_path / "t", home, "--json", REGISTRY_AUTH_FILE=str(auth))
    finally:
        gate.shutdown()
    if flood:  # an endless token answer is read up to 1 MiB, then refused
        refused(proc, 3, "token endpoint gave no token")
        assert not (tmp_path / "t").exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["ok"] is True and gate.token not in proc.stdout + proc.stderr


# --- an attacker's report: a GNU sparse 1.0 map in a layer ---------------------------------------


@pytest.mark.parametrize("sparse_map", [b"5\n", b"abc\n", b"3000000\n" + b"0\n" * 600_000])
def test_a_sparse_map_in_a_layer_is_refused_before_tarfile_reads_it(registry, tmp_path, home, sparse_map):
    """tarfile parses a PAX GNU sparse 1.0 map inside its header processing (malformed: ValueError, exit 70 before;
    long: read whole). pull goes through import's tar reader: exit 2, one line, no cache root."""
    guard = canary(tmp_path)
    info, _ = member(f"{GPT2}/blobs/{'0' * 64}", sparse_map)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": info.name,
                        "GNU.sparse.realsize": "10"}
    ref = push_image(registry.host, f"hostile/sparse-{len(sparse_map)}", "v1", [tar_bytes([(info, sparse_map)])])
    target = tmp_path / "fresh" / "hub"
    refused(pull(ref, target, home), 2, "a sparse file")
    assert not (tmp_path / "fresh").exists() and guard.read_bytes() == CANARY


def test_a_layer_listed_twice_or_too_many_layers_are_refused_before_any_layer_is_fetched(registry, tmp_path, home):
    """Each layer is a request under the metadata deadline: a registry repeating one layer (or listing thousands)
    could stretch a pull indefinitely. push writes each layer once, and at most one per repo."""
    from hfcache.errors import UsageError
    from hfcache.oci.pull import MAX_LAYERS, _layers_of

    target, guard = tmp_path / "new" / "hub", canary(tmp_path)
    layer = tar_bytes(repo_members("models--a--ok", "1" * 40, {"config.json": b"{}"}))
    ref = push_image(registry.host, "hostile/repeated", "v1", [layer, layer])
    refused(pull(ref, target, home), 2, "is listed twice")
    assert not (tmp_path / "new").exists() and guard.read_bytes() == CANARY
    many = [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{i:064x}", "size": 1}
            for i in range(MAX_LAYERS + 1)]
    config = {"rootfs": {"diff_ids": [f"sha256:{i:064x}" for i in range(MAX_LAYERS + 1)]}}
    with pytest.raises(UsageError, match=f"more than the {MAX_LAYERS} hfcache pulls"):
        _layers_of({"layers": many}, config, "r/x:v1")
    assert len(_layers_of({"layers": many[:MAX_LAYERS]}, {"rootfs": {"diff_ids": config["rootfs"]["diff_ids"][:-1]}},
                          "r/x:v1")) == MAX_LAYERS
