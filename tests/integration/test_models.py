"""Models with real weight files and custom code, end to end: warm --kind model, offline loads by real loaders
(model2vec, transformers), custom-code tokenizers (auto_map), commit-pinned revisions, and --lock cache resolution.

The repos come from ``tests/make_model_repos.py`` (generated once per session), served by the real test Hub server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import scan_cache_dir
from safetensors.numpy import load_file

from tests.helpers import clean_env, run_hfcache
from tests.make_model_repos import (
    EXPECTED_MODEL_FILES,
    EXPECTED_TOKENIZER_FILES,
    NEVER_FETCHED,
    ORG,
    TEXTS,
    read_torch_zip,
)
from tests.testhub import HubServer

ACME = f"{ORG}/acme-tokenizer"
TRANSFORMERS_REPOS = [f"{ORG}/tiny-bert", f"{ORG}/tiny-bert-sharded", f"{ORG}/tiny-sentence-transformer",
                      f"{ORG}/tiny-bert-bin"]


@pytest.fixture(scope="module")
def model_hub(model_repos_root):
    with HubServer(model_repos_root) as server:
        yield server


@pytest.fixture(scope="module")
def model_cache(model_hub, tmp_path_factory):
    """Every generated repo warmed with --kind model in one run; (cache, warm --json report)."""
    cache = tmp_path_factory.mktemp("models") / "hub"
    proc = run_hfcache(["warm", *EXPECTED_MODEL_FILES, "--kind", "model", "--cache-dir", str(cache),
                        "--endpoint", model_hub.endpoint, "--json"])
    assert proc.returncode == 0, proc.stderr
    return cache, json.loads(proc.stdout)


def snapshot(cache: Path, repo_id: str, commit: str | None = None) -> Path:
    snapshots = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if commit is None:
        (only,) = snapshots.iterdir()
        return only
    return snapshots / commit


def snapshot_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}


def run_offline(cache: Path, code: str, *args: str, env: dict[str, str] | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    environment = env or clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache),
                                   HF_HOME=str(cache.parent / "hf-home"))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environment,
                          timeout=timeout)


@pytest.mark.slow
def test_warm_kind_model_fetches_exactly_each_loaders_files(model_cache, model_repos_root):
    cache, report = model_cache
    by_id = {r["repo_id"]: r for r in report["repos"]}
    for repo_id, expected in EXPECTED_MODEL_FILES.items():
        assert {f["path"] for f in by_id[repo_id]["files"]} == expected, repo_id
        present = snapshot_files(snapshot(cache, repo_id))
        assert present == expected, (repo_id, sorted(present ^ expected))
        for never in set(NEVER_FETCHED) - expected:
            assert not any(p == never or p.startswith(never) for p in present), (repo_id, never)
        skipped = snapshot_files(model_repos_root / repo_id) - expected
        assert skipped or repo_id == ACME, repo_id  # each repo (but the code-only one) has files to leave out
        blobs = {p.name for p in (cache / f"models--{repo_id.replace('/', '--')}" / "blobs").iterdir()}
        assert len(blobs) <= len(expected)  # no blob of an unselected file was downloaded either
    assert scan_cache_dir(cache).warnings == []


@pytest.mark.slow
def test_weights_in_the_cache_equal_the_source(model_cache, model_repos_root):
    cache, _ = model_cache
    checked = 0
    for repo_id, expected in EXPECTED_MODEL_FILES.items():
        folder = snapshot(cache, repo_id)
        for path in sorted(expected):
            source = model_repos_root / repo_id / path
            if path.endswith(".safetensors"):
                got, want = load_file(folder / path), load_file(source)
            elif path.endswith(".bin"):
                got, want = read_torch_zip((folder / path).read_bytes()), read_torch_zip(source.read_bytes())
            else:
                continue
            assert got.keys() == want.keys() and got, (repo_id, path)
            assert all(np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want), path
            checked += 1
    # every weight file: 1 + 2 shards + 2 (root, 2_Dense) + 1 .bin + 1 model2vec
    assert checked == 7
    index = json.loads((snapshot(cache, f"{ORG}/tiny-bert-sharded") / "model.safetensors.index.json").read_text())
    shards = {n: load_file(snapshot(cache, f"{ORG}/tiny-bert-sharded") / n) for n in set(index["weight_map"].values())}
    assert all(tensor in shards[name] for tensor, name in index["weight_map"].items())


@pytest.mark.slow
def test_model2vec_and_autoconfig_load_offline_like_from_the_source(model_cache, model_repos_root):
    cache, _ = model_cache
    code = r"""
