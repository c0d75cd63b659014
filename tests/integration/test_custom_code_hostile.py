"""Hostile and broken custom-code repos, generated here and served by the real test Hub server; hfcache and
transformers run in real subprocesses. Each test asserts the exit code and the one-line message a user sees.

Covers: an ``auto_map`` module missing from a repo without any ``.py`` (marker, clear offline error), JSON nested too
deeply (warm/lock exit 3; check and doctor report that repo and go on), a bad sharded index, a relative import only
transformers' regex sees (in a docstring), a code file too large to parse, code in another repo, code that fails
(syntax error, bad ``auto_map`` entry), an explicit unwritable ``HF_MODULES_CACHE`` in check, and an unsafe private
modules folder for env/exec.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import clean_env, run_hfcache
from tests.make_model_repos import ORG, _json, _tokenizer_files, _write
from tests.testhub import HubServer

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_AUTO_MAP = '{"auto_map": ' + DEEP + "}"  # doctor parses only files that mention auto_map
GOOD_CODE = "from transformers import BertTokenizer\n\n\nclass {name}(BertTokenizer):\n    pass\n"


def _code_repo(root: Path, name: str, module: str, code: str, **extra: str) -> str:
    repo = root / ORG / name
    cls = "".join(p.title() for p in module.split("_"))
    _tokenizer_files(repo, {"tokenizer_class": cls, "do_lower_case": True,
                            "auto_map": {"AutoTokenizer": [f"{module}.{cls}", None]}})
    _write(repo / "config.json", _json({"model_type": "bert"}))
    _write(repo / f"{module}.py", code.format(name=cls))
    for path, data in extra.items():
        _write(repo / path, data)
    return f"{ORG}/{name}"


def make_hostile_repos(root: Path) -> dict[str, str]:
    """Write the repos; return a short key -> repo_id."""
    repos = {}
    no_py = root / ORG / "no-py-missing"
    _tokenizer_files(no_py, {"tokenizer_class": "BertTokenizer",
                             "auto_map": {"AutoTokenizer": ["tok_missing.MTok", None]}})
    _write(no_py / "config.json", _json({"model_type": "bert"}))
    repos["no_py"] = f"{ORG}/no-py-missing"
    for name, file in (("deep-config", "config.json"), ("deep-tokenizer-config", "tokenizer_config.json")):
        repo = root / ORG / name
        _tokenizer_files(repo)
        _write(repo / "config.json", _json({"model_type": "bert"}))
        _write(repo / file, DEEP_AUTO_MAP)
        repos[name] = f"{ORG}/{name}"
    deep_modules = root / ORG / "deep-modules"
    _tokenizer_files(deep_modules)
    _write(deep_modules / "config.json", _json({"model_type": "bert"}))
    _write(deep_modules / "modules.json", DEEP)
    _write(deep_modules / "model.safetensors", b"\0" * 16)
    repos["deep_modules"] = f"{ORG}/deep-modules"
    bad_index = root / ORG / "bad-index"
    _tokenizer_files(bad_index)
    _write(bad_index / "config.json", _json({"model_type": "bert"}))
    _write(bad_index / "model.safetensors.index.json", json.dumps({"weight_map": {"a": 5}}))
    repos["bad_index"] = f"{ORG}/bad-index"
    # transformers' get_relative_imports is a regex over the text: it sees the docstring line and fetches helper.py.
    repos["docstring"] = _code_repo(root, "docstring-import", "tok_doc",
                                    '"""Example:\n\n    from .helper import H\n"""\n' + GOOD_CODE,
                                    **{"helper.py": "H = 1\n"})
    repos["huge"] = _code_repo(root, "huge-code", "tok_huge",
                               "# filler\n" * (17 * 1024 * 1024 // 9) + "from .lost import L\n" + GOOD_CODE,
                               **{"lost.py": "L = 1\n"})
    foreign = root / ORG / "foreign-code"
    _tokenizer_files(foreign, {"tokenizer_class": "T", "auto_map": {"AutoTokenizer": ["other/lib--tok.T", None]}})
    _write(foreign / "config.json", _json({"model_type": "bert"}))
    repos["foreign"] = f"{ORG}/foreign-code"
    repos["syntax"] = _code_repo(root, "syntax-error", "tok_syntax", "def broken(:\n")
    bad_ref = root / ORG / "bad-auto-map"
    _tokenizer_files(bad_ref, {"tokenizer_class": "C", "auto_map": {"AutoTokenizer": ["a.b.C", None]}})
    _write(bad_ref / "config.json", _json({"model_type": "bert"}))
    _write(bad_ref / "a.py", "")
    repos["bad_ref"] = f"{ORG}/bad-auto-map"
    return repos


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-repos")
    repos = make_hostile_repos(root)
    with HubServer(root) as server:
        yield server, repos


def _warm(server: HubServer, cache: Path, *args: str) -> tuple[int, dict | None, str]:
    proc = run_hfcache(["warm", *args, "--cache-dir", str(cache), "--endpoint", server.endpoint, "--json"])
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def _offline(cache: Path, repo_id: str, **env: str):
    code = ("import sys\nfrom transformers import AutoTokenizer\n"
            "AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)\nprint('loaded')\n")
    import subprocess

    environment = clean_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "home"), **env)
    return subprocess.run([sys.executable, "-c", code, repo_id], capture_output=True, text=True, env=environment,
                          timeout=300)


def _check(cache: Path, *specs: str, **env: str) -> tuple[int, dict[str, dict]]:
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", "--trust-remote-code", "*", *specs],
                       env=clean_env(HF_HOME=str(cache.parent / "home"), **env), timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, {r["repo_id"]: r for r in json.loads(proc.stdout)["tokenizers"]}


@pytest.mark.slow
def test_missing_module_without_any_python_file_is_marked_absent(hostile, tmp_path):
    server, repos = hostile
    repo_id = repos["no_py"]
    cache = tmp_path / "hub"
    code, report, stderr = _warm(server, cache, repo_id)
    assert code == 0, stderr
    assert "tok_missing.py" in report["repos"][0]["absent"]
    commit = server.commit_of(repo_id)
    assert (cache / f"models--{repo_id.replace('/', '--')}" / ".no_exist" / commit / "tok_missing.py").is_file()
    loaded = _offline(cache, repo_id)
    assert loaded.returncode != 0 and "does not appear to have a file named tok_missing.py" in loaded.stderr
    assert "couldn't connect" not in loaded.stderr.lower()
    status, rows = _check(cache)
    assert status == 1
    assert rows[repo_id]["cause"] == "custom code: auto_map needs tok_missing.py, which the repo does not have"

    project = tmp_path / "project"
    project.mkdir()
    (project / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "{repo_id}"\n')
    assert run_hfcache(["lock"], cwd=project).returncode == 0
    assert "tok_missing.py" in (project / "hfcache.lock").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("key, file", [("deep-config", "config.json"),
                                       ("deep-tokenizer-config", "tokenizer_config.json")])
def test_deeply_nested_configs_fail_warm_and_lock_with_exit_3(hostile, tmp_path, key, file):
    server, repos = hostile
    code, report, stderr = _warm(server, tmp_path / "hub", repos[key])
    assert code == 3, stderr
    (row,) = report["repos"]
    assert row["error"] == f"{repos[key]}: {file} is JSON nested too deeply to parse" and row["hint"]
    project = tmp_path / "project"
    project.mkdir()
    (project / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "{repos[key]}"\n')
    locked = run_hfcache(["lock", "--json"], cwd=project)
    assert locked.returncode == 3 and "Traceback" not in locked.stderr
    (failure,) = json.loads(locked.stdout)["failures"]
    assert failure["error"].endswith(f"{file} is JSON nested too deeply to parse") and failure["hint"]


@pytest.mark.slow
def test_check_and_doctor_report_a_deeply_nested_cached_config_and_go_on(hostile, tmp_path):
    server, repos = hostile
    cache = tmp_path / "hub"
    # --kind all parses nothing: the hostile files land in the cache, beside a good custom-code repo.
    code, _, stderr = _warm(server, cache, repos["deep-config"], repos["deep-tokenizer-config"], "--kind", "all")
    assert code == 0, stderr
    assert _warm(server, cache, repos["docstring"])[0] == 0
    status, rows = _check(cache)
    assert status == 1
    for key, file in (("deep-config", "config.json"), ("deep-tokenizer-config", "tokenizer_config.json")):
        assert not rows[repos[key]]["ok"]
        assert rows[repos[key]]["cause"] == (f"{repos[key]}: {file} is JSON nested too deeply to parse: no loader "
                                             "can read it (fix the repo)")
    assert rows[repos["docstring"]]["ok"], rows[repos["docstring"]]
    doctor = run_hfcache(["doctor", "--json"], env=clean_env(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "h")))
    assert doctor.returncode in (0, 1), doctor.stderr
    findings = json.loads(doctor.stdout)["findings"]
    bad = [f for f in findings if f["code"] == "config.unparsable"]
    assert {f["message"].split("@")[0] for f in bad} == {repos["deep-config"], repos["deep-tokenizer-config"]}
    assert any(f["code"] == "modules.writable" and repos["docstring"] in f["message"] for f in findings)


@pytest.mark.slow
@pytest.mark.parametrize("key, message", [
    ("deep_modules", "modules.json is JSON nested too deeply to parse"),
    ("bad_index", "model.safetensors.index.json is not a sharded weight index: its weight_map names 5, not a file "
                  "name"),
])
def test_hostile_model_files_fail_warm_kind_model_with_exit_3(hostile, tmp_path, key, message):
    server, repos = hostile
    code, report, stderr = _warm(server, tmp_path / "hub", repos[key], "--kind", "model")
    assert code == 3, stderr
    (row,) = report["repos"]
    assert row["error"] == f"{repos[key]}: {message}"
    assert row["hint"] and row["hint"] != "None"
    human = run_hfcache(["warm", repos[key], "--kind", "model", "--cache-dir", str(tmp_path / "hub2"),
                         "--endpoint", server.endpoint, "-q"])
    assert human.returncode == 3 and "hint: None" not in human.stderr and message in human.stderr


@pytest.mark.slow
def test_relative_import_in_a_docstring_is_fetched_like_transformers_does(hostile, tmp_path):
    server, repos = hostile
    cache = tmp_path / "hub"
    code, report, stderr = _warm(server, cache, repos["docstring"])
    assert code == 0, stderr
    assert {"tok_doc.py", "helper.py"} <= {f["path"] for f in report["repos"][0]["files"]}
    loaded = _offline(cache, repos["docstring"])
    assert loaded.returncode == 0 and loaded.stdout.strip().endswith("loaded"), loaded.stderr


@pytest.mark.slow
def test_code_too_large_to_parse_and_foreign_code_are_reported(hostile, tmp_path):
    server, repos = hostile
    code, report, stderr = _warm(server, tmp_path / "hub", repos["huge"], repos["foreign"])
    assert code == 0, stderr
    notes = {r["repo_id"]: r["notes"] for r in report["repos"]}
    assert notes[repos["huge"]] == ["tok_huge.py is larger than 16777216 bytes: not parsed, the custom code it names "
                                    "or imports is not fetched"]
    assert notes[repos["foreign"]] == ["custom code in other/lib: warm it too"]
    human = run_hfcache(["warm", repos["foreign"], "--cache-dir", str(tmp_path / "hub"), "--endpoint",
                         server.endpoint, "-q"])
    assert human.returncode == 0 and f"warning: {repos['foreign']}: custom code in other/lib: warm it too" in \
        human.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "{repos["foreign"]}"\n')
    locked = run_hfcache(["lock", "--json"], cwd=project)
    assert locked.returncode == 0, locked.stderr
    assert json.loads(locked.stdout)["repos"][0]["notes"] == ["custom code in other/lib: warm it too"]


@pytest.mark.slow
def test_check_names_the_failing_code(hostile, tmp_path):
    server, repos = hostile
    cache = tmp_path / "hub"
    assert _warm(server, cache, repos["syntax"], repos["bad_ref"])[0] == 0
    status, rows = _check(cache)
    assert status == 1
    assert rows[repos["syntax"]]["cause"].startswith("custom code: the repo's code does not compile: SyntaxError")
    assert rows[repos["bad_ref"]]["cause"] == ("custom code: auto_map entry 'a.b.C' is not a module.Class reference "
                                               "transformers can load")


@pytest.mark.slow
def test_check_honours_an_explicit_unwritable_modules_cache(hostile, tmp_path):
    server, repos = hostile
    cache = tmp_path / "hub"
    assert _warm(server, cache, repos["docstring"])[0] == 0
    (tmp_path / "file").write_text("")
    blocked = str(tmp_path / "file" / "modules")  # a file where the folder would go: unwritable, for root too
    loaded = _offline(cache, repos["docstring"], HF_MODULES_CACHE=blocked)
    assert loaded.returncode != 0  # the application fails ...
    status, rows = _check(cache, HF_MODULES_CACHE=blocked)
    assert status == 1  # ... and so does check, naming why
    assert rows[repos["docstring"]]["cause"].startswith(f"custom code: HF_MODULES_CACHE={blocked} is not writable")
    writable = tmp_path / "modules"
    status, rows = _check(cache, HF_MODULES_CACHE=str(writable))
    assert status == 0 and (writable / "transformers_modules").is_dir()  # used, as the application would
    doctor = run_hfcache(["doctor", "--json"], env=clean_env(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "h"),
                                                             HF_MODULES_CACHE=blocked))
    (finding,) = [f for f in json.loads(doctor.stdout)["findings"] if f["code"] == "modules.unwritable"]
    assert "hfcache exec keeps it" in finding["fix"] and "temporary" not in finding["fix"]


@pytest.mark.slow
def test_env_and_exec_refuse_an_unsafe_private_modules_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "file").write_text("")
    planted = tmp / f"hfcache-modules-{os.geteuid()}"
    os.symlink(tmp_path / "attacker", planted)
    env = clean_env(TMPDIR=str(tmp), HF_HOME=str(tmp_path / "file" / "home"))  # default modules cache unwritable
    before = set(tmp.iterdir())
    for args in (["env"], ["env"], ["exec", "--", sys.executable, "-c", "pass"]):
        proc = run_hfcache([*args[:1], "--cache-dir", str(tmp_path / "cache"), *args[1:]], env=env)
        assert proc.returncode == 5, (args, proc.stdout, proc.stderr)
        assert f"{planted} is a link, not a private folder of uid {os.geteuid()}" in proc.stderr
    assert set(tmp.iterdir()) == before  # nothing new per call
    planted.unlink()
    outputs = {run_hfcache(["env", "--cache-dir", str(tmp_path / "cache")], env=env).stdout for _ in range(2)}
    assert len(outputs) == 1 and f"HF_MODULES_CACHE={planted}" in outputs.pop()


class _RecordingSink:
    """hfcache's ProgressSink protocol, recording what the progress bar would show."""

    def __init__(self) -> None:
        self.totals: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.early: int = 0  # bytes advanced before the repo's total was known

    def repo_started(self, key: int, label: str, files: int, total_bytes: int) -> None:
        self.totals[key] = total_bytes

    def advance(self, key: int, nbytes: int) -> None:
        if key not in self.totals:
            self.early += nbytes
        self.done[key] = self.done.get(key, 0) + nbytes

    def repo_finished(self, key: int, result) -> None:
        pass


