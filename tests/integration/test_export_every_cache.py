"""Export and import of a cache holding every fixture repo and every legacy alias, and huggingface_hub 2.4's shared
Xet store: as a tar, a directory and a pipe, the tar extracted by GNU tar too.

The source cache is written by the library's own code: the unmodified huggingface_hub + hf_xet download two aliases
through the Xet-speaking test Hub (their blobs are links into the shared store), then ``hfcache.warm`` adds every
other fixture repo, canonical id and alias, and the kernel repo. ``distilbert-base-uncased`` sorts before
``distilbert/distilbert-base-uncased`` by id but after it by folder name: an export that chose the holder of a shared
blob in one order and wrote entries in the other put the hardlink before its target.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import HUB, clean_env, run_hfcache
from tests.testhub import HubServer
from tests.xet_caches import library_download, store_linked_blobs, store_payloads, xet_hub

pytestmark = pytest.mark.slow

ALIASES: dict[str, str] = json.loads((HUB / "legacy_ids.json").read_text(encoding="utf-8"))
CANONICAL = sorted(f"{org.name}/{repo.name}" for org in HUB.iterdir() if org.is_dir() and org.name != "kernels"
                   for repo in org.iterdir() if repo.is_dir())
THROUGH_XET = ["distilbert-base-uncased", "gpt2"]  # written by huggingface_hub into the shared store


def _every(cache: Path) -> None:
    """Every fixture repo, canonical id and alias, the kernel repo; two aliases written by huggingface_hub."""
    with xet_hub(legacy_ids=ALIASES) as hub:
        library_download(hub.endpoint, cache, THROUGH_XET)
    requests = [WarmRequest.parse(s) for s in [*CANONICAL, *sorted(set(ALIASES) - set(THROUGH_XET))]]
    requests.append(WarmRequest.parse("kernels-community/tiny", repo_type="kernel", kind="all"))
    _warm(cache, requests)
    assert len({p.name for p in cache.iterdir() if "--" in p.name}) == len(CANONICAL) + len(ALIASES) + 1


def _distilbert_xet(cache: Path) -> None:
    """The alias written by huggingface_hub (blobs linked into the shared store), the canonical id by hfcache."""
    with xet_hub(legacy_ids=ALIASES) as hub:
        library_download(hub.endpoint, cache, ["distilbert-base-uncased"])
    _warm(cache, [WarmRequest.parse("distilbert/distilbert-base-uncased")])


def _warm(cache: Path, requests: list[WarmRequest]) -> None:
    with HubServer(HUB) as server:
        report = hfcache.warm(requests, cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos]


#: Caches whose shared blobs are first held (in scan order, by id) by a folder that sorts after another holder:
#: with bert-base-uncased beside them its folder holds the shared vocab first in both orders, hiding the mistake.
CACHES = {
    "every": _every,
    "distilbert-alias": lambda cache: _warm(cache, [WarmRequest.parse("distilbert-base-uncased")]),
    "distilbert-xet": _distilbert_xet,
}


@pytest.fixture(scope="module", params=sorted(CACHES))
def every_cache(request, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp(request.param) / "cache"
    CACHES[request.param](cache)
    assert {"models--distilbert-base-uncased", "models--distilbert--distilbert-base-uncased"} <= set(
        os.listdir(cache))
    if request.param != "distilbert-alias":
        assert store_payloads(cache) and store_linked_blobs(cache)
    return cache


def contents(cache: Path) -> dict[str, tuple[str, str]]:
    """Every snapshot file (content sha256, followed through links) and ref of ``cache``."""
    out = {}
    for p in sorted(cache.glob("*--*/snapshots/*/**/*")):
        if p.is_file():
            out[str(p.relative_to(cache))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    for p in sorted(cache.glob("*--*/refs/**/*")):
        if p.is_file():
            out[str(p.relative_to(cache))] = ("ref", p.read_text())
    return out


def imported(archive: str, target: Path, stdin: bytes | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-m", "hfcache", "import", archive, "--cache-dir", str(target), "--json"],
                          input=stdin, capture_output=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert run_hfcache(["verify", "--cache-dir", str(target)]).returncode == 0
    return json.loads(proc.stdout)


def test_tar_lists_every_hardlink_after_its_target_and_imports(every_cache, tmp_path):
    archive = tmp_path / "every.tar"
    proc = run_hfcache(["export", str(archive), "--cache-dir", str(every_cache), "--json"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    files_before: set[str] = set()
    links = 0
    for m in members:
        if m.islnk():
            assert m.linkname in files_before, f"{m.name} links to {m.linkname}, not an earlier file"
            links += 1
        elif m.isfile():
            files_before.add(m.name)
    assert links and [m.name for m in members] == sorted(m.name for m in members)
    assert any(m.islnk() and m.name.startswith("models--distilbert-base-uncased/blobs/") for m in members)

    target = tmp_path / "imported"
    imported(str(archive), target)
    assert contents(target) == contents(every_cache)

    extracted = tmp_path / "gnu"
    extracted.mkdir()
    gnu = subprocess.run(["tar", "-xf", str(archive), "-C", str(extracted)], capture_output=True, text=True)
    assert gnu.returncode == 0, gnu.stderr
    assert contents(extracted) == contents(every_cache)
    shared = [p for p in extracted.glob("*--*/blobs/*") if p.stat().st_nlink > 1]
    assert shared and run_hfcache(["verify", "--cache-dir", str(extracted)]).returncode == 0


def test_directory_and_pipe_exports_of_every_cache_import(every_cache, tmp_path):
    out = tmp_path / "exported"
    proc = run_hfcache(["export", str(out), "--cache-dir", str(every_cache)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert contents(out) == contents(every_cache)
    assert run_hfcache(["verify", "--cache-dir", str(out)]).returncode == 0
    vocab = {p.stat().st_ino for p in out.glob("models--*distilbert-base-uncased/blobs/*")
             if p.name == "fb140275c155a9c7c5a3b3e0e77a9e839594a938"}
    assert len(vocab) == 1  # the alias and the canonical folder share one inode

    exporter = subprocess.run([sys.executable, "-m", "hfcache", "export", "-", "--cache-dir", str(every_cache)],
                              capture_output=True, env=clean_env(), timeout=300)
    assert exporter.returncode == 0, exporter.stderr.decode()
    target = tmp_path / "piped"
    report = imported("-", target, stdin=exporter.stdout)
    assert report["blob_contents"] < report["blobs_new"]
    assert contents(target) == contents(every_cache)
    assert not any(p.is_symlink() and not p.exists() for p in target.rglob("*"))
    assert os.listdir(target / "models--distilbert-base-uncased" / "refs") == ["main"]


@pytest.mark.parametrize("split", ["single", "repo"])
def test_push_layers_list_every_hardlink_after_its_target(every_cache, split):
    """push's layers are cut from the same plan (oci/image.py split_plan): each layer a tar a reader can extract."""
    from hfcache.move.export import plan_export
    from hfcache.oci.image import split_plan

    plan = plan_export(every_cache)
    layers = split_plan(plan, split)
    assert len(layers) == (1 if split == "single" else len(plan.repos))
    for layer in layers:
        earlier: set[str] = set()
        for e in layer.entries:
            assert e.kind != "hardlink" or e.target in earlier, (e.name, e.target)
            if e.kind == "file":
                earlier.add(e.name)
