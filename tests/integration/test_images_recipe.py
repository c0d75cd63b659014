"""docs/images.md's recipe ("Building the example images without Docker Hub"), run as written: its three ``sh``
blocks read from the page, not copied here.

Block 1 (debootstrap, the host's CA bundle, the trim, tar) is the base every container test builds on
(tests/podman.py ``base_tarball``: run once and cached by the block's text, the mirror and the CA bundle); blocks 2
(podman's limits in a ``containers.conf``) and 3 (import, both builds, the local Hub, the offline run) run here in
one shell, in a copy of the checkout, with podman's storage in a private home. What is changed, and only that:
``/tmp/`` paths go to the test's folder, port 8080 to a free one (another test may hold 8080), the Debian mirror
to ``HFCACHE_TEST_DEBIAN_MIRROR`` when set, and block 1's ``apt-get install`` line is left out (CI installs the
tools). Marker ``container``: root, podman, buildah, runc and debootstrap needed (tests/integration/test_container.py
says why).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ARTIFACT_NAMES, GOLDEN, REPO, clean_env
from tests.podman import (
    APT_HINT,
    IMAGES_MD,
    PODMAN_HOME_PREFIX,
    RunLog,
    base_tarball,
    cache_root,
    make_podman,
    missing_tools,
    recipe_blocks,
    recipe_script,
    remove_home,
    run_script,
    unavailable,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.container

#: What the recipe's builds need of the checkout (docker/Dockerfile's context is the root; examples/ is the app's).
CHECKOUT = ("pyproject.toml", "README.md", "hfcache", "docker", "examples", "tests/data/hub")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _documented_base_mb() -> int:
    """The base's size the page states ("trimmed to N MB" in block 1)."""
    return int(re.search(r"trimmed to (\d+) MB", recipe_blocks()[0]).group(1))


def test_the_recipe_of_images_md_builds_and_runs_the_example_image(tmp_path_factory: pytest.TempPathFactory) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    missing = missing_tools()
    if missing:
        message = f"{', '.join(missing)} not installed ({APT_HINT})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the container tests: {message}", pytrace=False)
        pytest.skip(message)
    log = RunLog(tmp_path_factory.mktemp("recipe-log") / "recipe.log")
    started = time.monotonic()
    tarball = base_tarball(log)  # block 1, as written (cached by its text)
    # Not under pytest's basetemp (0700 and kept after a failure): the storage is about 1.5 GB.
    home = Path(tempfile.mkdtemp(prefix=PODMAN_HOME_PREFIX, dir=cache_root()))
    engine = make_podman(home / "podman", log)
    try:
        work = home / "tmp"  # the recipe's /tmp
        work.mkdir()
        os.link(tarball, work / "base.tar") if os.stat(tarball).st_dev == os.stat(work).st_dev \
            else shutil.copyfile(tarball, work / "base.tar")
        checkout = home / "checkout"
        for name in CHECKOUT:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, checkout / name,
                                ignore=shutil.ignore_patterns(*ARTIFACT_NAMES, "*.egg-info", "*.pyc"))
            else:
                (checkout / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, checkout / name)
        port = str(_free_port())
        script = "".join(recipe_script(block, work) for block in recipe_blocks()[1:]).replace("8080", port)
        assert script.count(port) == 2, "block 3 should serve on 8080 and build from http://127.0.0.1:8080"
        # hfcache and python3 are the test environment's (README's install: .venv/bin first on PATH).
        env = {**clean_env(), **{k: v for k, v in engine.env.items() if k.startswith("CONTAINERS_")},
               "TMPDIR": engine.env["TMPDIR"], "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        # Block 3 leaves the local Hub running if a command fails before its `kill`: stopped at the shell's exit.
        proc = run_script(log, "trap 'jobs -p | xargs -r kill' EXIT\n" + script, env=env, cwd=checkout,
                          timeout=2400)
        log.phase("docs/images.md blocks 2 and 3", time.monotonic() - started)

        lines = proc.stdout.strip().splitlines()
        first = lines.index("HF_HUB_OFFLINE=1 HF_HUB_CACHE=/opt/hf-cache")  # the run's output follows the builds'
        loaded = {doc["repo_id"]: doc for doc in map(json.loads, lines[first + 1:])}
        lock = tomllib.loads((REPO / "examples" / "hfcache.lock").read_text(encoding="utf-8"))
        assert sorted(loaded) == sorted(repo["repo_id"] for repo in lock["repos"])
        for repo in lock["repos"]:
            assert loaded[repo["repo_id"]].get("input_ids") == GOLDEN["repos"][repo["canonical_id"]]["input_ids"], \
                loaded[repo["repo_id"]]
        # The engine as the recipe left it: its containers.conf, its images, its trimmed base.
        recipe_env = {**engine.env, "CONTAINERS_CONF": str(work / "containers.conf")}
        listed = run_script(log, "podman image ls --format '{{.Repository}}'", env=recipe_env).stdout.split()
        assert {"localhost/debian-python", "registry.example.com/hfcache", "localhost/my-app"} <= set(listed), listed
        size = int(run_script(log, "podman image inspect --format '{{.Size}}' localhost/debian-python:bookworm",
                              env=recipe_env).stdout) / 1e6
        documented = _documented_base_mb()
        assert abs(size - documented) <= 0.1 * documented, (
            f"the base is {size:.0f} MB, docs/images.md says {documented} MB: update {IMAGES_MD.name}")
        assert list((checkout / "examples" / "dist").glob("hfcache-*.whl"))  # the recipe built its wheel
    finally:
        remove_home(engine)
        shutil.rmtree(home, ignore_errors=True)
