"""prune's pure parts: durations, sizes, --keep specs, and the command's argument handling (Click's CliRunner)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hfcache.cli.main import cli
from hfcache.errors import CacheError, UsageError
from hfcache.prune import KeepSpec
from hfcache.units import format_duration, parse_duration, parse_size


@pytest.mark.parametrize("text, seconds", [
    ("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("45s", 45), ("2w", 14 * 86400), ("1.5h", 5400),
    ("0s", 0), ("7D", 7 * 86400), (" 3h ", 3 * 3600),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "", "d", "-1d", "3x", "1d12h", "1e3s", "30 days", "nan"])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    assert info.value.exit_code == 2 and "30d" in info.value.hint


@pytest.mark.parametrize("text, size", [
    ("50GB", 50 * 10**9), ("500MiB", 500 * 2**20), ("1.5G", 1_500_000_000), ("20Gi", 20 * 2**30),
    ("1048576", 1048576), ("0", 0), ("1KB", 1000), ("1KiB", 1024), ("2tb", 2 * 10**12), ("1TiB", 2**40),
    ("10 MB", 10**7), ("100B", 100), ("0.5KiB", 512),
])
def test_sizes_decimal_and_binary(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "-5GB", "5XB", "5 G B", "five", "1,5G", "5PB"])
def test_bad_sizes_are_usage_errors(text):
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert info.value.exit_code == 2 and "MiB" in info.value.hint


def test_format_duration_round_trips():
    for text in ("30d", "12h", "90m", "45s", "2w"):
        assert format_duration(parse_duration(text)) == text


def test_keep_specs():
    assert KeepSpec.parse("bert-base-uncased") == KeepSpec("bert-base-uncased", None)
    assert KeepSpec.parse("openai-community/gpt2@main") == KeepSpec("openai-community/gpt2", "main")
    assert str(KeepSpec.parse("a/b@" + "0" * 40)) == "a/b@" + "0" * 40
    for bad in ("a/b@", "a/b/c", "../x", ""):
        with pytest.raises(UsageError):
            KeepSpec.parse(bad)


def invoke(*args: str):
    return CliRunner().invoke(cli, ["prune", *args])


def test_bad_option_values_name_the_option(tmp_path):
    result = invoke("--cache-dir", str(tmp_path), "--older-than", "30", "--dry-run")
    assert result.exit_code == 2 and "--older-than" in result.output and "30d" in result.output
    result = invoke("--cache-dir", str(tmp_path), "--max-size", "lots", "--dry-run")
    assert result.exit_code == 2 and "--max-size" in result.output


def test_json_needs_yes_or_dry_run(tmp_path):
    result = invoke("--cache-dir", str(tmp_path), "--json")
    assert isinstance(result.exception, UsageError) and "--yes or --dry-run" in str(result.exception)


def test_no_terminal_no_prompt(tmp_path):
    # CliRunner's stdin is not a terminal: without --yes there is nobody to ask, so nothing is removed.
    result = invoke("--cache-dir", str(tmp_path), "--older-than", "1d")
    assert isinstance(result.exception, UsageError) and "--yes" in result.exception.hint


def test_missing_cache_is_an_error_unless_missing_ok(tmp_path):
    # A mistyped path must not pass unnoticed (exit 5); a CronJob that runs before the first warm says --missing-ok.
    result = CliRunner().invoke(cli, ["prune", "--cache-dir", str(tmp_path / "nope"), "--yes", "--json"])
    assert isinstance(result.exception, CacheError) and "does not exist" in str(result.exception)
    result = CliRunner().invoke(cli, ["prune", "--cache-dir", str(tmp_path / "nope"), "--yes", "--json",
                                      "--missing-ok"])
    assert result.exit_code == 0 and "no cache at" in result.output and not (tmp_path / "nope").exists()
    (tmp_path / "file").write_text("x")
    result = invoke("--cache-dir", str(tmp_path / "file"), "--dry-run")
    assert result.exit_code == 2 and "is a file" in result.output


def test_bad_keep_is_a_usage_error(tmp_path):
    result = invoke("--cache-dir", str(tmp_path), "--dry-run", "--keep", "a/b/c")
    assert isinstance(result.exception, UsageError)
