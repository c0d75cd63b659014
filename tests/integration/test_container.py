"""Real container builds: examples/Dockerfile and docker/Dockerfile, built and run with podman, loads offline.

There is no Docker engine and no registry here, so Debian's podman/buildah/runc build the images from a base
image bootstrapped locally by the first block of docs/images.md's recipe (``debootstrap`` bookworm with python3,
python3-venv, python3-pip, ca-certificates; the host's CA bundle copied in; trimmed), ``podman import``; podman's
``containers.conf`` is what the recipe's second block writes (tests/podman.py reads both from the page;
tests/integration/test_images_recipe.py runs the whole recipe). What this needs from the machine (found by trying):

- runc as the runtime with explicit ``default_ulimits`` (nofile, nproc) in a ``containers.conf``: podman's own
  defaults exceed this sandbox's hard limits and, without CAP_SYS_RESOURCE, runc's setrlimit fails (EPERM); podman
  caps nproc at 32768;
- the host's CA certificates in the base rootfs (egress goes through a TLS proxy whose CA only the host trusts);
- ``--network host`` for the builds (pip reaches the package index; the builder stage reaches the local Hub
  server on 127.0.0.1), ``--network none`` for the runs;
- everything else stays inside a private podman home (storage, containers.conf, registries.conf with no registry;
  the runroot at a short path of its own, see tests/podman.py ``make_podman``), removed afterwards: the host's podman
  configuration and images are neither read nor changed.

The debootstrapped base is cached as a tarball under ``$HFCACHE_TEST_CACHE`` (default ``/var/cache/hfcache-test``),
keyed by a hash of the recipe (suite, variant, mirror, packages, host CA bundle): repeated runs skip debootstrap.
``rm -rf /var/cache/hfcache-test`` forces a rebuild. CI (``.ci/run``) installs podman, buildah, runc and
debootstrap first. The test builds rootful, so it needs root: it is skipped, with the reason, when not run as root
(rootless podman would also need subordinate uid ranges and an unprivileged bootstrap; not attempted), and when the
tools are missing outside CI; under ``CI`` a missing tool is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hfcache import __version__
from tests.helpers import ARTIFACT_NAMES, GOLDEN, build_wheel, clean_env
from tests.podman import (
    APT_HINT,
    PODMAN_HOME_PREFIX,
    Podman,
    RunLog,
    base_key,
    base_tarball,
    cache_root,
    make_podman,
    missing_tools,
    remove_home,
    remove_stale_homes,
    unavailable,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.container

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


EXAMPLE_IMAGE = "localhost/hfcache-example:test"
HFCACHE_IMAGE = "localhost/hfcache:test"
CACHE_DIR_IN_IMAGE = "/opt/hf-cache"


# --- what the machine offers ---------------------------------------------------------------------------------------



# --- the base image ------------------------------------------------------------------------------------------------



# --- podman in a private home ------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> RunLog:
    return RunLog(tmp_path_factory.mktemp("container-log") / "container.log")


@pytest.fixture(scope="module")
def podman(run_log: RunLog, pytestconfig: pytest.Config) -> Iterator[Podman]:
    """A private podman with the base image imported as ``base_image``; its storage is deleted afterwards."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    missing = missing_tools()
    if missing:
        message = f"{', '.join(missing)} not installed ({APT_HINT})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the container test: {message}", pytrace=False)
        pytest.skip(message)
    started = time.monotonic()
    tarball = base_tarball(run_log)
    remove_stale_homes(run_log)
    # Not under pytest's basetemp: it keeps the last runs, and this storage is about 1.5 GB.
    home = Path(tempfile.mkdtemp(prefix=PODMAN_HOME_PREFIX, dir=cache_root()))
    engine = make_podman(home, run_log)
    try:
        engine.base_image = f"localhost/hfcache-test-base:{base_key()}"
        engine("import", "--change", 'CMD ["/bin/bash"]', str(tarball), engine.base_image)
        run_log.phase("base image ready (bootstrap or cache, then podman import)", time.monotonic() - started)
        yield engine
    finally:
        remove_home(engine)
        lines = [f"  {seconds:6.1f}s  {name}" for name, seconds in run_log.phases]
        _to_terminal(pytestconfig, f"container test phases (log: {run_log.path}):\n" + "\n".join(lines))



