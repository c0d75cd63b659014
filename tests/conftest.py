"""Fixtures shared by every test: a clean Hugging Face environment and a local Hub server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import cleanup

if TYPE_CHECKING:
    from tests.testhub import HubServer


@pytest.fixture(autouse=True)
def clean_hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No HF_*/HFCACHE_* settings leak in from the developer's shell; HF_HOME points into a tmp dir, removed
    after the test (one per test: left in the basetemp they would add up over a session).

    huggingface_hub reads HF_* at import time, so this only protects subprocesses and code that reads
    the environment at call time; in-process calls must still pass endpoint=, cache_dir=, token=.
    """
    import shutil

    for name in list(os.environ):
        if name.startswith(("HF_", "HFCACHE_")):
            monkeypatch.delenv(name)
    home = tmp_path_factory.mktemp("hf-home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield
    shutil.rmtree(home, ignore_errors=True)


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
    """A running HubServer over ``hub_root`` on loopback ports, stopped after the test. (Imported here: this
    module is imported before pytest_configure points HOME into the session, and huggingface_hub, which the test Hub
    imports, reads its cache locations once, at import.)"""
    from tests.testhub import HubServer

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


# --- what a session leaves behind (tests/cleanup.py) ---------------------------------------------------------------


@pytest.hookimpl(trylast=True)  # after pytest's tmpdir plugin made its TempPathFactory
def pytest_configure(config: pytest.Config) -> None:
    """pytest's tmp_path and basetemp removals handle folder chains of any depth (tests/cleanup.py); no terminal size
    leaks into the tests' subprocesses; the session gets its token and its own HOME and TMPDIR (below)."""
    cleanup.install_deep_rmtree()
    _start_session(config)
    # pytest-xdist's workers export COLUMNS=80 and LINES=24 (a serial run exports neither): hfcache would wrap its
    # tables at 80 columns off a terminal instead of its pipe width (cli/render/common.py). Before the test modules
    # are imported (some build their subprocess environment at import); tests that want a width pass COLUMNS.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files so that the longest start first: those with ``container`` tests (image builds, minutes
    each), then by their number of ``slow`` tests, then by their number of tests (pytest-xdist's own reorder).

    pytest-xdist's ``--dist loadfile`` gives each worker whole files in this order (pyproject.toml:
    ``--no-loadscope-reorder``). Its default reorder, by number of tests alone, sent the files with few but long
    tests (test_container.py: 3 tests) last, and one worker then ran them alone at the end while the others idled.
    The sort is stable: each file's tests keep their order. Every worker sorts the same collection the same way.
    """
    from collections import Counter

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    container = Counter(file_of(i) for i in items if i.get_closest_marker("container") is not None)
    slow = Counter(file_of(i) for i in items if i.get_closest_marker("slow") is not None)
    counts = Counter(file_of(i) for i in items)
    items.sort(key=lambda i: (-container[file_of(i)], -slow[file_of(i)], -counts[file_of(i)]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (:func:`_longest_files_first`). Tests marked ``timing`` (wall-time ratios, the
    harness's own pytest sessions) run only when ``-m`` selects them (``-m slow``, ``-m timing``): the plain command
    of README.md and CI skips them, saying how to run them."""
    _longest_files_first(items)
    if config.option.markexpr:
        return
    skip = pytest.mark.skip(reason="timing: needs a quiet machine; run with -m slow (or -m timing)")
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(skip)


def _start_session(config: pytest.Config) -> None:
    """Give the session a token every child inherits; remove runtime folders that killed runs left; point HOME,
    the XDG folders, HF_HOME and TMPDIR into a folder of the session (tests/cleanup.py ``make_session_home``) and
    remove the other cache settings, before any test module imports huggingface_hub or transformers (they read
    them at import) and before pytest-xdist starts its workers (they inherit all of it). An xdist worker keeps its
    controller's token and folders: one session, judged by the controller at its end."""
    import tempfile

    if cleanup.is_xdist_worker() and os.environ.get(cleanup.SESSION_VAR):
        return
    token = cleanup.new_token()
    os.environ[cleanup.SESSION_VAR] = token
    os.environ[cleanup.SESSION_PID_VAR] = str(os.getpid())
    cleanup.sweep_dead_runtimes()
    config._tmp_path_factory.getbasetemp()  # where TMPDIR says now (the basetemp is pytest's, kept if a run fails)
    base = cleanup.make_session_home(token)
    config.stash[_SESSION_HOME] = base
    for name in cleanup.UNSET_FOR_SESSION:
        os.environ.pop(name, None)
    os.environ.update(cleanup.session_environment(base))
    tempfile.tempdir = None  # read TMPDIR again


_SESSION_HOME = pytest.StashKey[Path]()


@pytest.hookimpl(trylast=True)  # after pytest's own tmpdir plugin removed a passing session's basetemp
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the processes the session left running (and fail it), remove the runtime folders its teardowns
    left, bound the container tests' base cache, and print what is left on one line. Not in an xdist worker: its
    siblings and their children carry the same token; the controller does it once they have all ended."""
    token = os.environ.get(cleanup.SESSION_VAR)
    if not token or cleanup.is_xdist_worker():
        return
    from tests.chains import remove_tree

    processes = cleanup.stop_processes(token)
    home = session.config.stash.get(_SESSION_HOME, None)
    if home is not None:
        remove_tree(home)
    runtimes = cleanup.session_runtimes(token)
    for base in runtimes:
        remove_tree(base)
    base_cache = Path(os.environ.get("HFCACHE_TEST_CACHE", "/var/cache/hfcache-test"))
    cleanup.prune_base_cache(base_cache)
    # pytest has no public way to read the basetemp without creating it (TempPathFactory.getbasetemp makes one).
    basetemp = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)
    left = cleanup.Leftovers(basetemp, cleanup.tree_bytes(basetemp) if basetemp else 0, base_cache,
                             *cleanup.base_cache_bytes(base_cache), tuple(processes), tuple(runtimes))
    session.config.stash[_LEFT] = left
    factory = session.config._tmp_path_factory
    undeleted = (factory._retention_policy == "failed" and factory._given_basetemp is None
                 and left.basetemp_bytes > cleanup.MAX_LEFT_BYTES)
    if (processes or undeleted) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_LEFT = pytest.StashKey["cleanup.Leftovers"]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The line of what the session left (pytest_sessionfinish above measured it; the summary comes after)."""
    left = config.stash.get(_LEFT, None)
    if left is not None:
        terminalreporter.write_line(left.summary())
