"""Installing hfcache without PyPI, as README "Install" documents it: build the wheel from the source files the
Dockerfiles copy, install it into a fresh virtual environment, and run the installed command."""

from __future__ import annotations

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
