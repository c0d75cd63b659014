"""``hfcache path``: offline, from caches ``hfcache warm`` (or huggingface_hub through Xet) made against the test Hub.

What runtimes that take a path need: the snapshot folder of REPO@REV, one file or several in it by glob,
legacy ids in their own folder, commit-pinned revisions, exit 1 naming what is missing with the warm command that
fetches it, and refusals (exit 5) where a group member planted a link out of the cache, a FIFO, a deep chain or a
file name that would print a second line. Recipes run real consumers of the path: ``sha256sum`` and a Python that
imports only ``tokenizers``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.canary import Canary
from tests.chains import plant_chain
from tests.helpers import DATA, GOLDEN, clean_env, golden_ids, run_hfcache

HUB = DATA / "hub"
BERT, CANON = "bert-base-uncased", "google-bert/bert-base-uncased"
TINY = "hfcache-test/tiny-bert"
GGUF = "acme/tiny-GGUF"
QUANTS = ("F16", "Q4_K_M", "Q8_0")


def folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def the_snapshot(cache: Path, repo_id: str) -> Path:
    [snap] = (folder(cache, repo_id) / "snapshots").iterdir()
    return snap


def hf_path(cache: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["path", *args, "--cache-dir", str(cache)], timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The command failed with ``code``, printed nothing on stdout and one error line (plus a hint) on stderr."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "", proc.stdout
    lines = proc.stderr.splitlines()
    assert lines and lines[0].startswith("hfcache: error: "), proc.stderr
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint: ")), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc.stderr


def verified(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory, model_repos_root) -> Path:
    """A fixture Hub: bert-base-uncased (and its legacy id), a tiny BERT with safetensors weights, a GGUF repo with
    three quantizations."""
    root = tmp_path_factory.mktemp("path-hub")
    shutil.copytree(HUB / CANON, root / CANON)
    (root / "legacy_ids.json").write_text(json.dumps({BERT: CANON}))
    shutil.copytree(model_repos_root / TINY, root / TINY)
    gguf = root / GGUF
    gguf.mkdir(parents=True)
    for quant in QUANTS:
        (gguf / f"tiny-{quant}.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + quant.encode() * 4096)
    (gguf / "README.md").write_text("# tiny GGUF\n")
    return root


@pytest.fixture(scope="module")
def hub(hub_dir):
    from tests.testhub import HubServer

    with HubServer(hub_dir, legacy_ids={BERT: CANON}) as server:
        yield server


@pytest.fixture(scope="module")
def warmed(hub, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("path-cache") / "hub"
    proc = run_hfcache(["warm", BERT, TINY, GGUF, "--kind", "model", "--include", "*.gguf", "--cache-dir", str(cache),
                        "--endpoint", hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    return cache


@pytest.fixture
def cache(warmed, tmp_path) -> Path:
    """A private copy of the warmed cache, for tests that break it."""
    copy = tmp_path / "cache" / "hub"
    shutil.copytree(warmed, copy, symlinks=True)
    return copy


# ------------------------------------------------------------------------------------------------ what resolves


def test_snapshot_folder_is_what_huggingface_hub_resolves_offline(warmed):
    proc = hf_path(warmed, TINY)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{the_snapshot(warmed, TINY)}\n" and proc.stderr == ""
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], cache_dir=sys.argv[2], local_files_only=True))")
    library = subprocess.run([sys.executable, "-c", code, TINY, str(warmed)], capture_output=True, text=True,
                             env=clean_env(HF_HUB_OFFLINE="1"), timeout=120)
    assert library.returncode == 0, library.stderr
    assert library.stdout.strip() == proc.stdout.strip()
    doc = json.loads(hf_path(warmed, TINY, "--json").stdout)
    assert doc == {"repo_id": TINY, "repo_type": "model", "revision": "main",
                   "commit_hash": the_snapshot(warmed, TINY).name, "snapshot": proc.stdout.strip(), "files": []}


def test_a_glob_with_one_match_and_with_several(warmed):
    snap = the_snapshot(warmed, GGUF)
    one = hf_path(warmed, GGUF, "*Q8_0*.gguf", "--one")
    assert one.returncode == 0, one.stderr
    assert one.stdout == f"{snap}/tiny-Q8_0.gguf\n"
    several = hf_path(warmed, GGUF, "*.gguf")
    assert several.returncode == 0, several.stderr
    assert several.stdout.splitlines() == [f"{snap}/tiny-{q}.gguf" for q in QUANTS]
    assert all(Path(p).is_file() and Path(p).is_absolute() for p in several.stdout.splitlines())
    doc = json.loads(hf_path(warmed, GGUF, "*.gguf", "--json").stdout)
    assert doc["files"] == several.stdout.splitlines() and doc["snapshot"] == str(snap)
    # --one with three matches: exit 1, saying how many matched and which.
    one_line_error(hf_path(warmed, GGUF, "*.gguf", "--one"), 1, "3 files match '*.gguf'", "tiny-Q4_K_M.gguf")
    # '*' crosses '/' and a trailing '/' is a folder, as huggingface_hub's allow_patterns (and warm --include).
    assert hf_path(warmed, TINY, "*.json").stdout.count("\n") == 4
    one_line_error(hf_path(warmed, TINY, "*.json", "--one"), 1, "4 files match")
    one_line_error(hf_path(warmed, TINY, "--one"), 2, "--one needs a PATTERN")


def test_a_legacy_id_resolves_in_its_own_folder_as_transformers_loads_it(warmed):
    legacy = hf_path(warmed, BERT, "tokenizer.json", "--one")
    canonical = hf_path(warmed, CANON, "tokenizer.json", "--one")
    assert legacy.returncode == canonical.returncode == 0, legacy.stderr + canonical.stderr
    assert legacy.stdout.startswith(f"{folder(warmed, BERT)}/snapshots/")
    assert canonical.stdout.startswith(f"{folder(warmed, CANON)}/snapshots/")
    assert Path(legacy.stdout.strip()).read_bytes() == (HUB / CANON / "tokenizer.json").read_bytes()
    code = ("import sys; from huggingface_hub import hf_hub_download; "
            "print(hf_hub_download(sys.argv[1], 'tokenizer.json', cache_dir=sys.argv[2], local_files_only=True))")
    library = subprocess.run([sys.executable, "-c", code, BERT, str(warmed)], capture_output=True, text=True,
                             env=clean_env(HF_HUB_OFFLINE="1"), timeout=120)
    assert library.returncode == 0 and library.stdout.strip() == legacy.stdout.strip(), library.stderr


def test_a_commit_pinned_revision(hub, tmp_path):
    listing = json.loads(run_hfcache(["warm", TINY, "--kind", "model", "--cache-dir", str(tmp_path / "probe"),
                                      "--endpoint", hub.endpoint, "--json"]).stdout)
    commit = listing["repos"][0]["commit_hash"]
    cache = tmp_path / "pinned"
    proc = run_hfcache(["warm", f"{TINY}@{commit}", "--kind", "model", "--cache-dir", str(cache),
                        "--endpoint", hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    assert not (folder(cache, TINY) / "refs" / "main").exists()  # a pinned warm writes no ref
    pinned = hf_path(cache, f"{TINY}@{commit}", "*.safetensors", "--one")
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout == f"{folder(cache, TINY)}/snapshots/{commit}/model.safetensors\n"
    assert json.loads(hf_path(cache, f"{TINY}@{commit}", "--json").stdout)["commit_hash"] == commit
    # The branch was never fetched into this cache: `main` is missing, and the hint warms exactly it.
    one_line_error(hf_path(cache, TINY), 1, f"{TINY} has no ref 'main'", "no refs cached",
                   f"hint: fetch it: hfcache warm {TINY} --cache-dir {cache} --kind model")


def test_a_snapshot_backed_by_the_xet_store(tmp_path):
    from tests.xet_caches import library_download, store_linked_blobs, xet_hub

    cache = tmp_path / "xet"
    with xet_hub() as server:
        library_download(server.endpoint, cache, [BERT])
    assert store_linked_blobs(cache), "the library wrote no store link"
    proc = hf_path(cache, BERT, "tokenizer.json", "--one")
    assert proc.returncode == 0, proc.stderr
    resolved = Path(proc.stdout.strip())
    assert resolved.parent == the_snapshot(cache, BERT) and resolved.is_symlink()
    assert resolved.read_bytes() == (HUB / CANON / "tokenizer.json").read_bytes()
    verified(cache)
    # Its payload gone from the store: the snapshot path dangles, which is "not cached" (exit 1), said as such.
    blob = folder(cache, BERT) / "blobs" / os.readlink(resolved).rsplit("/", 1)[1]
    payload = (blob.parent / os.readlink(blob)).resolve()
    payload.unlink()
    one_line_error(hf_path(cache, BERT, "tokenizer.json"), 1, "dangling links", "tokenizer.json",
                   f"hint: fetch it: hfcache warm {BERT} --cache-dir {cache} --include tokenizer.json")


# ------------------------------------------------------------------------------------------------ what is missing


def test_missing_repo_revision_commit_and_file_name_what_and_the_warm_that_fetches_it(warmed, hub, tmp_path):
    one_line_error(hf_path(warmed, "acme/nope"), 1, "acme/nope@main is not in the cache", "no folder models--acme--nope",
                   f"hint: fetch it: hfcache warm acme/nope --cache-dir {warmed} --kind model")
    one_line_error(hf_path(warmed, f"{TINY}@v2"), 1, f"{TINY} has no ref 'v2'", "cached refs: main",
                   f"hfcache warm {TINY}@v2 --cache-dir {warmed} --kind model")
    zeros = "0" * 40
    one_line_error(hf_path(warmed, f"{TINY}@{zeros}"), 1, f"commit {zeros} of {TINY} is not in the cache")
    one_line_error(hf_path(warmed, GGUF, "*IQ2*.gguf"), 1, "no file matching '*IQ2*.gguf'", "3 files cached",
                   f"hfcache warm {GGUF} --cache-dir {warmed} --include '*IQ2*.gguf'")
    one_line_error(hf_path(tmp_path / "none", BERT), 1, f"no cache at {tmp_path / 'none'}")
    # A name the repo lacks at that commit (warm wrote its .no_exist marker): warming cannot help, so no warm hint.
    err = one_line_error(hf_path(warmed, BERT, "added_tokens.json"), 1, "the repo lacks it")
    assert "hfcache warm" not in err
    # The hint is a command that works: a cache with one quantization, the hint for another, then the path.
    small = tmp_path / "small"
    assert run_hfcache(["warm", GGUF, "--include", "*Q4_K_M*", "--cache-dir", str(small),
                        "--endpoint", hub.endpoint]).returncode == 0
    err = one_line_error(hf_path(small, GGUF, "*Q8_0*.gguf", "--one"), 1, "no file matching")
    hint = err.splitlines()[1].removeprefix("hint: fetch it: ")
    run = subprocess.run(["bash", "-c", f"{hint.replace('hfcache', f'{sys.executable} -m hfcache', 1)} "
                                        f"--endpoint {hub.endpoint}"], capture_output=True, text=True,
                         env=clean_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    assert hf_path(small, GGUF, "*Q8_0*.gguf", "--one").returncode == 0
    verified(small)


def test_bad_spec_and_pattern_are_usage_errors(warmed):
    one_line_error(hf_path(warmed, "a/b/c/d"), 2, "invalid repo id")
    one_line_error(hf_path(warmed, f"{TINY}@"), 2, "empty revision")
    one_line_error(hf_path(warmed, f"{TINY}@../x"), 2, "invalid revision")
    one_line_error(hf_path(warmed, TINY, "[" * 300), 2, "PATTERN is 300 characters long")
    one_line_error(hf_path(warmed, TINY, "a\x1b[2Jb"), 2, "control or invisible character")
    one_line_error(hf_path(warmed, f"datasets/{TINY}", "--repo-type", "kernel"), 2, "names a dataset repo")
    one_line_error(hf_path(warmed, f"datasets/{TINY}"), 1, f"datasets/{TINY}@main is not in the cache",
                   "--repo-type dataset --kind all")


def test_a_dangling_link_counts_as_missing_and_the_hint_repairs_it(cache, hub):
    snap = the_snapshot(cache, GGUF)
    blob = (snap / "tiny-Q8_0.gguf").resolve()
    blob.unlink()
    one_line_error(hf_path(cache, GGUF, "*Q8_0*"), 1, "1 of the files matching '*Q8_0*' are dangling links",
                   "tiny-Q8_0.gguf", f"hfcache warm {GGUF} --cache-dir {cache} --include '*Q8_0*'")
    # Without a pattern the whole snapshot is judged: a runtime given the folder would fail on that file too.
    one_line_error(hf_path(cache, GGUF), 1, "1 files are dangling links", "tiny-Q8_0.gguf")
    assert hf_path(cache, GGUF, "*Q4_K_M*", "--one").returncode == 0  # what is whole still resolves
    proc = run_hfcache(["warm", GGUF, "--cache-dir", str(cache), "--include", "*Q8_0*", "--endpoint", hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    assert hf_path(cache, GGUF).returncode == 0
    verified(cache)


def test_a_malformed_ref_is_missing_not_a_crash(cache):
    ref = folder(cache, TINY) / "refs" / "main"
    ref.write_text(ref.read_text() + "\n")  # what `echo > refs/main` leaves: huggingface_hub cannot load it either
    one_line_error(hf_path(cache, TINY), 1, "refs/main is malformed", "expected exactly 40 hex characters")


# ------------------------------------------------------------------------------------------------ hostile caches


def test_links_out_of_the_cache_fifos_chains_and_line_breaks_are_refused(cache, tmp_path):
    canary = Canary(tmp_path)
    snap = the_snapshot(cache, TINY)
    entry = snap / "tokenizer.json"
    entry.unlink()
    entry.symlink_to(canary.secret)  # a member's link to a root-only file
    one_line_error(hf_path(cache, TINY, "tokenizer.json"), 5, "links outside its repo folder")
    one_line_error(hf_path(cache, TINY), 5, "links outside its repo folder")  # the folder too: a runtime reads all
    assert hf_path(cache, TINY, "vocab.txt", "--one").returncode == 0  # a file not asked for is not judged
    entry.unlink()
    os.mkfifo(entry)  # a FIFO: a loader would block on it forever
    started = time.monotonic()
    one_line_error(hf_path(cache, TINY, "tokenizer.json", timeout=30), 5, "not a regular file")
    assert time.monotonic() - started < 20
    entry.unlink()
    (folder(cache, TINY) / "refs" / "main").rename(folder(cache, TINY) / "refs" / "kept")
    (folder(cache, TINY) / "refs" / "main").symlink_to(canary.public)
    one_line_error(hf_path(cache, TINY), 5, "refs/main", "symlink")
    (folder(cache, TINY) / "refs" / "main").unlink()
    (folder(cache, TINY) / "refs" / "kept").rename(folder(cache, TINY) / "refs" / "main")
    # A folder name holding a line break would print a line of its own (`/passwd.json`): refused, nothing printed.
    (snap / "x\n").mkdir()
    plant_chain(snap / "x\n", 0, leaf="passwd.json")
    one_line_error(hf_path(cache, TINY, "*.json"), 5, "control or invisible character")
    shutil.rmtree(snap / "x\n")
    plant_chain(snap / "deep", 70, leaf="a.json")  # deeper than bounds.MAX_TREE_DEPTH
    one_line_error(hf_path(cache, TINY, "*.json"), 5, "deeper than 64 levels")
    shutil.rmtree(snap / "deep")
    canary.assert_unchanged()


def test_a_link_into_another_repo_folder_is_refused(cache, tmp_path):
    """A link to another repo's blob stays inside the cache but not inside the repo folder: refused as well (the
    repo folder is the unit a member's write is judged by, as in check and export)."""
    canary = Canary(tmp_path)
    snap = the_snapshot(cache, TINY)
    other = next((folder(cache, GGUF) / "blobs").iterdir())
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(os.path.relpath(other, snap))
    one_line_error(hf_path(cache, TINY, "*.safetensors"), 5, "links outside its repo folder")
    canary.assert_unchanged()


