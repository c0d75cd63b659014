"""Selection of custom code (auto_map) and sentence-transformers module folders; the private modules cache."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hfcache.errors import CacheError
from hfcache.records import parse_specs
from hfcache.warming.custom_code import (
    RepoDataError,
    auto_map_refs,
    custom_code_paths,
    follow_configs,
    module_folder_paths,
    module_path,
    relative_imports,
)
from hfcache.warming.modules_cache import can_create, modules_cache, modules_cache_override, private_modules_dir
from hfcache.warming.selection import select, shards_from_index

DEEP = b"[" * 200_000 + b"]" * 200_000


def reader(files: dict[str, bytes | str]):
    calls: list[str] = []

    def read(path: str) -> bytes:
        calls.append(path)
        data = files[path]
        return data.encode() if isinstance(data, str) else data

    return read, calls


REPO = {
    "tokenizer_config.json": json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_x.XTok", "tokenization_x_fast.XTokFast"]}}),
    "config.json": json.dumps({"model_type": "x", "auto_map": {"AutoConfig": "configuration_x.XConfig",
                                                               "AutoModel": "modeling_x.XModel",
                                                               "AutoModelForCausalLM": "other/repo--modeling_y.Y"}}),
    "tokenization_x.py": "from .helpers import a\nfrom transformers import BertTokenizer\nclass XTok: pass\n",
    "tokenization_x_fast.py": "try:\n    from .tokenization_x import XTok\nexcept ImportError:\n    pass\n",
    "helpers.py": "from .deep import b\nfrom . import ignored\nfrom ..outside import c\n",
    "deep.py": "b = 1\n",
    "configuration_x.py": "class XConfig: pass\n",
    "modeling_x.py": "raise SystemExit('never executed')\n",
    "tokenizer.json": "{}",
}


def test_auto_map_refs_per_kind_and_legacy_list():
    assert auto_map_refs("tokenizer_config.json", REPO["tokenizer_config.json"].encode()) == (
        "tokenization_x.XTok", "tokenization_x_fast.XTokFast")
    assert auto_map_refs("config.json", REPO["config.json"].encode()) == ("configuration_x.XConfig",)
    assert auto_map_refs("config.json", REPO["config.json"].encode(), kind="all") == (
        "configuration_x.XConfig", "modeling_x.XModel", "other/repo--modeling_y.Y")
    legacy = json.dumps({"auto_map": ["tokenization_x.XTok", None]}).encode()
    assert auto_map_refs("tokenizer_config.json", legacy) == ("tokenization_x.XTok",)
    for junk in (b"not json", b"[]", b'{"auto_map": 3}', b'{"auto_map": {"AutoTokenizer": [null, 5]}}', b"\xff"):
        assert auto_map_refs("tokenizer_config.json", junk) == ()


@pytest.mark.parametrize("ref, expected", [
    ("tokenization_x.XTok", "tokenization_x.py"),
    ("org/repo--tokenization_x.XTok", None),  # code in another repo
    ("a.b.C", None),  # transformers' split(".") would fail on it too
    ("../../etc/passwd.X", None),
    ("/abs.X", None),
    (".X", None),
])
def test_module_path_follows_transformers_and_refuses_unsafe(ref, expected):
    assert module_path(ref) == expected


def test_relative_imports_follow_transformers_regexes_united_with_ast():
    # transformers' get_relative_imports: "from ..outside import" is ".outside" -> ".outside.py" (fetched, or marked)
    assert relative_imports(REPO["helpers.py"].encode(), "helpers.py") == (".outside.py", "deep.py")
    assert relative_imports(b"from .b import x\n", "sub/a.py") == ("sub/b.py",)
    assert relative_imports(b"def broken(:\n", "a.py") == ()
    assert relative_imports(b"from .x import y\n" * 2 + b"import os\n", "a.py") == ("x.py",)
    # In a docstring: transformers' regex sees it (and fetches helper.py), so hfcache must fetch it too.
    assert relative_imports(b'"""Use:\n    from .helper import H\n"""\n', "a.py") == ("helper.py",)
    assert relative_imports(b"import .legacy\n", "a.py") == ("legacy.py",)  # the regex's other form
    assert relative_imports(b"import os; from .semi import x\n", "a.py") == ("semi.py",)  # ast only
    assert relative_imports(b"def broken(:\nfrom .still import x\n", "a.py") == ("still.py",)
    assert relative_imports(b"x = " + b"(" * 100_000 + b")" * 100_000 + b"\nfrom .y import z\n", "a.py") == ("y.py",)
    assert relative_imports(b"from ../../etc import x\nfrom .a/../../b import c\n", "a.py") == ()


def test_hostile_json_is_a_clear_error_naming_the_file():
    for name in ("tokenizer_config.json", "config.json"):
        with pytest.raises(RepoDataError, match=f"{name} is JSON nested too deeply"):
            auto_map_refs(name, DEEP)
    with pytest.raises(RepoDataError, match="modules.json is JSON nested too deeply"):
        module_folder_paths(DEEP, {})
    for index in (b'{"weight_map": {"a": 5}}', b'{"weight_map": {"a": null}}', b'{"weight_map": {"a": ""}}', DEEP,
                  b'{"weight_map": {"a": [1]}}'):
        with pytest.raises(ValueError, match="model.safetensors.index.json is not a sharded weight index"):
            shards_from_index(index, {"model.safetensors.index.json"}, "model.safetensors.index.json")


def test_files_too_large_to_parse_are_reported():
    files = {"tokenizer_config.json": REPO["tokenizer_config.json"], "tokenization_x.py": "big",
             "tokenization_x_fast.py": "x = 1\n", "modules.json": "[]"}

    def read(path: str) -> bytes | None:
        return None if path in ("tokenization_x.py", "modules.json") else files[path].encode()

    followed = follow_configs(("tokenizer_config.json", "modules.json"), read, files, "model")
    assert followed.unparsed == ("tokenization_x.py", "modules.json")
    assert any(n.startswith("tokenization_x.py is larger than") for n in followed.notes)
    assert custom_code_paths(["tokenizer_config.json"], read, files).unparsed == ("tokenization_x.py",)


def test_tokenizer_selection_follows_auto_map_through_relative_imports():
    selection = select(REPO, "tokenizer")
    assert selection.needs_config == ("tokenizer_config.json", "config.json")
    read, calls = reader(REPO)
    followed = follow_configs(selection.needs_config, read, REPO, "tokenizer")
    assert set(followed.paths) == {"tokenization_x.py", "tokenization_x_fast.py", "helpers.py", "deep.py",
                                   "configuration_x.py"}
    assert "modeling_x.py" not in calls and "modeling_x.py" not in followed.paths  # AutoModel: not for a tokenizer
    assert followed.absent == (".outside.py",)  # "from ..outside": transformers asks for .outside.py too
    assert followed.foreign == ()


def test_model_kind_follows_every_auto_map_key_and_reports_foreign_code():
    read, _ = reader(REPO)
    followed = follow_configs(("tokenizer_config.json", "config.json"), read, REPO, "model")
    assert "modeling_x.py" in followed.paths
    assert followed.foreign == ("other/repo--modeling_y.Y",)
    assert "custom code in other/repo: warm it too" in followed.notes


def test_missing_code_gets_a_marker_and_exclude_wins():
    repo = {k: v for k, v in REPO.items() if k != "deep.py"}
    read, _ = reader(repo)
    followed = follow_configs(("tokenizer_config.json", "config.json"), read, repo, "tokenizer")
    assert "deep.py" in followed.absent and "deep.py" not in followed.paths
    read, _ = reader(repo)
    excluded = follow_configs(("tokenizer_config.json", "config.json"), read, repo, "tokenizer", exclude=("helpers*",))
    assert "helpers.py" not in excluded.paths and "deep.py" not in excluded.absent


def test_configs_are_read_without_any_python_file_too():
    plain = {"tokenizer_config.json": json.dumps({"auto_map": {"AutoTokenizer": ["tok_missing.MTok", None]}}),
             "config.json": "{}", "tokenizer.json": "{}"}
    selection = select(plain, "tokenizer")
    assert selection.needs_config == ("tokenizer_config.json", "config.json")
    read, _ = reader(plain)
    assert follow_configs(selection.needs_config, read, plain).absent == ("tok_missing.py",)
    assert select(REPO, "all").needs_config == ()


def test_modules_json_selects_module_folders_one_weight_format_each():
    files = {
        "modules.json": json.dumps([{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense"}, {"path": "../etc"},
                                    {"path": "3_Sharded/"}, {"nopath": 1}, "junk"]),
        "config.json": "{}", "model.safetensors": "", "1_Pooling/config.json": "{}",
        "2_Dense/config.json": "{}", "2_Dense/model.safetensors": "", "2_Dense/pytorch_model.bin": "",
        "2_Dense/onnx/model.onnx": "", "3_Sharded/model.safetensors.index.json": "{}",
        "3_Sharded/model-00001-of-00002.safetensors": "", "9_Unlisted/model.safetensors": "",
    }
    selection = select(files, "model")
    assert "modules.json" in selection.needs_config
    read, _ = reader(files)
    followed = follow_configs(selection.needs_config, read, files, "model")
    assert set(followed.paths) == {"1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors",
                                   "3_Sharded/model.safetensors.index.json"}
    assert followed.needs_index == ("3_Sharded/model.safetensors.index.json",)
    assert module_folder_paths(b"not json", files) == (set(), ())


def test_parse_specs_like_warm():
    assert parse_specs(["a/b", "a/b@v1", "c@" + "0" * 40]) == {"a/b": {"v1"}, "c": {"0" * 40}}
    assert parse_specs(["a/b"]) == {"a/b": set()}
    from hfcache.errors import UsageError

    with pytest.raises(UsageError):
        parse_specs(["a/b@"])


def test_modules_cache_default_explicit_and_override(tmp_path):
    assert modules_cache({"HF_HOME": str(tmp_path)}) == (tmp_path / "modules", False)
    assert modules_cache({"HF_MODULES_CACHE": "/x"}) == (Path("/x"), True)
    assert modules_cache_override({"HF_HOME": str(tmp_path / "new")}) is None  # creatable: left alone
    assert modules_cache_override({"HF_MODULES_CACHE": "/proc/nope"}) is None  # explicit: never replaced
    assert can_create(tmp_path / "a" / "b")
    (tmp_path / "file").write_text("")
    assert not can_create(tmp_path / "file" / "x")  # a file where a folder would go


def test_private_modules_dir_refuses_a_folder_others_can_write(tmp_path):
    first = private_modules_dir(str(tmp_path))
    assert first == tmp_path / f"hfcache-modules-{os.geteuid()}"
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert private_modules_dir(str(tmp_path)) == first  # reused while private
    first.chmod(0o777)  # ours, but someone could plant code there now: private again, same path
    assert private_modules_dir(str(tmp_path)) == first and stat.S_IMODE(first.stat().st_mode) == 0o700
    first.rmdir()
    os.symlink(tmp_path / "elsewhere", first)  # a link planted under the predictable name
    before = set(tmp_path.iterdir())
    for _ in range(3):
        with pytest.raises(CacheError, match=f"{first} is a link"):
            private_modules_dir(str(tmp_path))
    assert set(tmp_path.iterdir()) == before  # no folder per call


def _cache_with_custom_code(tmp_path: Path) -> Path:
    cache = tmp_path / "hub"
    snap = cache / "models--org--code" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "tokenizer_config.json").write_text(REPO["tokenizer_config.json"])
    plain = cache / "models--org--plain" / "snapshots" / ("b" * 40)
    plain.mkdir(parents=True)
    (plain / "config.json").write_text('{"model_type": "bert"}')
    return cache


def test_doctor_reports_an_unwritable_modules_cache_only_with_custom_code(tmp_path):
    from hfcache.offline.doctor import doctor
    from hfcache.offline.doctor_folder import modules_cache_findings
    from hfcache.warming.modules_cache import custom_code_repos

    cache = _cache_with_custom_code(tmp_path)
    assert [(r.repo_id, r.refs) for r in custom_code_repos(cache)] == [
        ("org/code", ("tokenization_x.XTok", "tokenization_x_fast.XTokFast"))]
    (tmp_path / "file").write_text("")
    blocked = {"HF_MODULES_CACHE": str(tmp_path / "file" / "modules")}  # a file where the folder would go
    (finding,) = modules_cache_findings(cache, blocked)
    assert finding.code == "modules.unwritable" and finding.severity == "error" and "org/code" in finding.message
    assert "hfcache exec" in finding.fix
    report = doctor(cache, environ={**blocked, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert report.exit_code == 1 and "modules.unwritable" in {f.code for f in report.findings}
    (ok,) = modules_cache_findings(cache, {"HF_HOME": str(tmp_path / "home")})
    assert ok.code == "modules.writable" and ok.severity == "info"
    (cache / "models--org--code").rename(tmp_path / "gone")
    assert modules_cache_findings(cache, blocked) == []  # no custom code cached: nothing to say


def test_offline_environment_moves_the_modules_cache_only_when_needed(tmp_path):
    from hfcache.offline.env import offline_environment

    (tmp_path / "file").write_text("")
    cache = tmp_path / "cache"  # not named "hub": HF_HOME is left to the environment
    blocked = offline_environment(cache, {"HF_HOME": str(tmp_path / "file"), "TMPDIR": str(tmp_path)})
    moved = Path(blocked.as_dict()["HF_MODULES_CACHE"])
    assert moved == tmp_path / f"hfcache-modules-{os.geteuid()}"
    assert moved.is_dir() and stat.S_IMODE(moved.stat().st_mode) == 0o700
    assert "HF_MODULES_CACHE" not in offline_environment(cache, {"HF_HOME": str(tmp_path)}).as_dict()
    # A cache folder named "hub" sets HF_HOME to its parent, whose modules/ folder is writable here.
    assert "HF_MODULES_CACHE" not in offline_environment(tmp_path / "hub", {"HF_HOME": str(tmp_path / "file")}).as_dict()
    explicit = offline_environment(cache, {"HF_HOME": str(tmp_path / "file"), "HF_MODULES_CACHE": "/x"})
    assert "HF_MODULES_CACHE" not in explicit.as_dict()  # the user's choice stands (doctor judges it)


def test_other_json_readers_turn_overflow_and_depth_into_clear_errors(tmp_path):
    """The same kind of fault outside custom code: cached/imported tree listings with a size of 1e999 (int(inf)
    raises OverflowError) or nested too deep."""
    from hfcache.errors import UsageError
    from hfcache.integrity.expectations import read_tree_listing
    from hfcache.move.import_plan import _parse_listing

    (tmp_path / "models--o--r" / "trees").mkdir(parents=True)
    for body in (b'{"format_version": 1, "files": {"a": {"blob_id": "x", "size": 1e999}}}', DEEP):
        (tmp_path / "models--o--r" / "trees" / ("c" * 40 + ".json")).write_bytes(body)
        assert read_tree_listing(str(tmp_path), "models--o--r", "c" * 40) is None
        with pytest.raises(UsageError, match="refused entry 'trees/x.json'"):
            _parse_listing(body, "trees/x.json")


def test_relative_import_regexes_stay_linear_on_blank_lines():
    """transformers' own ``^\\s*from...`` is quadratic on blank lines (40,000 lines took 34 s); hfcache's restatement
    must read a whole MAX_PARSE_BYTES file of them (16 MiB) in seconds. Generous bound: the machine is shared."""
    import time

    from hfcache.warming.custom_code import MAX_PARSE_BYTES

    started = time.perf_counter()
    assert relative_imports(b" \n" * (MAX_PARSE_BYTES // 2), "a.py") == ()
    assert time.perf_counter() - started < 60
