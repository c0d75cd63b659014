"""hfcache env: the variables, and every output format parsed back by the tool that consumes it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hfcache.errors import UsageError
from hfcache.offline.aliases import with_aliases
from hfcache.offline.env import OFFLINE_FLAGS, format_env, offline_environment

# Paths that break naive quoting: spaces, shell and Dockerfile metacharacters, quotes, backslashes, non-ASCII.
# (A `$NAME` is refused, tests/unit/test_env_aliases.py: huggingface_hub would expand it.)
TRICKY = ["/opt/hf-cache", "/data/my cache/hub", "/x/$-$/`id`/hub", "/q/it's \"quoted\"\\back", "/ü/日本/キャッシュ"]


def expected(cache: str) -> dict[str, str]:
    variables = {"HF_HOME": str(Path(cache).parent)} if Path(cache).name == "hub" else {}
    variables.update(with_aliases([("HF_HUB_CACHE", cache)]))
    variables.update(OFFLINE_FLAGS)
    return variables


def test_the_variables_are_the_cache_and_every_offline_flag():
    env = offline_environment("/opt/hf-cache").as_dict()
    assert env == {
        "HF_HUB_CACHE": "/opt/hf-cache",
        "HUGGINGFACE_HUB_CACHE": "/opt/hf-cache",
        "SENTENCE_TRANSFORMERS_HOME": "/opt/hf-cache",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "LLAMA_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }


def test_hf_home_is_set_only_when_the_cache_is_its_hub_folder():
    assert offline_environment("/srv/hf/hub").as_dict()["HF_HOME"] == "/srv/hf"
    assert "HF_HOME" not in offline_environment("/srv/hf-cache").as_dict()


def test_a_relative_cache_dir_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert offline_environment("cache").as_dict()["HF_HUB_CACHE"] == str(tmp_path / "cache")


def test_the_default_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert offline_environment().cache_dir == tmp_path / "c"


def test_a_path_with_a_line_break_is_refused():
    with pytest.raises(UsageError, match="line break"):
        offline_environment("/a\nb")


def test_unknown_format_is_a_usage_error():
    with pytest.raises(UsageError):
        format_env(offline_environment("/x"), "toml")


@pytest.mark.parametrize("cache", TRICKY)
def test_sh_is_sourced_by_bash(tmp_path, cache):
    script = tmp_path / "env.sh"
    script.write_text(format_env(offline_environment(cache), "sh"), encoding="utf-8")
    names = list(expected(cache))
    dump = "; ".join(f'printf "%s\\0" "${name}"' for name in names)
    proc = subprocess.run(["bash", "-c", f"set -eu; source {script}; {dump}"], capture_output=True, env={})
    assert proc.returncode == 0, proc.stderr
    assert dict(zip(names, proc.stdout.decode().split("\0")[:-1], strict=True)) == expected(cache)
    # exported, not just set: a child process sees them
    proc = subprocess.run(["bash", "-c", f"source {script}; env -0"], capture_output=True, env={})
    seen = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if "=" in item)
    assert {k: seen[k] for k in names} == expected(cache)


@pytest.mark.parametrize("cache", TRICKY)
def test_dotenv_is_read_back_by_a_shell(tmp_path, cache):
    dotenv = tmp_path / ".env"
    dotenv.write_text(format_env(offline_environment(cache), "dotenv"), encoding="utf-8")
    proc = subprocess.run(["bash", "-c", f"set -a; . {dotenv}; env -0"], capture_output=True, env={})
    seen = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if "=" in item)
    assert {k: seen[k] for k in expected(cache)} == expected(cache)


def test_dotenv_plain_values_need_no_unquoting():
    # `docker run --env-file` takes everything after '=' literally: a plain path must not be quoted.
    lines = [line for line in format_env(offline_environment("/opt/hf-cache"), "dotenv").splitlines()
             if not line.startswith("#")]
    assert dict(line.split("=", 1) for line in lines) == expected("/opt/hf-cache")


@pytest.mark.parametrize("cache", TRICKY)
def test_k8s_is_a_container_env_list_of_strings(cache):
    document = yaml.safe_load(format_env(offline_environment(cache), "k8s"))
    assert list(document) == ["env"]
    assert all(set(item) == {"name", "value"} and isinstance(item["value"], str) for item in document["env"])
    assert {item["name"]: item["value"] for item in document["env"]} == expected(cache)


@pytest.mark.parametrize("cache", TRICKY)
def test_json_is_one_object(cache):
    assert json.loads(format_env(offline_environment(cache), "json")) == expected(cache)


def test_dockerfile_is_one_env_instruction():
    text = format_env(offline_environment("/opt/hf-cache"), "dockerfile")
    instructions = [line for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert len(instructions) == 1 and instructions[0].startswith("ENV ")


@pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah (a real Dockerfile parser) is not installed")
def test_dockerfile_env_is_what_buildah_puts_in_the_image(tmp_path):
    """Build ``FROM scratch`` + our ENV lines with buildah (no base image, no registry) and read the image config."""
    cache = "/x/$-$/my cache/it's \"q\"\\b/hub"
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n" + format_env(offline_environment(cache), "dockerfile"),
                                        encoding="utf-8")
    storage = ["--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "runroot"), "--storage-driver", "vfs"]
    tag = "localhost/hfcache-env-test"
    build = subprocess.run(["buildah", *storage, "build", "-q", "-t", tag, str(context)], capture_output=True,
                           text=True, timeout=120)
    if build.returncode != 0:
        pytest.skip(f"buildah cannot build here: {build.stderr.strip()[-300:]}")
    try:
        inspect = subprocess.run(["buildah", *storage, "inspect", "--type", "image", tag], capture_output=True,
                                 text=True, timeout=60, check=True)
        env = dict(item.split("=", 1) for item in json.loads(inspect.stdout)["OCIv1"]["config"]["Env"])
    finally:
        subprocess.run(["buildah", *storage, "rmi", "-a", "-f"], capture_output=True, timeout=60)
        for folder in ("root", "runroot"):
            shutil.rmtree(tmp_path / folder, ignore_errors=True)
    assert {k: env[k] for k in expected(cache)} == expected(cache)


def test_headers_are_comments_and_name_the_command():
    for fmt in ("sh", "dotenv", "dockerfile", "k8s"):
        first, second = format_env(offline_environment("/opt/c"), fmt).splitlines()[:2]
        assert first.startswith("# ") and second == f"# Generated by: hfcache env --cache-dir /opt/c --format {fmt}"
