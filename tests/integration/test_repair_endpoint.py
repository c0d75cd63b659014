"""verify --repair fetches each revision from the endpoint warm recorded for it, and says so when it cannot.

warm records the endpoint that served each commit in its published record (``hfcache/cache/published.py``);
``verify --repair`` uses it by default (``--endpoint`` overrides it; ``HF_ENDPOINT`` / the public Hub serve revisions
with no record). A revision no endpoint can be reached for is an error line each on stderr and exit 3 (network),
not 1. The record is state anyone who can write the cache can change: a hint of *where*, never a reason to send the
token (docs/security.md, "Credentials are bound to the host the user gave them for").

The public Hub must never be asked: the repairing process runs under hfcache's network guard (the ``sitecustomize``
``hfcache exec`` uses) allowing only the test Hub's port, and ``HF_ENDPOINT`` is unset.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hfcache.offline
from hfcache.cache.published import read_record
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.testhub import HubServer
from tests.users import ALICE, BOB, GROUP, Runtime, needs_root

HUB = Path(__file__).parent.parent / "data" / "hub"
GUARD_SITE = Path(hfcache.offline.__file__).parent / "_guard_site"
TOKEN = "hf_n2RepairTokenBoundToItsHost"
FOLDERS = ("models--gpt2", "models--openai-community--gpt2")  # a legacy id fills both folders (one blob inode)


def _port(server: HubServer) -> int:
    return int(server.endpoint.rsplit(":", 1)[1])


def _guarded(*ports: int, **extra: str) -> dict[str, str]:
    """An environment whose Python processes may connect to these loopback ports only (HF_ENDPOINT unset unless
    in ``extra``): anything else, the public Hub included, is refused by hfcache's network guard."""
    env = clean_env(PYTHONPATH=str(GUARD_SITE), HFCACHE_ALLOW_HOSTS=",".join(f"127.0.0.1:{p}" for p in ports),
                    **extra)
    assert "HF_ENDPOINT" in extra or "HF_ENDPOINT" not in env
    return env


