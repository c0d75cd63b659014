"""The suite writes only below its own folders and reads no build output (tests/conftest.py, tests/cleanup.py).

- HOME, the XDG folders, HF_HOME and TMPDIR point into the session's folder (``/tmp/hfcache-users-session-*``), in
  this process (huggingface_hub, transformers and tempfile read them once) and in every subprocess, so nothing a
  library writes by default (``~/.cache/huggingface/hub``, transformers' ``modules/``, hfcache's private
  ``$TMPDIR/hfcache-modules-<uid>``, pip's cache) lands in the real home or in /tmp;
- build output in the checkout (the wheel docs/quickstart.md builds into ``examples/dist/``) is not read by the
  tests that scan the checkout's files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import cleanup
from tests.helpers import REPO, clean_env, is_artifact, source_files

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _session_base() -> Path:
    base = Path(os.environ["HOME"]).parent
    assert base.name.startswith(cleanup.SESSION_HOME_PREFIX) and base.parent == cleanup.RUNTIME_ROOT, base
    return base


def _inside(path: str | Path, base: Path) -> bool:
    return Path(path).resolve().is_relative_to(base.resolve())


#: Where the libraries of a test's subprocess put things by default, printed as JSON.
WHERE = """
import json, os, tempfile
import huggingface_hub.constants as c
from transformers.utils import hub
print(json.dumps({"home": os.path.expanduser("~"), "tmp": tempfile.gettempdir(), "hf_home": c.HF_HOME,
                  "hub_cache": c.HF_HUB_CACHE, "xet_cache": c.HF_XET_CACHE, "assets": c.HF_ASSETS_CACHE,
                  "token": c.HF_TOKEN_PATH, "modules": hub.HF_MODULES_CACHE}))
"""


def test_this_process_writes_its_defaults_into_the_session(tmp_path_factory):
    import huggingface_hub.constants as constants
    from transformers.utils import hub

    base = _session_base()
    basetemp = tmp_path_factory.getbasetemp()
    for name, value in cleanup.session_environment(base).items():
        if name != "HF_HOME":  # each test gets its own (conftest clean_hf_env), also in the basetemp
            assert os.environ[name] == value, name
    assert not [name for name in cleanup.UNSET_FOR_SESSION if name in os.environ]
    assert _inside(Path.home(), base) and _inside(tempfile.gettempdir(), base)
    # Read at import, which came after conftest pointed HOME into the session (and HF_HOME into it or, when a test's
    # clean_hf_env came first, into pytest's basetemp).
    for path in (constants.HF_HOME, constants.HF_HUB_CACHE, constants.HF_XET_CACHE, constants.HF_TOKEN_PATH,
                 hub.HF_MODULES_CACHE):
        assert _inside(path, base) or _inside(path, basetemp), path
    assert oct(os.stat(base / "tmp").st_mode & 0o7777) == "0o1777"  # other uids' processes use it as /tmp


def test_a_subprocess_writes_its_defaults_into_the_session():
    base = _session_base()
    proc = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, env=clean_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    where = json.loads(proc.stdout)
    assert {name: path for name, path in where.items() if not _inside(path, base)} == {}


def test_the_private_modules_folder_of_env_is_made_in_the_session_tmp(tmp_path):
    # HF_HOME cannot be created (a file is in the way): `hfcache env` points HF_MODULES_CACHE at a private
    # folder in TMPDIR, which would be /tmp/hfcache-modules-<uid> outside the session.
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = clean_env(HF_HOME=str(blocker / "hf"))
    proc = subprocess.run([sys.executable, "-m", "hfcache", "env", "--cache-dir", str(tmp_path / "cache"), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    modules = Path(json.loads(proc.stdout)["HF_MODULES_CACHE"])
    assert modules == _session_base() / "tmp" / f"hfcache-modules-{os.geteuid()}" and modules.is_dir()


#: What test_docs' citation scan refuses (built here so that this file does not hold it).
PLANTED = "DES" + "IGN \u00a7" + "2, iss" + "ue 12"


def test_build_output_is_not_a_source_file(tmp_path):
    # A checkout after the quickstart: examples/dist/ holds a wheel (zip bytes that may decode to anything).
    (tmp_path / "examples" / "dist").mkdir(parents=True)
    (tmp_path / "examples" / "k8s").mkdir()
    (tmp_path / "examples" / "dist" / "hfcache-0.1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 " + PLANTED.encode())
    (tmp_path / "examples" / "x.egg-info").mkdir()
    (tmp_path / "examples" / "x.egg-info" / "PKG-INFO").write_text(PLANTED)
    (tmp_path / "examples" / "k8s" / "app.yaml").write_text("kind: Pod\n")
    (tmp_path / "examples" / "Dockerfile").write_text("FROM x\n")
    found = source_files(tmp_path / "examples", tmp_path)
    assert found == [tmp_path / "examples" / "Dockerfile", tmp_path / "examples" / "k8s" / "app.yaml"]
    assert is_artifact(REPO / "examples" / "dist" / "hfcache-0.1.0-py3-none-any.whl")
    assert not is_artifact(REPO / "examples" / "hfcache.lock")


def test_the_longest_files_are_given_to_the_workers_first():
    # Given in the opposite order: the container test (minutes) goes first, then the file with more tests; each
    # file's tests stay together and in their order. xdist keeps this order only without its own reorder.
    files = ["tests/unit/test_selection.py", "tests/unit/test_paths.py", "tests/integration/test_images_recipe.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "--co", "-q", *files],
                          capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    order = [f for i, f in enumerate(f.split("::")[0] for f in ids) if i == 0 or ids[i - 1].split("::")[0] != f]
    assert order == [files[2], files[1], files[0]], order
    addopts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--dist loadfile" in addopts and "--no-loadscope-reorder" in addopts
