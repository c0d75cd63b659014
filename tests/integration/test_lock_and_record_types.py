"""Every field of a lock, a manifest and a cache's own JSON is type-checked where it is read: a value of another
TOML/JSON type (a table where a string is due, a float or a date where an integer is, a 5,000-digit integer, a
huge string, nesting past 64 levels) is one clear ``hfcache: error:`` line with the documented exit code, never exit
70 or a traceback. Locks and manifests are the user's files: exit 2. Records and listings are cache content: the
revision's own finding (``verify`` exit 1) or ignored, never a crash.

Each document is written to ``tmp_path`` with every path of a valid one substituted in turn (tests/mutations.py),
and the real command reads it: ``warm --lock`` (a lock), ``lock`` (a manifest, a ``pyproject.toml``), ``verify``
and ``verify --fast`` (warm's record ``.locks/<folder>/hfcache/<commit>.json``, a ``trees/<commit>.json`` listing,
the ``--fast`` record). A few hundred cases in-process, a few as subprocesses.

What escaped before (exit 70): a ``pyproject.toml`` whose ``tool`` is not a table (``tool = 1``: TypeError;
``tool = ["hfcache"]``: AttributeError); an integer of over 4,300 digits anywhere in a lock or manifest (Python's
int() limit, a ValueError that is not a TOMLDecodeError); a ``trees/<commit>.json`` entry whose ``blob_id`` is
not a string (``verify``: TypeError). Values were also quoted whole (a 5,000-character error line).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import tomli_w

from tests.helpers import clean_env, run_hfcache
from tests.mutations import JSON_VALUES, TOML_VALUES, label, mutations, problems, run_cli

C = hashlib.sha1(b"locked commit").hexdigest()  # a commit id
REFUSED = "http://127.0.0.1:9"  # nothing listens: a valid document ends at the network, exit 3
LOCK = {"version": 1, "repos": [{
    "repo_id": "org/x", "revision": "main", "repo_type": "model", "kind": "tokenizer", "include": ["*.json"],
    "exclude": ["x/*"], "canonical_id": "org/x", "commit_hash": C, "absent": ["special_tokens_map.json"],
    "files": [{"path": "tokenizer.json", "size": 96, "hash": "git-sha1:" + "a" * 40}]}]}
MANIFEST = {"endpoint": REFUSED, "cache_dir": "cache", "repos": [{
    "repo_id": "org/x", "revision": "main", "kind": "tokenizer", "include": ["*.json"], "exclude": ["x/*"],
    "repo_type": "model"}]}
#: Raw TOML no dict round-trips: integers past int()'s 4,300-digit limit, a key table where an array of tables is.
BIG = "1" * 5000
RAW_LOCKS = (f"version = {BIG}\n", f"version = 1\n[[repos]]\nrepo_id = \"org/x\"\ncommit_hash = {BIG}\n",
             "version = 1\nrepos = 5\n", "version = 1\n[repos]\nrepo_id = \"org/x\"\n", "version = 1e400\n")
RAW_MANIFESTS = (f"[[repos]]\nrepo_id = \"org/x\"\nrevision = {BIG}\n", f"endpoint = {BIG}\n",
                 "[repos]\nrepo_id = 5\n", "repos = [[[[1]]]]\n")
RAW_PYPROJECTS = ("tool = 1\n", "tool = \"hfcache\"\n", "tool = [\"hfcache\"]\n", "[tool]\nhfcache = 1\n",
                  "[tool]\nhfcache = [\"x\"]\n", f"[tool.hfcache]\nrepos = {BIG}\n", "tool = 1979-05-27\n")
FOLDER = "models--google-bert--bert-base-uncased"


def _check(cases, allowed) -> None:
    found = []
    for case, (code, _, stderr) in cases:
        found += problems(case, code, stderr, allowed)
    assert not found, "\n".join(found[:20]) + f"\n({len(found)} problems in {len(cases)} cases)"


def _toml(doc: object) -> str | None:
    try:
        return tomli_w.dumps(doc)
    except (TypeError, ValueError):  # not a table at the top, or a value TOML cannot hold (None): no case
        return None


def test_lock_fields_of_every_type(tmp_path):
    """``warm --lock``: every field of a lock (~250 cases, plus raw TOML): exit 2 naming the field, or 3 at the
    network for a substitute that is still a valid lock."""
    cases = []
    texts = [(f"lock {label(p, v)}", _toml(doc)) for p, v, doc in mutations(LOCK, TOML_VALUES)]
    texts += [(f"lock raw {raw[:30]!r}", raw) for raw in RAW_LOCKS]
    for i, (case, text) in enumerate(t for t in texts if t[1] is not None):
        lock = tmp_path / f"l{i}" / "hfcache.lock"
        lock.parent.mkdir()
        lock.write_text(text)
        cases.append((case, run_cli(["warm", "--lock", str(lock), "--cache-dir", str(tmp_path / "cache"),
                                     "--endpoint", REFUSED, "--retries", "0"])))
    assert len(cases) > 200
    _check(cases, (0, 2, 3))  # 0: a lock that pins nothing (repos deleted)


@pytest.mark.parametrize("name", ["hfcache.toml", "pyproject.toml"])
def test_manifest_fields_of_every_type(tmp_path, name):
    """``lock``: every field of ``hfcache.toml`` and of ``[tool.hfcache]`` (~140 cases each, plus raw TOML)."""
    base = MANIFEST if name == "hfcache.toml" else {"tool": {"hfcache": MANIFEST}}
    texts = [(f"{name} {label(p, v)}", _toml(doc)) for p, v, doc in mutations(base, TOML_VALUES)]
    texts += [(f"{name} raw {raw[:30]!r}", raw) for raw in (RAW_MANIFESTS if name == "hfcache.toml" else
                                                           RAW_PYPROJECTS)]
    cases = []
    for i, (case, text) in enumerate(t for t in texts if t[1] is not None):
        project = tmp_path / f"p{i}"
        project.mkdir()
        (project / name).write_text(text)
        cases.append((case, run_cli(["lock", "--manifest", str(project / name), "--retries", "0"])))
    assert len(cases) > 100
    _check(cases, (2, 3))


@pytest.fixture(scope="module")
def warmed(hub_root, tmp_path_factory):
    """A cache with bert-base-uncased's tokenizer warmed from the test Hub, and its commit."""
    from tests.testhub import HubServer

    cache = tmp_path_factory.mktemp("typed") / "cache"
    with HubServer(hub_root) as hub:
        code, _, err = run_cli(["warm", "google-bert/bert-base-uncased", "--cache-dir", str(cache),
                                "--endpoint", hub.endpoint])
    assert code == 0, err
    return cache, (cache / FOLDER / "refs" / "main").read_text()