@pytest.mark.slow
def test_progress_never_exceeds_its_total_with_the_two_step_selection(hostile, tmp_path):
    from hfcache.records import WarmRequest
    from hfcache.warming.orchestrate import warm

    server, repos = hostile
    sink = _RecordingSink()
    report = warm([WarmRequest(repos["docstring"])], cache_dir=tmp_path / "hub", endpoint=server.endpoint,
                  token=False, progress=sink)
    assert report.ok
    (key,) = sink.totals
    total = sum(f.size for f in report.repos[0].files)
    # Files fetched while the configs are read advance before the total is known (the display keeps them for the
    # bar it adds: cli/render/warm.py); what counts is that the bar ends exactly at its total, never past it.
    assert sink.totals[key] == total and sink.done[key] == total and sink.early <= total


def _bind_read_only(folder: Path) -> None:
    import subprocess

    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if bound.returncode != 0:  # root without CAP_SYS_ADMIN (an unprivileged container)
        pytest.skip(f"cannot bind-mount: {bound.stderr.strip()}")
    remounted = subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True, text=True)
    if remounted.returncode != 0:
        subprocess.run(["umount", str(folder)], check=True)
        pytest.skip(f"cannot remount read-only: {remounted.stderr.strip()}")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only: read-only bind mount")
