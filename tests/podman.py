"""Rootful podman in a private home, for the container tests (tests/integration/test_container.py, whose docstring
says what this machine needs and why) and the podman pull test (tests/integration/test_oci_podman.py): a base image
bootstrapped with debootstrap and cached as a tarball under ``$HFCACHE_TEST_CACHE``, an engine whose storage and
configuration live in a folder of its own, and a log of every command run."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BASE_SUITE = "bookworm"


#: Bump when the way the recipe is run below changes, so cached tarballs are rebuilt.
BASE_RECIPE = 2


DEBIAN_MIRROR = os.environ.get("HFCACHE_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")


HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


#: The page whose recipe the container tests follow: the base, podman's settings, then the images.
IMAGES_MD = Path(__file__).resolve().parent.parent / "docs" / "images.md"
RECIPE_SECTION = "## Building the example images without Docker Hub"
#: What the recipe's first block installs (CI's .ci/run installs them before the suite; the tests do not).
RECIPE_TOOLS = ("debootstrap", "podman", "buildah", "runc")


def recipe_blocks() -> list[str]:
    """The ```sh blocks of docs/images.md's recipe section, in order: the base, podman's settings, the images."""
    import re

    text = IMAGES_MD.read_text(encoding="utf-8")
    section = text[text.index(RECIPE_SECTION):]
    section = section[:section.index("\n## ", len(RECIPE_SECTION))]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 3, f"docs/images.md's recipe should have 3 sh blocks, found {len(blocks)}"
    return blocks


def recipe_script(block: str, work: Path) -> str:
    """``block`` as a test runs it: its ``/tmp/`` paths in ``work``, the Debian mirror :data:`DEBIAN_MIRROR`, and
    its ``apt-get install`` line left out (checked to name :data:`RECIPE_TOOLS`: the machine has them)."""
    lines = []
    for line in block.splitlines():
        if line.startswith("apt-get install"):
            assert set(RECIPE_TOOLS) <= set(line.split()), line
            continue
        lines.append(line.replace("/tmp/", f"{work}/").replace("http://deb.debian.org/debian", DEBIAN_MIRROR))
    return "\n".join(lines) + "\n"


def run_script(log: RunLog, script: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 1200, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``bash -euo pipefail -c script`` (the recipe's blocks in one shell), logged like any command."""
    log.note(f"$ bash -euo pipefail <<EOF\n{script}EOF")
    started = time.monotonic()
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    log.note(proc.stdout + proc.stderr + f"-> exit {proc.returncode} after {time.monotonic() - started:.1f}s")
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        pytest.fail(f"docs/images.md's recipe exited {proc.returncode} (full log: {log.path}):\n{tail}", pytrace=False)
    return proc


APT_HINT = "apt-get update && apt-get install -y podman buildah runc debootstrap"


PODMAN_HOME_PREFIX = "hfcache-podman-"


def unavailable() -> str | None:
    """Why this machine cannot run the builds at all (the reason of the skip), or None."""
    if os.geteuid() != 0:
        userns = Path("/proc/sys/user/max_user_namespaces")
        if not userns.exists() or userns.read_text().strip() == "0":
            return "podman cannot run here: not root and no user namespaces (user.max_user_namespaces is 0)"
        return ("needs root: the images are built with rootful podman on a debootstrapped base (debootstrap creates "
                "device nodes; rootless builds are not attempted); CI runs it as root")
    return None


def missing_tools() -> list[str]:
    return [tool for tool in ("podman", "buildah", "runc", "debootstrap", "tar") if shutil.which(tool) is None]


def cache_root() -> Path:
    return Path(os.environ.get("HFCACHE_TEST_CACHE", "/var/cache/hfcache-test"))


def base_key() -> str:
    """A hash of everything that goes into the base tarball: the recipe's first block, the mirror, the host's CA
    bundle (the block copies it in)."""
    recipe = {
        "recipe": BASE_RECIPE,
        "block": recipe_blocks()[0],
        "mirror": DEBIAN_MIRROR,
        "ca": hashlib.sha256(HOST_CA_BUNDLE.read_bytes()).hexdigest() if HOST_CA_BUNDLE.is_file() else None,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def base_tarball(log: RunLog) -> Path:
    """The base rootfs as a tar, made by docs/images.md's first recipe block (debootstrap, the CA bundle, the trim,
    tar): from the cache, or made now (~1 minute) and cached."""
    from filelock import FileLock

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = base_key()
    tarball = root / f"base-{BASE_SUITE}-{key}.tar"
    with FileLock(str(root / f"base-{key}.lock"), timeout=1800):
        if tarball.is_file():
            log.note(f"base rootfs: cached {tarball}")
            return tarball
        work = Path(tempfile.mkdtemp(prefix=f"base-{key}.", dir=root))
        try:
            started = time.monotonic()
            script = recipe_script(recipe_blocks()[0], work)
            for attempt in (1, 2):  # a mirror hiccup should not fail CI: one retry from an empty folder
                _remove_tree(work / "base-rootfs", log)
                if run_script(log, script, check=attempt == 2).returncode == 0:
                    break
            os.replace(work / "base.tar", tarball)
            log.phase("docs/images.md block 1: debootstrap, trim, tar of the base rootfs", time.monotonic() - started)
        finally:
            _remove_tree(work, log)
    return tarball


def _remove_tree(path: Path, log: RunLog) -> None:
    """``rm -rf path``, never through a mount point: a failed debootstrap can leave /proc (or, in a container, bind
    mounts of the host's /dev) mounted inside its target. Unmount what is below ``path`` first; if anything stays
    mounted, leave the folder alone."""
    below = f"{path}/"
    for _ in range(2):
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        mine = sorted((m for m in mounts if m.startswith(below)), key=len, reverse=True)
        if not mine:
            shutil.rmtree(path, ignore_errors=True)
            return
        for mount in mine:
            log.run(["umount", "--lazy", mount], check=False)
    log.note(f"left {path} in place: still mounted below it")


@dataclass
class RunLog:
    """Commands run, their output (in a log file kept with the test's tmp dir) and the duration of each phase."""

    path: Path
    phases: list[tuple[str, float]] = field(default_factory=list)

    def note(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text + "\n")

    def phase(self, name: str, seconds: float) -> None:
        self.phases.append((name, seconds))
        self.note(f"== {name}: {seconds:.1f}s")

    def run(self, cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``cmd``; on failure (with ``check``), fail the test with the command and its last output lines."""
        self.note(f"$ {shlex.join(cmd)}")
        started = time.monotonic()
        proc = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if not quiet or proc.returncode:
            self.note(proc.stdout + proc.stderr)
        self.note(f"-> exit {proc.returncode} after {time.monotonic() - started:.1f}s")
        if check and proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
            pytest.fail(f"{shlex.join(cmd)} exited {proc.returncode} (full log: {self.path}):\n{tail}", pytrace=False)
        return proc


@dataclass
class Podman:
    """``podman`` with its own containers.conf, storage and registries.conf: nothing of the host's is used."""

    home: Path
    runroot: Path
    log: RunLog
    env: dict[str, str]
    base_image: str = ""

    def __call__(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.log.run(["podman", *args], env=self.env, timeout=timeout, check=check)

    def build(self, name: str, context: Path, *args: str) -> None:
        started = time.monotonic()
        self("build", "--pull=never", "--network", "host", "--tag", name, *args, str(context), timeout=1200)
        self.log.phase(f"podman build {name}", time.monotonic() - started)


def make_podman(home: Path, log: RunLog) -> Podman:
    (home / "storage").mkdir(parents=True)
    # podman refuses a --runroot longer than 50 characters, and it passes the runroot as that flag to the
    # `podman container cleanup` that conmon runs when a container exits: a long one makes that cleanup fail and
    # every `podman run --rm` then waits 20 s for it. So the runroot lives at a short path.
    runroot = Path(tempfile.mkdtemp(prefix="hfcp-", dir="/run" if os.access("/run", os.W_OK) else "/tmp"))
    assert len(str(runroot)) <= 50, runroot
    (home / "runroot").write_text(str(runroot), encoding="utf-8")
    # containers.conf as docs/images.md's second block writes it (the limits and engine settings podman needs here).
    conf = home / "containers.conf"
    run_script(log, recipe_script(recipe_blocks()[1], home) + 'test "$CONTAINERS_CONF" = ' + shlex.quote(str(conf)))
    storage = home / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{home / "storage"}"\nrunroot = "{runroot}"\n',
                       encoding="utf-8")
    registries = home / "registries.conf"
    registries.write_text("unqualified-search-registries = []\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTAINERS_", "BUILDAH_", "HF_", "HFCACHE_"))}
    env.update(CONTAINERS_CONF=str(conf), CONTAINERS_STORAGE_CONF=str(storage),
               CONTAINERS_REGISTRIES_CONF=str(registries), TMPDIR=str(home))
    return Podman(home=home, runroot=runroot, log=log, env=env)


def remove_home(engine: Podman) -> None:
    """Stop and remove what the private podman holds (no mount left behind), then its folder."""
    engine("rm", "--all", "--force", "--time", "0", timeout=120, check=False)
    engine("rmi", "--all", "--force", timeout=300, check=False)
    # The overlay driver bind-mounts its own folder (and a container's shm may linger): unmounted first.
    _remove_tree(engine.runroot, engine.log)
    _remove_tree(engine.home, engine.log)


def remove_stale_homes(log: RunLog) -> None:
    """Private podman homes left by runs that were killed (hours old: no live run is that old)."""
    for home in cache_root().glob(f"{PODMAN_HOME_PREFIX}*"):
        try:
            stale = time.time() - home.stat().st_mtime > 6 * 3600
        except FileNotFoundError:
            continue
        if stale and (home / "runroot").is_file():
            log.note(f"removing stale podman home {home}")
            env = {**os.environ, "CONTAINERS_CONF": str(home / "containers.conf"),
                   "CONTAINERS_STORAGE_CONF": str(home / "storage.conf")}
            runroot = Path((home / "runroot").read_text(encoding="utf-8"))
            remove_home(Podman(home=home, runroot=runroot, log=log, env=env))
