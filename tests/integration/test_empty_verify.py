"""``verify`` and ``check`` never call a wrong folder a success: an HF_HOME (the cache is ``DIR/hub``) or a folder
that is no cache is exit 5 naming the cache meant; an empty cache is "nothing was verified" (exit 1) unless
``--allow-empty``; ``--revision`` is ``REPO_ID@REVISION`` for one repo (docs/verify.md, docs/cli.md "Which folders are
caches")."""

from __future__ import annotations

from pathlib import Path

from tests.canary import Canary
from tests.helpers import run_hfcache


def _warm(hub_server, cache: Path) -> None:
    proc = run_hfcache(["warm", "bert-base-uncased", "--endpoint", hub_server.endpoint, "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stderr


def test_verify_and_check_of_an_hf_home_name_its_hub_folder(tmp_path, hub_server):
    canary = Canary(tmp_path)
    home = tmp_path / "home"
    _warm(hub_server, home / "hub")
    for command in (["verify"], ["check"], ["verify", "--json"]):
        proc = run_hfcache([*command, "--cache-dir", str(home)])
        assert proc.returncode == 5, (command, proc.stdout, proc.stderr)
        assert f"did you mean {home / 'hub'}" in proc.stderr + proc.stdout, proc.stderr
        assert "Traceback" not in proc.stderr
    assert run_hfcache(["verify", "--cache-dir", str(home / "hub")]).returncode == 0
    canary.assert_unchanged()


def test_an_empty_cache_is_nothing_verified_unless_allowed(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_hfcache(["verify", "--cache-dir", str(empty)])
    assert proc.returncode == 1 and "nothing was verified" in proc.stderr, proc.stdout + proc.stderr
    assert "ok:" not in proc.stdout, proc.stdout  # a script grepping for ok: must not pass either
    assert run_hfcache(["verify", "--cache-dir", str(empty), "--allow-empty"]).returncode == 0
    proc = run_hfcache(["verify", "--cache-dir", str(tmp_path / "missing")])
    assert proc.returncode == 5 and "no cache at" in proc.stderr, proc.stderr


def test_verify_of_a_repo_the_cache_does_not_hold_is_not_success(tmp_path, hub_server):
    cache = tmp_path / "cache"
    _warm(hub_server, cache)
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "org/not-there"])
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_revision_option_is_the_spec_suffix(tmp_path, hub_server):
    cache = tmp_path / "cache"
    _warm(hub_server, cache)
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "bert-base-uncased", "--revision", "main"])
    assert proc.returncode == 0, proc.stderr
    proc = run_hfcache(["verify", "--cache-dir", str(cache), "a/b", "c/d", "--revision", "main"])
    assert proc.returncode == 2 and "REPO_ID@REVISION" in proc.stderr, proc.stderr


def test_warm_and_serve_refuse_an_hf_home_and_an_empty_cache_dir_is_a_usage_error(tmp_path, hub_server):
    """warm --cache-dir $HF_HOME wrote a second cache beside hub/ (and ls could no longer tell); serve --cache-dir
    $HF_HOME served an empty mirror that passed /healthz; --cache-dir '' meant the working directory."""
    home = tmp_path / "home"
    _warm(hub_server, home / "hub")
    before = sorted(p.name for p in home.iterdir())
    proc = run_hfcache(["warm", "gpt2", "--endpoint", hub_server.endpoint, "--cache-dir", str(home)])
    assert proc.returncode == 5 and f"did you mean {home / 'hub'}" in proc.stderr, proc.stderr
    assert sorted(p.name for p in home.iterdir()) == before
    proc = run_hfcache(["serve", "--cache-dir", str(home), "--port", "0"])
    assert proc.returncode == 5 and f"did you mean {home / 'hub'}" in proc.stderr, proc.stderr
    work = tmp_path / "work"
    work.mkdir()
    for command in (["warm", "gpt2", "--endpoint", hub_server.endpoint], ["ls"], ["verify"]):
        proc = run_hfcache([*command, "--cache-dir", ""], cwd=work)
        assert proc.returncode == 2 and "the cache directory is empty" in proc.stderr, (command, proc.stderr)
    assert list(work.iterdir()) == []
