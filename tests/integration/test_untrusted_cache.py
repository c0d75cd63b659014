"""Untrusted cache layouts and endpoint answers never make hfcache act outside the cache.

Every test builds its hostile input itself (symlinked repo parts in tmp dirs, hostile Hub handlers on loopback),
runs hfcache as a real subprocess (or its public API), and asserts the exit code and message, that a canary folder
outside the cache is byte-for-byte unchanged with no new file in it, and that the cache still verifies.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from tests.helpers import run_hfcache
from tests.hostile import PeerServer, git_sha1, send
from tests.testhub import HubServer
from tests.untrusted import FOLDER, HUB, REPO, make_canary, tree_state, verify, warm_two

OTHER_FOLDER = "models--FacebookAI--roberta-base"


# ----------------------------------------------------------------------------------------------------- helpers


def plant(cache: Path, canary: Path, part: str) -> tuple[Path, Path]:
    """Move ``part`` of the cache into the canary folder and leave a symlink to it in its place.

    Returns (the link in the cache, where the real content now is). An extra valid-looking blob and ref are added to
    the moved content, so a command following the link would have something to delete or rewrite.
    """
    where = {"repo": cache / FOLDER, ".locks": cache / ".locks", ".locks/<folder>": cache / ".locks" / FOLDER}
    link = where.get(part, cache / FOLDER / part)
    target = canary / (part.replace("/", "_").replace("<", "").replace(">", "") or "part")
    if link.exists():
        shutil.move(str(link), str(target))
    else:
        target.mkdir()
    if part == "blobs":
        orphan = b"an orphan blob outside the cache\n"
        (target / git_sha1(orphan)).write_bytes(orphan)
    if part == "refs":
        (target / "orphan-branch").write_text("0" * 40)
    link.symlink_to(target, target_is_directory=True)
    return link, target


def unplant(link: Path, target: Path, canary_extra: set[str]) -> None:
    """Undo :func:`plant` (the extra files added to the moved content are removed first)."""
    link.unlink()
    for name in canary_extra:
        (target / name).unlink(missing_ok=True)
    shutil.move(str(target), str(link))


def write_manifest(folder: Path, endpoint: str, cache: str) -> Path:
    folder.mkdir()
    (folder / "hfcache.toml").write_text(f'endpoint = "{endpoint}"\ncache_dir = "{cache}"\n\n'
                                         f'[[repos]]\nrepo_id = "{REPO}"\n')
    return folder



# ------------------------------------------------------------------------------------------- planted links

PARTS = ["blobs", "refs", "snapshots", ".no_exist", "trees", ".locks/<folder>", "repo", ".locks"]


def test_prune_and_verify_never_act_through_a_symlinked_blobs_folder(tmp_path: Path) -> None:
    """The reported fault: `prune --yes` deleted the files of a directory that `blobs/` linked to."""
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    warm_two(cache)
    link, target = plant(cache, canary, "blobs")
    before = tree_state(canary)

    proc = run_hfcache(["prune", "--cache-dir", str(cache), "--yes", "--json"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert any(FOLDER in w and "blobs: a symlink" in w for w in report["warnings"]), report["warnings"]
    assert not [i for i in report["items"] if i["repo_id"] == REPO]
    code, doc = verify(cache)
    assert code == 1
    errors = [(p["repo_id"], p["path"], p["kind"]) for p in doc["problems"] if p["error"]]
    assert errors == [(REPO, "blobs", "unsafe_layout")]
    assert tree_state(canary) == before

    unplant(link, target, {git_sha1(b"an orphan blob outside the cache\n")})
    assert verify(cache)[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("part", PARTS)
def test_every_command_leaves_a_symlinked_repo_part_alone(tmp_path: Path, part: str) -> None:
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    warm_two(cache)
    # An export of the healthy repo, to import into the planted cache later.
    tar = tmp_path / "healthy.tar"
    assert run_hfcache(["export", str(tar), REPO, "--cache-dir", str(cache), "--format", "tar"]).returncode == 0
    link, target = plant(cache, canary, part)
    extra = {git_sha1(b"an orphan blob outside the cache\n")} if part == "blobs" else (
        {"orphan-branch"} if part == "refs" else set())
    before = tree_state(canary)
    c = str(cache)

    with HubServer(HUB) as hub:
        runs = {
            "ls": run_hfcache(["ls", "--cache-dir", c, "--json"]),
            "verify": run_hfcache(["verify", "--cache-dir", c, "--json"]),
            "repair": run_hfcache(["verify", "--repair", "--cache-dir", c, "--endpoint", hub.endpoint, "--json"]),
            "prune": run_hfcache(["prune", "--cache-dir", c, "--yes", "--json"]),
            "warm": run_hfcache(["warm", REPO, "--cache-dir", c, "--endpoint", hub.endpoint]),
            # lock resolves only (it writes no cache); warm --lock then meets the planted link.
            "lock": run_hfcache(["lock"], cwd=write_manifest(tmp_path / "project", hub.endpoint, c)),
            "warm --lock": run_hfcache(["warm", "--lock", str(tmp_path / "project" / "hfcache.lock"),
                                        "--cache-dir", c, "--endpoint", hub.endpoint]),
            "export": run_hfcache(["export", str(tmp_path / "out.tar"), "--cache-dir", c, "--format", "tar"]),
            "link": run_hfcache(["link", c, str(tmp_path / "copy"), "--mode", "copy"]),
            "import": run_hfcache(["import", str(tar), "--cache-dir", c]),
        }
    with HubServer(cache, layout="cache") as mirror:
        try:
            urllib.request.urlopen(f"{mirror.endpoint}/api/models/{REPO}", timeout=30)  # loopback
            served = 200
        except urllib.error.HTTPError as exc:
            served = exc.code

    described = "a symlink"
    assert runs["lock"].returncode == 0, runs["lock"].stderr
    for name in ("warm", "warm --lock", "export", "link", "import"):
        assert runs[name].returncode == 5, (name, runs[name].returncode, runs[name].stderr)
        assert described in runs[name].stderr and "left alone" in runs[name].stderr, (name, runs[name].stderr)
    assert runs["ls"].returncode == 0
    health = {r["folder"]: r for r in json.loads(runs["ls"].stdout)["repos"]}
    assert described in json.dumps(health[FOLDER])
    assert runs["verify"].returncode == 1
    kinds = {(p["repo_id"], p["kind"]) for p in json.loads(runs["verify"].stdout)["problems"]}
    assert (REPO, "unsafe_layout") in kinds
    # A planted .locks (shared by every repo) stops repair before it starts; a planted repo part fails that repo.
    assert runs["repair"].returncode == (5 if part == ".locks" else 1), runs["repair"].stderr
    assert runs["prune"].returncode == 0, runs["prune"].stderr
    assert any(FOLDER in w for w in json.loads(runs["prune"].stdout)["warnings"])
    assert served == 404
    assert tree_state(canary) == before, part
    assert not (tmp_path / "copy").exists() and not (tmp_path / "out.tar").exists()

    unplant(link, target, extra)
    code, doc = verify(cache)
    assert code == 0, doc["problems"]
    assert not scan_cache_dir(cache).warnings


def test_a_symlinked_lock_file_is_never_opened(tmp_path: Path) -> None:
    """filelock opens with O_TRUNC: a `.locks/<folder>/<etag>.lock` planted as a link would truncate its target."""
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    warm_two(cache)
    locks = cache / ".locks" / FOLDER
    snapshot = next((cache / FOLDER / "snapshots").iterdir())
    etag = os.readlink(snapshot / "vocab.txt").rsplit("/", 1)[1]
    (cache / FOLDER / "blobs" / etag).unlink()  # so warm must download it again, under its lock
    (locks / f"{etag}.lock").unlink(missing_ok=True)
    (locks / f"{etag}.lock").symlink_to(canary / "precious.txt")
    before = tree_state(canary)
    with HubServer(HUB) as hub:
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint])
    assert proc.returncode == 5, proc.stderr
    assert f"{etag}.lock is a symlink" in proc.stderr
    assert tree_state(canary) == before


# --------------------------------------------------------------------------------------------- hostile endpoints

class ScriptedHub(PeerServer):
    """A Hub endpoint whose model info for ``h/<name>`` is given by the test (any JSON), with honest file bytes: the
    test Hub answers model info from the files it serves, this one whatever names and hashes the test makes up.

    ``repos``: repo id -> (model info dict, {path: bytes}). The resolve route serves the bytes of any commit.
    """

    def __init__(self, repos: dict[str, tuple[dict, dict[str, bytes]]]) -> None:
        self.repos = repos
        super().__init__()

    @property
    def requests(self) -> list[str]:
        return [path for _, path, _ in self.log]

    def _answer(self, h, head: bool) -> None:
        path = h.path.split("?")[0]
        for repo_id, (info, files) in self.repos.items():
            if path == f"/api/models/{repo_id}" or path.startswith(f"/api/models/{repo_id}/revision/"):
                return send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"})
            for name, data in files.items():
                if path.startswith(f"/{repo_id}/resolve/") and path.endswith("/" + name):
                    return send(h, 200, data, {"X-Repo-Commit": info["sha"], "ETag": f'"{git_sha1(data)}"'})
        send(h, 404, b"{}", {"X-Error-Code": "RepoNotFound"})


VOCAB = b"[PAD]\n[UNK]\nhello\n"
COMMIT = "c" * 40


def sibling(name: str, data: bytes, **extra) -> dict:
    return {"rfilename": name, "size": len(data), "blobId": git_sha1(data), **extra}


@pytest.mark.parametrize("field,value", [
    ("blobId", "../../../../canary/canary.txt"),
    ("blobId", "ABCDEF" + "0" * 34),  # uppercase: not a blob name hfcache or huggingface_hub writes
    ("blobId", "0" * 39),
    ("lfs", {"sha256": "../" * 6 + "canary/x", "size": 18, "pointerSize": 130}),
    ("lfs", {"sha256": "/" + "a" * 63, "size": 18, "pointerSize": 130}),
])
def test_warm_refuses_blob_names_that_are_not_hashes(tmp_path: Path, field: str, value) -> None:
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    before = tree_state(canary)
    info = {"id": "h/evil", "sha": COMMIT, "siblings": [{**sibling("vocab.txt", VOCAB), field: value},
                                                         sibling("config.json", b"{}")]}
    with ScriptedHub({"h/evil": (info, {"vocab.txt": VOCAB, "config.json": b"{}"})}) as hub:
        for _ in range(2):  # the second run is the one that linked an outside file on main
            proc = run_hfcache(["warm", "h/evil", "--cache-dir", str(cache), "--endpoint", hub.endpoint,
                                "--include", "vocab.txt"])
            assert proc.returncode == 3, proc.stderr
            assert hub.endpoint in proc.stderr
            shown = value["sha256"] if field == "lfs" else value
            assert repr(shown) in proc.stderr, proc.stderr
    assert tree_state(canary) == before
    assert not (cache / "models--h--evil").exists()
    assert not list((cache / ".locks").rglob("*.lock*")) or all(
        p.name == "hfcache-repo.lock" for p in (cache / ".locks").rglob("*.lock"))
    assert not cache.exists()  # every repo failed: the folder this warm made is gone (docs/warm.md)


def test_repo_folder_refuses_hostile_names_where_paths_are_built(tmp_path: Path) -> None:
    """The second line of defence: RepoFolder raises before any filesystem call, whoever passes the name."""
    from hfcache.cache.layout import RepoFolder
    from hfcache.cache.safefs import UnsafeName

    folder = RepoFolder(tmp_path, "h/x")
    for call in (lambda: folder.blob_path("../../x"), lambda: folder.blob_lock("A" * 40),
                 lambda: folder.pointer_path("../" + "a" * 37, "x"), lambda: folder.marker_path("a" * 40, "../x"),
                 lambda: folder.ref_path("../../x"), lambda: folder.ref_path("/etc/passwd"),
                 lambda: folder.write_ref("main", "not-a-commit"), lambda: folder.open_incomplete("x" * 40)):
        with pytest.raises(UnsafeName):
            call()
    assert list(tmp_path.iterdir()) == []


def test_an_endpoint_cannot_move_another_repos_ref(tmp_path: Path) -> None:
    """`h/canon2` answered as `google-bert/bert-base-uncased` at another commit: only `models--h--canon2` is written,
    its files come from `h/canon2`'s own URLs (the claimed repo serves none), and no other id is claimed."""
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    warm_two(cache)
    ref = cache / FOLDER / "refs" / "main"
    ref_before = ref.read_bytes()
    state_before = tree_state(cache / FOLDER)
    before = tree_state(canary)
    info = {"id": REPO, "sha": COMMIT, "siblings": [sibling("vocab.txt", VOCAB), sibling("config.json", b"{}")]}
    # The files only under the requested id: a client following the claimed id would find nothing (404).
    with ScriptedHub({"h/canon2": (info, {"vocab.txt": VOCAB, "config.json": b"{}"}), REPO: (info, {})}) as hub:
        proc = run_hfcache(["warm", "h/canon2", "--cache-dir", str(cache), "--endpoint", hub.endpoint, "--json"])
        text = run_hfcache(["warm", "h/canon2", "--cache-dir", str(cache), "--endpoint", hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["repos"][0]
    assert result["canonical_id"] in (None, "h/canon2") and result["notes"] == []
    assert text.returncode == 0 and REPO not in text.stdout + text.stderr, text.stdout
    assert ref.read_bytes() == ref_before
    assert tree_state(cache / FOLDER) == state_before
    assert (cache / "models--h--canon2" / "refs" / "main").read_text() == COMMIT
    assert tree_state(canary) == before
    assert verify(cache)[0] == 0
    assert not scan_cache_dir(cache).warnings


def test_a_null_file_listing_is_an_endpoint_fault(tmp_path: Path) -> None:
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    before = tree_state(canary)
    with ScriptedHub({"h/nolist": ({"id": "h/nolist", "sha": COMMIT, "siblings": None}, {})}) as hub:
        proc = run_hfcache(["warm", "h/nolist", "--cache-dir", str(cache), "--endpoint", hub.endpoint])
    assert proc.returncode == 3, proc.stderr
    assert f"{hub.endpoint} answered no file listing (siblings)" in proc.stderr
    assert tree_state(canary) == before


def test_a_legacy_id_moving_its_canonical_ref_says_so(tmp_path: Path) -> None:
    """Legacy ids are followed as on the Hub, and moving the canonical folder's ref is reported, not silent."""
    cache = tmp_path / "cache"
    warm_two(cache)
    ref = cache / FOLDER / "refs" / "main"
    old = ref.read_text()
    info = {"id": REPO, "sha": COMMIT, "siblings": [sibling("vocab.txt", VOCAB), sibling("config.json", b"{}")]}
    files = {"vocab.txt": VOCAB, "config.json": b"{}"}
    with ScriptedHub({"bert-base-uncased": (info, {}), REPO: (info, files)}) as hub:
        proc = run_hfcache(["warm", "bert-base-uncased", "--cache-dir", str(cache), "--endpoint", hub.endpoint,
                            "--json"])
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout)["repos"][0]["notes"]
    assert notes == [f"moved refs/main of {REPO} (not requested; the canonical id of bert-base-uncased) from "
                     f"{old[:12]} to {COMMIT[:12]}"]
    assert ref.read_text() == COMMIT
    assert verify(cache)[0] == 0


@pytest.mark.parametrize("paths", [("vocab.txt", "vocab.txt/inner.txt"), ("a/b", "a/b/c/d.txt")])
def test_a_listing_with_a_path_both_file_and_folder_publishes_nothing(tmp_path: Path, paths) -> None:
    cache, canary = tmp_path / "cache", make_canary(tmp_path)
    before = tree_state(canary)
    info = {"id": "h/both", "sha": COMMIT, "siblings": [sibling(p, VOCAB) for p in paths]}
    with ScriptedHub({"h/both": (info, {p.rsplit("/", 1)[-1]: VOCAB for p in paths})}) as hub:
        proc = run_hfcache(["warm", "h/both", "--cache-dir", str(cache), "--endpoint", hub.endpoint, "--kind", "all"])
    assert proc.returncode == 3, proc.stderr
    assert f"listed {paths[0]!r} as a file and as a folder" in proc.stderr
    folder = cache / "models--h--both"
    assert not list(folder.rglob("*")) if folder.exists() else True
    assert tree_state(canary) == before
    assert not cache.exists()  # every repo failed: the folder this warm made is gone (docs/warm.md)


def test_a_lock_with_a_path_both_file_and_folder_leaves_no_blob(tmp_path: Path) -> None:
    """The same check for `warm --lock`: a lock is input too, and the check runs before any download."""
    cache = tmp_path / "cache"
    lock = tmp_path / "hfcache.lock"
    files = "\n".join(f'[[repos.files]]\npath = "{p}"\nsize = {len(VOCAB)}\nhash = "git-sha1:{git_sha1(VOCAB)}"\n'
                      for p in ("x", "x/y"))
    lock.write_text(f'version = 1\n\n[[repos]]\nrepo_id = "h/both"\nrevision = "main"\nrepo_type = "model"\n'
                    f'kind = "tokenizer"\ncanonical_id = "h/both"\ncommit_hash = "{COMMIT}"\n\n{files}')
    info = {"id": "h/both", "sha": COMMIT, "siblings": []}
    with ScriptedHub({"h/both": (info, {"x": VOCAB, "y": VOCAB})}) as hub:
        proc = run_hfcache(["warm", "--lock", str(lock), "--cache-dir", str(cache), "--endpoint", hub.endpoint])
    assert proc.returncode == 3, proc.stderr
    assert "'x' is both a file and a folder" in proc.stderr
    folder = cache / "models--h--both"
    assert not [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else True


# ----------------------------------------------------------------------------- what warm published is checked

def test_a_file_edited_in_place_or_lost_fails_verify(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm_two(cache)
    snapshot = next((cache / FOLDER / "snapshots").iterdir())
    commit = snapshot.name
    record = cache / ".locks" / FOLDER / "hfcache" / f"{commit}.json"
    doc = json.loads(record.read_text())
    assert doc["files"]["vocab.txt"]["hash"].startswith("git-sha1:") and "tokenizer.json" in doc["files"]
    assert not scan_cache_dir(cache).warnings  # the record changes nothing in huggingface_hub's reading
    assert verify(cache)[0] == 0

    # sed -i: the link becomes a modified real file of the same size.
    vocab = snapshot / "vocab.txt"
    data = vocab.read_bytes()
    vocab.unlink()
    vocab.write_bytes(data.replace(b"[UNK]", b"[XXX]", 1))
    # A lost file, and a lost .no_exist marker with no file in its place.
    (snapshot / "tokenizer_config.json").unlink()
    absent = doc["absent"]
    assert absent, doc
    (cache / FOLDER / ".no_exist" / commit / absent[0]).unlink()

    code, out = verify(cache)
    assert code == 1
    errors = {(p["path"], p["kind"]) for p in out["problems"] if p["kind"] in ("file_mismatch", "file_missing")}
    assert errors == {("vocab.txt", "file_mismatch"), ("tokenizer_config.json", "file_missing"),
                      (absent[0], "file_missing")}, out["problems"]
    detail = {p["path"]: p["detail"] for p in out["problems"]}
    assert "neither the file nor its .no_exist marker" in detail[absent[0]]

    with HubServer(HUB) as hub:
        proc = run_hfcache(["warm", REPO, "--cache-dir", str(cache), "--endpoint", hub.endpoint])
    assert proc.returncode == 0, proc.stderr
    # warm publishes the revision again: the lost file and marker come back, the edited file is relinked.
    code, out = verify(cache)
    assert code == 0, out["problems"]


def test_prune_removes_the_record_of_a_pruned_revision(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm_two(cache)
    commit = next((cache / FOLDER / "snapshots").iterdir()).name
    (cache / FOLDER / "refs" / "main").unlink()
    old = 1_000_000_000  # 2001: a detached revision unused for longer than any grace period
    for p in [*(cache / FOLDER).rglob("*"), cache / FOLDER]:
        os.utime(p, (old, old), follow_symlinks=False)
    proc = run_hfcache(["prune", "--cache-dir", str(cache), "--yes"])
    assert proc.returncode == 0, proc.stderr
    assert not (cache / FOLDER / "snapshots" / commit).exists()
    assert not (cache / ".locks" / FOLDER / "hfcache" / f"{commit}.json").exists()
    assert verify(cache)[0] == 0
