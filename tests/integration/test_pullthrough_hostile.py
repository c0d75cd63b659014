"""The pull-through mirror (``hfcache serve --upstream``) against slow and hostile upstreams
and a member of a shared cache's group.

Each test builds its hostile upstream or member here (a dripping server, a proxy in front of the fixture Hub that
rewrites its answers, a swap loop run as another uid), runs the real mirror (uvicorn, in-process, what ``hfcache
serve`` runs), asserts the answer (status, ``X-Error-Code``, message), that a canary folder outside the cache did
not change, and that ``hfcache verify`` still passes on the cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx2
import pytest

from hfcache.serve.pullthrough import PullThroughConfig
from tests.canary import Canary
from tests.helpers import run_hfcache
from tests.hostile import PeerServer, Route, send
from tests.testhub import HubServer
from tests.users import ALICE, GROUP, Runtime

TOK = "acme/tok"


def make_hub(base: Path, repos: dict[str, dict[str, str]], legacy: dict[str, str] | None = None) -> Path:
    """A fixture Hub folder: ``repo id -> {path: text}``; ``legacy``: its legacy_ids.json (legacy -> canonical)."""
    hub = base / "hub"
    for repo_id, files in repos.items():
        for rel, text in files.items():
            (hub / repo_id / rel).parent.mkdir(parents=True, exist_ok=True)
            (hub / repo_id / rel).write_text(text)
    if legacy:
        (hub / "legacy_ids.json").write_text(json.dumps(legacy))
    return hub


@contextmanager
def mirror(cache: Path, *upstreams: str, **options) -> Iterator[HubServer]:
    """The pull-through server in-process (uvicorn, one origin, as ``hfcache serve`` runs it)."""
    config = PullThroughConfig(upstreams=tuple(upstreams), **options)
    cache.mkdir(parents=True, exist_ok=True)
    with HubServer(cache, layout="cache", backend="uvicorn", lfs_redirect=False, upstream=config) as server:
        yield server


def verify(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--allow-empty"])  # a refused fetch keeps nothing
    assert proc.returncode == 0, proc.stdout + proc.stderr


def repo_folders(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(("models--", "datasets--")))


class _Upstream(PeerServer):
    """A hostile upstream: ``answer`` answers every request (a drip, or the test Hub's answers rewritten: what the
    test Hub itself never sends); ``requests`` lists each request line."""

    def __init__(self, answer: Route) -> None:
        super().__init__()
        self.routes["/"] = answer

    @property
    def requests(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.log]


def dripping(stop: threading.Event) -> Route:
    """Answers 200 with a 1 MB body and sends one byte a second: never idle long enough for a read timeout."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(10**6))
        h.end_headers()
        while not stop.wait(1.0):
            h.wfile.write(b" ")
            h.wfile.flush()
    return answer


