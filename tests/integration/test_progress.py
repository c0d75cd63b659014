"""Progress that tells the truth (docs/cli.md "Where output goes").

- a resumed repo's bar starts at the bytes already on disk, not at 0 for the whole run (a real pty: the bars are
  only drawn on a terminal);
- ``push``/``pull`` with stderr to a log file write no progress bar into it (and on a pty they still draw one);
- an interrupted warm prints the summary of what finished (``ok``) and what did not (``interrupted``), exit 130.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.registry import available, running_registry
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
SMALL, LARGE = "google-bert/bert-base-chinese", "openai-community/gpt2"  # ~0.4 MiB and 2.7 MiB of tokenizer files
#: What only a drawn progress bar writes: rich's bar characters and a carriage return (cursor back to redraw).
BAR_MARKS = ("\u2501", "\u2578", "\u257a", "\r", "\x1b[")
MIB = re.compile(rb"(\d+\.\d)/(\d+\.\d) MiB")


def _hfcache(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "hfcache", *args]


def run_on_pty(args: list[str], *, env: dict[str, str], timeout: float = 60) -> tuple[int, bytes, bytes]:
    """Run hfcache with stderr (and stdin) on a real pseudo-terminal, stdout on a pipe: (exit code, stdout, what
    the terminal received)."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(_hfcache(args), stdin=secondary, stdout=subprocess.PIPE, stderr=secondary, env=env)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read()
        code = proc.wait(timeout=10)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    return code, out, seen


def terminal_env() -> dict[str, str]:
    env = clean_env(COLUMNS="160", TERM="xterm")
    env.pop("NO_COLOR", None)
    return env


#: The warm bar moves with the bytes because hfcache/warming/repo_job.py reports the files it starts while a repo's
#: configs are read (``_describe_and_read``: ``_ensure_blob(..., True)``), and render/warm.py's WarmProgress keeps
#: bytes reported before a repo's bar exists.


def test_resumed_repo_starts_at_the_bytes_already_on_disk(tmp_path):
    """A warm stopped half way keeps its partial files; the next warm's bar starts at what they hold (and moves),
    where it used to show ``0.0/2.7 MiB`` until the very end."""
    cache, canary = tmp_path / "cache", Canary(tmp_path)
    with HubServer(HUB, throttle_bps=150_000) as server:
        args = ["warm", LARGE, "--cache-dir", str(cache), "--endpoint", server.endpoint]
        first = subprocess.Popen(_hfcache([*args, "-q"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=clean_env())
        deadline = time.monotonic() + 20
        kept = 0
        while kept < 1_200_000 and time.monotonic() < deadline:
            time.sleep(0.05)
            kept = sum(p.stat().st_size for p in cache.rglob("*.incomplete"))
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=20) == 130, first.stderr.read()
        kept = sum(p.stat().st_size for p in cache.rglob("*.incomplete"))
        assert kept >= 1_000_000, "the first warm did not get far enough"
        code, out, seen = run_on_pty(args, env=terminal_env())
    assert code == 0, seen[-2000:]
    shown = [(float(a), float(b)) for a, b in MIB.findall(seen) if float(b) >= 2.5]
    assert shown, seen[-2000:]
    # The first frame that shows the repo's size already counts every kept byte (it used to show 0.0 to the end,
    # then only the files whose download had started: 0.4 of 1.2 MiB kept): RepoJob._precount_kept counts the
    # leftovers of the files still waiting for a connection when the bar is added.
    assert shown[0][0] >= kept / 2**20 - 0.1, (kept, shown[:5])
    assert b"ok" in out and b"Traceback" not in seen
    verified = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    canary.assert_unchanged()


def test_progress_moves_while_a_repo_downloads(tmp_path):
    """The bar of a repo whose files are fetched while its configs are read moves with the bytes; it used to sit
    at 0.0 until every file was in and then jump to the end."""
    cache = tmp_path / "cache"
    with HubServer(HUB, throttle_bps=400_000) as server:
        code, out, seen = run_on_pty(["warm", LARGE, "--cache-dir", str(cache), "--endpoint", server.endpoint],
                                     env=terminal_env())
    assert code == 0, seen[-2000:]
    done = {float(a) for a, b in MIB.findall(seen) if float(b) >= 2.5}
    assert len([d for d in done if 0.0 < d < 2.5]) >= 3, sorted(done)  # intermediate values were shown


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("progress-src") / "cache"
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(SMALL)], cache_dir=root, endpoint=server.endpoint, token=False)
    assert report.ok
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if available() is not None and not os.environ.get("CI"):
        pytest.skip(str(available()))
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


