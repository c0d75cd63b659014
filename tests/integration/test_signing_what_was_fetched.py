"""A signer signs only what the cache proves was fetched (docs/security.md, the signing rows): three ways
around it, built as an attacker would. In a shared cache (tests/users.py: root-owned, group 4100, 2775) Alice, a
member (uid 4101), edits the custom tokenizer code of a warmed repo:

- a record rewritten: a copy with code added, stored as ``blobs/<its own git sha1>``, the snapshot link re-pointed to it and warm's
  group-writable record rewritten to match. ``sign --lock`` and ``push --lock --sign-key`` signed it (exit 0) though
  the lock pins another hash; ``verify --lock`` said exit 1. Now: exit 5, naming the file, nothing signed or pushed.
- the record left alone: the same blob and link: ``sign``/``sign --rehash``/``push --sign-key`` signed it while
  plain ``verify`` said exit 1. Now exit 5, and ``verify --signature`` of a bundle another tool signed over it: exit 1.
- no record: the link replaced by an edited real file, the record deleted or that path's entry removed: ``sign`` signed it
  unchecked. Now exit 5 ("nothing proves it is what was fetched").

The pushes go to a real registry (tests/registry.py); bundles written by ``model_signing``'s own CLI stand for the
bundles the unfixed ``sign`` wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import key_pair
from tests.canary import Canary
from tests.helpers import clean_env, one_error_line, run_hfcache
from tests.make_model_repos import ACME, ACME_FOLDER, APPENDED, CODE
from tests.registry import available, running_registry
from tests.shared_cache import shared_cache
from tests.testhub import HubServer
from tests.users import ALICE, needs_root

MODEL_SIGNING = str(Path(sys.executable).with_name("model_signing"))

#: Alice's edit (python -c, as uid 4101): argv = repo folder, commit, what to do with the record (keep, match,
#: delete, drop), and the form of the edited code (link: a new blob named by its git sha1; file: a real file).
EDIT = r"""
import hashlib, json, os, sys
folder, commit, record_mode, form = sys.argv[1:5]
snapshot = os.path.join(folder, "snapshots", commit)
code = os.path.join(snapshot, "tokenization_acme.py")
data = open(code, "rb").read() + b"\nimport os\nos.system('id > /tmp/hfcache-owned')\n"
sha1 = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
os.unlink(code)
if form == "link":
    with open(os.path.join(folder, "blobs", sha1), "wb") as f:
        f.write(data)
    os.symlink("../../blobs/" + sha1, code)
else:
    with open(code, "wb") as f:
        f.write(data)
record = os.path.join(os.path.dirname(folder), ".locks", os.path.basename(folder), "hfcache",
                      commit + ".json")
if record_mode == "delete":
    os.unlink(record)
elif record_mode in ("match", "drop"):
    doc = json.load(open(record))
    if record_mode == "match":
        doc["files"]["tokenization_acme.py"] = {"hash": "git-sha1:" + sha1, "size": len(data)}
    else:
        del doc["files"]["tokenization_acme.py"]
    with open(record, "w") as f:  # in place: the record is group-writable in a shared cache
        json.dump(doc, f)
print(sha1)
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if available() is not None and not os.environ.get("CI"):
        pytest.skip(str(available()))
    with running_registry(tmp_path_factory.mktemp("fetched-registry")) as reg:
        yield reg