def _warmed(tmp_path: Path, hub: HubServer) -> Path:
    cache = tmp_path / "cache"
    proc = run_hfcache(["warm", "gpt2", "--cache-dir", str(cache), "--endpoint", hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    return cache


def _corrupt(cache: Path) -> None:
    """Overwrite config.json's blob in place (both folders' hardlinks): one broken revision per folder."""
    [config] = (cache / FOLDERS[1] / "snapshots").glob("*/config.json")
    config.resolve().write_bytes(b'{"corrupted": true}\n')


def _repair(cache: Path, env: dict[str, str], *extra: str):
    return run_hfcache(["verify", "--repair", "--cache-dir", str(cache), *extra], env=env)


def _verified(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_recorded_endpoint_down_is_exit_3_and_up_it_repairs_without_the_public_hub(tmp_path):
    canary = Canary(tmp_path)
    hub = HubServer(HUB).start()
    port = _port(hub)
    try:
        cache = _warmed(tmp_path, hub)
    finally:
        hub.stop()
    for folder in FOLDERS:
        [record] = (cache / ".locks" / folder / "hfcache").glob("*.json")
        assert read_record(cache, folder, record.stem).endpoint == f"http://127.0.0.1:{port}"
    _corrupt(cache)
    down = _repair(cache, _guarded(port))
    assert down.returncode == 3, down.stdout + down.stderr
    errors = [line for line in down.stderr.splitlines() if line.startswith("hfcache: error: ")]
    assert len(errors) == 2, down.stderr  # one line per broken revision
    for line in errors:
        assert line.startswith("hfcache: error: not repaired: ") and f"cannot connect to http://127.0.0.1:{port}" in line
    assert "Traceback" not in down.stderr and "huggingface.co" not in down.stdout + down.stderr
    assert "hint: check the network and the endpoint" in down.stderr
    with HubServer(HUB, port=port) as hub:  # the recorded URL answers again
        up = _repair(cache, _guarded(port))
        asked = hub.requests
    assert up.returncode == 0, up.stdout + up.stderr
    assert asked and all(not r.authorized for r in asked)
    canary.assert_unchanged()
    _verified(cache)


def test_the_guard_would_have_caught_a_public_hub_request(tmp_path):
    """Control for the test above: the same guarded environment refuses a repair that asks huggingface.co (exit 4,
    offline: one line per revision naming it, no internal error)."""
    with HubServer(HUB) as hub:
        cache = _warmed(tmp_path, hub)
        _corrupt(cache)
        hub.clear_log()
        proc = _repair(cache, _guarded(_port(hub)), "--endpoint", "https://huggingface.co")
        assert hub.requests == []
    assert proc.returncode == 4, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hfcache: error: ")]
    assert len(errors) == 2 and all("https://huggingface.co is not reachable from here" in e for e in errors), errors
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_recorded_endpoint_gets_the_token_only_when_it_is_the_users(tmp_path):
    """The cache came from A; the user's HF_ENDPOINT is B and a token is set. Repair fetches from A (the record)
    without the token; with HF_ENDPOINT=A the token goes to A (its host); --endpoint B overrides the record."""
    canary = Canary(tmp_path)
    with HubServer(HUB) as a, HubServer(HUB) as b:
        cache = _warmed(tmp_path, a)
        ports = (_port(a), _port(b))
        a.clear_log()
        _corrupt(cache)
        proc = _repair(cache, _guarded(*ports, HF_TOKEN=TOKEN, HF_ENDPOINT=b.endpoint))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert a.requests and not any(r.authorized for r in a.requests)
        assert b.requests == []
        a.clear_log()
        _corrupt(cache)
        proc = _repair(cache, _guarded(*ports, HF_TOKEN=TOKEN, HF_ENDPOINT=a.endpoint))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert a.requests and all(r.authorized for r in a.requests if r.origin == "hub")
        a.clear_log()
        _corrupt(cache)
        proc = _repair(cache, _guarded(*ports, HF_TOKEN=TOKEN), "--endpoint", b.endpoint)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert a.requests == [] and b.requests and all(r.authorized for r in b.requests if r.origin == "hub")
    assert TOKEN not in proc.stdout + proc.stderr
    canary.assert_unchanged()
    _verified(cache)


def test_a_planted_record_gets_neither_its_credentials_nor_the_token(tmp_path):
    """Someone who can write the cache points the record at another server, with userinfo: repair asks it (a hint
    of where), but sends no Authorization at all: not the userinfo's, not the user's token (bound to the public
    Hub here, which the guard would refuse anyway)."""
    canary = Canary(tmp_path)
    with HubServer(HUB) as hub:
        cache = _warmed(tmp_path, hub)
    with HubServer(HUB) as planted:
        for folder in FOLDERS:
            [record] = (cache / ".locks" / folder / "hfcache").glob("*.json")
            doc = json.loads(record.read_text())
            doc["endpoint"] = f"http://member:{TOKEN}@127.0.0.1:{_port(planted)}/?token={TOKEN}"
            record.write_text(json.dumps(doc))
        _corrupt(cache)
        proc = _repair(cache, _guarded(_port(planted), HF_TOKEN=TOKEN), "--json")
        asked = planted.requests
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert asked and not any(r.authorized for r in asked)
    assert all(TOKEN not in r.path for r in asked)
    assert TOKEN not in proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 0
    canary.assert_unchanged()
    _verified(cache)


_PLANT = r"""
import json, os, sys
path, endpoint = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
doc["endpoint"] = endpoint
with open(path + ".new", "w") as out:
    json.dump(doc, out)
os.replace(path + ".new", path)
"""


@needs_root
def test_a_group_member_repoints_the_record_and_the_token_stays_home(runtime: Runtime, tmp_path):
    """A shared cache (setgid, group-writable): ALICE warmed it; as a group member she can replace warm's record,
    and points it at her own server with credentials in the URL. BOB, who holds a token for HF_ENDPOINT, repairs:
    her server is asked (a hint of where) with no Authorization, the token's own endpoint is not needed, and BOB's
    repair succeeds."""
    canary = Canary(tmp_path)
    cache = runtime.base / "shared-repair"
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)
    with HubServer(HUB) as hub, HubServer(HUB) as alices:
        warm = runtime.hfcache(ALICE, "warm", "gpt2", "--cache-dir", str(cache), "--endpoint", hub.endpoint)
        assert warm.returncode == 0, warm.stderr
        for folder in FOLDERS:
            [record] = (cache / ".locks" / folder / "hfcache").glob("*.json")
            planted = runtime.run(ALICE, ["-c", _PLANT, str(record),
                                          f"http://alice:{TOKEN}@127.0.0.1:{_port(alices)}/?token={TOKEN}"])
            assert planted.returncode == 0, planted.stderr
            assert record.stat().st_uid == ALICE.uid
        _corrupt(cache)
        hub.clear_log()
        proc = runtime.hfcache(BOB, "verify", "--repair", "--cache-dir", str(cache), "--json",
                               HF_TOKEN=TOKEN, HF_ENDPOINT=hub.endpoint)
        asked = alices.requests
        assert hub.requests == []
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert asked and not any(r.authorized for r in asked) and all(TOKEN not in r.path for r in asked)
    assert TOKEN not in proc.stdout + proc.stderr
    canary.assert_unchanged()
    _verified(cache)