def _to_terminal(config: pytest.Config, text: str) -> None:
    """Print past pytest's output capture, so that CI's log shows it for a passing test too."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{text}", flush=True)


# --- the local Hub ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hub:
    endpoint: str
    token: str
    token_file: Path


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """``python -m tests.testhub tests/data/hub`` on 127.0.0.1, requiring a Bearer token (a private Hub)."""
    token = f"hf_containertest{secrets.token_hex(16)}"
    token_file = tmp_path / "hf_token"
    token_file.write_text(token, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.testhub", str(REPO / "tests/data/hub"), "--host", "127.0.0.1", "--port", "0",
         "--token", token],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=REPO,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        if " at http://" not in line:
            pytest.fail(f"the Hub server did not start: {line!r}", pytrace=False)
        yield Hub(endpoint=line.rsplit(" at ", 1)[1].strip(), token=token, token_file=token_file)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- helpers -------------------------------------------------------------------------------------------------------


def _lock() -> dict:
    return tomllib.loads((EXAMPLES / "hfcache.lock").read_text(encoding="utf-8"))


def _installed_version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _grep_storage(podman: Podman, needle: str) -> list[str]:
    """Files of the podman storage (every layer of every image and stage, image configs and histories) holding
    ``needle``."""
    proc = podman.log.run(["grep", "-r", "-l", "-a", "-F", "-D", "skip", needle, str(podman.home / "storage")],
                          check=False, quiet=True)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout.split()


def _dockerfile_env_block(dockerfile: str) -> str | None:
    """The ``hfcache env --format dockerfile`` block pasted in a Dockerfile (its comment lines and ENV), if any."""
    lines = dockerfile.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("# Offline settings for the Hugging Face cache at "):
            j = i + 1
            while j < len(lines) and lines[j].startswith("#"):  # the header, then the notes on aliases
                j += 1
            block = lines[i:j + 1]
            j += 1
            while block[-1].rstrip("\n").endswith("\\") and j < len(lines):
                block.append(lines[j])
                j += 1
            return "".join(block)
    return None


#: Run in the application container: its uid, entries of the cache not owned by 1000:1000, distinct file bytes.
_INSPECT_CACHE = f"""
import json, os, stat
root = {CACHE_DIR_IN_IMAGE!r}
sizes, foreign = {{}}, [root] if (os.lstat(root).st_uid, os.lstat(root).st_gid) != (1000, 1000) else []
for folder, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(folder, name)
        st = os.lstat(path)
        if (st.st_uid, st.st_gid) != (1000, 1000):
            foreign.append(path)
        if stat.S_ISREG(st.st_mode):
            sizes[st.st_ino] = st.st_size
print(json.dumps({{"uid": os.getuid(), "foreign_owners": foreign, "distinct_bytes": sum(sizes.values())}}))
"""


#: What the init-container image must not carry (it once did, to run `warm`), and what its serve flavour adds.
NOT_IN_CORE = ("transformers", "numpy", "safetensors", "uvicorn", "werkzeug", "prometheus_client")
SERVE_EXTRA = ("uvicorn", "werkzeug", "prometheus_client")
HFCACHE_SERVE_IMAGE = "localhost/hfcache-serve:test"

#: Run in the hfcache image: load_tokenizer's fast path (no transformers) for each repo; which of NOT_IN_CORE got
#: imported.
_FAST_LOAD = f"""
import json, sys
import hfcache
out = {{r: hfcache.load_tokenizer(r, cache_dir="/cache", backend="tokenizers").encode(sys.argv[1]).ids
       for r in sys.argv[2:]}}