# ------------------------------------------------------------------------------------------------ recipes


def test_recipe_sha256sum_of_the_resolved_weights_is_the_published_sha256(warmed, hub_dir):
    script = f'sha256sum "$({sys.executable} -m hfcache path {TINY} \'*.safetensors\' --one --cache-dir {warmed})"'
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; {script}"], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    digest, name = proc.stdout.split()
    assert digest == hashlib.sha256((hub_dir / TINY / "model.safetensors").read_bytes()).hexdigest()
    assert name.endswith("/model.safetensors")
    assert digest == os.readlink(name).rsplit("/", 1)[1]  # the blob's name: the sha256 the Hub publishes (LFS)
    # A missing file: the substitution is empty, the pipeline fails, the reason is on stderr.
    failed = subprocess.run(["bash", "-c", f"set -euo pipefail; x=$({sys.executable} -m hfcache path {TINY} '*.gguf' "
                                           f"--one --cache-dir {warmed}); sha256sum \"$x\""],
                            capture_output=True, text=True, env=clean_env(), timeout=60)
    assert failed.returncode == 1 and failed.stdout == "" and "no file matching '*.gguf'" in failed.stderr


TOKENIZERS_ONLY = r"""
import json, sys
from tokenizers import Tokenizer
ids = Tokenizer.from_file(sys.argv[1]).encode(sys.argv[2]).ids
print(json.dumps({"ids": ids, "transformers": "transformers" in sys.modules}))
"""


