"""``prune --superseded`` and what the grace period keeps: after an update moved ``refs/main``, the replaced revision
is detached; a plain prune keeps it for the grace period and says why (table and ``--json``), ``--superseded``
removes it at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers import HUB, clean_env, run_hfcache, warm

GPT2 = "openai-community/gpt2"


def _updated_cache(tmp_path: Path) -> tuple[Path, str, str]:
    """A cache warmed with gpt2, then again after the repo changed upstream: (cache, old commit, new commit)."""
    hub = tmp_path / "hub"
    shutil.copytree(HUB / GPT2, hub / GPT2)
    cache = tmp_path / "cache"
    warm(cache, GPT2, root=hub)
    folder = cache / "models--openai-community--gpt2"
    old = (folder / "refs" / "main").read_text()
    config = json.loads((hub / GPT2 / "config.json").read_text())
    (hub / GPT2 / "config.json").write_text(json.dumps({**config, "updated": True}))
    warm(cache, GPT2, root=hub)
    new = (folder / "refs" / "main").read_text()
    assert new != old and {p.name for p in (folder / "snapshots").iterdir()} == {old, new}
    return cache, old, new


def test_the_grace_period_says_what_it_keeps_and_superseded_removes_it(tmp_path):
    cache, old, new = _updated_cache(tmp_path)
    folder = cache / "models--openai-community--gpt2"

    plain = run_hfcache(["prune", "--cache-dir", str(cache), "--dry-run", "--json"])
    assert plain.returncode == 0, plain.stderr
    document = json.loads(plain.stdout)
    assert document["revisions"] == [] and document["items"] == []
    (kept,) = document["kept"]
    assert (kept["kind"], kept["revision"], kept["repo_id"]) == ("revision", old, GPT2)
    assert "kept for the 1h grace" in kept["why"] and "--superseded removes it" in kept["why"], kept
    table = run_hfcache(["prune", "--cache-dir", str(cache), "--dry-run"], env=clean_env(COLUMNS="250"))
    assert "kept by the grace period" in table.stdout and old[:12] in table.stdout, table.stdout
    assert "nothing to prune (1 kept by the grace period: see above)" in table.stdout, table.stdout

    pruned = run_hfcache(["prune", "--cache-dir", str(cache), "--superseded", "--yes", "--json"])
    assert pruned.returncode == 0, pruned.stderr
    result = json.loads(pruned.stdout)
    assert [(r["commit_hash"], r["reason"]) for r in result["revisions"]] == [(old, "superseded")]
    assert result["policy"]["superseded"] is True and result["kept"] == [] and result["summary"]["bytes_freed"] > 0
    assert {p.name for p in (folder / "snapshots").iterdir()} == {new}
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0
    again = json.loads(run_hfcache(["prune", "--cache-dir", str(cache), "--superseded", "--dry-run",
                                    "--json"]).stdout)
    assert again["revisions"] == [] and again["kept"] == []


def test_superseded_leaves_a_repo_no_ref_names_at_all_to_the_grace_period(tmp_path):
    """A revision warmed by commit in a repo with no ref: nothing superseded it (it may be a download in progress)."""
    cache, old, _ = _updated_cache(tmp_path)
    (cache / "models--openai-community--gpt2" / "refs" / "main").unlink()
    document = json.loads(run_hfcache(["prune", "--cache-dir", str(cache), "--superseded", "--dry-run",
                                       "--json"]).stdout)
    assert document["revisions"] == [] and len(document["kept"]) == 2
    assert all("--superseded" not in k["why"] for k in document["kept"])
