"""Moving and serving caches that hold huggingface_hub 2.4's shared Xet blob store (``utils/_shared_blobs.py``).

The source caches are written by the unmodified huggingface_hub + hf_xet downloading from the Xet-speaking test
Hub (tests/xet_caches.py), never built by hand: every repo blob is a link ``../../blobs/<2hex>/<xet_hash>``. Then
export (dir, ``--materialize``, tar + import), link, ``hfcache serve``'s cache store, and push/pull must carry the
payloads' bytes so the result loads offline with no link leaving it; a payload replaced by a symlink to a canary
outside the cache is refused, the canary unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import clean_env, golden_ids, offline_load, run_hfcache
from tests.testhub import HubServer
from tests.xet_caches import library_download, store_linked_blobs, store_payloads, xet_hub

pytestmark = pytest.mark.slow

REPOS = {"bert-base-uncased": "google-bert/bert-base-uncased", "openai-community/gpt2": None}
CANARY = b"canary: outside the cache, never to be read or served\n"


@pytest.fixture(scope="module")
def store_cache(tmp_path_factory) -> Path:
    """A cache the library filled through Xet: every repo blob a link into the shared store."""
    cache = tmp_path_factory.mktemp("xet-src") / "cache"
    with xet_hub() as hub:
        library_download(hub.endpoint, cache, list(REPOS))
    assert store_payloads(cache) and store_linked_blobs(cache)
    return cache


def _loads(cache: Path) -> None:
    loaded = offline_load(cache, list(REPOS))
    for repo_id, canonical in REPOS.items():
        assert loaded[repo_id].get("input_ids") == golden_ids(repo_id, canonical), loaded[repo_id]


def _no_link_leaves(root: Path) -> None:
    """Every symlink below ``root`` resolves to a regular file inside ``root``."""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_symlink():
                resolved = Path(os.path.realpath(path))
                assert resolved.is_relative_to(root.resolve()) and resolved.is_file(), (path, resolved)


def _hostile_copy(store_cache: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the store cache whose largest payload is a symlink to a canary outside it: (cache, canary,
    the snapshot file served from that payload)."""
    cache = tmp_path / "hostile" / "cache"
    shutil.copytree(store_cache, cache, symlinks=True)
    canary = tmp_path / "canary.txt"
    canary.write_bytes(CANARY)
    payload = max(store_payloads(cache), key=lambda p: p.stat().st_size)
    os.chmod(payload.parent, 0o755)
    payload.unlink()
    payload.symlink_to(canary)
    victim = next(p for p in cache.glob("*--*/snapshots/*/*")
                  if os.path.realpath(p) == str(canary.resolve()))
    return cache, canary, victim


def test_export_dir_loads_offline_and_no_link_leaves_it(store_cache, tmp_path):
    for flags in ([], ["--materialize"]):
        dest = tmp_path / ("dest" + "".join(flags))
        proc = run_hfcache(["export", str(dest), "--cache-dir", str(store_cache), *flags])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _no_link_leaves(dest)
        assert not (dest / "blobs").exists()  # the payloads became the repos' blobs
        assert not [p for p in dest.glob("*--*/blobs/*") if p.is_symlink()]
        if flags:
            assert not [p for p in dest.rglob("*") if p.is_symlink()]
        verify = run_hfcache(["verify", "--cache-dir", str(dest)])
        assert verify.returncode == 0, verify.stdout + verify.stderr
        _loads(dest)


