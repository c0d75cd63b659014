"""hfcache.offline.paths: the grammar of ``exec --path NAME=SPEC[:PATTERN]`` and of ``hfcache path``, and
:func:`resolve` called in-process (as ``hfcache exec --path`` calls it) on a cache warm made from the test Hub."""

from __future__ import annotations

import pytest

import hfcache
from hfcache.errors import CheckFailed, UsageError
from hfcache.offline.paths import (
    AmbiguousPath,
    PathNotCached,
    ResolvedPath,
    check_pattern,
    parse_path_var,
    parse_spec,
    resolve,
    warm_command,
)
from hfcache.records import WarmRequest

BERT, CANON = "bert-base-uncased", "google-bert/bert-base-uncased"


@pytest.mark.parametrize("text, expected", [
    ("MODEL=org/name", ("MODEL", "org/name", None)),
    ("MODEL=org/name@main", ("MODEL", "org/name@main", None)),
    ("_m1=bert-base-uncased@refs/pr/1:tokenizer.json", ("_m1", "bert-base-uncased@refs/pr/1", "tokenizer.json")),
    ("GGUF=org/name-GGUF:*Q8_0*.gguf", ("GGUF", "org/name-GGUF", "*Q8_0*.gguf")),
    ("X=org/name@v1:a:b*", ("X", "org/name@v1", "a:b*")),  # the first ':' starts the pattern
    ("D=datasets/org/name:*.parquet", ("D", "datasets/org/name", "*.parquet")),
    ("E=a=b", None),  # '=' in a repo id is refused by the id rule below
])
def test_parse_path_var(text, expected):
    if expected is None:
        with pytest.raises(UsageError, match="invalid repo id"):
            parse_path_var(text)
        return
    assert parse_path_var(text) == expected


@pytest.mark.parametrize("text, message", [
    ("org/name", "expected NAME=REPO_ID"),
    ("=org/name", "is not a variable name"),
    ("1MODEL=org/name", "is not a variable name"),
    ("MO-DEL=org/name", "is not a variable name"),
    ("MODÈL=org/name", "is not a variable name"),
    ("MODEL=", "no repo after '='"),
    ("MODEL=:x", "no repo after '='"),
    ("MODEL=org/name:", "empty pattern after ':'"),
    ("MODEL=org/name@", "empty revision"),
    ("MODEL=org/name@../x", "invalid revision"),
    ("MODEL=a/b/c", "invalid repo id"),
    ("MODEL=org/name:" + "*" * 257, "PATTERN is 257 characters long"),
    ("MODEL=org/name:a\nb", "control or invisible character"),
])
def test_parse_path_var_refuses(text, message):
    with pytest.raises(UsageError, match=message) as info:
        parse_path_var(text)
    assert info.value.exit_code == 2 and info.value.hint


def test_parse_spec_types_and_defaults():
    assert parse_spec("org/name") == WarmRequest("org/name")
    assert parse_spec("datasets/org/name@v2") == WarmRequest("org/name", "v2", repo_type="dataset")
    assert parse_spec("kernels/org/k").repo_type == "kernel"
    assert parse_spec("org/name", "dataset").repo_type == "dataset"
    assert parse_spec("datasets/squad").repo_id == "squad"
    with pytest.raises(UsageError, match="names a dataset repo"):
        parse_spec("datasets/org/name", "kernel")
    with pytest.raises(UsageError, match="invalid repo spec"):
        parse_spec("")


def test_check_pattern():
    assert check_pattern("*Q8_0*.gguf") == "*Q8_0*.gguf"
    for bad in ("", "x" * 300, "a\x1bb", "a\u202eb"):
        with pytest.raises(UsageError):
            check_pattern(bad)


def test_warm_command_is_shell_quoted(tmp_path):
    cache = tmp_path / "a cache"
    assert warm_command(cache, WarmRequest("org/m", "v1")) == f"hfcache warm org/m@v1 --cache-dir '{cache}' --kind model"
    assert warm_command(cache, WarmRequest("org/m"), "*Q8_0*") == f"hfcache warm org/m --cache-dir '{cache}' --include '*Q8_0*'"
    assert warm_command(cache, WarmRequest("org/d", repo_type="dataset"), "*.csv") == (
        f"hfcache warm org/d --cache-dir '{cache}' --repo-type dataset --kind all --include '*.csv'")


def test_one(tmp_path):
    snap = tmp_path / "s"
    one = ResolvedPath("o/n", "main", "a" * 40, snap, (snap / "x.gguf",), pattern="*.gguf")
    assert one.one() == snap / "x.gguf"
    many = ResolvedPath("o/n", "main", "a" * 40, snap, (snap / "a.gguf", snap / "b.gguf"), pattern="*.gguf")
    with pytest.raises(AmbiguousPath, match=r"2 files match '\*.gguf' in o/n@main, expected exactly one: a.gguf, "
                                            "b.gguf") as info:
        many.one()
    assert isinstance(info.value, CheckFailed) and info.value.exit_code == 1
    with pytest.raises(UsageError):
        ResolvedPath("o/n", "main", "a" * 40, snap).one()


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory, hub_root):
    import json

    from tests.testhub import HubServer

    cache = tmp_path_factory.mktemp("paths") / "hub"
    with HubServer(hub_root, legacy_ids=json.loads((hub_root / "legacy_ids.json").read_text())) as server:
        report = hfcache.warm([WarmRequest.parse(BERT)], cache_dir=cache, endpoint=server.endpoint, token=False)
    assert report.ok, report
    return cache


def test_resolve_in_process(warm_cache):
    got = resolve(warm_cache, BERT, "*.json")
    assert got.snapshot.parent.parent.name == "models--bert-base-uncased" and got.snapshot.is_absolute()
    assert [p.name for p in got.files] == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert all(p.parent == got.snapshot and p.is_file() for p in got.files)
    assert resolve(warm_cache, f"{BERT}@{got.commit_hash}") == ResolvedPath(BERT, got.commit_hash, got.commit_hash,
                                                                           got.snapshot)
    assert resolve(warm_cache, CANON, "vocab.txt").one().read_text().startswith("[PAD]")
    assert resolve(warm_cache, BERT, "tokenizer.json").one() == got.snapshot / "tokenizer.json"


@pytest.mark.parametrize("spec, pattern, missing, message", [
    ("org/absent", None, "repo", "no folder models--org--absent"),
    (f"{BERT}@v9", None, "ref", "has no ref 'v9'"),
    (f"{BERT}@{'f' * 40}", None, "snapshot", "is not in the cache"),
    (BERT, "*.gguf", "file", "no file matching '*.gguf'"),
    (BERT, "added_tokens.json", "file", "the repo lacks it"),
])
def test_resolve_names_what_is_missing(warm_cache, spec, pattern, missing, message):
    with pytest.raises(PathNotCached, match=message.replace("*", r"\*").replace(".", r"\.")) as info:
        resolve(warm_cache, spec, pattern)
    assert info.value.missing == missing and info.value.exit_code == 1
    if missing != "file" or pattern == "*.gguf":
        assert info.value.warm_command.startswith("hfcache warm ") and info.value.hint.endswith(
            info.value.warm_command)
    else:
        assert info.value.warm_command is None
