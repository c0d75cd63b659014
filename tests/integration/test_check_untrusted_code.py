"""``check`` and untrusted code: custom code a cache holds runs only on the user's opt-in, never as root from a
cache other users can write; a FIFO, a deep listing or an odd ref in the metadata the load reads never blocks it.

The custom-code repo is served by the real test Hub and warmed with hfcache's own code (by a member of the shared
group, as another uid, where the cache is shared); its ``tok.py`` appends the uid it runs as to a marker file outside
the cache the moment it is imported, so "the code never ran" is a file that never appeared.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.canary import Canary
from tests.chains import remove_tree
from tests.helpers import REPO, clean_env, run_hfcache
from tests.make_model_repos import ORG, _json, _tokenizer_files, _write
from tests.testhub import HubServer
from tests.users import ALICE, GROUP, Runtime, needs_root

PLANTED = f"{ORG}/planted-code"
PLAIN = f"{ORG}/plain-tokenizer"
NOT_RUN = "needs custom code: not run"
TOK_PY = """\
import os
with open({marker!r}, "a") as f:
    f.write(f"{{os.geteuid()}}\\n")
from transformers import BertTokenizer


class PlantedTokenizer(BertTokenizer):
    pass
"""


def make_repos(root: Path, marker: Path) -> None:
    planted = root / ORG / "planted-code"
    _tokenizer_files(planted, {"tokenizer_class": "PlantedTokenizer", "do_lower_case": True,
                               "auto_map": {"AutoTokenizer": ["tok.PlantedTokenizer", None]}})
    _write(planted / "config.json", _json({"model_type": "bert"}))
    _write(planted / "tok.py", TOK_PY.format(marker=str(marker)))
    plain = root / ORG / "plain-tokenizer"
    _tokenizer_files(plain)
    _write(plain / "config.json", _json({"model_type": "bert"}))


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Iterator[tuple[HubServer, Path]]:
    """The test Hub serving both repos, and the marker path tok.py writes (outside every cache; world-writable
    folder, so that the code would leave it whoever ran it)."""
    base = tmp_path_factory.mktemp("untrusted-code-hub")
    os.chmod(base, 0o755)
    marks = base / "marks"
    marks.mkdir()
    os.chmod(marks, 0o1777)
    make_repos(base / "repos", marks / "ran-as")
    with HubServer(base / "repos") as server:
        yield server, marks / "ran-as"


def check(cache: Path, *args: str, timeout: float = 120) -> tuple[int, dict | None, str]:
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", *args],
                       env=clean_env(HF_HOME=str(cache.parent / "root-home")), timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def rows(report: dict) -> dict[str, dict]:
    return {r["repo_id"]: r for r in report["tokenizers"]}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hfcache: error:")]


def verified(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def warm_as_root(server: HubServer, cache: Path, *repo_ids: str) -> None:
    proc = run_hfcache(["warm", *repo_ids, "--cache-dir", str(cache), "--endpoint", server.endpoint])
    assert proc.returncode == 0, proc.stderr


@needs_root
def test_root_never_runs_code_a_group_member_planted(hub, runtime: Runtime, tmp_path):
    server, marker = hub
    canary = Canary(tmp_path)
    canary.watch(marker)
    cache = runtime.base / "shared-planted"
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)  # the documented recipe: chgrp GROUP; chmod 2775
    warm_as_root(server, cache, PLAIN)
    planted = runtime.hfcache(ALICE, "warm", PLANTED, "--cache-dir", str(cache), "--endpoint", server.endpoint,
                              umask=0o002)
    assert planted.returncode == 0, planted.stderr
    assert (folder(cache, PLANTED) / "blobs").stat().st_uid == ALICE.uid

    # No arguments: every cached revision. The planted repo is reported, not run; the plain one loads.
    code, report, stderr = check(cache)
    assert code == 0, (report, stderr)
    by_id = rows(report)
    assert by_id[PLAIN]["ok"] and by_id[PLAIN]["class"] == "BertTokenizer"
    assert by_id[PLANTED]["skipped"].startswith(f"{NOT_RUN}: its auto_map names tok.PlantedTokenizer")
    assert by_id[PLANTED]["trust_remote_code"] is False and by_id[PLANTED]["class"] is None
    assert f"warning: 1 tokenizer(s) need custom code and were not run ({PLANTED}@main)" in " ".join(stderr.split())

    # Only the planted repo: nothing was proven, so not a pass.
    code, report, _ = check(cache, PLANTED)
    assert code == 1 and report["ok"] is False and report["exit_code"] == 1
    assert rows(report)[PLANTED]["skipped"].startswith(NOT_RUN)

    # Opted in, as root, on a cache the group can write: refused before anything loads.
    for args in (["--trust-remote-code", PLANTED], [PLANTED, "--trust-remote-code", PLANTED],
                 ["--trust-remote-code", "*"]):
        code, report, stderr = check(cache, *args)
        refusal = (f"refusing to run {PLANTED}'s custom code as root: {cache} is writable by group (mode 2775), so "
                   "another user could have chosen that code")
        assert code == 2 and report["ok"] is False and report["error"] == refusal, (args, stderr)
        assert error_lines(stderr) == [f"hfcache: error: {refusal}"], stderr
        assert "run `hfcache check` as the cache's owner" in " ".join(stderr.split())

    # The root folder made private again: the member still owns (and can rewrite) what she planted.
    os.chmod(cache, 0o755)
    code, _, stderr = check(cache, "--trust-remote-code", PLANTED)
    assert code == 2 and error_lines(stderr) == [
        f"hfcache: error: refusing to run {PLANTED}'s custom code as root: {folder(cache, PLANTED)} is owned by uid "
        f"{ALICE.uid}, so another user could have chosen that code"], stderr
    os.chmod(cache, 0o2775)

    assert not marker.exists(), marker.read_text()
    canary.assert_unchanged()
    verified(cache)


def test_opt_in_runs_the_code_on_a_private_cache(hub, tmp_path):
    """The proof that the opt-in works (and that the tests above can fail): on the user's own cache, naming the
    repo runs its code, exactly once, as this user; without the name it never runs."""
    server, marker = hub
    if marker.exists():
        marker.unlink()
    canary = Canary(tmp_path)
    cache = tmp_path / "private"
    warm_as_root(server, cache, PLANTED, PLAIN)
    os.chmod(cache, 0o755)

    code, report, stderr = check(cache)
    assert code == 0 and rows(report)[PLANTED]["skipped"].startswith(NOT_RUN), stderr
    code, report, _ = check(cache, PLANTED)
    assert code == 1 and rows(report)[PLANTED]["skipped"].startswith(NOT_RUN)
    assert not marker.exists()

    code, report, stderr = check(cache, "--trust-remote-code", PLANTED)
    assert code == 0, (report, stderr)
    row = rows(report)[PLANTED]
    assert row["ok"] and row["class"] == "PlantedTokenizer" and row["trust_remote_code"] is True
    assert row["skipped"] is None and rows(report)[PLAIN]["trust_remote_code"] is False
    assert marker.read_text() == f"{os.geteuid()}\n"
    marker.unlink()

    code, report, _ = check(cache, "--trust-remote-code", "*", PLANTED)
    assert code == 0 and rows(report)[PLANTED]["class"] == "PlantedTokenizer"
    assert marker.read_text() == f"{os.geteuid()}\n"
    marker.unlink()
    canary.assert_unchanged()
    verified(cache)


def test_a_lock_pins_the_repos_whose_code_may_run(hub, tmp_path):
    server, marker = hub
    if marker.exists():
        marker.unlink()
    project = tmp_path / "project"
    project.mkdir()
    (project / "hfcache.toml").write_text(f'[[repos]]\nrepo_id = "{PLANTED}"\n')
    cache = tmp_path / "cache"
    env = clean_env(HF_HOME=str(tmp_path / "home"), HF_ENDPOINT=server.endpoint,
                    PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    locked = run_hfcache(["lock"], cwd=project, env=env)
    assert locked.returncode == 0, locked.stderr
    warm_as_root(server, cache, PLANTED, PLAIN)
    code, report, stderr = check(cache, "--lock", str(project / "hfcache.lock"))
    assert code == 0, (report, stderr)
    assert [(r["repo_id"], r["class"], r["trust_remote_code"]) for r in report["tokenizers"]] == [
        (PLANTED, "PlantedTokenizer", True)]
    assert marker.read_text() == f"{os.geteuid()}\n"
    marker.unlink()


def test_a_malformed_or_unknown_opt_in_is_a_usage_error(hub, tmp_path):
    server, marker = hub
    cache = tmp_path / "cache"
    warm_as_root(server, cache, PLAIN)
    for value, message in ((f"{PLAIN},{PLANTED}", None),
                           (PLANTED, f"hfcache: error: --trust-remote-code {PLANTED}: no such tokenizer is checked")):
        code, report, stderr = check(cache, "--trust-remote-code", value)
        assert code == 2 and report["ok"] is False, stderr
        lines = error_lines(stderr)
        assert len(lines) == 1 and (message is None or lines == [message]), stderr


def _gpt2_like(server: HubServer, tmp_path: Path) -> tuple[Path, Path, str]:
    cache = tmp_path / "cache"
    warm_as_root(server, cache, PLAIN)
    repo = folder(cache, PLAIN)
    commit = (repo / "refs" / "main").read_text()
    return cache, repo, commit


@pytest.mark.parametrize("plant", ["fifo", "deep", "link", "fifo-ref"])
def test_metadata_the_load_reads_never_blocks_it(hub, tmp_path, plant):
    """huggingface_hub opens ``trees/<commit>.json`` (and refs) with a blocking ``open()`` through any link and
    parses it unbounded: a FIFO there blocked check's child for 600 s, then exit 70."""
    server, _ = hub
    canary = Canary(tmp_path)
    cache, repo, commit = _gpt2_like(server, tmp_path)
    (repo / "trees").mkdir(exist_ok=True)
    listing = repo / "trees" / f"{commit}.json"
    if plant == "fifo":
        os.mkfifo(listing)
        why = f"trees/{commit}.json is not a regular file (a FIFO, device or folder)"
    elif plant == "deep":
        listing.write_text("[" * 5000 + "]" * 5000)
        why = f"trees/{commit}.json: JSON nested deeper than 64 levels"
    elif plant == "link":
        listing.symlink_to(canary.secret)
        why = f"trees/{commit}.json is a symlink or sits under one"
    else:
        os.mkfifo(repo / "refs" / "dev")
        why = "refs/dev is not a regular file (a FIFO, device or link)"
    started = time.monotonic()
    code, report, stderr = check(cache, timeout=60)
    assert time.monotonic() - started < 30
    assert code == 1, (report, stderr)
    (row,) = report["tokenizers"]
    assert row["error"] == "not loaded: unsafe cache layout" and row["cause"] == why, row
    human = run_hfcache(["check", "--cache-dir", str(cache)], timeout=60)
    assert human.returncode == 1 and "unsafe cache layout" in human.stdout, human.stdout + human.stderr
    assert stat.S_ISFIFO(os.lstat(listing).st_mode) if plant == "fifo" else True  # left alone
    canary.assert_unchanged()
    if plant == "fifo-ref":
        (repo / "refs" / "dev").unlink()
    else:
        listing.unlink()
    verified(cache)
    code, report, _ = check(cache)
    assert code == 0 and report["tokenizers"][0]["ok"]


