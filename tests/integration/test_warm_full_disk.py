"""A warm that fails leaves nothing half-published and gives back the space it used; ``ls`` never
calls a repo with no file ``ok``.

The full disk is a real one: a 5 MiB tmpfs mounted in a private user and mount namespace (no root needed), the
warm and the listing run inside it (tests/integration/test_oci_hostile.py does the same for push and pull).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HUB, clean_env, run_hfcache, user_namespaces, warm
from tests.testhub import HubServer
from tests.testhub.faults import Faults

REPOS = ["gpt2", "FacebookAI/roberta-base", "bert-base-uncased", "google-t5/t5-small", "distilbert-base-uncased"]

#: Inside the namespace: mount the tmpfs, warm, then list what is left and what ls says, before the mount goes.
_SCRIPT = ('out="$0"; m="$1"; shift; mount -t tmpfs -o size=5m tmpfs "$m" || exit 99; "$@" 2>"$out.err"; rc=$?; '
           'cd "$m/cache" && find . -mindepth 1 -printf "%y %s %p -> %l\\n" > "$out.find"; '
           '"$1" -m hfcache ls --cache-dir "$m/cache" --json > "$out.ls"; exit $rc')


@pytest.mark.skipif(not user_namespaces(), reason="no user namespaces to mount a small tmpfs")
def test_a_full_disk_leaves_no_half_published_repo_and_gives_the_space_back(tmp_path):
    mount, out = tmp_path / "tmpfs", tmp_path / "run"
    mount.mkdir()
    with HubServer(HUB) as server:
        proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _SCRIPT, str(out),
                               str(mount), sys.executable, "-m", "hfcache", "warm", *REPOS, "--cache-dir",
                               str(mount / "cache"), "--endpoint", server.endpoint],
                              env=clean_env(), capture_output=True, text=True, timeout=300)
    stderr = Path(f"{out}.err").read_text()
    assert proc.returncode == 5, (proc.returncode, proc.stderr, stderr)
    assert "no space left on the device" in stderr and "Traceback" not in stderr
    assert "gave back the" in stderr, stderr

    entries = [line.split(" ", 2) for line in Path(f"{out}.find").read_text().splitlines()]
    refs = {path.split(" -> ")[0]: None for kind, _, path in entries if kind == "f" and "/refs/" in path}
    published = {p.split("/")[1] for p in refs}
    for kind, _size, path in entries:
        path = path.split(" -> ")[0]
        folder = path.split("/")[1]
        if "/snapshots/" in path or "/.no_exist/" in path or "/blobs/" in path and kind == "f":
            # a snapshot entry, a marker or a blob only in a folder whose ref was written: nothing half-published
            assert folder in published or path.endswith(".incomplete"), (path, sorted(published))
    kept = sum(int(size) for kind, size, path in entries if path.split(" -> ")[0].endswith(".incomplete"))
    assert kept == 0 or f"kept {kept} bytes of partial downloads" in stderr.replace("\n", " "), (kept, stderr)
    listing = json.loads(Path(f"{out}.ls").read_text())
    assert listing["repos"] and not [r for r in listing["repos"] if r["health"] == "ok" and r["files"] == 0]


def test_a_cut_download_keeps_its_partial_file_and_says_so(tmp_path):
    """Every body cut midway, no retry: the blobs fetched go, the partial downloads stay for the rerun (which
    resumes and leaves none), and ls, meanwhile, does not call the folder without a file ok."""
    cache = tmp_path / "cache"
    args = ["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--retries", "0"]
    with HubServer(HUB, faults=Faults(failing_bodies=1000, body_failure="reset")) as server:
        failed = run_hfcache([*args, "--endpoint", server.endpoint])
    assert failed.returncode == 3, failed.stderr
    partials = list(cache.glob("*/blobs/*.incomplete"))
    kept = sum(p.stat().st_size for p in partials)
    assert partials and kept and f"kept {kept} bytes of partial downloads in models--openai-community--gpt2/blobs " \
        "for a rerun to resume" in failed.stderr.replace("\n", " "), failed.stderr
    assert not [p for p in cache.glob("*/blobs/*") if not p.name.endswith(".incomplete")]
    assert not list(cache.glob("*/snapshots/*")) and not list(cache.glob("*/refs/*"))

    listed = json.loads(run_hfcache(["ls", "--cache-dir", str(cache), "--json"]).stdout)
    (repo,) = listed["repos"]
    assert repo["files"] == 0 and repo["health"] != "ok" and listed["totals"]["unhealthy"] == 1, repo

    with HubServer(HUB) as server:
        again = run_hfcache([*args, "--endpoint", server.endpoint, "--json"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["repos"][0]["bytes_downloaded"] < sum(
        f["size"] for f in json.loads(again.stdout)["repos"][0]["files"])
    assert not list(cache.rglob("*.incomplete"))


def test_a_refused_file_leaves_no_folder_and_no_partial_file(tmp_path):
    """Bytes that fail their hash: a rerun would get the same, so nothing of the repo stays, not even its folder."""
    cache = tmp_path / "cache"
    tampered = {("openai-community/gpt2", "vocab.json"): b"{}" * 1000}
    with HubServer(HUB, overrides=tampered) as server:
        proc = run_hfcache(["warm", "openai-community/gpt2", "--cache-dir", str(cache), "--endpoint",
                            server.endpoint])
    assert proc.returncode == 3 and "vocab.json" in proc.stderr, proc.stderr
    assert "gave back the" in proc.stderr and "kept" not in proc.stderr, proc.stderr
    assert not list(cache.glob("models--*")), list(cache.rglob("*"))


def test_ls_never_calls_a_repo_folder_without_a_file_ok(tmp_path):
    """What a failed warm left before (blobs, no snapshot, no ref): ``empty``, counted unhealthy, in the table too."""
    cache = tmp_path / "cache"
    warm(cache, "openai-community/gpt2")
    folder = cache / "models--openai-community--gpt2"
    shutil.rmtree(folder / "snapshots")
    shutil.rmtree(folder / "refs")
    (folder / "snapshots").mkdir()
    listed = run_hfcache(["ls", "--cache-dir", str(cache), "--json"])
    assert listed.returncode == 0, listed.stderr
    (repo,) = json.loads(listed.stdout)["repos"]
    assert repo["files"] == 0 and repo["health"].startswith("empty: no snapshot holds a file"), repo
    assert json.loads(listed.stdout)["totals"]["unhealthy"] == 1
    table = run_hfcache(["ls", "--cache-dir", str(cache)], env=clean_env(COLUMNS="200"))
    assert "empty" in table.stdout and " ok " not in table.stdout, table.stdout