@pytest.fixture
def warmed(runtime, model_repos_root, tmp_path):
    """(the shared cache holding the warmed acme tokenizer, its snapshot, the project's lock of it)."""
    cache = shared_cache(runtime, f"fetched-{tmp_path.name}")
    with HubServer(model_repos_root) as server:
        assert hfcache.warm([WarmRequest.parse(ACME, kind="tokenizer")], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok
        project = tmp_path / "project"
        project.mkdir()
        (project / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\n[[repos]]\nrepo_id = "{ACME}"\n')
        locked = run_hfcache(["lock"], cwd=project)
        assert locked.returncode == 0, locked.stderr
    (snapshot,) = (cache / ACME_FOLDER / "snapshots").iterdir()
    return cache, snapshot, project / "hfcache.lock"


def alice_edits(runtime, cache: Path, snapshot: Path, record: str, form: str = "link") -> str:
    proc = runtime.run(ALICE, ["-c", EDIT, str(cache / ACME_FOLDER), snapshot.name, record, form])
    assert proc.returncode == 0, proc.stderr
    assert (snapshot / CODE).read_bytes().endswith(APPENDED)
    return proc.stdout.strip()


def sign(cache: Path, key: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["sign", *args, "--key", str(key), "--cache-dir", str(cache), "--output", str(out)])


def push(registry, name: str, cache: Path, key: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["push", f"{registry.host}/{name}:v1", *args, "--cache-dir", str(cache), "--plain-http",
                        "--sign-key", str(key)], env=clean_env(HOME=str(home)), timeout=300)


def tags(registry, name: str) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://{registry.host}/v2/{name}/tags/list", timeout=30) as answer:
            return json.loads(answer.read()).get("tags") or []
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        return []


def forged_bundle(snapshot: Path, key: Path, out: Path) -> Path:
    """A bundle over the snapshot as it is, written by model_signing's CLI (as the unfixed ``sign`` wrote one)."""
    proc = subprocess.run([MODEL_SIGNING, "sign", "key", "--private_key", str(key), "--signature", str(out),
                           "--allow_symlinks", str(snapshot)], check=False, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def verify_signature(cache: Path, bundle: Path, public: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["verify", ACME, "--signature", str(bundle), "--verify-key", str(public), "--cache-dir",
                        str(cache), *extra])


@needs_root
def test_sign_and_push_with_a_lock_refuse_content_the_lock_contradicts(warmed, runtime, registry, tmp_path):
    """The record rewritten to match Alice's blob; only the lock still pins the fetched hash."""
    cache, snapshot, lock = warmed
    private, _public = key_pair(tmp_path / "keys", "root")
    out = tmp_path / "bundles"
    out.mkdir()
    # before the edit, the lock's snapshot signs and pushes
    assert sign(cache, private, out, "--lock", str(lock)).returncode == 0
    assert push(registry, "fetched/locked-ok", cache, private, "--lock", str(lock), home=tmp_path).returncode == 0
    for bundle in out.iterdir():
        bundle.unlink()
    sha1 = alice_edits(runtime, cache, snapshot, "match")
    canary = Canary(tmp_path)
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 0  # the record agrees with Alice now
    assert run_hfcache(["verify", "--cache-dir", str(cache), "--lock", str(lock)]).returncode == 1
    for extra in ((), ("--rehash",)):
        line = one_error_line(sign(cache, private, out, "--lock", str(lock), *extra), 5, f"snapshots/{snapshot.name}/"
                              f"{CODE}", f"links to blob {sha1}", "the lock expects", "nothing was signed")
        assert line.count(CODE) == 1
        assert list(out.iterdir()) == []
    for fmt in ("image", "modelpack"):
        name = f"fetched/locked-{fmt}"
        one_error_line(push(registry, name, cache, private, "--lock", str(lock), "--format", fmt, home=tmp_path), 5,
                       CODE, f"links to blob {sha1}", "the lock expects")
        assert tags(registry, name) == []  # refused before any manifest was written
    canary.assert_unchanged()


@needs_root
def test_sign_refuses_a_link_that_contradicts_warms_record(warmed, runtime, registry, tmp_path):
    """The new blob and re-pointed link, the record left alone (plain verify: exit 1)."""
    cache, snapshot, _lock = warmed
    private, public = key_pair(tmp_path / "keys", "root")
    out = tmp_path / "bundles"
    out.mkdir()
    sha1 = alice_edits(runtime, cache, snapshot, "keep")
    canary = Canary(tmp_path)
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 1
    for extra in ((), ("--rehash",)):
        one_error_line(sign(cache, private, out, ACME, *extra), 5, CODE, f"links to blob {sha1}",
                       "the warm record expects", "nothing was signed")
        assert list(out.iterdir()) == []
    for fmt in ("image", "modelpack"):
        name = f"fetched/record-{fmt}"
        one_error_line(push(registry, name, cache, private, ACME, "--format", fmt, home=tmp_path), 5, CODE,
                       "the warm record expects")
        assert tags(registry, name) == []
    # a bundle over Alice's snapshot that another signer wrote verifies as a signature, not as what was fetched
    forged = forged_bundle(snapshot, private, tmp_path / "forged.sig")
    for extra in ((), ("--rehash",)):
        proc = verify_signature(cache, forged, public, "--json", *extra)
        assert proc.returncode == 1 and json.loads(proc.stdout)["changed"] == [CODE], proc.stdout + proc.stderr
        assert "the warm record expects" in proc.stderr and "not verified" in proc.stderr
    canary.assert_unchanged()


@needs_root
@pytest.mark.parametrize("record", ["delete", "drop"])
def test_a_real_file_nothing_names_is_never_signed(warmed, runtime, registry, tmp_path, record):
    """The link replaced by an edited real file; the record deleted, or its entry for that path removed."""
    cache, snapshot, _lock = warmed
    private, public = key_pair(tmp_path / "keys", "root")
    out = tmp_path / "bundles"
    out.mkdir()
    alice_edits(runtime, cache, snapshot, record, form="file")
    canary = Canary(tmp_path)
    report = json.loads(run_hfcache(["verify", "--cache-dir", str(cache), "--json"]).stdout)
    assert (CODE, "unverified") in {(p["path"], p["kind"]) for p in report["problems"]}  # verify's own word for it
    for extra in ((), ("--rehash",)):
        one_error_line(sign(cache, private, out, ACME, *extra), 5, f"snapshots/{snapshot.name}/{CODE}",
                       "nothing proves it is what was fetched", "nothing was signed")
        assert list(out.iterdir()) == []
    one_error_line(push(registry, f"fetched/real-{record}", cache, private, ACME, "--format", "modelpack",
                        home=tmp_path), 5, CODE, "nothing proves it is what was fetched")
    assert tags(registry, f"fetched/real-{record}") == []
    forged = forged_bundle(snapshot, private, tmp_path / "forged.sig")
    proc = verify_signature(cache, forged, public, "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["changed"] == [CODE], proc.stdout + proc.stderr
    canary.assert_unchanged()
