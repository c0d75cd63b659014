"""Installing hfcache without PyPI, as README "Install" documents it: build the wheel from the source files the
Dockerfiles copy, install it into a fresh virtual environment, and run the installed command.

Then the core install (the wheel without extras, its dependencies from the package index, as docker/Dockerfile
installs it for the init container): every core command works without transformers, numpy or a server stack, and
``check``/``serve`` say which extra to install (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hfcache import __version__
from tests.helpers import build_wheel, clean_env


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    wheel = build_wheel(tmp_path / "dist", tmp_path)
    assert wheel.name == f"hfcache-{__version__}-py3-none-any.whl"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The dependencies come from the test environment's site-packages (a .pth line, searched after the new venv's
    # own): no download. hfcache itself is not installed there (the tests run it from the checkout), so only the
    # wheel can provide it.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}  # not the checkout: the installed wheel
    elsewhere = tmp_path / "elsewhere"  # a cwd without the checkout's hfcache/ folder
    elsewhere.mkdir()
    version = subprocess.run([str(venv / "bin" / "hfcache"), "--version"], capture_output=True, text=True,
                             cwd=elsewhere, env=env, timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == f"hfcache, version {__version__}", version
    where = subprocess.run([str(python), "-c", "import hfcache; print(hfcache.__file__)"], capture_output=True,
                           text=True, cwd=elsewhere, env=env, timeout=120)
    assert where.stdout.strip().startswith(str(venv)), where
    # The network guard of `hfcache exec` is package data of its own (hfcache/_guard_site): it must be in the wheel.
    guarded = subprocess.run([str(venv / "bin" / "hfcache"), "exec", "--cache-dir", str(tmp_path / "cache"), "--",
                              str(python), "-c", "import socket; socket.create_connection(('192.0.2.1', 80), 1)"],
                             capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert guarded.returncode != 0 and "192.0.2.1" in guarded.stderr, guarded


# --- the core install: no transformers, no numpy, no server (pyproject.toml's extras `check` and `serve`) ---------

#: What a core install must not carry (the init-container image once carried them to run `warm`).
NOT_IN_CORE = ("transformers", "numpy", "uvicorn", "werkzeug", "prometheus_client", "safetensors")
REPOS = ("openai-community/gpt2", "google-bert/bert-base-uncased")

#: `hfcache.load_tokenizer` both ways in a process `hfcache exec` started: the fast path loads, the default
#: backend names its extra; and which of NOT_IN_CORE got imported (none may).
LOAD_BOTH = r"""
import json, sys
import hfcache
out = {}
for repo_id in sys.argv[2:]:
    out[repo_id] = hfcache.load_tokenizer(repo_id, backend="tokenizers").encode(sys.argv[1]).ids
try:
    hfcache.load_tokenizer(sys.argv[2])
except hfcache.HfcacheError as exc:
    out["default"] = {"type": type(exc).__name__, "message": str(exc), "hint": exc.hint, "exit_code": exc.exit_code}
