"""serve (often root) never reads a file outside the cache through a name a group member swaps.

A real file in ``snapshots/<commit>/`` (a no-symlink cache) is hashed for its listing. It was checked through a
safe walk and then hashed by path again: a member exchanging it with a link to a root-only file made the mirror
publish that file's sha256 and size. It is now hashed from the descriptor the safe walk
opened (``serve/cache_store.py`` ``_from_real_file``, ``serve/vocabulary.py`` ``HashMemo.describe(opened=)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import SECRET, Canary
from tests.helpers import run_hfcache
from tests.shared_cache import SWAP, shared_cache
from tests.testhub import HubServer
from tests.users import ALICE, Runtime, needs_root

HUB = os.path.join(os.path.dirname(__file__), "..", "data", "hub")


@needs_root
@pytest.mark.slow
def test_serve_never_hashes_a_file_a_member_swaps_for_a_link(runtime: Runtime, tmp_path) -> None:
    cache = shared_cache(runtime, "serve-race")
    with HubServer(HUB) as upstream:
        assert hfcache.warm([WarmRequest.parse("gpt2")], cache_dir=cache, endpoint=upstream.endpoint, token=False).ok
    canary = Canary(runtime.base)
    snapshot = next((cache / "models--gpt2" / "snapshots").iterdir())
    leak = snapshot / "leak.bin"
    subprocess.run([*ALICE.setpriv(), "sh", "-c", f"umask 002; echo hello > {leak}"], check=True)
    stop = runtime.base / "stop-swap"
    spec = {"stop": str(stop), "rounds": 2_000_000, "hold": 0.0005, "plant": [],
            "exchange": [[str(leak), str(canary.secret)]]}
    member = subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", SWAP, json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True, env=runtime.env(ALICE))
    secret_sha = hashlib.sha256(SECRET).hexdigest()
    answers = []
    try:
        with HubServer(cache, layout="cache", backend="uvicorn", lfs_redirect=False) as served:
            url = f"{served.endpoint}/api/models/gpt2/tree/main"
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url, timeout=10) as response:
                        body = response.read().decode()
                except urllib.error.HTTPError as exc:
                    raise AssertionError(exc.read().decode()) from None
                answers.append(body)
    finally:
        stop.touch()
        swaps = int(member.communicate(timeout=60)[0].strip() or 0)
    assert swaps > 100 and answers, (swaps, len(answers))  # the race ran (how often the file was listed varies)
    assert not [a for a in answers if secret_sha in a], "the mirror published the hash of a file outside the cache"
    canary.assert_unchanged()
    leak.unlink()
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0


def test_a_real_file_is_hashed_from_the_descriptor_the_safe_walk_opened(tmp_path) -> None:
    """The window the race above aims at, opened on purpose: the name is swapped for a link to a root-only file
    between the safe open and the hashing; what is hashed is still the file that was opened."""
    from hfcache.serve.vocabulary import HashMemo, open_beneath

    canary = Canary(tmp_path)
    root = tmp_path / "cache"
    (root / "snap").mkdir(parents=True)
    local = root / "snap" / "leak.bin"
    local.write_bytes(b"hello\n")
    with open_beneath(root, ("snap", "leak.bin")) as opened:
        local.unlink()
        os.symlink(canary.secret, local)  # what a member's exchange leaves at the name
        described = HashMemo().describe("leak.bin", local, opened=opened)
    assert described.sha256 == hashlib.sha256(b"hello\n").hexdigest() and described.size == 6
    assert described.sha256 != hashlib.sha256(SECRET).hexdigest()
    canary.assert_unchanged()


@needs_root
@pytest.mark.slow
def test_serve_of_a_folder_of_repos_never_follows_a_file_a_member_swaps(runtime: Runtime) -> None:
    """``serve --layout repos`` re-checked containment with ``resolve()`` and then opened the resolved path, which
    follows a link swapped in after the check (a root-only file was read this way in 1–32 requests). It now opens from the root with ``O_NOFOLLOW`` at every component."""
    from tests.users import GROUP

    root = runtime.base / "repos"
    repo = root / "attacker-org" / "repo"
    repo.mkdir(parents=True)
    for folder in (root, root / "attacker-org", repo):
        os.chown(folder, 0, GROUP)
        os.chmod(folder, 0o2775)
    (repo / "data.txt").write_bytes(b"public data\n")
    (runtime.base / "repos-race").mkdir()
    canary = Canary(runtime.base / "repos-race")  # the module's runtime is shared: a folder of its own
    stop = runtime.base / "stop-swap-repos"
    spec = {"stop": str(stop), "rounds": 5_000_000, "hold": 0, "plant": [],
            "exchange": [[str(repo / "data.txt"), str(canary.secret)]]}
    member = subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", SWAP, json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True, env=runtime.env(ALICE))
    bodies = []
    try:
        with HubServer(root, backend="uvicorn", lfs_redirect=False) as served:
            url = f"{served.endpoint}/attacker-org/repo/resolve/main/data.txt"
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url, timeout=10) as response:
                        bodies.append(response.read())
                except urllib.error.HTTPError as exc:
                    bodies.append(exc.code)
    finally:
        stop.touch()
        swaps = int(member.communicate(timeout=60)[0].strip() or 0)
    assert swaps > 100 and b"public data\n" in bodies, (swaps, bodies[:5])
    assert SECRET not in bodies and not any(isinstance(b, bytes) and b"root-only" in b for b in bodies)
    canary.assert_unchanged()