import json, sys
import numpy as np
from model2vec import StaticModel
from transformers import AutoConfig
source, texts, ids = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
offline = StaticModel.from_pretrained("hfcache-test/tiny-model2vec").encode(texts)
local = StaticModel.from_pretrained(source).encode(texts)
configs = {i: AutoConfig.from_pretrained(i).model_type for i in ids}
print(json.dumps({"equal": bool(np.array_equal(offline, local)), "shape": list(offline.shape),
                  "norms": np.linalg.norm(offline, axis=1).round(4).tolist(), "configs": configs}))
"""
    proc = run_offline(cache, code, str(model_repos_root / ORG / "tiny-model2vec"), json.dumps(TEXTS),
                       *TRANSFORMERS_REPOS)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["equal"] and result["shape"] == [len(TEXTS), 16]
    assert result["norms"] == [1.0] * len(TEXTS)  # normalize=True in the config was applied
    assert result["configs"] == {i: "bert" for i in TRANSFORMERS_REPOS}


@pytest.mark.slow
def test_check_passes_on_every_model_repo_custom_code_included(model_cache):
    cache, _ = model_cache
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", "--trust-remote-code", "*"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["repo_id"]: r for r in json.loads(proc.stdout)["tokenizers"]}
    assert set(rows) == set(EXPECTED_MODEL_FILES)
    assert {i for i, r in rows.items() if r["trust_remote_code"]} == {ACME}  # exactly where auto_map needs it
    assert rows[ACME]["class"] == "AcmeTokenizer"


LOAD_ACME = r"""
import json, sys
from transformers import AutoTokenizer
revision = sys.argv[1] if len(sys.argv) > 1 else None
tok = AutoTokenizer.from_pretrained("hfcache-test/acme-tokenizer", revision=revision, trust_remote_code=True)
print(json.dumps({"class": type(tok).__name__, "marker": tok.acme_marker, "ids": tok("hello world")["input_ids"]}))
"""


@pytest.mark.slow
def test_custom_code_tokenizer_warm_fetches_its_code_and_loads_offline(model_hub, tmp_path):
    cache = tmp_path / "hub"
    proc = run_hfcache(["warm", ACME, "--cache-dir", str(cache), "--endpoint", model_hub.endpoint, "--json"])
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)["repos"][0]
    assert {f["path"] for f in entry["files"]} == EXPECTED_TOKENIZER_FILES[ACME]  # code + relative import, no modeling
    assert snapshot_files(snapshot(cache, ACME)) == EXPECTED_TOKENIZER_FILES[ACME]
    loaded = run_offline(cache, LOAD_ACME)
    assert loaded.returncode == 0, loaded.stderr
    result = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert result == {"class": "AcmeTokenizer", "marker": "acme-v1", "ids": [2, 5, 6, 3]}

    checked = run_hfcache(["check", "--cache-dir", str(cache), "--json", "--trust-remote-code", "*"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (row,) = json.loads(checked.stdout)["tokenizers"]
    assert row["ok"] and row["class"] == "AcmeTokenizer" and row["trust_remote_code"] is True
    assert not (cache / ".hfcache-check-home").exists()


@pytest.mark.slow
def test_check_blames_custom_code_not_a_package(model_hub, tmp_path):
    cache = tmp_path / "hub"
    assert run_hfcache(["warm", ACME, "--cache-dir", str(cache), "--endpoint", model_hub.endpoint]).returncode == 0
    (snapshot(cache, ACME) / "acme_text.py").unlink()  # the relative import of tokenization_acme.py
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", "--trust-remote-code", "*"])
    assert proc.returncode == 1
    (row,) = json.loads(proc.stdout)["tokenizers"]
    assert row["cause"].startswith("custom code: auto_map needs acme_text.py, which is not in the cache"), row
    assert "package" not in row["cause"]


@pytest.mark.slow
def test_commit_pinned_revision_is_checked_and_verified(model_hub, tmp_path):
    commit = model_hub.commit_of(ACME)
    cache = tmp_path / "hub"
    proc = run_hfcache(["warm", f"{ACME}@{commit}", "--cache-dir", str(cache), "--endpoint", model_hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    assert not (cache / f"models--{ACME.replace('/', '--')}" / "refs").exists()  # no ref for a commit
    for args in ([], [ACME], [f"{ACME}@{commit}"]):
        checked = run_hfcache(["check", "--cache-dir", str(cache), "--json", "--trust-remote-code", "*", *args])
        assert checked.returncode == 0, (args, checked.stdout, checked.stderr)
        (row,) = json.loads(checked.stdout)["tokenizers"]
        assert row["revision"] == commit and row["ok"] and row["class"] == "AcmeTokenizer"
    loaded = run_offline(cache, LOAD_ACME, commit)
    assert loaded.returncode == 0 and json.loads(loaded.stdout.splitlines()[-1])["class"] == "AcmeTokenizer"

    verified = run_hfcache(["verify", f"{ACME}@{commit}", "--cache-dir", str(cache), "--json"])
    assert verified.returncode == 0, verified.stdout
    other = "0" * 40
    missing = run_hfcache(["verify", f"{ACME}@{other}", f"{ORG}/absent@main", "--cache-dir", str(cache), "--json"])
    assert missing.returncode == 1
    kinds = {(p["repo_id"], p["kind"]) for p in json.loads(missing.stdout)["problems"]}
    assert kinds == {(ACME, "revision_missing"), (f"{ORG}/absent", "revision_missing")}
    unchecked = run_hfcache(["check", f"{ACME}@{other}", "--cache-dir", str(cache), "--json", "--trust-remote-code", "*"])
    assert unchecked.returncode == 1
    assert "no snapshot of commit" in json.loads(unchecked.stdout)["tokenizers"][0]["cause"]


@pytest.mark.slow
def test_lock_commands_read_the_manifests_cache(model_hub, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "hfcache.toml").write_text(
        f'endpoint = "{model_hub.endpoint}"\ncache_dir = "hf-cache"\n'
        f'[[repos]]\nrepo_id = "{ACME}"\n[[repos]]\nrepo_id = "{ORG}/tiny-model2vec"\nkind = "model"\n')
    assert run_hfcache(["lock"], cwd=project).returncode == 0
    lock_text = (project / "hfcache.lock").read_text()
    assert '"tokenization_acme.py"' in lock_text and '"acme_text.py"' in lock_text  # lock follows auto_map too
    assert '"modeling_acme.py"' not in lock_text
    # The environment names another (empty) cache: every --lock command must still use the manifest's.
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    env = clean_env(HF_HUB_CACHE=str(decoy), HF_HOME=str(tmp_path / "home"))
    lock = str(project / "hfcache.lock")
    assert run_hfcache(["warm", "--lock", lock, "-q"], env=env).returncode == 0
    assert (project / "hf-cache" / f"models--{ACME.replace('/', '--')}").is_dir()
    verified = run_hfcache(["verify", "--lock", lock, "--json"], env=env)
    assert verified.returncode == 0 and json.loads(verified.stdout)["cache_dir"] == str(project / "hf-cache")
    checked = run_hfcache(["check", "--lock", lock, "--json"], env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {r["repo_id"] for r in json.loads(checked.stdout)["tokenizers"]} == {ACME, f"{ORG}/tiny-model2vec"}
    listed = run_hfcache(["ls", "--lock", lock, "--json"], env=env)
    assert listed.returncode == 0
    repos = json.loads(listed.stdout)["repos"]
    assert {r["repo_id"] for r in repos} == {ACME, f"{ORG}/tiny-model2vec"}
    assert all(rev["pinned"] for r in repos for rev in r["revisions"])
    exported = run_hfcache(["export", str(tmp_path / "out"), "--lock", lock, "--json"], env=env)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "out" / f"models--{ACME.replace('/', '--')}").is_dir()
    # --cache-dir still wins over the manifest.
    overridden = run_hfcache(["verify", "--lock", lock, "--cache-dir", str(decoy), "--json"], env=env)
    assert overridden.returncode == 1


def _read_only_home(tmp_path: Path) -> Path:
    home = tmp_path / "ro-home"
    home.mkdir()
    bound = subprocess.run(["mount", "--bind", str(home), str(home)], capture_output=True, text=True)
    if bound.returncode != 0:  # root without CAP_SYS_ADMIN (an unprivileged container)
        pytest.skip(f"cannot bind-mount: {bound.stderr.strip()}")
    remounted = subprocess.run(["mount", "-o", "remount,ro,bind", str(home)], capture_output=True, text=True)
    if remounted.returncode != 0:
        subprocess.run(["umount", str(home)], check=True)
        pytest.skip(f"cannot remount read-only: {remounted.stderr.strip()}")
    return home


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only: read-only bind mount")
def test_custom_code_under_exec_with_a_read_only_home(model_hub, tmp_path):
    cache = tmp_path / "cache"
    assert run_hfcache(["warm", ACME, "--cache-dir", str(cache), "--endpoint", model_hub.endpoint]).returncode == 0
    home = _read_only_home(tmp_path)
    assert not os.access(home, os.W_OK)  # read-only even for root
    try:
        base = {k: v for k, v in clean_env().items() if k not in ("HF_HOME", "XDG_CACHE_HOME", "HF_MODULES_CACHE")}
        base["HOME"] = str(home)
        base["TMPDIR"] = str(tmp_path / "tmp")
        (tmp_path / "tmp").mkdir()
        # Without hfcache: transformers writes custom code into ~/.cache/huggingface/modules and fails.
        plain = run_offline(cache, LOAD_ACME, env={**base, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
        assert plain.returncode != 0 and ("Read-only file system" in plain.stderr or "Permission" in plain.stderr)
        doctor = run_hfcache(["doctor", "--json"], env={**base, "HF_HUB_CACHE": str(cache)})
        findings = {f["code"]: f for f in json.loads(doctor.stdout)["findings"]}
        assert doctor.returncode == 1 and findings["modules.unwritable"]["severity"] == "error"
        assert ACME in findings["modules.unwritable"]["message"]

        proc = run_hfcache(["exec", "--cache-dir", str(cache), "--", sys.executable, "-c", LOAD_ACME], env=base)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1])["class"] == "AcmeTokenizer"
        modules = tmp_path / "tmp" / f"hfcache-modules-{os.geteuid()}"
        assert (modules / "transformers_modules").is_dir() and oct(modules.stat().st_mode & 0o777) == "0o700"
        inside = run_hfcache(["exec", "--cache-dir", str(cache), "--", sys.executable, "-m", "hfcache", "doctor",
                              "--json"], env=base)
        codes = {f["code"] for f in json.loads(inside.stdout)["findings"]}
        assert "modules.writable" in codes and "modules.unwritable" not in codes
    finally:
        subprocess.run(["umount", str(home)], check=True)