out["imported"] = sorted(set(%r) & set(sys.modules))
print(json.dumps(out))
""" % (NOT_IN_CORE,)  # noqa: UP031 - a script whose own braces would need escaping in a format string


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed WITHOUT extras, its dependencies downloaded from the package index
    (no test environment on its path). Returns the venv's folder."""
    work = tmp_path_factory.mktemp("core-install")
    wheel = build_wheel(work / "dist", work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir",
                           "--disable-pip-version-check", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=900, env=clean_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return venv


def _core(venv: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The installed ``hfcache`` of ``venv``, run from ``cwd`` (not the checkout) without PYTHONPATH."""
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    env["HF_HOME"] = str(cwd / "hf-home")
    return subprocess.run([str(venv / "bin" / "hfcache"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _one_error(proc: subprocess.CompletedProcess[str], extra: str) -> None:
    """Exit 2, one error line naming what is missing and a hint line naming the extra; no traceback."""
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("hfcache: error: ") and "not installed" in lines[0], proc.stderr
    assert lines[1] == f"hint: pip install 'hfcache[{extra}]'", proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_core_install_runs_the_core_commands_without_transformers_numpy_or_a_server(core_venv, hub_server, tmp_path):
    from tests.canary import Canary
    from tests.helpers import GOLDEN, golden_ids
    from tests.registry import available, running_registry

    canary = Canary(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    python = core_venv / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] "
                            "if importlib.util.find_spec(n)))", *NOT_IN_CORE], capture_output=True, text=True,
                           cwd=work, env=clean_env(), timeout=60)
    assert found.returncode == 0 and found.stdout.strip() == "", found
    (work / "hfcache.toml").write_text("".join(f'[[repos]]\nrepo_id = "{r}"\n' for r in REPOS))
    cache, endpoint = work / "cache", hub_server.endpoint

    def ok(*args: str) -> subprocess.CompletedProcess[str]:
        proc = _core(core_venv, *args, cwd=work)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc)
        return proc

    ok("lock", "--endpoint", endpoint)
    ok("warm", "--lock", "hfcache.lock", "--locked", "--cache-dir", str(cache), "--endpoint", endpoint)
    ok("warm", "--lock", "hfcache.lock", "--cache-dir", str(cache))  # satisfied: no endpoint needed
    ok("verify", "--lock", "hfcache.lock", "--cache-dir", str(cache))
    assert ok("path", REPOS[0], "tokenizer.json", "--cache-dir", str(cache), "--one").stdout.strip().startswith(
        str(cache))
    assert f"HF_HUB_CACHE={cache}" in ok("env", "--cache-dir", str(cache), "--format", "dotenv").stdout
    ok("doctor", "--cache-dir", str(cache))
    ok("export", str(work / "cache.tar"), "--lock", "hfcache.lock", "--cache-dir", str(cache), "--format", "tar")
    ok("import", str(work / "cache.tar"), "--cache-dir", str(work / "imported"))
    ok("verify", "--lock", "hfcache.lock", "--cache-dir", str(work / "imported"))
    ok("link", str(cache), str(work / "linked"), "--mode", "hardlink")
    ok("prune", "--cache-dir", str(cache), "--keep-lock", "hfcache.lock", "--older-than", "0s", "--yes")
    ok("verify", "--lock", "hfcache.lock", "--cache-dir", str(cache))  # the lock's revisions survived the prune
    loaded = json.loads(ok("exec", "--cache-dir", str(cache), "--lock", "hfcache.lock", "--", str(python), "-c",
                           LOAD_BOTH, GOLDEN["text"], *REPOS).stdout)
    for repo_id in REPOS:
        assert loaded[repo_id] == golden_ids(repo_id), repo_id
    assert loaded["default"]["type"] == "UsageError" and loaded["default"]["exit_code"] == 2, loaded
    assert loaded["default"]["hint"].startswith("pip install 'hfcache[check]'"), loaded
    assert loaded["imported"] == [], loaded
    if available() is None:  # push/pull: CI installs docker-registry (.ci/run)
        with running_registry(tmp_path / "registry") as registry:
            ok("push", f"{registry.host}/hf/core:v1", "--lock", "hfcache.lock", "--cache-dir", str(cache),
               "--plain-http")
            ok("pull", f"{registry.host}/hf/core:v1", "--cache-dir", str(work / "pulled"), "--plain-http")
        ok("verify", "--lock", "hfcache.lock", "--cache-dir", str(work / "pulled"))
    elif os.environ.get("CI"):
        pytest.fail(f"CI must run push/pull: {available()}", pytrace=False)
    canary.assert_unchanged()


@pytest.mark.slow
def test_core_install_check_and_serve_name_the_extra_to_install(core_venv, hub_server, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cache = work / "cache"
    warmed = _core(core_venv, "warm", REPOS[0], "--cache-dir", str(cache), "--endpoint", hub_server.endpoint,
                   cwd=work)
    assert warmed.returncode == 0, warmed
    _one_error(_core(core_venv, "check", "--cache-dir", str(cache), cwd=work), "check")
    _one_error(_core(core_venv, "serve", "--cache-dir", str(cache), "--port", "0", cwd=work, timeout=60), "serve")
    # the test Hub too (python -m tests.testhub, at the repository root): the same message, no server stack needed
    proc = subprocess.run([str(core_venv / "bin" / "python"), "-m", "tests.testhub", str(cache)], capture_output=True,
                          text=True, cwd=Path(__file__).parents[2], env=clean_env(), timeout=60)
    assert proc.returncode != 0 and "pip install 'hfcache[serve]'" in proc.stderr, proc
    assert _core(core_venv, "verify", "--cache-dir", str(cache), cwd=work).returncode == 0


@pytest.mark.parametrize(("command", "extra"), [("check", "check"), ("serve", "serve")])
def test_missing_extra_is_one_line_and_exit_2(tmp_path, hub_server, command, extra):
    """The same messages in the test environment, with the extra's packages hidden (``sys.modules[name] = None``
    makes both ``import`` and ``importlib.util.find_spec`` see them as absent): fast, so every run checks them."""
    from tests.canary import Canary
    from tests.helpers import run_hfcache

    canary = Canary(tmp_path)
    cache = tmp_path / "cache"
    assert run_hfcache(["warm", REPOS[0], "--cache-dir", str(cache), "--endpoint", hub_server.endpoint,
                        "-q"]).returncode == 0
    hide = (f"import sys; sys.modules.update(dict.fromkeys({NOT_IN_CORE!r})); sys.argv[0] = 'hfcache'; "
            "from hfcache.cli import run; run()")
    args = [command, "--cache-dir", str(cache)] + (["--port", "0"] if command == "serve" else [])
    proc = subprocess.run([sys.executable, "-c", hide, *args], capture_output=True, text=True, env=clean_env(),
                          timeout=120, stdin=subprocess.DEVNULL)
    _one_error(proc, extra)
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0
    canary.assert_unchanged()
