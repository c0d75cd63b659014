"""Resume keeps every byte on disk (hub/transfer.py, cache/extents.py): a warm killed with SIGKILL in the middle of a
file fetched in parallel ranges is resumed by requesting only the ranges its extent record does not hold; a record
that is tampered with, another user's, or about another file is never trusted into a wrong blob.

Before: only the first part's contiguous prefix survived a crash (64 MiB over parallel ranges killed after 5 s left
32 MiB on disk, the rerun re-sent 59 MiB).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import clean_env, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
MiB = 1024 * 1024
SIZE = 40 * MiB
FOLDER = "models--acme--big"


@pytest.fixture(scope="module")
def big_hub(tmp_path_factory) -> tuple[Path, str]:
    """A hub with acme/big: gpt2's tokenizer files and a 40 MiB weight file; (root, the weight file's sha256)."""
    root = tmp_path_factory.mktemp("bighub")
    repo = root / "acme" / "big"
    shutil.copytree(HUB / "openai-community" / "gpt2", repo)
    data = os.urandom(SIZE)
    (repo / "model.safetensors").write_bytes(data)
    return root, hashlib.sha256(data).hexdigest()


def _warm(server: HubServer, cache: Path) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["warm", "acme/big", "--kind", "all", "--max-workers", "4", "--cache-dir", str(cache),
                        "--endpoint", server.endpoint, "--json"])


def _record(cache: Path, etag: str) -> Path:
    return cache / ".locks" / FOLDER / f"{etag}.extents.json"


def _recorded(cache: Path, etag: str) -> list[tuple[int, int]]:
    try:
        return [tuple(e) for e in json.loads(_record(cache, etag).read_text())["extents"]]
    except (FileNotFoundError, ValueError):
        return []


def _killed_mid_download(server: HubServer, cache: Path, etag: str, at_least: int) -> list[tuple[int, int]]:
    """Start a warm, SIGKILL it once its record holds ``at_least`` bytes in two extents or more; the record."""
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", "acme/big", "--kind", "all", "--max-workers",
                             "4", "--cache-dir", str(cache), "--endpoint", server.endpoint, "-q"], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            extents = _recorded(cache, etag)
            if len(extents) >= 2 and sum(e - s for s, e in extents) >= at_least:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the download never recorded enough extents")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    return _recorded(cache, etag)


def _blob_sha256(cache: Path, etag: str) -> str:
    return hashlib.sha256((cache / FOLDER / "blobs" / etag).read_bytes()).hexdigest()


def _weight_requests(server: HubServer) -> list:
    return [r for r in server.requests if r.method == "GET" and r.origin == "cdn"]


def _span(request) -> tuple[int, int]:
    start, end = request.range.split("=")[1].split("-")
    return int(start), int(end) + 1


@pytest.mark.slow
def test_a_killed_parallel_download_is_resumed_by_its_missing_ranges_only(tmp_path, big_hub):
    root, etag = big_hub
    cache = tmp_path / "cache"
    with HubServer(root, throttle_bps=2_000_000) as server:
        kept = _killed_mid_download(server, cache, etag, 8 * MiB)
    held = sum(end - start for start, end in kept)
    assert len(kept) >= 2 and held >= 8 * MiB, kept
    with HubServer(root) as server:
        proc = _warm(server, cache)
        requests = _weight_requests(server)
    assert proc.returncode == 0, proc.stderr
    assert requests and all(r.status == 206 for r in requests), requests
    for request in requests:  # no range asked overlaps what the record held
        start, end = _span(request)
        assert all(end <= s or start >= e for s, e in kept), (request.range, kept)
    missing = SIZE - held
    # what crossed the wire: the missing bytes (a part split on the way is cut where its second half begins)
    assert sum(r.bytes_sent for r in requests) <= missing + 4 * MiB, (requests, kept)
    report = json.loads(proc.stdout)["repos"][0]
    weight = next(f for f in report["files"] if f["path"] == "model.safetensors")
    assert weight["source"] == "downloaded"
    assert _blob_sha256(cache, etag) == etag
    assert not _record(cache, etag).exists() and not list(cache.rglob("*.incomplete"))
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0


def _incomplete(record: Path) -> Path:
    return next((record.parent.parent.parent / FOLDER / "blobs").glob("*.incomplete"))


def _tamper_full(record: Path) -> None:
    data = json.loads(record.read_text())
    data["extents"] = [[0, _incomplete(record).stat().st_size]]  # "all of it is here": its own owner's hostile edit
    record.write_text(json.dumps(data))


def _tamper_other_file(record: Path) -> None:
    data = json.loads(record.read_text())
    data["incomplete"] = "0" * 64 + ".deadbeef.incomplete"
    record.write_text(json.dumps(data))


def _tamper_owner(record: Path) -> None:
    os.chown(record, 65534, 65534)  # another user's record: no authority for this one


def _tamper_mode(record: Path) -> None:
    os.chmod(record, 0o666)


def _tamper_bytes(record: Path) -> None:
    """The record is right, the bytes it vouches for are not: a member overwrote a recorded extent."""
    extents = json.loads(record.read_text())["extents"]
    with open(_incomplete(record), "r+b") as f:
        f.seek(extents[0][0])
        f.write(b"\0" * 4096)


@pytest.mark.slow
@pytest.mark.parametrize("tamper", [_tamper_full, _tamper_other_file, _tamper_owner, _tamper_mode, _tamper_bytes],
                         ids=lambda f: f.__name__[len("_tamper_"):])
def test_a_record_that_does_not_match_its_file_is_never_trusted_into_a_wrong_blob(tmp_path, big_hub, tamper):
    if tamper is _tamper_owner and os.geteuid() != 0:
        pytest.skip("chown needs root")
    root, etag = big_hub
    cache = tmp_path / "cache"
    with HubServer(root, throttle_bps=4_000_000) as server:
        kept = _killed_mid_download(server, cache, etag, 4 * MiB)
    tamper(_record(cache, etag))
    with HubServer(root) as server:
        proc = _warm(server, cache)
        requests = _weight_requests(server)
    assert proc.returncode == 0, proc.stderr
    assert _blob_sha256(cache, etag) == etag  # the published blob is the right one, whatever the record said
    assert not list(cache.rglob("*.incomplete"))
    fetched = sum(r.bytes_sent for r in requests)
    if tamper is _tamper_bytes:  # trusted, then refuted by the hash: fetched again from byte 0
        assert fetched >= SIZE, (fetched, kept)
    elif tamper is _tamper_full:  # trusted: refuted by the hash unless the bytes it claims had landed unrecorded
        pass
    else:  # ignored: at most the contiguous prefix is kept
        prefix = kept[0][1] if kept[0][0] == 0 else 0
        assert fetched >= SIZE - prefix - MiB, (fetched, kept)
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0
