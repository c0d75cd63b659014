"""Issue #30, item 1: no silent success on the wrong input.

``ls``/``prune`` on a folder that is not a cache (an ``HF_HOME``: the cache is ``DIR/hub``), on a missing folder
and on an empty one; ``env``/``exec`` on a missing cache; warm's warnings (``--kind model`` without weights, an
``--include`` that matched nothing, a lock that drifted from its manifest, a root umask that hides the cache from
other users); ``--revision`` (item 9). Each on real caches warmed from the test Hub, through the real CLI.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache

BERT = "google-bert/bert-base-uncased"
GPT2 = "openai-community/gpt2"


def warm(cache: Path, endpoint: str, *specs: str, umask: int | None = None,
         extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hfcache", "warm", *specs, "--cache-dir", str(cache), "--endpoint", endpoint,
            *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=clean_env(), timeout=120,
                          **({"umask": umask} if umask is not None else {}))


def warm_json(cache: Path, endpoint: str, *specs: str, extra: tuple[str, ...] = ()) -> dict:
    proc = warm(cache, endpoint, *specs, extra=("--json", *extra))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``hfcache: error:`` line (never a traceback), plus the hint line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith("hfcache: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(("warning: ", "hfcache: warning: "))]


@pytest.fixture
def hf_home(hub_server, tmp_path) -> Path:
    """An HF_HOME as huggingface_hub leaves it: a token file, xet/, and the cache in hub/ (two repos)."""
    home = tmp_path / "hf-home-dir"
    (home / "xet").mkdir(parents=True)
    (home / "token").write_text("hf_not_a_real_token\n")
    warm_json(home / "hub", hub_server.endpoint, BERT, GPT2)
    return home


# ---------------------------------------------------------------------------------------------------- ls


def test_ls_on_an_hf_home_names_its_hub_folder(hf_home, tmp_path):
    canary = Canary(tmp_path)
    proc = run_hfcache(["ls", "--cache-dir", str(hf_home)])
    assert proc.returncode == 5 and proc.stdout == ""
    assert error_line(proc) == (f"hfcache: error: {hf_home} is not a hub cache (an HF_HOME); did you mean "
                                f"{hf_home / 'hub'} (it holds 2 repos)?")
    assert f"hint: pass --cache-dir {hf_home / 'hub'}" in proc.stderr
    proc = run_hfcache(["ls", "--cache-dir", str(hf_home), "--json"])
    document = json.loads(proc.stdout)
    assert proc.returncode == 5 and document["ok"] is False and document["exit_code"] == 5
    assert f"did you mean {hf_home / 'hub'} (it holds 2 repos)?" in document["error"]
    listed = run_hfcache(["ls", "--cache-dir", str(hf_home / "hub"), "--json"])
    assert listed.returncode == 0 and json.loads(listed.stdout)["totals"]["repos"] == 2
    canary.assert_unchanged()
    verify_ok(hf_home / "hub")


def test_ls_on_a_folder_that_is_no_cache_is_exit_5(hub_server, tmp_path):
    canary = Canary(tmp_path)
    junk = tmp_path / "project"
    (junk / "src").mkdir(parents=True)
    (junk / "README.md").write_text("not a cache\n")
    proc = run_hfcache(["ls", "--cache-dir", str(junk)])
    assert proc.returncode == 5 and proc.stdout == ""
    assert error_line(proc) == (f"hfcache: error: {junk} is not a hub cache: it holds no models--*, datasets--*, "
                                ".locks or CACHEDIR.TAG")
    # A repo folder given as the cache: the cache is its parent.
    cache = tmp_path / "cache"
    warm_json(cache, hub_server.endpoint, BERT)
    repo = cache / "models--google-bert--bert-base-uncased"
    proc = run_hfcache(["ls", "--cache-dir", str(repo), "--json"])
    assert proc.returncode == 5
    assert json.loads(proc.stdout)["error"] == (f"{repo} is not a hub cache (a repo folder); did you mean {cache} "
                                                "(it holds 1 repo)?")
    canary.assert_unchanged()
    verify_ok(cache)


def test_ls_on_an_empty_folder_is_an_empty_cache(tmp_path):
    for name, content in (("fresh", ()), ("volume", ("lost+found",))):
        folder = tmp_path / name
        folder.mkdir()
        for sub in content:
            (folder / sub).mkdir()
        proc = run_hfcache(["ls", "--cache-dir", str(folder), "--json"])
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["totals"]["repos"] == 0
        assert proc.stderr.strip() == f"hfcache: note: {folder} is an empty cache: nothing was warmed into it yet"
    proc = run_hfcache(["ls", "--cache-dir", str(tmp_path / "missing")])
    assert proc.returncode == 5 and "no cache at" in error_line(proc)


def test_ls_of_a_repo_the_cache_does_not_hold_is_exit_1(hf_home, tmp_path):
    canary = Canary(tmp_path)
    cache = hf_home / "hub"
    proc = run_hfcache(["ls", "bert-base-uncased", BERT, "--cache-dir", str(cache), "--json"])
    assert proc.returncode == 1, proc.stderr
    assert [r["repo_id"] for r in json.loads(proc.stdout)["repos"]] == [BERT]  # what is there is still listed
    assert warning_lines(proc.stderr) == [f"hfcache: warning: bert-base-uncased is not in the cache {cache}; did you "
                                          f"mean {BERT}?"]
    proc = run_hfcache(["ls", "org/never-warmed", "--cache-dir", str(cache)])
    assert proc.returncode == 1
    assert warning_lines(proc.stderr) == [f"hfcache: warning: org/never-warmed is not in the cache {cache}"]
    assert run_hfcache(["ls", BERT, GPT2, "--cache-dir", str(cache)]).returncode == 0
    canary.assert_unchanged()
    verify_ok(cache)


# ---------------------------------------------------------------------------------------------------- prune


def test_prune_missing_folder_fails_and_empty_volume_is_nothing_to_prune(tmp_path):
    canary = Canary(tmp_path)
    missing = tmp_path / "vol" / "hub"
    for args in (["--yes"], ["--dry-run", "--json"]):
        proc = run_hfcache(["prune", "--cache-dir", str(missing), *args])
        assert proc.returncode == 5, proc.stdout + proc.stderr
        assert error_line(proc) == f"hfcache: error: the cache {missing} does not exist: nothing was pruned"
        assert not missing.exists()
    # A job scheduled before the first warm says so: exit 0, the warning in the JSON, nothing created.
    proc = run_hfcache(["prune", "--cache-dir", str(missing), "--missing-ok", "--yes", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["warnings"] == [f"no cache at {missing} (nothing to prune)"]
    assert not missing.exists()
    missing.mkdir(parents=True)
    (missing / "lost+found").mkdir()
    proc = run_hfcache(["prune", "--cache-dir", str(missing), "--yes"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "empty cache: nothing to prune"
    proc = run_hfcache(["prune", "--cache-dir", str(missing), "--dry-run", "--json"])
    assert proc.returncode == 0 and json.loads(proc.stdout)["empty_cache"] is True
    canary.assert_unchanged()


def test_prune_refuses_an_hf_home_and_removes_nothing(hf_home, tmp_path):
    canary = Canary(tmp_path)
    before = sorted(p.relative_to(hf_home) for p in hf_home.rglob("*"))
    proc = run_hfcache(["prune", "--cache-dir", str(hf_home), "--older-than", "0s", "--yes"])
    assert proc.returncode == 5
    assert error_line(proc) == (f"hfcache: error: {hf_home} is not a hub cache (an HF_HOME); did you mean "
                                f"{hf_home / 'hub'} (it holds 2 repos)?")
    assert sorted(p.relative_to(hf_home) for p in hf_home.rglob("*")) == before
    canary.assert_unchanged()
    verify_ok(hf_home / "hub")


@pytest.mark.parametrize("command", ["export", "link", "push", "sign"])
def test_the_movers_refuse_an_hf_home_and_write_nothing(hf_home, tmp_path, command):
    """export/link/push/sign of an HF_HOME used to report 0 repos (or sign nothing) with exit 0: the same exit 5 and
    line as ls, before any output is written or any registry is asked."""
    canary = Canary(tmp_path)
    out = tmp_path / "out"
    key = tmp_path / "key.pem"  # never read: the cache is refused first
    key.write_text("not a key\n")
    argv = {"export": ["export", str(out), "--cache-dir", str(hf_home)],
            "link": ["link", str(hf_home), str(out)],
            "push": ["push", "127.0.0.1:9/hfcache/x:1", "--cache-dir", str(hf_home), "--plain-http"],
            "sign": ["sign", BERT, "--key", str(key), "--cache-dir", str(hf_home),
                     "--output", str(out)]}[command]
    proc = run_hfcache(argv)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert error_line(proc) == (f"hfcache: error: {hf_home} is not a hub cache (an HF_HOME); did you mean "
                                f"{hf_home / 'hub'} (it holds 2 repos)?")
    assert not out.exists() and not os.path.lexists(out)
    canary.assert_unchanged()


# ---------------------------------------------------------------------------------------------------- env, exec


def test_env_and_exec_warn_on_a_missing_cache(hf_home, tmp_path):
    canary = Canary(tmp_path)
    missing = tmp_path / "nowhere" / "hub"
    proc = run_hfcache(["env", "--cache-dir", str(missing)])
    assert proc.returncode == 0
    assert f"export HF_HUB_CACHE={missing}" in proc.stdout and "warning" not in proc.stdout  # stdout is eval'ed
    assert warning_lines(proc.stderr) == [f"hfcache: warning: the cache {missing} does not exist: a program run with "
                                          "these settings finds nothing cached (warm it first, or check --cache-dir)"]
    assert proc.stderr.count("\n") == 1
    # exec still runs the command (a warning, not a refusal), with its exit status.
    proc = run_hfcache(["exec", "--cache-dir", str(missing), "--", "sh", "-c", 'echo "$HF_HUB_CACHE"; exit 7'])
    assert proc.returncode == 7 and proc.stdout == f"{missing}\n"
    assert warning_lines(proc.stderr) == [f"hfcache: warning: the cache {missing} does not exist: a program run with "
                                          "these settings finds nothing cached (warm it first, or check --cache-dir)"]
    # An HF_HOME given as the cache: refused as every command refuses it (docs/cli.md), naming the cache meant.
    proc = run_hfcache(["env", "--cache-dir", str(hf_home), "--format", "json"])
    assert proc.returncode == 5 and proc.stdout == "", proc.stdout
    assert str(hf_home / "hub") in proc.stderr and "Traceback" not in proc.stderr
    # A real cache: not a word on stderr.
    proc = run_hfcache(["env", "--cache-dir", str(hf_home / "hub")])
    assert proc.returncode == 0 and proc.stderr == ""
    canary.assert_unchanged()
    assert not missing.exists()
    verify_ok(hf_home / "hub")


# ---------------------------------------------------------------------------------------------------- warm


def test_kind_model_without_weights_and_an_include_matching_nothing_warn(hub_server, tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    proc = warm(cache, hub_server.endpoint, BERT, extra=("--kind", "model", "--include", "onnx/*"))
    assert proc.returncode == 0, proc.stderr
    assert warning_lines(proc.stderr) == [
        f"warning: {BERT}: no weight file matched: this repo has no *.safetensors or *.bin at its root, so --kind "
        "model warmed its configs and tokenizer only (another format or folder: --include 'onnx/*' or '*.gguf'; "
        "everything: --kind all)",
        f"warning: {BERT}: --include 'onnx/*' matched no file of this repo (globs match the whole path from the "
        "repo root, e.g. 'onnx/*'; a folder: 'onnx/')",
    ]
    document = warm_json(cache, hub_server.endpoint, BERT, extra=("--kind", "model", "--include", "onnx/*"))
    assert document["ok"] is True and len(document["warnings"]) == 2
    assert document["warnings"][1].startswith(f"{BERT}: --include 'onnx/*' matched no file")
    assert document["repos"][0]["notes"] == [w.split(": ", 1)[1] for w in document["warnings"]]
    # An include that matched, on the tokenizer kind: no warning.
    document = warm_json(cache, hub_server.endpoint, BERT, extra=("--include", "*.txt"))
    assert document["warnings"] == []
    canary.assert_unchanged()
    verify_ok(cache)


def test_warm_lock_without_locked_warns_about_drift(hub_server, tmp_path):
    canary = Canary(tmp_path)
    manifest = tmp_path / "hfcache.toml"
    body = f'endpoint = "{hub_server.endpoint}"\ncache_dir = "cache"\n' + textwrap.dedent(f"""
        [[repos]]
        repo_id = "{BERT}"

        [[repos]]
        repo_id = "{GPT2}"
        """)
    manifest.write_text(body)
    assert run_hfcache(["lock"], cwd=tmp_path).returncode == 0
    proc = run_hfcache(["warm", "--lock", "hfcache.lock"], cwd=tmp_path)
    assert proc.returncode == 0 and warning_lines(proc.stderr) == [], proc.stderr
    manifest.write_text(body.replace(f'repo_id = "{GPT2}"', f'repo_id = "{GPT2}"\nkind = "all"'))
    proc = run_hfcache(["warm", "--lock", "hfcache.lock"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert warning_lines(proc.stderr) == [
        f"warning: hfcache.lock is out of date with hfcache.toml: {GPT2}: manifest entry changed since the lock was "
        "written (kind 'tokenizer' -> 'all'); installed the lock as written (run `hfcache lock` to update it, or "
        "--locked to refuse a lock that drifted)"]
    proc = run_hfcache(["warm", "--lock", "hfcache.lock", "--json"], cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["warnings"][0].startswith("hfcache.lock is out of date")
    proc = run_hfcache(["warm", "--lock", "hfcache.lock", "--locked"], cwd=tmp_path)
    assert proc.returncode == 1 and "out of date" in error_line(proc)
    canary.assert_unchanged()
    verify_ok(tmp_path / "cache")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="a root warm (CI runs as root)")
def test_root_warm_under_umask_077_warns(hub_server, tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    proc = warm(cache, hub_server.endpoint, BERT, umask=0o077)
    assert proc.returncode == 0, proc.stderr
    assert warning_lines(proc.stderr) == [
        f"warning: umask 0077: what this warm wrote into {cache} is unreadable by other users (a pod's non-root uid "
        f"cannot load it); warm under `umask 022`, or fix it now: chmod -R a+rX {cache}"]
    blobs = list((cache / "models--google-bert--bert-base-uncased" / "blobs").iterdir())
    assert blobs and all(not stat.S_IMODE(b.stat().st_mode) & 0o044 for b in blobs)  # the warning is true
    proc = warm(cache, hub_server.endpoint, GPT2, umask=0o022, extra=("--json",))
    assert proc.returncode == 0 and json.loads(proc.stdout)["warnings"] == []
    canary.assert_unchanged()
    verify_ok(cache)


# ---------------------------------------------------------------------------------------------------- --revision


def test_revision_option_for_one_repo_and_a_usage_error_for_several(hub_server, tmp_path):
    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    document = warm_json(cache, hub_server.endpoint, BERT, extra=("--revision", "main"))
    assert document["repos"][0]["revision"] == "main" and document["repos"][0]["ok"]
    for specs, expected in (
        ((BERT, GPT2), "hfcache: error: --revision goes with a single REPO_ID (2 given): use REPO_ID@REVISION "
                       "(e.g. bert-base-uncased@main)"),
        ((f"{BERT}@v1",), f"hfcache: error: {BERT}@v1 names a revision already, and --revision says 'main'"),
    ):
        proc = warm(cache, hub_server.endpoint, *specs, extra=("--revision", "main"))
        assert proc.returncode == 2 and error_line(proc) == expected
        assert "Did you mean" not in proc.stderr
    canary.assert_unchanged()
    verify_ok(cache)