def _record_path(cache: Path, commit: str) -> Path:
    return cache / ".locks" / FOLDER / "hfcache" / f"{commit}.json"


def test_warm_record_and_trees_listing_fields_of_every_type(warmed):
    """``verify`` against warm's record, then against a ``trees/`` listing (the record removed): every field of
    each (~200 cases). A bad record or listing is ignored or the revision's finding (exit 0/1), never 70."""
    cache, commit = warmed
    record_file = _record_path(cache, commit)
    original = record_file.read_bytes()
    record = json.loads(original)
    first = sorted(record["files"])[0]
    small = {**record, "files": {first: record["files"][first]}, "absent": record["absent"][:1]}
    entry = record["files"][first]
    listing = {"format_version": 1, "files": {first: {"size": entry["size"], "blob_id": entry["hash"].split(":")[1],
                                                      "lfs_sha256": None, "lfs_size": None}}}
    trees = cache / FOLDER / "trees" / f"{commit}.json"
    cases = []
    try:
        for path, value, doc in mutations(small, JSON_VALUES, skip=[("format",), ("version",)]):
            record_file.write_text(json.dumps(doc))
            cases.append((f"record {label(path, value)}", run_cli(["verify", "--cache-dir", str(cache)])))
        record_file.unlink()
        trees.parent.mkdir(exist_ok=True)
        for path, value, doc in mutations(listing, JSON_VALUES):
            trees.write_text(json.dumps(doc))
            cases.append((f"trees {label(path, value)}", run_cli(["verify", "--cache-dir", str(cache)])))
    finally:
        trees.unlink(missing_ok=True)
        record_file.write_bytes(original)
    assert len(cases) > 150
    _check(cases, (0, 1))


def test_verify_fast_record_fields_of_every_type(warmed):
    """``verify --fast``'s own record (``.locks/hfcache-verified.json``): every field; a malformed one is ignored
    with a note and every blob is hashed (exit 0)."""
    cache, _ = warmed
    assert run_cli(["verify", "--fast", "--cache-dir", str(cache)])[0] == 0
    record_file = cache / ".locks" / "hfcache-verified.json"
    original = record_file.read_bytes()
    record = json.loads(original)
    small = {**record, "blobs": record["blobs"][:1]}
    cases = []
    try:
        for path, value, doc in mutations(small, JSON_VALUES):
            record_file.write_text(json.dumps(doc))
            record_file.chmod(0o644)
            cases.append((f"fast {label(path, value)}", run_cli(["verify", "--fast", "--cache-dir", str(cache)])))
    finally:
        record_file.write_bytes(original)
    assert len(cases) > 50
    _check(cases, (0,))


@pytest.mark.parametrize(("name", "text", "args"), [
    ("pyproject.toml", "tool = 1\n", ["lock"]),
    ("hfcache.lock", f"version = {BIG}\n", ["warm", "--lock", "hfcache.lock", "--cache-dir", "cache"]),
])
def test_documents_that_were_exit_70_as_a_subprocess(tmp_path, name, text, args):
    """Two of the cases that were exit 70, through ``python -m hfcache`` itself: exit 2 naming the file."""
    (tmp_path / name).write_text(text)
    if name == "hfcache.lock":
        (tmp_path / "hfcache.toml").write_text('[[repos]]\nrepo_id = "org/x"\n')
    proc = run_hfcache(args, cwd=tmp_path, env=clean_env())
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert name in proc.stderr.splitlines()[0] or "no hfcache.toml" in proc.stderr, proc.stderr


def test_a_trees_listing_blob_id_of_another_type_as_a_subprocess(warmed, tmp_path):
    """``verify`` on a listing whose ``blob_id`` is a number (was exit 70: TypeError slicing it)."""
    cache = tmp_path / "cache"
    shutil.copytree(warmed[0], cache, symlinks=True)
    commit = warmed[1]
    record = json.loads(_record_path(cache, commit).read_text())
    _record_path(cache, commit).unlink()
    listing = {"format_version": 1, "files": {p: {"size": e["size"], "blob_id": 5} for p, e in record["files"].items()}}
    (cache / FOLDER / "trees").mkdir(exist_ok=True)
    (cache / FOLDER / "trees" / f"{commit}.json").write_text(json.dumps(listing))
    proc = run_hfcache(["verify", "--cache-dir", str(cache)], env=clean_env())
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