def test_doctor_downgrades_a_read_only_modules_cache_that_holds_the_code(hostile, tmp_path):
    import subprocess

    server, repos = hostile
    cache = tmp_path / "hub"
    assert _warm(server, cache, repos["docstring"])[0] == 0
    modules = tmp_path / "modules"
    assert _offline(cache, repos["docstring"], HF_MODULES_CACHE=str(modules)).returncode == 0  # fills it
    _bind_read_only(modules)
    try:
        assert not os.access(modules, os.W_OK)
        env = clean_env(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "h"), HF_MODULES_CACHE=str(modules))
        findings = {f["code"]: f for f in json.loads(run_hfcache(["doctor", "--json"], env=env).stdout)["findings"]}
        assert findings["modules.readonly"]["severity"] == "warning" and "modules.unwritable" not in findings
        loaded = _offline(cache, repos["docstring"], HF_MODULES_CACHE=str(modules))
        assert loaded.returncode == 0, loaded.stderr  # the warning is right: the load works
        assert _warm(server, cache, repos["no_py"])[0] == 0  # new custom code the folder does not hold
        findings = {f["code"]: f for f in json.loads(run_hfcache(["doctor", "--json"], env=env).stdout)["findings"]}
        assert findings["modules.unwritable"]["severity"] == "error" and "modules.readonly" not in findings
    finally:
        subprocess.run(["umount", str(modules)], check=True)
