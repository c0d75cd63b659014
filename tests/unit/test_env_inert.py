"""What ``hfcache env`` writes is inert in every format.

A line break in ``TMPDIR`` (which becomes ``HF_MODULES_CACHE`` when the default modules cache cannot be written)
used to add lines to ``--format dotenv`` (``docker run --env-file`` then read an injected ``LD_PRELOAD=``) and raw
instructions to ``--format dockerfile``; a U+2028 in ``--cache-dir`` added ``securityContext: {privileged: true}``
to ``--format k8s`` through its comment header (YAML breaks lines at U+0085, U+2028 and U+2029). Each test builds
the hostile value, runs the real ``hfcache env`` in a subprocess and checks the exit code and the one-line error;
the outputs that are accepted are parsed back by their consumer (bash, PyYAML, json, and strict parsers for dotenv
and Dockerfile that refuse any line they do not expect) and yield exactly the expected variables.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hfcache.errors import UsageError
from hfcache.offline.env import FORMATS, OFFLINE_FLAGS, check_inert, format_env, offline_environment
from tests.canary import Canary
from tests.helpers import clean_env

#: str.splitlines()'s line breaks: every one a consumer (YAML, a shell, docker) may take as a new line.
BREAKS = ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
PAYLOAD = "LD_PRELOAD=/tmp/evil.so"
K8S_PAYLOAD = "securityContext: {privileged: true}"


def _env(args: list, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hfcache", "env", *args], capture_output=True, text=True,
                          env=clean_env(**extra), timeout=60, errors="surrogateescape")


def _modules_setup(tmp_path: Path, tmpdir_name: str) -> dict[str, str]:
    """An environment whose default modules cache cannot be written (HF_HOME below a file), so env sets
    HF_MODULES_CACHE in ``TMPDIR`` = ``tmp_path/<tmpdir_name>`` (created)."""
    (tmp_path / "file").write_text("")
    tmpdir = tmp_path / tmpdir_name
    tmpdir.mkdir(parents=True)
    return {"HF_HOME": str(tmp_path / "file" / "home"), "TMPDIR": str(tmpdir)}


def _assert_refused(proc: subprocess.CompletedProcess[str], start: str, char: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == "", proc.stdout
    lines = proc.stderr.splitlines()  # splits at every kind of line break: a raw one would add a line
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert lines[0].startswith(f"hfcache: error: {start}"), lines
    assert f"U+{ord(char):04X}" in lines[0] or "contains a line break" in lines[0], lines


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("char", BREAKS, ids=[f"U+{ord(c):04X}" for c in BREAKS])
def test_a_line_break_in_tmpdir_is_refused_in_every_format(tmp_path, fmt, char):
    canary = Canary(tmp_path)
    extra = _modules_setup(tmp_path, f"t{char}{PAYLOAD}")
    proc = _env(["--cache-dir", str(tmp_path / "cache"), "--format", fmt], **extra)
    _assert_refused(proc, "HF_MODULES_CACHE (from TMPDIR) would be ", char)
    assert f"which holds a line break (U+{ord(char):04X})" in proc.stderr
    canary.assert_unchanged()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("char", BREAKS, ids=[f"U+{ord(c):04X}" for c in BREAKS])
def test_a_line_break_in_cache_dir_is_refused_in_every_format(tmp_path, fmt, char):
    canary = Canary(tmp_path)
    cache = f"{tmp_path}/c{char}{K8S_PAYLOAD}"
    proc = _env(["--cache-dir", cache, "--format", fmt])
    start = "cache path " if char in "\n\r" else "HF_HUB_CACHE would be "
    _assert_refused(proc, start, char)
    assert not os.path.lexists(cache)
    canary.assert_unchanged()


@pytest.mark.parametrize("text, name", [("\x1b[1;32mok\x1b[0m", "ESC"), ("\u202eevil", "bidi override"),
                                         ("a\x7fb", "DEL"), ("a\u200bb", "zero width space"), ("a\tb", "tab")])
def test_other_control_and_invisible_characters_are_refused(tmp_path, text, name):
    proc = _env(["--cache-dir", f"{tmp_path}/{text}", "--format", "k8s"])
    assert proc.returncode == 2 and proc.stdout == "", (name, proc.stderr)
    assert "holds a control or invisible character" in proc.stderr.splitlines()[0], (name, proc.stderr)
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr


def test_a_path_that_is_not_utf8_is_refused_not_an_internal_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hfcache", "env", "--cache-dir", os.fsencode(tmp_path) + b"/x\xff"],
                          capture_output=True, env=clean_env(), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0].endswith(b"which holds a byte that is not UTF-8 (U+DCFF): no output format "
                                                b"can carry it safely"), proc.stderr


# ---------------------------------------------------------------------------------------------------- accepted


def _strict_dotenv(text: str) -> dict[str, str]:
    """``docker run --env-file`` / compose lines: comments or NAME=VALUE, nothing else; values unquoted as sh."""
    found = {}
    for line in text.split("\n")[:-1]:
        if line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and name.isidentifier() and name not in found, line
        (found[name],) = shlex.split(value) if value else ("",)
    return found


def _strict_dockerfile(text: str) -> dict[str, str]:
    """Comments, then exactly one ENV instruction: ``NAME="VALUE"`` words (``\\`` escapes the next character, as
    Docker's word processing does), continuation lines ending in `` \\``; anything else fails."""
    lines = [line for line in text.split("\n")[:-1] if not line.startswith("#")]
    assert lines[0].startswith("ENV ") and all(line.endswith(" \\") for line in lines[:-1]), lines
    assert all(line.startswith("    ") for line in lines[1:]), lines
    words = " ".join(line.removesuffix(" \\").strip() for line in lines)[4:]
    word = re.compile(r'([A-Z_]+)="((?:[^"\\]|\\.)*)"(?: |$)')
    found, at = {}, 0
    while at < len(words):
        match = word.match(words, at)
        assert match, words[at:]
        found[match[1]] = re.sub(r"\\(.)", r"\1", match[2])
        at = match.end()
    return found


def _bash(text: str, tmp_path: Path) -> dict[str, str]:
    script = tmp_path / "vars.sh"
    script.write_text(text, encoding="utf-8")
    out = subprocess.run(["env", "-i", "/bin/bash", "--norc", "--noprofile", "-c", f"set -a; . {script}; env -0"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    found = dict(item.split("=", 1) for item in out.split("\0") if item)
    return {k: v for k, v in found.items() if k not in ("PWD", "SHLVL", "_", "OLDPWD")}


PARSERS = {
    "sh": _bash,
    "dotenv": lambda text, _: _strict_dotenv(text),
    "dockerfile": lambda text, _: _strict_dockerfile(text),
    "k8s": lambda text, _: {e["name"]: e["value"] for e in yaml.safe_load(text)["env"]},
    "json": lambda text, _: json.loads(text),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["café/日本/キャッシュ", "my cache/$-$/`id`", "q'uo\"te\\d"])
def test_printable_paths_are_written_and_parse_back_to_exactly_the_variables(tmp_path, fmt, name):
    canary = Canary(tmp_path)
    extra = _modules_setup(tmp_path, "tmp dir é")
    cache = f"{tmp_path}/{name}/cache"
    proc = _env(["--cache-dir", cache, "--format", fmt], **extra)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.splitlines() == text.split("\n")[:-1]  # no line break but \n, anywhere (comment headers included)
    expected = {"HF_HUB_CACHE": cache, "HUGGINGFACE_HUB_CACHE": cache, "SENTENCE_TRANSFORMERS_HOME": cache,
                "HF_MODULES_CACHE": f"{extra['TMPDIR']}/hfcache-modules-{os.geteuid()}", **dict(OFFLINE_FLAGS)}
    assert PARSERS[fmt](text, tmp_path) == expected
    if fmt == "k8s":
        assert set(yaml.safe_load(text)) == {"env"}
    canary.assert_unchanged()


def test_every_value_is_checked_not_only_the_paths():
    """format_env is the one gate: a value it is handed (whoever built the OfflineEnv) is checked too."""
    env = offline_environment("/opt/hf-cache")
    hostile = type(env)(cache_dir=env.cache_dir, variables=(*env.variables, ("HF_X", f"1\u2029{PAYLOAD}")))
    for fmt in FORMATS:
        with pytest.raises(UsageError, match=r"HF_X would be 1\\u2029LD_PRELOAD=/tmp/evil.so, which holds a line "
                                             r"break \(U\+2029\)"):
            format_env(hostile, fmt)
    check_inert("HF_HUB_CACHE", "/opt/ü/日本")  # printable non-ASCII is fine
