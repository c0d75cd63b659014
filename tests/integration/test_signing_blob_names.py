"""Every path that hashes cache content for a signature checks it against its blob name first (docs/security.md):
``hfcache sign`` used to hash a git-sha1 blob's current bytes without that check, so in a shared cache a group member
appended code to a custom tokenizer's blob, root's ``sign`` signed it and ``verify --signature --rehash`` said ok, while
plain ``verify`` and ``push --sign-key`` refused the same cache. Now ``sign`` refuses it as ``push --sign-key`` does
(exit 5, naming the file, no bundle written), ``verify --signature`` reports it as changed (exit 1) as plain ``verify``
does, and ``pull --verify-key`` refuses a target blob that does not hold its name's content (exit 1).

The member is a real other uid (tests/users.py, ``setpriv``: root only); the pulls use a real registry
(tests/registry.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import attach_signature, key_pair, signed_files, snapshot_files, tree
from tests.canary import Canary
from tests.helpers import clean_env, one_error_line, run_hfcache
from tests.make_model_repos import ACME, ACME_FOLDER, APPENDED, CODE
from tests.registry import available, member, push_tar, running_registry
from tests.shared_cache import shared_cache
from tests.testhub import HubServer
from tests.users import ALICE, needs_root

HUB = Path(__file__).parent.parent / "data" / "hub"
GPT2_REPO = "openai-community/gpt2"
GPT2 = "models--openai-community--gpt2"
registry_needed = pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))



@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if available() is not None and not os.environ.get("CI"):
        pytest.skip(str(available()))
    with running_registry(tmp_path_factory.mktemp("names-registry")) as reg:
        yield reg


@needs_root
def test_sign_refuses_a_blob_a_member_appended_code_to(runtime, model_repos_root, registry, tmp_path) -> None:
    cache = shared_cache(runtime, "sign-tampered")
    with HubServer(model_repos_root) as server:
        assert hfcache.warm([WarmRequest.parse(ACME, kind="tokenizer")], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok
    (snapshot,) = (cache / ACME_FOLDER / "snapshots").iterdir()
    blob = cache / ACME_FOLDER / "blobs" / os.readlink(snapshot / CODE).rsplit("/", 1)[1]
    private, public = key_pair(tmp_path / "keys", "root")
    good = tmp_path / "good.sig.json"
    sign = ["sign", ACME, "--key", str(private), "--cache-dir", str(cache)]
    assert run_hfcache([*sign, "--output", str(good)]).returncode == 0
    # Alice, a member of the cache's group, appends code to the custom tokenizer's blob (group-writable)
    appended = runtime.run(ALICE, ["-c", f"open({str(blob)!r}, 'ab').write({APPENDED!r})"])
    assert appended.returncode == 0, appended.stderr
    assert blob.read_bytes().endswith(APPENDED)
    canary = Canary(tmp_path)
    for extra in ((), ("--rehash",)):
        out = tmp_path / f"tampered{len(extra)}.sig.json"
        one_error_line(run_hfcache([*sign, "--output", str(out), *extra]), 5, CODE, "does not match its blob name",
                       "nothing was signed")
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
        # verify --signature calls it what plain verify calls it: a changed file (exit 1), never "ok"
        proc = run_hfcache(["verify", ACME, "--signature", str(good), "--verify-key", str(public), "--cache-dir",
                            str(cache), "--json", *extra])
        assert proc.returncode == 1 and json.loads(proc.stdout)["changed"] == [CODE], proc.stdout + proc.stderr
        assert "no longer matches its blob name" in proc.stderr
    assert run_hfcache(["verify", "--cache-dir", str(cache)]).returncode == 1
    # push --sign-key refuses the same cache with the same exit code, before anything is pushed
    pushed = run_hfcache(["push", f"{registry.host}/names/acme:v1", ACME, "--cache-dir", str(cache), "--plain-http",
                          "--format", "modelpack", "--sign-key", str(private)], env=clean_env(HOME=str(tmp_path)))
    one_error_line(pushed, 5, f"blobs/{blob.name}", "does not match its name", "nothing pushed")
    canary.assert_unchanged()


# --- pull --verify-key: a target blob the image links to without bringing it ---------------------------------------


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("names-seed") / "cache"
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse(GPT2_REPO)], cache_dir=root, endpoint=server.endpoint, token=False).ok
    return root


def _pull(ref: str, target: Path, public: Path):
    return run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--verify-key", str(public)],
                       env=clean_env(HOME=str(target.parent / "home")))


@registry_needed
def test_a_linked_target_blob_holding_other_bytes_is_refused_though_they_are_the_signed_ones(seed, registry, tmp_path):
    """The image links config.json to the target's merges.txt blob (not brought), which a member rewrote with
    config.json's signed bytes: the sha256 the signature saw was right, so the pull "verified" and published a
    snapshot whose config.json is a blob named for other content. Its name is checked now: exit 1, nothing written."""
    commit, files = snapshot_files(seed)
    by_path = {path: (data, etag) for path, data, etag in files}
    merges_etag = by_path["merges.txt"][1]
    members = [member(f"{GPT2}/blobs/{etag}", data) for path, data, etag in files if path != "merges.txt"]
    members += [member(f"{GPT2}/snapshots/{commit}/{path}",
                       link=f"../../blobs/{merges_etag if path == 'config.json' else etag}") for path, _, etag in files]
    members.append(member(f"{GPT2}/refs/main", commit.encode()))
    private, public = key_pair(tmp_path / "keys", "team")
    ref = push_tar(registry.host, "names/linked", members)
    attach_signature(ref, {**signed_files(seed), "merges.txt": hashlib.sha256(by_path["merges.txt"][0]).hexdigest()},
                       private)
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)  # the target holds gpt2's blobs, no snapshot of it
    for part in ("snapshots", "refs"):
        shutil.rmtree(target / GPT2 / part)
    (target / GPT2 / "blobs" / merges_etag).write_bytes(by_path["config.json"][0])  # the member's rewrite
    before, canary = tree(target), Canary(tmp_path)
    one_error_line(_pull(ref, target, public), 1, f"the target's {GPT2}/blobs/{merges_etag} does not hold the "
                   "content its blob name", "changed on disk")
    assert tree(target) == before
    canary.assert_unchanged()


@registry_needed
def test_a_held_snapshot_file_whose_blob_changed_is_refused_by_name(seed, registry, tmp_path):
    """The target's snapshot of the pulled commit holds vocab.json, which the image does not bring; its blob was
    edited in place. The snapshot after the pull is what the signature covers: refused naming the blob."""
    commit, files = snapshot_files(seed)
    private, public = key_pair(tmp_path / "keys", "team")
    kept = [(p, d, e) for p, d, e in files if p != "vocab.json"]
    members = [member(f"{GPT2}/blobs/{etag}", data) for _, data, etag in kept]
    members += [member(f"{GPT2}/snapshots/{commit}/{path}", link=f"../../blobs/{etag}") for path, _, etag in kept]
    ref = push_tar(registry.host, "names/held", members)
    attach_signature(ref, signed_files(seed), private)
    target = tmp_path / "target"
    shutil.copytree(seed, target, symlinks=True)
    vocab = (target / GPT2 / "snapshots" / commit / "vocab.json").resolve()
    vocab.write_bytes(vocab.read_bytes().replace(b'"!"', b'"?"', 1))
    before = tree(target)
    one_error_line(_pull(ref, target, public), 1, f"snapshots/{commit}/vocab.json does not hold the content its "
                   "blob name")
    assert tree(target) == before
