"""Where the CLI writes: a command's result on stdout (so `hfcache ls | grep bert` works), progress and diagnostics on
stderr, tables as wide as their content when piped, and a `hint:` line under every usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.helpers import clean_env, run_hfcache
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
#: Longer than rich's 80-column default on its own: a row holding it must not wrap when piped.
LONG_ID = "an-organisation-with-a-rather-long-name/a-repository-name-long-enough-to-wrap-an-eighty-column-table"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("stdout") / "cache"
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse("bert-base-uncased")], cache_dir=cache, endpoint=server.endpoint,
                              token=False)
    assert report.ok, [r.error for r in report.repos]
    return cache


def report_lines(args: list[str], code: int = 0) -> list[str]:
    """Run hfcache with stdout and stderr piped (no COLUMNS): the result is on stdout and stderr stays empty."""
    proc = run_hfcache(args, env=clean_env())
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr  # nothing but the result: no progress, no stray line
    assert proc.stdout.strip(), args
    return proc.stdout.splitlines()


def test_reports_go_to_stdout_and_nothing_else(cache):
    ls = report_lines(["ls", "--cache-dir", str(cache)])
    assert [line for line in ls if "bert-base-uncased" in line]  # `hfcache ls | grep bert`
    verify = report_lines(["verify", "--cache-dir", str(cache)])
    assert verify[-1].startswith("ok: ")
    doctor = report_lines(["doctor", "--cache-dir", str(cache)])
    assert doctor[-1].startswith("ok, ") and "warning(s)" in doctor[-1]
    env = report_lines(["env", "--cache-dir", str(cache)])
    assert "export HF_HUB_OFFLINE=1" in env
    prune = report_lines(["prune", "--cache-dir", str(cache), "--dry-run"])
    # the summary is on stdout whichever it is (what is prunable depends on what ran before in this cache)
    assert any("dry run" in line or line == "nothing to prune" for line in prune), prune


@pytest.mark.slow
def test_check_report_on_stdout_without_wrapping(cache):
    """check: the table on stdout; a repo the cache lacks is named as such (not transformers' message about the
    closed loopback port of the offline child), on one unwrapped row."""
    lines = report_lines(["check", "--cache-dir", str(cache), "bert-base-uncased", LONG_ID], code=1)
    [row] = [line for line in lines if LONG_ID in line]
    assert f"{LONG_ID} is not in the cache" in row
    assert any("bert-base-uncased@main" in line and "ok [" in line for line in lines)
    assert "127.0.0.1" not in "\n".join(lines) and "couldn't connect" not in "\n".join(lines)
    assert lines[-1] == "1 loaded, 1 failed"


def test_tables_keep_their_width_when_piped(cache, tmp_path):
    """A piped table is as wide as its content: the row of a long repo id stays one line, the JSON stays one
    document."""
    long_folder = cache.parent / "long-cache"
    folder = long_folder / ("models--" + LONG_ID.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "snapshots").mkdir()
    (folder / "blobs").mkdir()
    lines = report_lines(["ls", "--cache-dir", str(long_folder)])
    [row] = [line for line in lines if LONG_ID in line]
    assert len(row) > 120 and row.startswith("│")
    proc = run_hfcache(["ls", "--cache-dir", str(long_folder), "--json"])
    assert proc.stderr == "" and json.loads(proc.stdout)["repos"][0]["repo_id"] == LONG_ID


USAGE_ERRORS = [
    # hfcache's own usage errors
    ["warm", "bert-base-uncased", "--lock", "hfcache.lock"],
    ["warm"],
    ["warm", "--locked", "bert-base-uncased"],
    ["warm", "not//valid"],
    ["lock", "bert-base-uncased"],
    ["export", "-", "--format", "dir"],
    ["export", "-", "--format", "tar", "--json"],
    ["export", "out", "--chown", "root"],
    ["prune", "--json"],
    ["serve", "--allow", "google-bert/*"],
    ["exec", "--no-such-option"],
    ["link", "/nonexistent-hfcache-source", "dest"],
    ["link", ".", "./"],
    ["verify", "--lock", "/nonexistent/hfcache.lock"],
    ["warm", "bert-base-uncased", "--token-file", "/nonexistent/token"],
    # click's own parameter errors
    ["no-such-command"],
    ["ls", "--no-such-option"],
    ["ls", "--sort", "colour"],
    ["warm", "bert-base-uncased", "--max-workers", "0"],
    ["prune", "--older-than", "soon", "--dry-run"],
    ["link"],
    ["env", "--format", "xml"],
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=[" ".join(a) for a in USAGE_ERRORS])
def test_every_usage_error_has_a_hint(args, tmp_path):
    proc = run_hfcache(args, env=clean_env(HF_HUB_CACHE=str(tmp_path / "cache")), cwd=tmp_path, input_text="")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("hfcache: error: ") and lines[1].startswith("hint: ") and len(lines) == 2, lines
    assert "Traceback" not in proc.stderr


def test_usage_error_hint_is_in_the_json_document(tmp_path):
    proc = run_hfcache(["ls", "--json", "--sort", "colour"], cwd=tmp_path)
    document = json.loads(proc.stdout)
    assert proc.returncode == 2 and document["exit_code"] == 2 and document["hint"] == "see `hfcache ls --help`"
    proc = run_hfcache(["warm", "bert-base-uncased", "--lock", "x.lock", "--json"], cwd=tmp_path)
    assert json.loads(proc.stdout)["hint"].startswith("add the repos to the manifest")


def test_hfcache_alone_prints_its_help():
    """A newcomer typing `hfcache` gets the command list on stdout, not an error."""
    proc = run_hfcache([])
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("Usage: hfcache") and "warm" in proc.stdout and "error" not in proc.stdout


def test_the_program_exits_without_teardown_but_keeps_what_an_exit_must_do(cache, tmp_path):
    """``hfcache`` skips the interpreter's module teardown (cli.run): exit codes, piped output, atexit handlers and
    non-daemon threads must be as after a normal exit."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "atexit-ran"
    joined = tmp_path / "thread-joined"
    (site / "sitecustomize.py").write_text(
        "import atexit, pathlib, threading, time\n"
        f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('ran'))\n"
        f"threading.Thread(target=lambda: (time.sleep(0.3), pathlib.Path({str(joined)!r}).write_text('j'))).start()\n")
    env = clean_env(PYTHONPATH=f"{site}:{Path(__file__).resolve().parents[2]}")
    proc = run_hfcache(["ls", "--cache-dir", str(cache), "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "bert-base-uncased" in [r["repo_id"] for r in json.loads(proc.stdout)["repos"]]
    assert marker.read_text() == "ran" and joined.read_text() == "j"
    failed = run_hfcache(["verify", "--cache-dir", str(tmp_path / "missing"), "--json"], env=env)
    assert failed.returncode not in (0, 70) and json.loads(failed.stdout)  # an error's exit code and its document


def test_an_output_that_cannot_be_written_ends_the_command_in_one_line(cache, tmp_path):
    """A full disk or a closed stdout: one `hfcache: error:` line, exit 5, no traceback (cli/stdout.py)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "hfcache", "ls", "--cache-dir", str(cache), "--json"]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env())
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.startswith("hfcache: error: cannot write to standard output: No space left on device")
    assert "Traceback" not in proc.stderr
    closed = subprocess.run([sys.executable, "-m", "hfcache", "env"], stderr=subprocess.PIPE, text=True,
                            env=clean_env(), preexec_fn=lambda: os.close(1))
    assert closed.returncode == 5 and "standard output is closed" in closed.stderr, closed.stderr
    assert "Traceback" not in closed.stderr
    # `export -` writes the tar to the binary stdout: the same rules, the error said once.
    export = [sys.executable, "-m", "hfcache", "export", "-", "--cache-dir", str(cache)]
    with open("/dev/full", "wb") as full:
        tar_full = subprocess.run(export, stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env())
    tar_closed = subprocess.run(export, stderr=subprocess.PIPE, text=True, env=clean_env(),
                                preexec_fn=lambda: os.close(1))
    for proc in (tar_full, tar_closed):
        assert proc.returncode == 5, proc.stderr
        assert proc.stderr.count("hfcache: error: cannot write to standard output") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    piped = subprocess.Popen(export, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=clean_env())
    assert piped.stdout.read(512)
    piped.stdout.close()
    assert piped.wait(timeout=60) == 141


def test_a_reader_that_goes_away_ends_the_command_with_141(tmp_path):
    """`hfcache ls --json | head -c 100`: exit 141, as a shell reports for SIGPIPE, not 1 ("a check failed")."""
    import subprocess
    import sys

    from tests.helpers import many_repos_cache

    big = many_repos_cache(tmp_path, 1500)
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "ls", "--cache-dir", str(big), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""


def test_sigterm_ends_the_command_even_when_its_reader_does_not_read(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import many_repos_cache

    big = many_repos_cache(tmp_path, 3000)
    reader = subprocess.Popen(["sleep", "120"], stdin=subprocess.PIPE)  # never reads: the pipe fills up
    try:
        proc = subprocess.Popen([sys.executable, "-m", "hfcache", "ls", "--cache-dir", str(big), "--json"],
                                stdout=reader.stdin, stderr=subprocess.PIPE, env=clean_env())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "pipe_write" not in Path(f"/proc/{proc.pid}/wchan").read_text():
            time.sleep(0.05)  # until it blocks writing to the full pipe
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143  # not held until the reader drains the pipe (120 s)
        assert b"Traceback" not in proc.stderr.read()
        # ...without O_NONBLOCK: that flag belongs to the pipe's open file description, shared with the pipeline.
        assert os.get_blocking(reader.stdin.fileno())
    finally:
        reader.kill()
        reader.wait()
