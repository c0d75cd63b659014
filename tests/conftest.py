"""Fixtures shared by every test: a clean Hugging Face environment and a local Hub server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hfcache.serve import HubServer


@pytest.fixture(autouse=True)
def clean_hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No HF_*/HFCACHE_* settings leak in from the developer's shell; HF_HOME points into a tmp dir.

    huggingface_hub reads HF_* at import time, so this only protects subprocesses and code that reads
    the environment at call time; in-process calls must still pass endpoint=, cache_dir=, token=.
    """
    for name in list(os.environ):
        if name.startswith(("HF_", "HFCACHE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def hub_root() -> Path:
    """The fixture Hub: ``<org>/<name>/`` repo folders plus ``legacy_ids.json``."""
    return Path(__file__).parent / "data" / "hub"


@pytest.fixture(scope="session")
def model_repos_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small model repos with real weight files, generated once per session (``tests/make_model_repos.py``)."""
    from tests.make_model_repos import make_model_repos

    return make_model_repos(tmp_path_factory.mktemp("model-repos"))


@pytest.fixture
def hub_server(hub_root: Path) -> Iterator[HubServer]:
    """A running HubServer over ``hub_root`` on loopback ports, stopped after the test."""
    with HubServer(hub_root) as server:
        yield server


@pytest.fixture(scope="module")
def runtime():
    """What another uid needs to run hfcache (tests/users.py :func:`make_runtime`), for the shared-cache tests;
    skipped where they cannot run (root and setpriv needed). Removed afterwards whatever chains it holds."""
    import shutil

    from tests.chains import remove_tree
    from tests.users import make_runtime

    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("runs commands as other uids (root and setpriv needed)")
    rt = make_runtime()
    yield rt
    remove_tree(rt.base)