def test_tar_export_then_import_loads_offline_and_verifies(store_cache, tmp_path):
    tar = tmp_path / "x.tar"
    proc = run_hfcache(["export", str(tar), "--cache-dir", str(store_cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = tmp_path / "y.tar"
    assert run_hfcache(["export", str(again), "--cache-dir", str(store_cache)]).returncode == 0
    assert tar.read_bytes() == again.read_bytes()  # still reproducible
    target = tmp_path / "target" / "hub"
    proc = run_hfcache(["import", str(tar), "--cache-dir", str(target)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verify = run_hfcache(["verify", "--cache-dir", str(target)])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    _no_link_leaves(target)
    _loads(target)


@pytest.mark.parametrize("mode", ["hardlink", "copy"])
def test_link_carries_the_payloads(store_cache, tmp_path, mode):
    dest = store_cache.parent / f"linked-{mode}" if mode == "hardlink" else tmp_path / "linked"
    proc = run_hfcache(["link", "--mode", mode, str(store_cache), str(dest)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run_hfcache(["link", "--mode", mode, str(store_cache), str(dest)]).returncode == 0  # idempotent
    _no_link_leaves(dest)
    assert run_hfcache(["verify", "--cache-dir", str(dest)]).returncode == 0
    _loads(dest)


def _get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # (loopback test server)
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


@pytest.mark.parametrize("backend", ["werkzeug", "uvicorn"])  # uvicorn: the stack of `hfcache serve`
def test_server_answers_every_store_backed_file(store_cache, backend):
    files = sorted(p for p in store_cache.glob("*--*/snapshots/*/*") if p.is_symlink())
    assert files
    with HubServer(store_cache, layout="cache", lfs_redirect=False, backend=backend) as server:
        for path in files:
            folder, commit = path.parts[-4], path.parts[-2]
            repo_id = folder.split("--", 1)[1].replace("--", "/")
            url = f"{server.endpoint}/{repo_id}/resolve/{commit}/{path.name}"
            status, headers, body = _get(url)
            assert status == 200, (url, status)
            assert hashlib.sha256(body).digest() == hashlib.sha256(path.read_bytes()).digest(), url
            status, headers, _ = _get(url, "HEAD")
            etag = (headers.get("x-linked-etag") or headers.get("etag") or "").removeprefix("W/").strip('"')
            assert status == 200 and etag == os.readlink(path).rsplit("/", 1)[-1], (url, headers)


def test_payload_symlinked_to_a_canary_is_refused_by_export_and_server(store_cache, tmp_path):
    cache, canary, victim = _hostile_copy(store_cache, tmp_path)
    for dest in (tmp_path / "out", tmp_path / "out.tar"):
        proc = run_hfcache(["export", str(dest), "--cache-dir", str(cache)])
        assert proc.returncode == 5, proc.stdout + proc.stderr
        assert not dest.exists() or dest.is_file() and CANARY not in dest.read_bytes()
    proc = run_hfcache(["link", "--mode", "copy", str(cache), str(tmp_path / "linked")])
    assert proc.returncode != 0 and not (tmp_path / "linked").exists()
    repo_id = victim.parts[-4].split("--", 1)[1].replace("--", "/")
    with HubServer(cache, layout="cache", lfs_redirect=False) as server:
        url = f"{server.endpoint}/{repo_id}/resolve/{victim.parts[-2]}/{victim.name}"
        status, _, body = _get(url)
        head, _, _ = _get(url, "HEAD")
    assert status == 404 and head == 404 and CANARY not in body
    assert canary.read_bytes() == CANARY


@pytest.mark.skipif(shutil.which("docker-registry") is None, reason="docker-registry not installed")
def test_push_pull_round_trip_loads_offline(store_cache, tmp_path):
    from tests.registry import running_registry

    with running_registry(tmp_path / "registry") as registry:
        ref = f"{registry.host}/hf/xet:v1"
        pushed = run_hfcache(["push", ref, "--cache-dir", str(store_cache), "--plain-http", "--json"])
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        target = tmp_path / "pulled" / "hub"
        pulled = run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--json"],
                             env=clean_env())
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert json.loads(pulled.stdout)["digest"] == json.loads(pushed.stdout)["digest"]
    assert run_hfcache(["verify", "--cache-dir", str(target)]).returncode == 0
    _no_link_leaves(target)
    _loads(target)


def test_import_into_a_store_cache_reuses_its_payloads(store_cache, tmp_path):
    """The target already holds the bytes in its shared store: the import writes no blob again and keeps the links;
    a payload whose bytes differ from its blob name is a conflict (nothing changed)."""
    tar = tmp_path / "x.tar"
    assert run_hfcache(["export", str(tar), "--cache-dir", str(store_cache)]).returncode == 0
    target = tmp_path / "target" / "cache"
    shutil.copytree(store_cache, target, symlinks=True)
    links = {p: os.readlink(p) for p in store_linked_blobs(target)}
    proc = run_hfcache(["import", str(tar), "--cache-dir", str(target), "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["blobs_new"] == 0 and report["bytes_new"] == 0, report
    assert {p: os.readlink(p) for p in store_linked_blobs(target)} == links
    _loads(target)

    payload = max(store_payloads(target), key=lambda p: p.stat().st_size)
    os.chmod(payload, 0o644)
    payload.write_bytes(bytes(len(payload.read_bytes())))  # same size, other bytes
    before = payload.read_bytes()
    proc = run_hfcache(["import", str(tar), "--cache-dir", str(target)])
    assert proc.returncode == 1 and "shared Xet store payload" in proc.stderr, proc.stdout + proc.stderr
    assert payload.read_bytes() == before and {p: os.readlink(p) for p in store_linked_blobs(target)} == links