def test_recipe_tokenizers_loads_the_resolved_tokenizer_json_offline(warmed):
    resolved = hf_path(warmed, BERT, "tokenizer.json", "--one")
    assert resolved.returncode == 0, resolved.stderr
    proc = subprocess.run([sys.executable, "-I", "-c", TOKENIZERS_ONLY, resolved.stdout.strip(), GOLDEN["text"]],
                          capture_output=True, text=True, env=clean_env(HF_HUB_OFFLINE="1"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"ids": golden_ids(CANON), "transformers": False}


# ------------------------------------------------------------------------------------------------ a member's race


def test_a_member_swapping_the_file_for_a_link_out_never_gets_it_approved_or_crashes(runtime, hub_dir, tmp_path):
    """Alice (a group member) exchanges the snapshot entry with a link to a root-only file in a loop while root
    runs ``hfcache path``: every run is either the snapshot path (exit 0) or a one-line refusal (exit 5); never a
    crash or a hang, and nothing outside the cache changes."""
    from tests.shared_cache import SWAP, shared_cache
    from tests.testhub import HubServer
    from tests.users import ALICE  # the runtime fixture skips where setpriv or root is missing

    cache = shared_cache(runtime, "path-race")
    with HubServer(hub_dir, legacy_ids={BERT: CANON}) as server:
        assert hfcache_warm(cache, server.endpoint).returncode == 0
    canary = Canary(runtime.base)
    entry = the_snapshot(cache, BERT) / "tokenizer.json"
    expected = f"{entry}\n"
    stop = runtime.base / "stop-path-swap"
    spec = {"stop": str(stop), "rounds": 2_000_000, "hold": 0.002, "plant": [],
            "exchange": [[str(entry), str(canary.secret)]]}
    member = subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", SWAP, json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True, env=runtime.env(ALICE))
    outcomes = []
    try:
        for _ in range(30):
            proc = hf_path(cache, BERT, "tokenizer.json", "--one", timeout=30)
            if proc.returncode == 0:
                assert proc.stdout == expected and proc.stderr == "", proc.stdout + proc.stderr
            else:
                one_line_error(proc, 5)
                assert "links outside its repo folder" in proc.stderr or "changed while" in proc.stderr, proc.stderr
            outcomes.append(proc.returncode)
    finally:
        stop.touch()
        swaps = int(member.communicate(timeout=60)[0].strip() or 0)
    assert swaps > 10 and 5 in outcomes, (swaps, outcomes)  # the race ran and was seen
    canary.assert_unchanged()
    assert hf_path(cache, BERT, "tokenizer.json", "--one").stdout == expected
    verified(cache)


def hfcache_warm(cache: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["warm", BERT, "--cache-dir", str(cache), "--endpoint", endpoint])


def test_a_snapshot_another_user_cannot_read_is_exit_5_naming_it(runtime, hub_dir):
    """Eve, outside the cache's group, and Alice with the snapshot closed to her: exit 5 with what blocks, no crash."""
    from tests.shared_cache import shared_cache
    from tests.testhub import HubServer
    from tests.users import ALICE, EVE

    cache = shared_cache(runtime, "path-denied")
    with HubServer(hub_dir, legacy_ids={BERT: CANON}) as server:
        assert hfcache_warm(cache, server.endpoint).returncode == 0
    ok = runtime.hfcache(ALICE, "path", BERT, "tokenizer.json", "--one", "--cache-dir", str(cache))
    assert ok.returncode == 0 and ok.stdout == f"{the_snapshot(cache, BERT)}/tokenizer.json\n", ok.stderr
    repo = folder(cache, BERT)
    os.chmod(repo, 0o2770)  # the group only: Eve cannot enter the repo folder
    one_line_error(runtime.hfcache(EVE, "path", BERT, "--cache-dir", str(cache)), 5,
                   f"{repo}", "permission denied for uid 4103")
    os.chmod(repo, 0o2775)
    snap = the_snapshot(cache, BERT)
    mode = snap.stat().st_mode
    os.chmod(snap, 0o700)
    try:
        one_line_error(runtime.hfcache(ALICE, "path", BERT, "*.json", "--cache-dir", str(cache)), 5,
                       "permission denied for uid 4101")
    finally:
        os.chmod(snap, mode)
    verified(cache)
