"""One rule for a ``--cache-dir`` that is an HF_HOME or no cache at all, in every command: exit 5,
one line naming what the folder looks like and the cache meant, the hint passing that cache; ``doctor`` gives the
same line as an error finding for an effective cache (HF_HUB_CACHE) that is an HF_HOME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import clean_env, one_error_line, run_hfcache, warm

COMMANDS = [["ls"], ["verify"], ["prune", "--dry-run"], ["warm", "openai-community/gpt2"], ["env"],
            ["exec", "--", "true"], ["doctor"], ["path", "openai-community/gpt2"], ["check", "openai-community/gpt2"]]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    warm(home / "hub", "openai-community/gpt2")
    (home / "token").write_text("hf_not_a_real_token\n")
    return home


def _with_cache_dir(args: list[str], cache_dir: Path) -> list[str]:
    at = args.index("--") if "--" in args else len(args)
    return [*args[:at], "--cache-dir", str(cache_dir), *args[at:]]


@pytest.mark.parametrize("args", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_an_hf_home_as_cache_dir_is_refused_naming_its_hub(hf_home, args, tmp_path):
    proc = run_hfcache(_with_cache_dir(args, hf_home), env=clean_env(HOME=str(tmp_path)))
    line = one_error_line(proc, 5, f"{hf_home} is not a hub cache (an HF_HOME); did you mean {hf_home}/hub "
                                   "(it holds 1 repo)?")
    assert f"hint: pass --cache-dir {hf_home}/hub" in proc.stderr, proc.stderr
    assert "export" not in proc.stdout and "HF_HUB_CACHE" not in proc.stdout, (line, proc.stdout)
    assert not [p for p in hf_home.iterdir() if p.name.startswith(("models--", ".locks", "CACHEDIR"))]


@pytest.mark.parametrize("args", [["env"], ["exec", "--", "true"], ["doctor"], ["path", "openai-community/gpt2"]],
                         ids=["env", "exec", "doctor", "path"])
def test_a_folder_of_other_things_is_no_cache_for_the_commands_that_hand_one_on(args, tmp_path):
    other = tmp_path / "project"
    other.mkdir()
    (other / "README.md").write_text("not a cache\n")
    proc = run_hfcache(_with_cache_dir(args, other), env=clean_env(HOME=str(tmp_path)))
    one_error_line(proc, 5, f"{other} is not a hub cache: it holds no models--*")


def test_doctor_calls_an_effective_hf_home_cache_an_error_with_the_same_words(hf_home, tmp_path):
    proc = run_hfcache(["doctor", "--json"], env=clean_env(HF_HUB_CACHE=str(hf_home), HOME=str(tmp_path)))
    assert proc.returncode == 1, proc.stderr
    finding = next(f for f in json.loads(proc.stdout)["findings"] if f["code"] == "cache.not_a_cache")
    assert finding["severity"] == "error" and f"did you mean {hf_home}/hub" in finding["message"], finding
    assert finding["fix"] == f"pass --cache-dir {hf_home}/hub"
    assert not any(f["code"] == "cache.empty" for f in json.loads(proc.stdout)["findings"])
