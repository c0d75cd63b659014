"""Hostile locks, manifests and cache paths, and env output: a lock's canonical id naming another repo, cache
folders and revisions the OS cannot hold, `warm --lock`'s time in the number of files, astral characters in k8s.

Each test builds the hostile manifest or lock itself and runs the real command: exit 2 and one line naming the file
and entry (never a traceback or exit 70). The linear time of ``warm --lock`` is measured at the end (``-m slow``:
a ratio of wall times needs a quiet machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hfcache.errors import UsageError
from hfcache.warming.lockfile import read_lock
from tests.helpers import clean_env, run_hfcache

COMMIT = "c" * 40
HASH = "git-sha1:" + "b" * 40
NO_ENDPOINT = "http://127.0.0.1:9"  # nothing listens: a command that got past reading the lock fails otherwise


def _lock(repo_id: str, canonical_id: str | None, *, revision: str = "main", absent: str = "",
          files: str = f'[{{path = "tokenizer.json", size = 1, hash = "{HASH}"}}]') -> str:
    canonical = "" if canonical_id is None else f'canonical_id = "{canonical_id}"\n'
    return (f'version = 1\n[[repos]]\nrepo_id = "{repo_id}"\nrevision = "{revision}"\n{canonical}'
            f'commit_hash = "{COMMIT}"\n{absent}files = {files}\n')


def _project(tmp_path: Path, lock: str, manifest: str | None = None, repo_id: str = "org/x") -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "hfcache.toml").write_text(manifest or f'[[repos]]\nrepo_id = "{repo_id}"\n')
    (folder / "hfcache.lock").write_text(lock)
    return folder


def _run(folder: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(HF_HUB_CACHE=str(tmp_path / "cache"), HF_ENDPOINT=NO_ENDPOINT, HOME=str(tmp_path))
    return run_hfcache(list(args), env=env, cwd=folder, timeout=60)


def _refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The one error line of a refused command (exit 2, no traceback), checked to hold every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hfcache: error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# --------------------------------------------------------------------------------------------------- canonical_id


LOCK_COMMANDS = [
    ("warm", "--lock", "hfcache.lock", "--locked"),
    ("warm", "--lock", "hfcache.lock"),
    ("verify", "--lock", "hfcache.lock"),
    ("ls", "--lock", "hfcache.lock"),
    ("check", "--lock", "hfcache.lock"),
    ("exec", "--lock", "hfcache.lock", "--", "true"),
    ("push", "--lock", "hfcache.lock", "localhost:9/x:y"),
]


@pytest.mark.parametrize("args", LOCK_COMMANDS, ids=lambda a: " ".join(a[:2] + a[3:4]))
def test_lock_canonical_id_of_another_repo_is_refused_everywhere(tmp_path, args):
    """An org/name entry whose canonical_id names another repo (the attacker's commit and hashes) would put
    that repo's files under the requested repo's folder; every --lock command refuses the lock as it reads it."""
    folder = _project(tmp_path, _lock("google-bert/bert-base-uncased", "attacker/bert-base-uncased"),
                      repo_id="google-bert/bert-base-uncased")
    (tmp_path / "cache").mkdir()  # commands that only read a cache get as far as the lock
    _refused(_run(folder, tmp_path, *args), "hfcache.lock: repos[0] (google-bert/bert-base-uncased)",
             "'canonical_id' is 'attacker/bert-base-uncased'")
    assert not (tmp_path / "cache" / "models--google-bert--bert-base-uncased").exists()


@pytest.mark.parametrize("repo_id,canonical_id,ok", [
    ("google-bert/bert-base-uncased", "google-bert/bert-base-uncased", True),
    ("google-bert/bert-base-uncased", None, True),  # none: the requested id
    ("bert-base-uncased", "bert-base-uncased", True),
    ("bert-base-uncased", "google-bert/bert-base-uncased", True),  # the Hub's rename of a legacy id
    ("bert-base-uncased", "google-bert/gpt2", False),
    ("bert-base-uncased", "gpt2", False),
    ("org/x", "org/y", False),
    ("org/x", "x", False),
])
def test_canonical_id_rule_is_folder_ids(tmp_path, repo_id, canonical_id, ok):
    path = tmp_path / "hfcache.lock"
    path.write_text(_lock(repo_id, canonical_id))
    if ok:
        assert read_lock(path).repos[0].canonical_id == (canonical_id or repo_id)
    else:
        with pytest.raises(UsageError, match=r"repos\[0\] .*'canonical_id' is .*another repo"):
            read_lock(path)


# -------------------------------------------------------------------- names the OS cannot hold (was exit 70)


@pytest.mark.parametrize("cache_dir,needle", [
    ('"/tmp/a\\u0000b"', "holds a NUL byte"),
    ('"~nosuchuser-hfcache/x"', "'~nosuchuser-hfcache' names no home directory"),
    (f'"/tmp/{"a" * 300}"', "a path component is 300 bytes long"),
    ('"/tmp/' + "a/" * 2100 + '"', "bytes long (the limit is 4095)"),
], ids=["nul", "tilde-user", "long-component", "long-path"])
@pytest.mark.parametrize("args", [("exec", "--lock", "hfcache.lock", "--", "true"), ("ls", "--lock", "hfcache.lock"),
                                  ("warm", "--lock", "hfcache.lock")], ids=lambda a: a[0])
def test_manifest_cache_dir_the_os_cannot_hold(tmp_path, cache_dir, needle, args):
    folder = _project(tmp_path, _lock("org/x", "org/x"), f'cache_dir = {cache_dir}\n[[repos]]\nrepo_id = "org/x"\n')
    _refused(_run(folder, tmp_path, *args), "hfcache.toml: field 'cache_dir'", needle)


@pytest.mark.parametrize("cache_dir,needle", [
    ("~nosuchuser-hfcache/x", "names no home directory"),
    (f"/tmp/{'a' * 300}", "a path component is 300 bytes long"),
], ids=["tilde-user", "long-component"])
@pytest.mark.parametrize("command", ["ls", "warm", "env", "verify"])
def test_command_line_cache_dir_the_os_cannot_hold(tmp_path, cache_dir, needle, command):
    args = [command, "--cache-dir", cache_dir] + (["org/x"] if command == "warm" else [])
    _refused(_run(tmp_path, tmp_path, *args), "the cache directory", needle)


def test_revision_too_long(tmp_path):
    """A 70,000-character revision once reached the HTTP client (InvalidURL: exit 70)."""
    folder = _project(tmp_path, "", f'[[repos]]\nrepo_id = "org/x"\nrevision = "{"r" * 70000}"\n')
    (folder / "hfcache.lock").unlink()
    _refused(_run(folder, tmp_path, "lock", "--timeout", "1", "--retries", "0"),
             "repos[0] (org/x): field 'revision' is 70000 characters long (at most 255)")


@pytest.mark.parametrize("field", ["absent", "files"])
@pytest.mark.parametrize("args", [("exec", "--lock", "hfcache.lock", "--", "true"), ("warm", "--lock", "hfcache.lock")],
                         ids=lambda a: a[0])
def test_lock_name_too_long(tmp_path, field, args):
    long = "b" * 300
    lock = (_lock("org/x", "org/x", absent=f'absent = ["{long}"]\n') if field == "absent" else
            _lock("org/x", "org/x", files=f'[{{path = "d/{long}", size = 1, hash = "{HASH}"}}]'))
    folder = _project(tmp_path, lock)
    marker = tmp_path / "cache" / "models--org--x"
    (marker / ".no_exist" / COMMIT).mkdir(parents=True)
    (marker / "refs").mkdir()
    (marker / "refs" / "main").write_text(COMMIT)
    line = _refused(_run(folder, tmp_path, *args), "hfcache.lock: repos[0] (org/x)", "bbbbbbbb")
    assert len(line) < 400


# --------------------------------------------------------------------------------------------------- linear lock


def _timed_warm(tmp_path: Path, n: int) -> float:
    folder = tmp_path / f"n{n}"
    folder.mkdir()
    files = ", ".join(f'{{path = "f{i}", size = 1, hash = "{HASH}"}}' for i in range(n))
    (folder / "hfcache.lock").write_text(_lock("org/x", "org/x", files=f"[{files}]"))
    env = clean_env(HF_HUB_CACHE=str(folder / "cache"), HF_ENDPOINT=NO_ENDPOINT, HOME=str(tmp_path))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hfcache", "warm", "--lock", "hfcache.lock", "--retries", "0",
                           "--timeout", "1"], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return elapsed


@pytest.mark.slow
@pytest.mark.timing
def test_warm_lock_is_not_quadratic_in_files(tmp_path):
    """4x the files must cost about 4x the time before the first request, not 16x (was 5k 1.8 s, 20k 34 s).
    The run of a one-file lock is the fixed cost (start-up, imports), taken off both."""
    base = min(_timed_warm(tmp_path, 1), _timed_warm(tmp_path, 2))
    small, large = _timed_warm(tmp_path, 4000), _timed_warm(tmp_path, 16000)
    ratio = (large - base) / max(small - base, 0.05)
    assert ratio < 8, (base, small, large, ratio)


# --------------------------------------------------------------------------------------------------- k8s


@pytest.mark.parametrize("piece", ["\U0001F600", "\U00010348", "é\u3000", 'q"b\\s'])
def test_k8s_env_astral_characters_parse_back(tmp_path, piece):
    """A non-BMP character was written as a JSON surrogate pair, which YAML reads as two lone surrogates."""
    cache = tmp_path / f"emoji{piece}" / "hub"
    cache.mkdir(parents=True)
    proc = run_hfcache(["env", "--cache-dir", str(cache), "--format", "k8s"], env=clean_env(HOME=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    values = {e["name"]: e["value"] for e in yaml.safe_load(proc.stdout)["env"]}
    assert values["HF_HUB_CACHE"] == str(cache)
    assert values["HF_HOME"] == os.fspath(cache.parent)
    assert "\\ud83d" not in proc.stdout


def test_a_command_line_revision_too_long_is_exit_2_and_creates_nothing(tmp_path):
    """``warm REPO@<70,000 characters>`` was an httpx ``InvalidURL`` (exit 70): a revision is a file name under
    ``refs/``, so more than 255 bytes is refused where the request is built (``records.WarmRequest``)."""
    cache = tmp_path / "cache"
    for revision in ("a" * 70_000, "é" * 128):
        proc = run_hfcache(["warm", f"gpt2@{revision}", "--cache-dir", str(cache)])
        assert proc.returncode == 2, proc.stderr
        assert "longer than 255 bytes" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 2
    assert not cache.exists()
    assert run_hfcache(["warm", f"gpt2@{'a' * 255}", "--cache-dir", str(cache), "--endpoint",
                        "http://127.0.0.1:9"]).returncode != 2  # the limit itself is accepted (then unreachable)


@pytest.mark.parametrize("where", ["manifest", "command line"])
def test_a_glob_fnmatch_would_spend_hours_on_is_refused_at_once(tmp_path, where):
    """fnmatch's cost grows with the square of a pattern: a manifest include of 1,000,000 '[' kept `lock` busy for
    hours (one argument holds at most 128 KiB, so the command line gets 100,000). Globs are bounded where a request
    is built (``records.WarmRequest``)."""
    glob = "[" * 1_000_000
    started = time.monotonic()
    if where == "manifest":
        manifest = f'[[repos]]\nrepo_id = "org/x"\ninclude = ["{glob}"]\n'
        proc = _run(_project(tmp_path, _lock("org/x", None), manifest), tmp_path, "lock")
    else:
        proc = run_hfcache(["warm", "gpt2", "--include", glob[:100_000], "--cache-dir", str(tmp_path / "c"),
                            "--endpoint", NO_ENDPOINT])
    assert time.monotonic() - started < 20
    assert proc.returncode == 2 and "at most 256 characters" in proc.stderr, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "c").exists()
