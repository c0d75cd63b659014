"""hfcache doctor: each misconfiguration is created for real and flagged; where cheap, the trap is shown to be real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import hfcache
from hfcache.offline.env import offline_environment
from hfcache.records import WarmRequest
from tests.helpers import GOLDEN, LOAD_SCRIPT, clean_env, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"


def warm(cache: Path, *specs: str) -> None:
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(s) for s in specs], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("doctor") / "hub"
    warm(path, "google-bert/bert-base-uncased")
    return path


def doctor(env: dict[str, str], *args: str, prefix: tuple[str, ...] = (), **popen) -> tuple[int, dict]:
    """Run ``hfcache doctor --json`` in a child (``prefix``/``popen``: to run it as someone else)."""
    proc = subprocess.run([*prefix, sys.executable, "-m", "hfcache", "doctor", "--json", *args], capture_output=True,
                          text=True, env=env, timeout=120, **popen)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def codes(report: dict, severity: str | None = None) -> dict[str, dict]:
    return {f["code"]: f for f in report["findings"] if severity is None or f["severity"] == severity}


def offline_env(cache: Path, **extra: str) -> dict[str, str]:
    return clean_env(**{**offline_environment(cache).as_dict(), **extra})


def test_the_environment_hfcache_env_prints_is_healthy(cache):
    code, report = doctor(offline_env(cache))
    assert code == 0, report
    assert codes(report, "error") == {} and codes(report, "warning") == {}, report["findings"]
    assert report["effective_cache_dir"] == str(cache) and report["cache_source"] == "HF_HUB_CACHE"
    assert report["offline"] is True
    assert report["cache"]["writable"] is True and report["cache"]["symlinks"] is True
    assert report["cache"]["free_bytes"] > 0 and report["cache"]["owner_uid"] == os.geteuid()
    assert report["versions"]["huggingface_hub"].startswith("2.") and report["versions"]["transformers"]
    assert report["versions"]["tokenizers"]
    assert "offline.on" in codes(report) and "cache.path" in codes(report)


def test_effective_cache_path_and_the_setting_that_chose_it(tmp_path):
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    cases = [
        ({"HF_HOME": str(home)}, home / "hub", "HF_HOME"),
        ({"XDG_CACHE_HOME": str(xdg)}, xdg / "huggingface" / "hub", "XDG_CACHE_HOME"),
        ({"HF_HOME": str(home), "HUGGINGFACE_HUB_CACHE": str(tmp_path / "legacy")}, tmp_path / "legacy",
         "HUGGINGFACE_HUB_CACHE"),
        ({"HF_HOME": str(home), "HF_HUB_CACHE": str(tmp_path / "c")}, tmp_path / "c", "HF_HUB_CACHE"),
    ]
    for settings, path, source in cases:
        env = {k: v for k, v in clean_env(**settings).items() if k not in ("HF_HOME", "XDG_CACHE_HOME")
               or k in settings}
        code, report = doctor(env)
        assert (report["effective_cache_dir"], report["cache_source"]) == (str(path), source)
        assert code == 1 and "cache.missing" in codes(report, "error")  # nothing warmed there
        # the same path as huggingface_hub itself computes
        probe = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
                               capture_output=True, text=True, env=env, check=True)
        assert probe.stdout.strip() == str(path)
        if source == "HUGGINGFACE_HUB_CACHE":
            assert "env.legacy_hub_cache" in codes(report, "warning")


def test_hf_hub_offline_0_masking_transformers_offline_1(cache):
    env = offline_env(cache, HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="1")
    code, report = doctor(env)
    assert code == 1 and report["offline"] is False
    masked = codes(report, "error")["offline.masked"]
    assert "HF_HUB_OFFLINE=0 masks TRANSFORMERS_OFFLINE=1" in masked["message"]
    assert masked["fix"].startswith("export HF_HUB_OFFLINE=1")
    # It is real: with this environment a cached load still asks the server.
    with HubServer(HUB) as server:
        proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], "google-bert/bert-base-uncased"],
                              capture_output=True, text=True, env={**env, "HF_ENDPOINT": server.endpoint}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert len(server.requests) > 0
    # An empty HF_HUB_OFFLINE does not mask it (huggingface_hub: `HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE`).
    code, report = doctor(offline_env(cache, HF_HUB_OFFLINE="", TRANSFORMERS_OFFLINE="1"))
    assert report["offline"] is True and "offline.masked" not in codes(report)


def test_offline_off_and_values_huggingface_hub_does_not_understand(cache):
    env = clean_env(HF_HUB_CACHE=str(cache))
    code, report = doctor(env)
    assert report["offline"] is False and "offline.off" in codes(report, "warning")
    code, report = doctor(clean_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="y"))
    assert report["offline"] is False and "env.not_boolean" in codes(report, "warning")


def test_transformers_cache_is_ignored_by_transformers_5(cache, tmp_path):
    env = clean_env(TRANSFORMERS_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "home"))
    code, report = doctor(env)
    assert code == 1
    finding = codes(report, "error")["env.transformers_cache"]
    assert "ignored by transformers 5" in finding["message"] and f"HF_HUB_CACHE={cache}" in finding["fix"]
    # It is real: transformers does not find the warmed tokenizer there.
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, "hi", "google-bert/bert-base-uncased"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert "error" in json.loads(proc.stdout.strip().splitlines()[-1])["google-bert/bert-base-uncased"]
    # Naming the effective cache, it is only a warning.
    code, report = doctor(offline_env(cache, TRANSFORMERS_CACHE=str(cache)))
    assert code == 0 and "env.transformers_cache" in codes(report, "warning")


def test_hf_home_and_hf_hub_cache_disagreeing(cache, tmp_path):
    code, report = doctor(offline_env(cache, HF_HOME=str(tmp_path / "elsewhere")))
    finding = codes(report, "warning")["env.home_mismatch"]
    assert str(tmp_path / "elsewhere" / "hub") in finding["message"]
    assert finding["fix"].startswith(f"export HF_HOME={cache.parent}")
    assert code == 0  # HF_HUB_CACHE wins, loads work: a warning


def test_an_empty_cache_variable_is_an_error(cache, tmp_path):
    code, report = doctor(offline_env(cache, HF_HUB_CACHE=""))
    assert code == 1 and "env.empty" in codes(report, "error")
    assert report["cache_source"] == "HF_HUB_CACHE"


def test_cache_dir_that_the_environment_does_not_point_to(cache, tmp_path):
    code, report = doctor(clean_env(HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1"), "--cache-dir", str(cache))
    assert report["cache_dir"] == str(cache) and report["effective_cache_dir"] == str(tmp_path / "home" / "hub")
    finding = codes(report, "warning")["cache.not_effective"]
    assert f"export HF_HUB_CACHE={cache}" in finding["fix"]
    assert "cache.missing" not in codes(report)  # the cache examined is --cache-dir, which exists


def test_human_output_and_exit_code(cache):
    proc = run_hfcache(["doctor"], env=offline_env(cache, HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 1 and proc.stderr == ""  # the report is the result: stdout
    assert "masks" in proc.stdout and "1 error(s)" in proc.stdout


def test_hf_hub_disable_symlinks_is_reported(cache):
    code, report = doctor(offline_env(cache, HF_HUB_DISABLE_SYMLINKS="1"))
    assert "cache.symlinks_disabled" in codes(report, "info")
    assert not list(cache.glob(".hfcache-doctor-*"))  # the symlink probe left nothing behind


# ------------------------------------------------------------------------------------------------ needs root

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="needs root: to run as another user, or to mount")


def other_user() -> dict | None:
    """How to run a child as uid 1000, when uid 1000 can start this interpreter (None otherwise)."""
    popen = {"user": 1000, "group": 1000, "extra_groups": [], "cwd": "/"}
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True, capture_output=True, timeout=60, **popen)
    except (PermissionError, subprocess.CalledProcessError):
        return None
    return popen


@needs_root
def test_cache_owned_by_another_user():
    """The image is built as one user (root), the pod runs as another (1000): readable is fine, writable is not."""
    root = Path(tempfile.mkdtemp(prefix="hfcache-doctor-"))  # pytest's tmp folders are private to root
    try:
        os.chmod(root, 0o755)
        cache = root / "hub"
        warm(cache, "google-bert/bert-base-uncased")
        run = other_user()
        if run is not None:
            me, owner = 1000, 0
        elif shutil.which("setpriv") is not None:
            # uid 1000 cannot start this interpreter (it lives under /root). The same situation with the roles
            # swapped: the files belong to 1000, doctor runs as root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH,
            # i.e. as an ordinary user who is not the owner.
            for path in [root, *root.rglob("*")]:
                os.chown(path, 1000, 1000, follow_symlinks=False)
            me, owner = 0, 1000
            run = {"prefix": ("setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--")}
        else:
            pytest.skip("uid 1000 cannot start this interpreter and setpriv is missing")
        env = offline_env(cache, HOME=str(root))
        code, report = doctor(env, **run)
        assert report["user"]["uid"] == me and report["cache"]["owner_uid"] == owner
        finding = codes(report, "warning")["cache.not_writable"]
        assert f"owned by uid {owner}" in finding["message"] and f"you are uid {me}" in finding["message"]
        assert f"chown -R {me}:{me} {cache}" in finding["fix"]
        assert code == 0 and report["cache"]["writable"] is False  # readable: offline loads work; downloads not

        # Built with umask 077: the files are the owner's alone, and loads fail.
        for path in cache.rglob("*"):
            if not path.is_symlink():
                path.chmod(0o700 if path.is_dir() else 0o600)
        code, report = doctor(env, **run)
        assert code == 1
        assert "PermissionError" in codes(report, "error")["cache.unreadable"]["message"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def mounted(target: Path, *options: str) -> Iterator[None]:
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", *options, str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(target)], capture_output=True)


@needs_root
def test_read_only_filesystem(cache, tmp_path):
    ro = tmp_path / "ro"
    with mounted(ro, "--bind", str(cache)):
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        code, report = doctor(offline_env(ro))
        assert report["cache"]["read_only_fs"] is True and report["cache"]["writable"] is False
        assert codes(report, "info")["cache.read_only_fs"]["message"].startswith("the cache is on a read-only")
        assert "cache.not_writable" not in codes(report) and code == 0
        assert report["cache"]["symlinks"] is True  # told from the snapshot links, without writing
        code, report = doctor(clean_env(HF_HUB_CACHE=str(ro)))  # not offline: huggingface_hub would try to write
        assert "cache.read_only_fs" in codes(report, "warning")


@needs_root
def test_low_disk_space(tmp_path):
    small = tmp_path / "small"
    with mounted(small, "-t", "tmpfs", "-o", "size=2m", "tmpfs"):
        (small / "hub").mkdir()
        code, report = doctor(offline_env(small / "hub"))
        assert report["cache"]["free_bytes"] <= 2 * 1024 * 1024
        assert "disk.low" in codes(report, "warning")
