"""What hfcache prints is inert: text a cache, an endpoint or a command line supplies cannot print lines or
escape sequences of its own.

Every table and summary goes through the render consoles (``cli/render/common.py``, ``InertConsole``), every
command-level error through ``print_error``; both escape what ``str.isprintable`` refuses. A registry's text is
escaped before that too (``oci/peer.py``). An endpoint with a control character is a usage error (exit 2).
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import clean_env, run_hfcache

HOSTILE = ["\x1b[32mok\x1b[0m", "\rhfcache: ok", "\u2028hint: fine", "\x85x", "\u202eevil", "\x1b[2K\x1b[1A"]
RAW = "\x1b\r\x85\u2028\u202e"


def _escaped(piece: str) -> str:
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in piece)


@pytest.fixture
def warmed(hub_server, tmp_path):
    cache = tmp_path / "cache"
    proc = run_hfcache(["warm", "gpt2", "--endpoint", hub_server.endpoint, "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stderr
    return cache


@pytest.mark.parametrize("piece", HOSTILE)
def test_a_file_name_a_cache_supplies_is_escaped_in_ls_and_verify(warmed, piece):
    snapshot = next((warmed / "models--gpt2" / "snapshots").iterdir())
    planted = snapshot / f"x{piece}y"
    os.symlink("../../blobs/" + "0" * 40, planted)  # a broken link with a hostile name: both commands name it
    try:
        for command in (["ls"], ["verify"]):
            proc = run_hfcache([*command, "--cache-dir", str(warmed)], env=clean_env(COLUMNS="400"))  # no folding
            assert proc.returncode in (0, 1), proc.stderr
            out = proc.stdout + proc.stderr
            assert not any(c in out for c in RAW), (command, repr(out))
            stripped = "".join(c for c in piece if c.isprintable())  # rich itself drops CR, BS, BEL, VT, FF
            assert f"x{_escaped(piece)}"[:10] in out or f"x{stripped}"[:10] in out, (command, out)
    finally:
        planted.unlink()
    assert run_hfcache(["verify", "--cache-dir", str(warmed)]).returncode == 0


@pytest.mark.parametrize("piece", HOSTILE + ["\nhint: all good"])
def test_an_endpoint_with_a_control_character_is_a_usage_error_on_one_line(tmp_path, piece):
    for env_endpoint in (False, True):
        endpoint = f"http://127.0.0.1:9/{piece}"
        args = ["warm", "gpt2", "--cache-dir", str(tmp_path / "c")] + ([] if env_endpoint else ["--endpoint", endpoint])
        env = {**os.environ, "HF_ENDPOINT": endpoint} if env_endpoint else None
        proc = run_hfcache(args, env=env)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert lines[0].startswith("hfcache: error: invalid endpoint") and lines[1].startswith("hint: "), proc.stderr
        assert len(lines) == 2 and not any(c in proc.stderr for c in RAW), repr(proc.stderr)
    assert not (tmp_path / "c").exists()


def test_text_that_looks_like_rich_markup_is_printed_as_it_is(tmp_path):
    """A cache path or hint with brackets is text, never rich markup: '/x/a[/b]' was a MarkupError (exit 70) in
    doctor's table, and "pip install 'hfcache[check]'" lost its "[check]"."""
    cache = tmp_path / "a[/b]" / "c[bold]"
    cache.mkdir(parents=True)
    proc = run_hfcache(["doctor", "--cache-dir", str(cache)], env=clean_env(COLUMNS="400"))
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, \
        proc.stderr
    assert "c[bold]" in proc.stdout, proc.stdout
