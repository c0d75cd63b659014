"""Run hfcache and transformers as other uids, for the shared-cache tests (root only: setpriv changes uid).

The test interpreter may not be usable by another uid (a pyenv under a 0700 /root, a checkout in a private home):
:func:`make_runtime` builds what such a user needs in a world-readable temporary folder: a copy of the ``hfcache``
package and of ``tests/sitecustom`` (which adds the test venv's site-packages), and picks an interpreter the user
can execute: the test one, else the system's ``pythonX.Y`` of the same version. CI (``.ci/run``) keeps its venv in a
world-readable place for this.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import LOAD_SCRIPT, clean_env

REPO = Path(__file__).resolve().parent.parent
GROUP = 4100  #: the group sharing the cache


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def setpriv(self) -> list[str]:
        groups = ["--groups=" + ",".join(map(str, self.groups))] if self.groups else ["--clear-groups"]
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", *groups, "--"]


ALICE = User(4101, 4101, (GROUP,))
BOB = User(4102, 4102, (GROUP,))
EVE = User(4103, 4103)  #: in no shared group

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="runs commands as other uids (root and setpriv needed)")


@dataclass(frozen=True)
class Runtime:
    base: Path  #: world-traversable folder for caches and homes
    python: str
    code: Path  #: PYTHONPATH for the other users: sitecustomize.py and a copy of hfcache

    def env(self, user: User, **extra: str) -> dict[str, str]:
        home = self.base / f"home-{user.uid}"
        home.mkdir(exist_ok=True)
        os.chown(home, user.uid, user.gid)
        env = clean_env(HOME=str(home), PYTHONPATH=str(self.code),
                        HFCACHE_TEST_SITE=sysconfig.get_paths()["purelib"], HF_HOME=str(home / "hf"))
        env.update(extra)
        return env

    def run(self, user: User, argv: Sequence[str], *, umask: int = 0o022, timeout: float = 300,
            **extra: str) -> subprocess.CompletedProcess[str]:
        """Run ``python ARGV`` as ``user`` with ``umask``; ``extra`` are environment variables."""
        return subprocess.run([*user.setpriv(), self.python, *argv], capture_output=True, text=True,
                              env=self.env(user, **extra), cwd=self.base, timeout=timeout,
                              preexec_fn=lambda: os.umask(umask))

    def hfcache(self, user: User, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run(user, ["-m", "hfcache", *args], **kw)

    def load(self, user: User, cache: Path, repo_ids: Sequence[str], text: str) -> dict:
        """AutoTokenizer.from_pretrained(repo_id) for each id, offline, as ``user``."""
        import json

        proc = self.run(user, ["-c", LOAD_SCRIPT, text, *repo_ids], HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])


def make_runtime() -> Runtime:
    """Build the runtime in a fresh world-traversable ``/tmp/hfcache-users-*`` folder (other uids cannot enter
    pytest's 0700 basetemp), marked with this session (tests/cleanup.py) so that the session's end, or the next
    session if this one is killed, removes it when the caller's teardown did not. Skips when no interpreter fits."""
    from tests import cleanup

    base = Path(tempfile.mkdtemp(prefix=cleanup.RUNTIME_PREFIX, dir=cleanup.RUNTIME_ROOT))
    os.chmod(base, 0o755)
    cleanup.mark_runtime(base, os.environ.get(cleanup.SESSION_VAR))
    code = base / "code"
    shutil.copytree(REPO / "hfcache", code / "hfcache", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "tests" / "sitecustom" / "sitecustomize.py", code / "sitecustomize.py")
    for root, dirs, files in os.walk(code):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    os.chmod(code, 0o755)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [os.path.realpath(sys.executable), f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    # hfcache check re-runs sys.executable: the user must be able to exec it by that name, not only via setpriv.
    probe = ("import hfcache, transformers, huggingface_hub, subprocess, sys; "
             "subprocess.run([sys.executable, '-c', 'import hfcache'], check=True); "
             "print('%d.%d' % sys.version_info[:2])")
    tried = []
    for python in candidates:
        if not os.path.exists(python):
            continue
        runtime = Runtime(base, python, code)
        proc = runtime.run(ALICE, ["-c", probe], timeout=120)
        if proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == version:
            return runtime
        tried.append(f"{python}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    shutil.rmtree(base, ignore_errors=True)
    pytest.skip("no interpreter another uid can run with the test packages: " + "; ".join(tried))