def proxy(target: str, rewrite: Callable[[str, int, dict[str, str], bytes], tuple[int, dict[str, str], bytes]],
          route: Callable[[str], str] = lambda path: path) -> Route:
    """Forwards each request to the fixture Hub at ``target`` (path mapped by ``route``), then ``rewrite``s the
    answer (path, status, headers, body) -> (status, headers, body)."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        path = route(h.path)
        r = httpx2.request(h.command, target + path, follow_redirects=False, timeout=30)
        keep = {k: v for k, v in r.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")}
        status, headers, body = rewrite(path, r.status_code, keep, r.content)
        send(h, status, body, {k: v for k, v in headers.items() if k.lower() != "content-length"})
    return answer


def warm_into(cache: Path, endpoint: str, *repo_ids: str) -> None:
    proc = run_hfcache(["warm", *repo_ids, "--cache-dir", str(cache), "--endpoint", endpoint, "--kind", "all"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- a dripping upstream never starves cached answers -----------------------------------------------------------


def test_held_files_answer_while_forty_misses_wait_on_a_dripping_upstream(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "mirror"
    hub = make_hub(tmp_path, {TOK: {"vocab.txt": "held\n", "config.json": "{}"}})
    with HubServer(hub) as good:
        warm_into(cache, good.endpoint, TOK)
        commit = good.commit_of(TOK)
    drip_stop = threading.Event()
    with (_Upstream(dripping(drip_stop)) as drip, mirror(cache, drip.endpoint, timeout=2) as server,
          ThreadPoolExecutor(40) as pool):
        misses = [pool.submit(httpx2.get, f"{server.endpoint}/api/models/acme/miss{n}", timeout=300)
                  for n in range(40)]
        time.sleep(1.0)  # every miss is now waiting on the drip (or was answered 503 at once)
        started = time.monotonic()
        by_commit = httpx2.get(f"{server.endpoint}/{TOK}/resolve/{commit}/vocab.txt", timeout=30)
        commit_s = time.monotonic() - started
        started = time.monotonic()
        by_branch = httpx2.get(f"{server.endpoint}/{TOK}/resolve/main/vocab.txt", timeout=30)
        branch_s = time.monotonic() - started
        waiting = sum(not f.done() for f in misses)
        early = [f.result() for f in misses if f.done()]
        drip_stop.set()  # the drip ends: the waiting misses are answered and the mirror can stop
        late = [f.result() for f in misses]

    assert by_commit.status_code == 200 and by_commit.content == b"held\n" and commit_s < 3.0, commit_s
    # The branch is revalidated, and the upstream silent for --timeout (2 s) counts as failing: the cache answers.
    assert by_branch.status_code == 200 and by_branch.content == b"held\n" and branch_s < 6.0, branch_s
    assert waiting >= 20  # the misses were still held by the drip while the cache answered
    assert all((r.status_code, r.headers["x-error-code"]) == (503, "UpstreamUnavailable") for r in early)
    assert all(r.headers.get("retry-after") for r in early)
    assert {r.status_code for r in late} <= {503, 502, 404}
    assert repo_folders(cache) == ["models--acme--tok"]
    canary.assert_unchanged()
    verify(cache)


def test_a_held_commit_without_a_listing_is_answered_with_no_upstream_request(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "mirror"
    hub = make_hub(tmp_path, {TOK: {"vocab.txt": "held\n", "config.json": "{}"}})
    with HubServer(hub) as good:
        warm_into(cache, good.endpoint, TOK)  # warm keeps no trees/<commit>.json listing
        commit = good.commit_of(TOK)
        assert not (cache / "models--acme--tok" / "trees").exists()
        with _Upstream(proxy(good.endpoint, lambda p, s, h, b: (s, h, b))) as counted, \
                mirror(cache, counted.endpoint) as server:
            info = httpx2.get(f"{server.endpoint}/api/models/{TOK}/revision/{commit}")
            body = httpx2.get(f"{server.endpoint}/{TOK}/resolve/{commit}/vocab.txt")
            head = httpx2.head(f"{server.endpoint}/{TOK}/resolve/{commit}/config.json")
            asked_for_held = list(counted.requests)
            # A file the commit does not hold makes the mirror ask upstream for the listing, once.
            missing = httpx2.get(f"{server.endpoint}/{TOK}/resolve/{commit}/nope.txt")

    assert info.status_code == 200 and info.json()["sha"] == commit
    assert body.status_code == 200 and body.content == b"held\n" and head.status_code == 200
    assert asked_for_held == []  # answered from the cache: zero upstream requests
    # Not held: upstream's whole listing was asked for (once) and says the commit has no such file.
    assert missing.status_code == 404 and missing.headers["x-repo-commit"] == commit
    assert any(f"/revision/{commit}" in r for r in counted.requests)
    canary.assert_unchanged()
    verify(cache)


# --- --allow cannot be bypassed by an upstream's rename -----------------------------------------------------------


def test_an_upstream_renaming_an_allowed_legacy_id_to_another_repo_does_not_open_it(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "mirror"
    hub = make_hub(tmp_path, {"victim-org/victim": {"vocab.txt": "victim\n", "secret.txt": "victim data\n"}},
                   legacy={"gpt2": "victim-org/victim"})  # the hostile upstream answers gpt2 as victim-org/victim
    with HubServer(hub) as hostile, mirror(cache, hostile.endpoint, allow=("gpt2",)) as server:
        gpt2 = httpx2.get(f"{server.endpoint}/api/models/gpt2")
        gpt2_file = httpx2.get(f"{server.endpoint}/gpt2/resolve/main/vocab.txt", follow_redirects=True)
        before = len(hostile.requests)
        victim = httpx2.get(f"{server.endpoint}/api/models/victim-org/victim")
        victim_file = httpx2.get(f"{server.endpoint}/victim-org/victim/resolve/main/secret.txt")
        victim_asked = len(hostile.requests) - before

    assert gpt2.status_code == 200 and gpt2.json()["id"] == "gpt2"  # not followed: kept under the id asked
    assert gpt2_file.status_code == 200 and gpt2_file.content == b"victim\n"
    for answer in (victim, victim_file):
        assert (answer.status_code, answer.headers["x-error-code"]) == (403, "RepoNotAllowed"), answer.text
        assert "victim-org/victim" in answer.headers["x-error-message"]
    assert victim_asked == 0  # refused without contacting upstream
    assert repo_folders(cache) == ["models--gpt2"]  # nothing stored under the repo nobody asked for
    canary.assert_unchanged()
    verify(cache)


def test_a_legacy_rename_the_hub_makes_is_followed_and_its_canonical_id_allowed(tmp_path):
    cache = tmp_path / "mirror"
    hub = make_hub(tmp_path, {"openai-community/gpt2": {"vocab.txt": "gpt2\n"}, "other/x": {"a.txt": "x\n"}},
                   legacy={"gpt2": "openai-community/gpt2"})
    with HubServer(hub) as upstream, mirror(cache, upstream.endpoint, allow=("gpt2",)) as server:
        legacy = httpx2.get(f"{server.endpoint}/gpt2/resolve/main/vocab.txt", follow_redirects=True)
        canonical = httpx2.get(f"{server.endpoint}/api/models/openai-community/gpt2")
        other = httpx2.get(f"{server.endpoint}/api/models/other/x")

    assert legacy.status_code == 200 and legacy.content == b"gpt2\n"
    assert canonical.status_code == 200 and canonical.json()["id"] == "openai-community/gpt2"
    assert (other.status_code, other.headers["x-error-code"]) == (403, "RepoNotAllowed")
    assert repo_folders(cache) == ["models--gpt2", "models--openai-community--gpt2"]
    verify(cache)


# --- a 40-hex revision must come back as itself ------------------------------------------------------------------


def test_a_commit_answered_with_another_sha_is_refused_and_nothing_is_kept(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "mirror"
    hub = make_hub(tmp_path, {TOK: {"vocab.txt": "current\n"}})
    asked = "c" * 40
    with HubServer(hub) as good:
        # The hostile upstream answers any revision with main's commit D (repo info, tree and resolve alike).
        def route(path: str) -> str:
            return path.replace(asked, "main")

        with _Upstream(proxy(good.endpoint, lambda p, s, h, b: (s, h, b), route)) as hostile, \
                mirror(cache, hostile.endpoint) as server:
            info = httpx2.get(f"{server.endpoint}/api/models/{TOK}/revision/{asked}")
            body = httpx2.get(f"{server.endpoint}/{TOK}/resolve/{asked}/vocab.txt")
            tree = httpx2.get(f"{server.endpoint}/api/models/{TOK}/tree/{asked}")
        real = good.commit_of(TOK)

    for answer in (info, body, tree):
        assert (answer.status_code, answer.headers["x-error-code"]) == (502, "UpstreamError"), answer.text
        message = answer.headers["x-error-message"]
        assert asked in message and real in message, message  # names the commit asked and the one answered
    assert repo_folders(cache) == []  # nothing stored: no ref, no snapshot, no listing
    canary.assert_unchanged()
    verify(cache)


# --- case variants share one folder ---------------------------------------------------------------------------


def case_variants(repo_id: str, n: int) -> list[str]:
    letters = [i for i, c in enumerate(repo_id) if c.isalpha()]
    out = []
    for k in range(1, n + 1):
        chars = list(repo_id)
        for bit, i in enumerate(letters):
            if k >> bit & 1:
                chars[i] = chars[i].upper()
        out.append("".join(chars))
    return out


def test_case_variants_of_an_allowed_id_share_one_folder_and_one_resolution(tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "mirror"
    variants = case_variants("acme/tokenizer", 300)
    hub = make_hub(tmp_path, {"acme/tokenizer": {"vocab.txt": "tok\n"}})

    def route(path: str) -> str:  # the Hub resolves ids without case
        return re.sub("acme/tokenizer", "acme/tokenizer", path, flags=re.IGNORECASE)

    with HubServer(hub) as good, _Upstream(proxy(good.endpoint, lambda p, s, h, b: (s, h, b), route)) as upstream, \
            mirror(cache, upstream.endpoint, allow=("acme/tokenizer",)) as server:
        # The first answer fixes the spelling kept (hub/answers.py keeps the asked spelling of an org/name id).
        assert httpx2.get(f"{server.endpoint}/api/models/acme/tokenizer").json()["id"] == "acme/tokenizer"
        with ThreadPoolExecutor(8) as pool:
            infos = list(pool.map(lambda v: httpx2.get(f"{server.endpoint}/api/models/{v}", timeout=60), variants))
            files = list(pool.map(lambda v: httpx2.get(f"{server.endpoint}/{v}/resolve/main/vocab.txt",
                                                       follow_redirects=True, timeout=60), variants[:30]))
        resolutions = [r for r in upstream.requests if "/api/models/" in r]

    assert len(variants) == 300 and len(set(variants)) == 300
    assert {r.status_code for r in infos} == {200} and {r.json()["id"] for r in infos} == {"acme/tokenizer"}
    assert {(r.status_code, r.content) for r in files} == {(200, b"tok\n")}
    assert repo_folders(cache) == ["models--acme--tokenizer"]  # one folder, not one per variant
    assert len(resolutions) <= 3, resolutions  # one resolution of main (a few more for the listing fetches)
    locks = sorted(p.name for p in (cache / ".locks").iterdir())
    assert locks == ["models--acme--tokenizer"], locks

    # After a restart (nothing in memory), a variant maps to the folder the cache holds, without a folder of its own.
    with HubServer(hub) as good, _Upstream(proxy(good.endpoint, lambda p, s, h, b: (s, h, b), route)) as upstream, \
            mirror(cache, upstream.endpoint, allow=("acme/tokenizer",)) as server:
        again = [httpx2.get(f"{server.endpoint}/api/models/{v}") for v in variants[-20:]]
    assert {(r.status_code, r.json()["id"]) for r in again} == {(200, "acme/tokenizer")}
    assert repo_folders(cache) == ["models--acme--tokenizer"]
    canary.assert_unchanged()
    verify(cache)


# --- the listing write goes through the descriptor of the checked trees/ folder -------------------------------


SWAP_LOOP = r"""
import ctypes, os, sys, time
cache, target, stop, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
def exchange(a, b):  # renameat2(RENAME_EXCHANGE): trees/ and the link swap places atomically
    return libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0