out["imported"] = sorted(set({NOT_IN_CORE!r}) & set(sys.modules))
print(json.dumps(out))
"""
_FIND = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n)))"


# --- the tests -----------------------------------------------------------------------------------------------------


def test_example_image_builds_with_a_secret_token_and_loads_offline(podman: Podman, hub: Hub, tmp_path: Path,
                                                                    pytestconfig: pytest.Config) -> None:
    """examples/Dockerfile: the builder warms the lock from the local (token-protected) Hub with the token as a build
    secret; the runtime image, run with no network at all, loads every tokenizer and gets the golden ids."""
    dockerfile = (EXAMPLES / "Dockerfile").read_text(encoding="utf-8")
    # The ENV block is what `hfcache env --format dockerfile` prints today, verbatim.
    env_cmd = [sys.executable, "-m", "hfcache", "env", "--cache-dir", CACHE_DIR_IN_IMAGE, "--format", "dockerfile"]
    generated = podman.log.run(env_cmd, env=clean_env()).stdout
    assert _dockerfile_env_block(dockerfile) == generated, (
        f"examples/Dockerfile's ENV block differs from `{shlex.join(env_cmd[2:])}`; paste this in:\n{generated}")
    # The lock is current with the manifest (the build runs warm --locked, which would fail later and slower).
    podman.log.run([sys.executable, "-m", "hfcache", "lock", "--check", "--manifest", str(EXAMPLES / "hfcache.toml")],
                   env=clean_env())

    # As the Dockerfile's header says: the wheel in the context's dist/, then `docker build` in examples/.
    context = tmp_path / "examples"
    shutil.copytree(EXAMPLES, context, ignore=shutil.ignore_patterns(*ARTIFACT_NAMES, "*.egg-info"))  # not dist/
    build_wheel(context / "dist", tmp_path)
    podman.build(
        EXAMPLE_IMAGE, context,
        "--build-arg", f"PYTHON_IMAGE={podman.base_image}",
        "--build-arg", f"HF_ENDPOINT={hub.endpoint}",
        "--build-arg", "APP_REQUIREMENTS=" + " ".join(
            f"{dist}=={_installed_version(dist)}" for dist in ("transformers", "tokenizers")),
        "--secret", f"id=hf_token,src={hub.token_file}",
    )

    # The token reached the builder (the server refuses requests without it) but no layer, config or history of any
    # image or intermediate stage; the endpoint, a plain build argument, is found the same way (the search works).
    assert _grep_storage(podman, hub.endpoint), "control: the HF_ENDPOINT build argument should be in the history"
    assert _grep_storage(podman, hub.token) == [], "the Hub token leaked into the image storage"

    # The offline load, in a container without any network, by the image's own CMD.
    started = time.monotonic()
    proc = podman("run", "--rm", "--network", "none", EXAMPLE_IMAGE, timeout=300)
    podman.log.phase("podman run --network none (offline load)", time.monotonic() - started)
    _to_terminal(pytestconfig, f"$ podman run --rm --network none {EXAMPLE_IMAGE}\n{proc.stdout.rstrip()}")
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"HF_HUB_OFFLINE=1 HF_HUB_CACHE={CACHE_DIR_IN_IMAGE}"
    loaded = {doc["repo_id"]: doc for doc in map(json.loads, lines[1:])}
    lock = _lock()
    assert sorted(loaded) == sorted(repo["repo_id"] for repo in lock["repos"])
    for repo in lock["repos"]:
        got = loaded[repo["repo_id"]]
        assert "error" not in got, got
        assert got["input_ids"] == GOLDEN["repos"][repo["canonical_id"]]["input_ids"], repo["repo_id"]

    # The cache is ONE layer, owned by the runtime user, holding each stored file once (COPY kept the hardlinks of the
    # legacy id's blobs): its size is the cache's distinct file bytes plus tar headers, not a second copy of anything.
    history = json.loads(podman("history", "--no-trunc", "--format", "json", EXAMPLE_IMAGE).stdout)
    cache_layers = [h for h in history if f"in {CACHE_DIR_IN_IMAGE}" in h.get("createdBy", h.get("CreatedBy", ""))]
    assert len(cache_layers) == 1, history
    layer_size = cache_layers[0].get("size", cache_layers[0].get("Size"))
    inspect = podman("run", "--rm", "--network", "none", EXAMPLE_IMAGE, "python", "-c", _INSPECT_CACHE).stdout
    found = json.loads(inspect)
    assert found["uid"] == 1000 and found["foreign_owners"] == [], found
    unique_content = sum({f["hash"]: f["size"] for repo in lock["repos"] for f in repo["files"]}.values())
    assert unique_content <= found["distinct_bytes"] <= layer_size <= found["distinct_bytes"] + 256 * 1024, \
        (layer_size, found["distinct_bytes"], unique_content)
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", EXAMPLE_IMAGE).stdout)
    assert config["User"] == "1000:1000"
    assert f"HF_HUB_CACHE={CACHE_DIR_IN_IMAGE}" in config["Env"] and "HF_HUB_OFFLINE=1" in config["Env"]


def test_hfcache_image_is_an_init_container(podman: Podman, hub: Hub, tmp_path: Path) -> None:
    """docker/Dockerfile: `hfcache --version`, non-root; as an init container it fills a mounted volume from the Hub
    (token from a mounted secret file), and a restart with no network finds the lock satisfied and loads offline."""
    podman.build(HFCACHE_IMAGE, REPO, "--file", str(REPO / "docker/Dockerfile"),
                 "--build-arg", f"BASE_IMAGE={podman.base_image}")
    assert podman("run", "--rm", "--network", "none", HFCACHE_IMAGE, "--version").stdout.strip() \
        == f"hfcache, version {__version__}"
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", HFCACHE_IMAGE).stdout)
    assert config["User"] == "1000:1000" and config["Entrypoint"] == ["hfcache"], config

    volume = tmp_path / "volume"
    volume.mkdir()
    os.chown(volume, 1000, 1000)  # what fsGroup/an emptyDir gives the pod
    mounts = ["--volume", f"{volume}:/cache", "--volume", f"{EXAMPLES}:/config:ro",
              "--volume", f"{hub.token_file}:/run/secrets/hf_token:ro"]
    podman("run", "--rm", "--network", "host", *mounts, HFCACHE_IMAGE, "warm", "--lock", "/config/hfcache.lock",
           "--cache-dir", "/cache", "--endpoint", hub.endpoint, "--token-file", "/run/secrets/hf_token", "-q")
    # The pod restarts: no network, the lock is already satisfied (zero requests), and the tokenizers load offline.
    podman("run", "--rm", "--network", "none", *mounts, HFCACHE_IMAGE, "warm", "--lock", "/config/hfcache.lock",
           "--cache-dir", "/cache", "-q")
    # The image is the core install (no transformers): check names its extra; the fast path loads in the image.
    refused = podman("run", "--rm", "--network", "none", *mounts, HFCACHE_IMAGE, "check", "--lock",
                     "/config/hfcache.lock", "--cache-dir", "/cache", check=False)
    assert refused.returncode == 2 and "hint: pip install 'hfcache[check]'" in refused.stderr, refused
    fast = json.loads(podman("run", "--rm", "--network", "none", *mounts, "--entrypoint", "/opt/hfcache/bin/python",
                             HFCACHE_IMAGE, "-c", _FAST_LOAD, GOLDEN["text"],
                             *(repo["repo_id"] for repo in _lock()["repos"])).stdout)
    assert fast.pop("imported") == [], fast
    canonical = {repo["repo_id"]: repo["canonical_id"] for repo in _lock()["repos"]}
    for repo_id, ids in fast.items():
        assert ids == GOLDEN["repos"][canonical[repo_id]]["input_ids"], repo_id
    assert {p.stat().st_uid for p in volume.rglob("*")} == {1000}
    # AutoTokenizer loads from the volume too (the test environment has transformers: the app container's side;
    # as root, check records its fast-path verdicts in the cache, hence after the owner check above).
    checked = subprocess.run([sys.executable, "-m", "hfcache", "check", "--lock", str(EXAMPLES / "hfcache.lock"),
                              "--cache-dir", str(volume), "--text", GOLDEN["text"], "--json"], capture_output=True,
                             text=True, env=clean_env(), timeout=300, cwd=REPO)
    report = json.loads(checked.stdout)
    assert report["ok"] is True, report
    assert sorted(t["repo_id"] for t in report["tokenizers"]) == sorted(canonical)
    for t in report["tokenizers"]:
        assert t["input_ids"] == GOLDEN["repos"][canonical[t["repo_id"]]]["input_ids"], t["repo_id"]


def _image_mb(podman: Podman, image: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()) / 1e6


def test_init_image_is_the_core_install_and_serve_is_an_extra(podman: Podman, pytestconfig: pytest.Config) -> None:
    """docker/Dockerfile without build args is the core install (no transformers, numpy or server stack; with them
    it was 518 MB on a 199 MB base); HFCACHE_EXTRAS=serve adds the server for `hfcache serve`. The
    sizes are printed for docs/images.md ("Image sizes")."""
    podman.build(HFCACHE_IMAGE, REPO, "--file", str(REPO / "docker/Dockerfile"),
                 "--build-arg", f"BASE_IMAGE={podman.base_image}")
    podman.build(HFCACHE_SERVE_IMAGE, REPO, "--file", str(REPO / "docker/Dockerfile"),
                 "--build-arg", f"BASE_IMAGE={podman.base_image}", "--build-arg", "HFCACHE_EXTRAS=serve")
    python = ["run", "--rm", "--network", "none", "--entrypoint", "/opt/hfcache/bin/python"]
    assert podman(*python, HFCACHE_IMAGE, "-c", _FIND, *NOT_IN_CORE, "pip").stdout.split() == []
    assert podman(*python, HFCACHE_SERVE_IMAGE, "-c", _FIND, *NOT_IN_CORE).stdout.split() == list(SERVE_EXTRA)
    refused = podman("run", "--rm", "--network", "none", HFCACHE_IMAGE, "serve", "--port", "0", check=False)
    assert refused.returncode == 2 and "hint: pip install 'hfcache[serve]'" in refused.stderr, refused
    assert podman(*python, HFCACHE_SERVE_IMAGE, "-c", "import hfcache.serve.mirror").returncode == 0
    base, lean, serve = (_image_mb(podman, image) for image in (podman.base_image, HFCACHE_IMAGE, HFCACHE_SERVE_IMAGE))
    _to_terminal(pytestconfig, f"image sizes: base {base:.0f} MB, hfcache (init container) {lean:.0f} MB "
                               f"(+{lean - base:.0f}), hfcache-serve {serve:.0f} MB (+{serve - base:.0f})")
    # The core install's venv is ~70 MB (tokenizers, hf_xet, huggingface_hub, pygments, ...); transformers alone
    # would add ~220 MB.
    assert lean - base < 120, (base, lean)
    assert serve - lean < 40, (lean, serve)
