"""hfcache env: every alias (hfcache/offline/aliases.py) in every format, parsed back by its consumer, carries
exactly its canonical variable's value; the JSON keys of before stay; a cache path that readers would expand
differently is refused.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hfcache.errors import UsageError
from hfcache.offline.aliases import ALIASES, aliases_of, with_aliases
from hfcache.offline.env import FORMATS, OfflineEnv, format_env, offline_environment
from tests.canary import Canary
from tests.helpers import clean_env

HUB_CACHE = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
#: Every variable `hfcache env` printed before aliases were added: their keys must stay (JSON, k8s, ...).
BEFORE = ["HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
          "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_IMPLICIT_TOKEN"]


def _env_cli(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hfcache", "env", *args], capture_output=True, text=True,
                          env=clean_env(HOME=str(tmp_path / "home"), **extra), timeout=60)


def _bash(script: str, tmp_path: Path, dotenv: bool) -> dict[str, str]:
    path = tmp_path / "vars.txt"
    path.write_text(script, encoding="utf-8")
    source = f"set -a; . {path}" if dotenv else f". {path}"
    out = subprocess.run(["env", "-i", "/bin/bash", "--norc", "--noprofile", "-c", f"{source}; env -0"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if item)


def _dockerfile(text: str) -> dict[str, str]:
    """The one ENV instruction's ``NAME="VALUE"`` words, unescaped as Docker's word processing does."""
    body = " ".join(line.removesuffix(" \\").strip() for line in text.splitlines() if not line.startswith("#"))
    assert body.startswith("ENV "), body
    return {m[1]: re.sub(r"\\(.)", r"\1", m[2]) for m in re.finditer(r'([A-Z_]+)="((?:[^"\\]|\\.)*)"', body)}


PARSERS = {
    "sh": lambda text, tmp: _bash(text, tmp, dotenv=False),
    "dotenv": lambda text, tmp: _bash(text, tmp, dotenv=True),
    "dockerfile": lambda text, _: _dockerfile(text),
    "k8s": lambda text, _: {e["name"]: e["value"] for e in yaml.safe_load(text)["env"]},
    "json": lambda text, _: json.loads(text),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("alias", ALIASES, ids=lambda a: a.name)
def test_every_alias_is_printed_with_its_canonical_value_in_every_format(tmp_path, alias, fmt):
    canary = Canary(tmp_path)
    cache = tmp_path / "my cache" / "it's \"q\" é" / "hub"  # quoting in every format, and HF_HOME set
    proc = _env_cli(tmp_path, "--cache-dir", str(cache), "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    parsed = PARSERS[fmt](proc.stdout, tmp_path)
    assert parsed[alias.canonical] == parsed[alias.name]
    assert parsed[alias.name] == (str(cache) if alias.canonical == "HF_HUB_CACHE" else "1")
    assert set(BEFORE) <= set(parsed)  # nothing printed before is gone
    canary.assert_unchanged()


def test_aliases_follow_their_canonical_variable_and_json_stays_one_flat_object(tmp_path):
    proc = _env_cli(tmp_path, "--cache-dir", str(tmp_path / "c"), "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert all(isinstance(v, str) for v in document.values())  # still an environment: os.environ.update works
    names = list(document)
    for alias in ALIASES:
        group = [alias.canonical, *[a.name for a in aliases_of(alias.canonical)]]
        start = names.index(alias.canonical)
        assert names[start:start + len(group)] == group
    env = offline_environment(tmp_path / "c")
    assert env.aliases == {a.name: a.canonical for a in ALIASES}
    assert env.as_dict() == document


def test_the_header_names_the_aliases_and_never_a_value(tmp_path):
    cache = tmp_path / "unique-path-marker"
    for fmt in ("sh", "dotenv", "dockerfile", "k8s"):
        proc = _env_cli(tmp_path, "--cache-dir", str(cache), "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        comments = [line for line in proc.stdout.splitlines() if line.lstrip().startswith("#")]
        notes = comments[2:]
        assert any(line.startswith("# HUGGINGFACE_HUB_CACHE, SENTENCE_TRANSFORMERS_HOME: aliases of HF_HUB_CACHE")
                   for line in notes), notes
        assert any("LLAMA_OFFLINE" in line and "HF_HUB_OFFLINE" in line for line in notes), notes
        assert any(line.startswith("# No HF_HOME") for line in notes), notes  # the cache is not named hub
        assert not any("unique-path-marker" in line for line in notes), notes


def test_an_alias_value_goes_through_the_inert_check():
    env = offline_environment("/opt/hf-cache")
    hostile = OfflineEnv(cache_dir=env.cache_dir, variables=tuple(
        (name, "/opt/x\u2028securityContext: {privileged: true}" if name == "HUGGINGFACE_HUB_CACHE" else value)
        for name, value in env.variables))
    for fmt in FORMATS:
        with pytest.raises(UsageError, match=r"^HUGGINGFACE_HUB_CACHE would be /opt/x\\u2028securityContext"):
            format_env(hostile, fmt)


def test_with_aliases_refuses_an_alias_given_as_a_variable():
    with pytest.raises(ValueError, match="HUGGINGFACE_HUB_CACHE is an alias"):
        with_aliases([("HF_HUB_CACHE", "/a"), ("HUGGINGFACE_HUB_CACHE", "/b")])


@pytest.mark.parametrize("cache", ["/x/$HOME/hub", "/x/${HOME}/hub", "/srv/$cache_1/c"])
def test_a_cache_path_that_huggingface_hub_expands_is_refused(tmp_path, cache):
    canary = Canary(tmp_path)
    # Why: huggingface_hub reads this HF_HUB_CACHE as another folder than the one every raw reader uses.
    probe = subprocess.run([sys.executable, "-c", HUB_CACHE],
                           capture_output=True, text=True, timeout=60, check=True,
                           env=clean_env(HF_HUB_CACHE=cache, HOME="/home/someone", cache_1="elsewhere"))
    assert probe.stdout.strip() != cache
    proc = _env_cli(tmp_path, "--cache-dir", cache, cache_1="elsewhere")
    assert proc.returncode == 2 and proc.stdout == ""
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"hfcache: error: cache path {cache} contains $"), proc.stderr
    assert "huggingface_hub expands" in first and "Traceback" not in proc.stderr
    canary.assert_unchanged()


def test_a_dollar_that_is_not_expanded_is_kept(tmp_path):
    cache = tmp_path / "price$" / "a$-b"
    env = offline_environment(cache).as_dict()
    assert env["HUGGINGFACE_HUB_CACHE"] == env["HF_HUB_CACHE"] == str(cache)
    probe = subprocess.run([sys.executable, "-c", HUB_CACHE],
                           capture_output=True, text=True, timeout=60, check=True,
                           env=clean_env(HF_HUB_CACHE=str(cache)))
    assert probe.stdout.strip() == str(cache)


def test_the_offline_flags_keep_their_old_order():
    names = [name for name, _ in offline_environment("/opt/c").variables]
    assert names[names.index("HF_HUB_OFFLINE"):] == [
        "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "LLAMA_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_IMPLICIT_TOKEN"]
