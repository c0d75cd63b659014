"""Input nested deeper than Python's parsers recurse (docs/security.md): a usage error naming the file, never exit 70."""

from __future__ import annotations

import pytest

from tests.helpers import run_hfcache

DEEP_TOML = "[[repos]]\nrepo_id = \"gpt2\"\nx = " + "[" * 5000 + "]" * 5000 + "\n"


@pytest.mark.parametrize("name", ["hfcache.toml", "pyproject.toml", "hfcache.lock"])
def test_a_deeply_nested_manifest_or_lock_is_a_usage_error(tmp_path, name):
    project = tmp_path / "project"
    project.mkdir()
    body = ("[tool.hfcache]\n" + DEEP_TOML.replace("[[repos]]", "[[tool.hfcache.repos]]")) if name == "pyproject.toml" \
        else DEEP_TOML
    (project / name).write_text(body)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep")
    cache = tmp_path / "cache"
    if name == "hfcache.lock":
        (project / "hfcache.toml").write_text('[[repos]]\nrepo_id = "gpt2"\n')
        args = ["warm", "--lock", str(project / name), "--cache-dir", str(cache)]
    else:
        args = ["lock"]
    proc = run_hfcache(args, cwd=project, timeout=120)
    assert "Traceback" not in proc.stderr
    if name == "pyproject.toml":  # not recognised as a manifest: the discovery says so
        assert proc.returncode == 2 and "no hfcache.toml" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 2, proc.stderr
        assert f"{project / name}: invalid TOML: nested too deep" in proc.stderr
    assert not cache.exists() or not any(cache.glob("models--*"))
    assert [p.name for p in canary.iterdir()] == ["keep.txt"] and (canary / "keep.txt").read_text() == "keep"