def test_push_and_pull_write_no_progress_bar_into_a_log_file(warmed, registry, tmp_path):
    """stderr to a file (a CI log, `2>push.log`): only the lines a log should have; before, rich printed every
    blob's final bar there (docs/cli.md: progress only on a terminal)."""
    canary = Canary(tmp_path)
    ref = f"{registry.host}/progress/log:v1"
    log = tmp_path / "push.log"
    with log.open("w") as err:
        push = subprocess.run(_hfcache(["push", ref, "--cache-dir", str(warmed), "--plain-http"]), stderr=err,
                              stdout=subprocess.PIPE, text=True, env=clean_env(), timeout=120)
    text = log.read_text()
    assert push.returncode == 0, text
    assert push.stdout.startswith(f"{ref}@sha256:") and push.stdout.count("\n") == 1
    assert text.splitlines() == [line for line in text.splitlines() if line.startswith("pushed ")], text
    assert not any(mark in text for mark in BAR_MARKS), repr(text)
    target, log = tmp_path / "target", tmp_path / "pull.log"
    with log.open("w") as err:
        pull = subprocess.run(_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http"]), stderr=err,
                              stdout=subprocess.PIPE, text=True, env=clean_env(), timeout=120)
    assert pull.returncode == 0, log.read_text()
    assert log.read_text() == "", repr(log.read_text())  # pull's result is on stdout; nothing else to log
    assert pull.stdout.startswith(f"pulled {ref} ") and not any(m in pull.stdout for m in BAR_MARKS)
    verified = run_hfcache(["verify", "--cache-dir", str(target)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    canary.assert_unchanged()


def test_pull_on_a_terminal_still_draws_its_bars(warmed, registry, tmp_path):
    """The other side of the rule: on a terminal the bars are drawn (and cleared: the result line stays)."""
    ref = f"{registry.host}/progress/tty:v1"
    assert run_hfcache(["push", ref, "--cache-dir", str(warmed), "--plain-http"]).returncode == 0
    code, out, seen = run_on_pty(["pull", ref, "--cache-dir", str(tmp_path / "target"), "--plain-http"],
                                 env=terminal_env())
    assert code == 0, seen[-2000:]
    assert "\u2501".encode() in seen and b"\r" in seen, seen[-2000:]
    assert out.startswith(f"pulled {ref} ".encode())


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_interrupted_warm_prints_what_finished_and_what_did_not(tmp_path, as_json):
    """Ctrl-C after the first repo finished: the summary lists it as ok and the other as interrupted, then the one
    "interrupted" error line, exit 130; the cache holds the finished repo and verifies."""
    cache, canary = tmp_path / "cache", Canary(tmp_path)
    with HubServer(HUB, throttle_bps=100_000) as server:
        args = ["warm", SMALL, LARGE, "--cache-dir", str(cache), "--endpoint", server.endpoint]
        proc = subprocess.Popen(_hfcache([*args, *(["--json"] if as_json else [])]), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=clean_env())
        ref = cache / "models--google-bert--bert-base-chinese" / "refs" / "main"
        deadline = time.monotonic() + 20
        while not ref.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ref.exists(), "the small repo did not finish"
        time.sleep(0.3)  # its result reaches the report (after publishing)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-2:] == [lines[-2], lines[-1]] and lines[-2] == "hfcache: error: interrupted", err
    assert lines[-1].startswith("hint: ")
    if as_json:
        report = json.loads(out)
        rows = {r["repo_id"]: r for r in report["repos"]}
        assert rows[SMALL]["ok"] and rows[SMALL]["files"]
        assert rows[LARGE]["error_type"] == "Interrupted" and rows[LARGE]["exit_code"] == 130
        assert report["exit_code"] == 130 and not report["ok"]
    else:
        rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("\u2502")}
        assert rows[SMALL].split("\u2502")[-2].strip() == "ok", out
        assert rows[LARGE].split("\u2502")[-2].strip() == "interrupted", out
        assert "1 ok, 0 failed, 1 interrupted;" in out
        assert sum(line.startswith("hfcache: error:") for line in lines) == 1, err  # no error line per repo
    verified = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    canary.assert_unchanged()


def test_interrupted_warm_lock_lists_the_repos_the_cache_already_held(tmp_path):
    """``warm --lock`` stopped after one repo: the repo the cache already satisfied (never started, so no progress
    event) is ok, not interrupted; the finished one ok; the one downloading interrupted; exit 130."""
    held, canary = "distilbert/distilbert-base-uncased", Canary(tmp_path)
    cache = tmp_path / "cache"
    with HubServer(HUB) as fast:
        assert run_hfcache(["warm", held, "--cache-dir", str(cache), "--endpoint", fast.endpoint]).returncode == 0
    with HubServer(HUB, throttle_bps=100_000) as server:
        (tmp_path / "hfcache.toml").write_text(
            f'endpoint = "{server.endpoint}"\ncache_dir = "cache"\n'
            + "".join(f'\n[[repos]]\nrepo_id = "{r}"\n' for r in (held, SMALL, LARGE)))
        locked = run_hfcache(["lock"], cwd=tmp_path)
        assert locked.returncode == 0, locked.stderr
        proc = subprocess.Popen(_hfcache(["warm", "--lock", "hfcache.lock"]), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path)
        ref = cache / "models--google-bert--bert-base-chinese" / "refs" / "main"
        deadline = time.monotonic() + 20
        while not ref.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ref.exists(), "the small repo did not finish"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-2] == "hfcache: error: interrupted", err
    rows = {line.split()[1]: line.split("\u2502")[-2].strip() for line in out.splitlines()
            if line.startswith("\u2502")}
    assert rows == {held: "ok", SMALL: "ok", LARGE: "interrupted"}, out
    assert "2 ok, 0 failed, 1 interrupted;" in out
    verified = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    canary.assert_unchanged()