@pytest.mark.parametrize("part", ["snapshots", ".no_exist"])
def test_a_folder_chain_past_the_bound_is_that_revisions_problem(hub, tmp_path, part):
    """A 1,000-level chain: os.walk / Path.rglob recursed once per level (RecursionError, exit 70)."""
    server, _ = hub
    canary = Canary(tmp_path)
    cache, repo, commit = _gpt2_like(server, tmp_path)
    deep = repo / part / commit
    deep.mkdir(parents=True, exist_ok=True)
    fd = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(1000):  # a path this long cannot be built in one string: walk down by descriptor
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    try:
        code, report, stderr = check(cache, timeout=60)
        assert code == 1, (report, stderr)
        (row,) = report["tokenizers"]
        assert row["error"] == "not loaded: unsafe cache layout" and "deeper than 64" in row["cause"], row
        for extra in ([PLAIN], [f"{PLAIN}@main"]):
            code, report, _ = check(cache, *extra, timeout=60)
            assert code == 1 and "deeper than 64" in report["tokenizers"][0]["cause"]
        canary.assert_unchanged()
    finally:
        remove_tree(deep / "d")  # pytest's own tmp cleanup (shutil.rmtree) recurses: it would fail on the chain
    verified(cache)




def test_a_module_in_the_working_folder_never_reaches_the_child(hub, tmp_path):
    """``python -m`` puts the working folder first on ``sys.path``: run from a folder others can write (a shared
    cache, a project checkout), a planted ``transformers.py`` was imported by check's child."""
    server, marker = hub
    if marker.exists():
        marker.unlink()
    canary = Canary(tmp_path)
    canary.watch(marker)
    cache = tmp_path / "cache"
    warm_as_root(server, cache, PLAIN)
    planted = tmp_path / "shared-folder"
    planted.mkdir()
    os.chmod(planted, 0o1777)
    (planted / "transformers.py").write_text(f"open({str(marker)!r}, 'a').write('imported\\n')\nraise SystemExit(9)\n")
    env = clean_env(HF_HOME=str(tmp_path / "home"),
                    PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json"], cwd=planted, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["tokenizers"][0]["class"] == "BertTokenizer"
    assert not marker.exists()
    canary.assert_unchanged()
    verified(cache)


SWAP_LOOP = r"""
import os, sys, time
folder, name, done = sys.argv[1], sys.argv[2], sys.argv[3]
path, stop, i = os.path.join(folder, name), time.monotonic() + 60, 0
while time.monotonic() < stop and not os.path.exists(done):
    tmp = os.path.join(folder, f".swap-{i % 2}")
    if i % 2:
        os.mkfifo(tmp)
    else:
        with open(tmp, "w") as f:
            f.write("not a listing")
    os.replace(tmp, path)
    i += 1
    time.sleep(0.0005)
print(i)
"""


@needs_root
@pytest.mark.slow
def test_a_member_swapping_the_listing_for_a_fifo_never_hangs_check(hub, runtime: Runtime, tmp_path):
    """The member's loop (another uid) swaps ``trees/<commit>.json`` between a file and a FIFO while root checks:
    every check ends within seconds, exit 0 or 1 with the reason, never a hang or exit 70."""
    server, _ = hub
    canary = Canary(tmp_path)
    cache = runtime.base / "shared-swap"
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)
    planted = runtime.hfcache(ALICE, "warm", PLAIN, "--cache-dir", str(cache), "--endpoint", server.endpoint,
                              umask=0o002)
    assert planted.returncode == 0, planted.stderr
    repo = folder(cache, PLAIN)
    commit = (repo / "refs" / "main").read_text()
    trees = repo / "trees"
    made = runtime.run(ALICE, ["-c", f"import os; os.mkdir({str(trees)!r})"], umask=0o002)
    assert made.returncode == 0, made.stderr
    done = runtime.base / "swap-done"
    argv = [*ALICE.setpriv(), runtime.python, "-c", SWAP_LOOP, str(trees), f"{commit}.json", str(done)]
    loop = subprocess.Popen(argv,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=runtime.env(ALICE),
                            cwd=runtime.base, preexec_fn=lambda: os.umask(0o002))
    seen = set()
    try:
        for _ in range(8):
            started = time.monotonic()
            code, report, stderr = check(cache, timeout=60)
            assert time.monotonic() - started < 20, "check took too long"
            assert code in (0, 1), (code, report, stderr)
            (row,) = report["tokenizers"]
            assert row["ok"] or row["error"] == "not loaded: unsafe cache layout" or \
                row["error"].startswith("not loaded: the offline load blocked"), row
            seen.add(row["error"])
    finally:
        done.touch()
        out, err = loop.communicate(timeout=60)
    assert seen, "no check ran"
    assert loop.returncode == 0 and int(out) > 100, err
    canary.assert_unchanged()
    shutil.rmtree(trees)
    verified(cache)


@needs_root
def test_root_refuses_code_it_would_import_from_a_shared_modules_cache(hub, tmp_path):
    """transformers copies the code into HF_MODULES_CACHE and imports it from there: a folder others can write
    there is as good as a writable repo."""
    server, marker = hub
    if marker.exists():
        marker.unlink()
    cache = tmp_path / "private"
    warm_as_root(server, cache, PLANTED)
    os.chmod(cache, 0o755)
    modules = tmp_path / "modules"
    modules.mkdir()
    os.chmod(modules, 0o777)
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--trust-remote-code", PLANTED],
                       env=clean_env(HF_HOME=str(tmp_path / "home"), HF_MODULES_CACHE=str(modules)))
    assert proc.returncode == 2 and error_lines(proc.stderr) == [
        f"hfcache: error: refusing to run {PLANTED}'s custom code as root: {modules} is writable by group "
        "(mode 0777), so another user could have chosen that code"], proc.stderr
    assert not marker.exists() and not any(modules.iterdir())