done = swapped = 0
deadline = time.monotonic() + 40
folders = []
while done < rounds and not os.path.exists(stop) and time.monotonic() < deadline:
    done += 1
    if done % 200 == 1:  # new repo folders appear as the mirror fetches
        folders = [os.path.join(cache, n) for n in os.listdir(cache) if n.startswith("models--")]
        for folder in folders:
            trees, link = os.path.join(folder, "trees"), os.path.join(folder, "trees.alice")
            try:
                if not os.path.lexists(trees):
                    os.mkdir(trees)
                if not os.path.lexists(link):
                    os.symlink(target, link)  # a link to the canary folder, swapped in for trees/
            except OSError as exc:
                error = exc
        if not folders:
            time.sleep(0.01)
    for folder in folders:  # trees/ is a real folder, then the link, then the folder again...
        swapped += exchange(os.path.join(folder, "trees"), os.path.join(folder, "trees.alice"))
print(done, swapped, file=sys.stdout)
if not swapped:
    print(error if "error" in globals() else "no repo folder", ctypes.get_errno(), file=sys.stderr)
"""


@pytest.mark.slow
def test_a_member_swapping_trees_for_a_link_never_makes_the_mirror_write_outside(runtime: Runtime, tmp_path):
    canary = Canary(tmp_path)
    cache = runtime.base / "shared-mirror"
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)  # the shared-cache recipe: chgrp GROUP; chmod 2775
    repos = {f"acme/r{n}": {f"f{k}.txt": f"repo {n} file {k}\n" for k in range(4)} for n in range(12)}
    hub = make_hub(tmp_path, repos)
    stop = runtime.base / "stop-swapping"
    with HubServer(hub) as upstream, mirror(cache, upstream.endpoint) as server:
        for repo_id in repos:  # the repo folders exist (resolved; nothing fetched yet)
            httpx2.get(f"{server.endpoint}/api/models/{repo_id}").raise_for_status()
        member = threading.Thread(target=lambda: results.append(runtime.run(
            ALICE, ["-c", SWAP_LOOP, str(cache), str(canary.dir), str(stop), "100000000"], umask=0o002, timeout=120)))
        results: list = []
        member.start()
        time.sleep(0.5)
        answers = [httpx2.get(f"{server.endpoint}/{repo_id}/resolve/main/f{k}.txt", timeout=60)
                   for repo_id in repos for k in range(4)]
        stop.touch()
        member.join(120)
    proc = results[0]
    assert proc.returncode == 0, proc.stderr
    rounds, swapped = map(int, proc.stdout.split())
    assert swapped > 50, proc.stdout + proc.stderr  # the member really raced the mirror
    # A fetch that found the member's link is refused (507 CacheError naming it); none is an internal error.
    refused = [a for a in answers if a.status_code != 200]
    assert all((a.status_code, a.headers["x-error-code"]) == (507, "CacheError") for a in refused), \
        {(a.status_code, a.headers.get("x-error-message")) for a in refused}
    assert all("symlink" in a.headers["x-error-message"] for a in refused)
    assert sum(a.status_code == 200 for a in answers) >= len(repos) // 2  # still serving (how many fetches meet a link varies with load)
    canary.assert_unchanged()  # no listing (nor its temporary file) landed in the canary folder
    for repo in cache.glob("models--*"):  # the member's leftovers, then the cache must verify
        for part in repo.glob("trees*"):
            if part.is_symlink() or part.name != "trees":
                part.unlink() if part.is_symlink() else shutil.rmtree(part)
    verify(cache)


@pytest.mark.slow
def test_the_listing_write_never_follows_a_trees_link_a_member_swaps_in(runtime: Runtime, tmp_path):
    """The same member, against the listing write alone, 1,500 times (the mirror writes one per commit fetched):
    enough rounds for a write by path to land in the canary folder (it did, on the old code)."""
    from hfcache.cache.layout import RepoFolder
    from hfcache.errors import CacheError
    from hfcache.hub.files import RemoteFile, RepoRevision
    from hfcache.serve.upstream_listing import write_listing

    canary = Canary(tmp_path)
    cache = runtime.base / "shared-listing"
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)
    hub = make_hub(tmp_path, {TOK: {"vocab.txt": "tok\n"}})
    with HubServer(hub) as upstream, mirror(cache, upstream.endpoint) as server:
        httpx2.get(f"{server.endpoint}/{TOK}/resolve/main/vocab.txt").raise_for_status()
        commit = upstream.commit_of(TOK)
    folder = RepoFolder(cache, TOK)
    revision = RepoRevision(repo_id=TOK, canonical_id=TOK, repo_type="model", revision="main", commit_hash=commit,
                            files=(RemoteFile(path="vocab.txt", size=4, blob_id="a" * 40),))
    stop = runtime.base / "stop-listing"
    results: list = []
    member = threading.Thread(target=lambda: results.append(runtime.run(
        ALICE, ["-c", SWAP_LOOP, str(cache), str(canary.dir), str(stop), "100000000"], umask=0o002, timeout=120)))
    member.start()
    time.sleep(0.5)
    refused = 0
    for _ in range(1500):
        try:
            write_listing(folder, revision)
        except CacheError:  # the old code let a planted link's UnsafeLayout escape; count it as refused
            refused += 1
    stop.touch()
    member.join(120)
    proc = results[0]
    assert proc.returncode == 0 and int(proc.stdout.split()[1]) > 100, proc.stdout + proc.stderr
    canary.assert_unchanged()  # neither the listing nor its temporary file landed in the canary folder
    for part in (cache / folder.name).glob("trees*"):
        if part.is_symlink():
            part.unlink()
        elif part.name != "trees":
            shutil.rmtree(part)
    verify(cache)
