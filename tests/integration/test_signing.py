"""hfcache sign / verify --signature: OpenSSF model-signing v1.0 bundles over cached snapshots, interoperable both
ways with the ``model_signing`` 1.1.1 CLI, and every way a snapshot or a bundle can differ named (exit 1).

The cache is a warmed ``hfcache-test/tiny-bert`` (``--kind model``: an LFS ``model.safetensors`` whose blob is named
by its sha256, and small git-sha1 files). Each test works on its own copy; a canary outside the cache must be
unchanged and, where the cache was not damaged on purpose, ``hfcache verify`` must still pass.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import hfcache
from hfcache.records import WarmRequest
from tests.artifacts import MODEL_SIGNING, write_key
from tests.canary import SECRET, Canary
from tests.helpers import clean_env, run_hfcache
from tests.shared_cache import SWAP, shared_cache
from tests.testhub import HubServer
from tests.users import ALICE, needs_root

REPO = "hfcache-test/tiny-bert"
FOLDER = "models--hfcache-test--tiny-bert"
LFS_FILE, SMALL_FILE = "model.safetensors", "vocab.txt"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, model_repos_root) -> Path:
    root = tmp_path_factory.mktemp("signing-src") / "cache"
    with HubServer(model_repos_root) as server:
        report = hfcache.warm([WarmRequest.parse(REPO, kind="model")], cache_dir=root, endpoint=server.endpoint,
                              token=False)
    assert report.ok
    return root


@pytest.fixture
def cache(pristine, tmp_path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


def snapshot_of(cache: Path) -> Path:
    (snapshot,) = (cache / FOLDER / "snapshots").iterdir()
    return snapshot



@pytest.fixture
def keys(tmp_path) -> tuple[Path, Path]:
    folder = tmp_path / "keys"
    folder.mkdir()
    return write_key(folder, "signer")


def sign(cache: Path, key: Path, out: Path, *extra: str, **kw) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["sign", REPO, "--key", str(key), "--cache-dir", str(cache), "--output", str(out), *extra],
                       **kw)


def verify_signature(cache: Path, bundle: Path, public: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["verify", REPO, "--signature", str(bundle), "--verify-key", str(public), "--cache-dir",
                        str(cache), *extra])


def signed_bundle(cache: Path, key: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bundle.sig.json"
    proc = sign(cache, key, out)
    assert proc.returncode == 0, proc.stderr
    return out


def one_error_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("hfcache: error: "), proc.stderr
    for needle in needles:
        assert needle in first, (needle, first)
    return first


def statement_of(bundle: bytes) -> dict:
    return json.loads(base64.b64decode(json.loads(bundle)["dsseEnvelope"]["payload"]))


def assert_cache_verifies(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- interoperability with the model_signing CLI --------------------------------------------------------------------


def test_a_bundle_hfcache_writes_verifies_with_the_model_signing_cli(cache, keys, tmp_path) -> None:
    canary = Canary(tmp_path)
    private, public = keys
    out = tmp_path / "bundles"
    out.mkdir()
    proc = sign(cache, private, out, "--json")
    assert proc.returncode == 0, proc.stderr
    (written,) = json.loads(proc.stdout)["bundles"]
    snapshot = snapshot_of(cache)
    bundle = Path(written["path"])
    assert bundle == out / f"{FOLDER}@{snapshot.name}.sig.json" and written["files"] == 6
    document = json.loads(bundle.read_bytes())
    assert document["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    statement = statement_of(bundle.read_bytes())
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    digests = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    assert digests[LFS_FILE] == os.readlink(snapshot / LFS_FILE).rsplit("/", 1)[1]  # the LFS etag, unread
    assert written["hashed"] == 5  # the five small git-sha1 files, hashed with sha256
    ms = subprocess.run([MODEL_SIGNING, "verify", "key", "--signature", str(bundle), "--public_key", str(public),
                         "--allow_symlinks", str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 0 and "Verification succeeded" in ms.stdout, ms.stdout + ms.stderr
    # Without --allow_symlinks the model_signing CLI refuses a hub cache snapshot (its files are links to blobs/).
    ms = subprocess.run([MODEL_SIGNING, "verify", "key", "--signature", str(bundle), "--public_key", str(public),
                         str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 1 and "allow_symlinks" in ms.stderr
    ok = verify_signature(cache, bundle, public)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"ok: {REPO}@{snapshot.name}: 6 file(s) signed"), ok.stdout
    canary.assert_unchanged()
    assert_cache_verifies(cache)


@pytest.mark.parametrize("rehash", [False, True])
def test_a_bundle_the_model_signing_cli_writes_verifies_with_hfcache(cache, keys, tmp_path, rehash) -> None:
    canary = Canary(tmp_path)
    private, public = keys
    snapshot = snapshot_of(cache)
    bundle = tmp_path / "model.sig"
    ms = subprocess.run([MODEL_SIGNING, "sign", "key", "--private_key", str(private), "--signature", str(bundle),
                         "--allow_symlinks", str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 0, ms.stdout + ms.stderr
    proc = verify_signature(cache, bundle, public, "--json", *(["--rehash"] if rehash else []))
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["ok"] and len(document["signature"]["signed"]) == 6
    assert document["hashed"] == (6 if rehash else 5)
    canary.assert_unchanged()
    assert_cache_verifies(cache)


def test_a_git_path_in_a_snapshot_is_never_left_out_of_a_check(cache, keys, tmp_path) -> None:
    """model_signing leaves .git*/.github paths out of a bundle (and its CLI out of a check): hfcache's bundles do
    too, so they verify with the CLI's defaults, but a check never drops a file: a snapshot holding one cannot be
    signed (exit 1, naming it), a bundle that does not list it leaves it unsigned, and one that lists it
    (``--no-ignore-git-paths``) covers it."""
    private, public = keys
    snapshot = snapshot_of(cache)
    # as huggingface_hub stores it: a link to a blob named by its git sha1 (a real file nothing names is refused)
    data = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob name
    (cache / FOLDER / "blobs" / blob).write_bytes(data)
    (snapshot / ".gitattributes").symlink_to(f"../../blobs/{blob}")
    out = tmp_path / "bundle.sig.json"
    one_error_line(sign(cache, private, out), 1, "cannot sign", ".gitattributes is a git path")
    assert not out.exists()
    default = tmp_path / "default.sig"
    ms = subprocess.run([MODEL_SIGNING, "sign", "key", "--private_key", str(private), "--signature", str(default),
                         "--allow_symlinks", str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 0, ms.stdout + ms.stderr
    assert ".gitattributes" not in {r["name"] for r in statement_of(default.read_bytes())["predicate"]["resources"]}
    line = one_error_line(verify_signature(cache, default, public), 1, "unsigned: .gitattributes",
                          "model-signing leaves git paths")
    assert "changed" not in line and "missing" not in line
    listed = tmp_path / "listed.sig"
    ms = subprocess.run([MODEL_SIGNING, "sign", "key", "--private_key", str(private), "--signature", str(listed),
                         "--allow_symlinks", "--no-ignore-git-paths", str(snapshot)], capture_output=True, text=True,
                        timeout=120)
    assert ms.returncode == 0, ms.stdout + ms.stderr
    proc = verify_signature(cache, listed, public, "--json")
    assert proc.returncode == 0, proc.stderr
    assert ".gitattributes" in json.loads(proc.stdout)["signature"]["signed"]
    (snapshot / ".gitattributes").unlink()  # without it, the snapshot signs and verifies with both tools
    bundle = signed_bundle(cache, private, tmp_path)
    ms = subprocess.run([MODEL_SIGNING, "verify", "key", "--signature", str(bundle), "--public_key", str(public),
                         "--allow_symlinks", str(snapshot)], capture_output=True, text=True, timeout=120)
    assert ms.returncode == 0, ms.stdout + ms.stderr


def test_a_key_made_with_openssl_signs_and_an_encrypted_one_needs_its_password(cache, tmp_path) -> None:
    canary = Canary(tmp_path)
    key, pub = tmp_path / "ossl.pem", tmp_path / "ossl.pub"
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "ec", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    bundle = signed_bundle(cache, key, tmp_path)
    assert verify_signature(cache, bundle, pub).returncode == 0
    locked, locked_pub = write_key(tmp_path, "locked", password=b"correct horse")
    one_error_line(sign(cache, locked, tmp_path / "a.sig.json"), 2, "the key is encrypted")
    one_error_line(sign(cache, locked, tmp_path / "b.sig.json", "--password-stdin", input_text="wrong\n"), 2,
                   "wrong password")
    proc = sign(cache, locked, tmp_path / "c.sig.json", "--password-stdin", input_text="correct horse\n")
    assert proc.returncode == 0, proc.stderr
    assert verify_signature(cache, tmp_path / "c.sig.json", locked_pub).returncode == 0
    assert not (tmp_path / "a.sig.json").exists() and not (tmp_path / "b.sig.json").exists()
    canary.assert_unchanged()


# --- what verify --signature names ------------------------------------------------------------------------------------


def _flip(path: Path) -> None:
    real = path.resolve()
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 0x01
    real.write_bytes(bytes(data))


DIFFER, NOT_ITS_NAME = "differ from the signed ones", "no longer matches its blob name"


def damage_lfs_byte(snapshot: Path) -> tuple[tuple[str, ...], str, str, str]:
    _flip(snapshot / LFS_FILE)
    # the blob's name is its digest: --rehash reads the bytes, which no longer match that name
    return ("--rehash",), "changed:", LFS_FILE, NOT_ITS_NAME


def damage_small_byte(snapshot: Path) -> tuple[tuple[str, ...], str, str, str]:
    _flip(snapshot / SMALL_FILE)
    return (), "changed:", SMALL_FILE, NOT_ITS_NAME  # a git-sha1 blob is always hashed: checked against its name


def damage_repointed(snapshot: Path) -> tuple[tuple[str, ...], str, str, str]:
    """The link re-pointed at another blob of the repo: every blob matches its name, the file has other bytes."""
    other = os.readlink(snapshot / "tokenizer_config.json")
    (snapshot / SMALL_FILE).unlink()
    os.symlink(other, snapshot / SMALL_FILE)
    return (), "changed:", SMALL_FILE, DIFFER


def damage_added(snapshot: Path) -> tuple[tuple[str, ...], str, str, str]:
    (snapshot / "added.json").write_text("{}\n")
    return (), "unsigned:", "added.json", DIFFER


def damage_removed(snapshot: Path) -> tuple[tuple[str, ...], str, str, str]:
    (snapshot / "tokenizer.json").unlink()
    return (), "missing:", "tokenizer.json", DIFFER


@pytest.mark.parametrize("damage", [damage_lfs_byte, damage_small_byte, damage_repointed, damage_added,
                                    damage_removed])
def test_each_difference_from_the_signed_files_is_exit_1_naming_the_file(cache, keys, tmp_path, damage) -> None:
    private, public = keys
    bundle = signed_bundle(cache, private, tmp_path)
    canary = Canary(tmp_path)
    extra, label, name, why = damage(snapshot_of(cache))
    line = one_error_line(verify_signature(cache, bundle, public, *extra), 1, f"{REPO}@", label, name, why)
    assert line.count(name) == 1
    document = json.loads(verify_signature(cache, bundle, public, *extra, "--json").stdout)
    assert document["ok"] is False and document["exit_code"] == 1 and document["reason"] == "files"
    assert document[label.rstrip(":")] == [name]
    canary.assert_unchanged()


def test_every_unsigned_changed_and_missing_file_is_named_at_once(cache, keys, tmp_path) -> None:
    private, public = keys
    bundle = signed_bundle(cache, private, tmp_path)
    snapshot = snapshot_of(cache)
    for damage in (damage_repointed, damage_added, damage_removed):
        damage(snapshot)
    (snapshot / "second-added.txt").write_text("x\n")
    line = one_error_line(verify_signature(cache, bundle, public), 1)
    assert "changed: vocab.txt; unsigned: added.json, second-added.txt; missing: tokenizer.json" in line, line


def test_a_wrong_key_and_an_altered_bundle_are_exit_1(cache, keys, tmp_path) -> None:
    private, _public = keys
    canary = Canary(tmp_path)
    bundle = signed_bundle(cache, private, tmp_path)
    _other, other_pub = write_key(tmp_path, "other")
    one_error_line(verify_signature(cache, bundle, other_pub), 1, "does not verify with this key", str(other_pub))
    # The statement edited to sign another digest, the signature left as it was.
    document = json.loads(bundle.read_bytes())
    statement = statement_of(bundle.read_bytes())
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    altered = tmp_path / "altered.sig.json"
    altered.write_text(json.dumps(document))
    one_error_line(verify_signature(cache, altered, keys[1]), 1, "does not verify")
    document = json.loads(verify_signature(cache, altered, keys[1], "--json").stdout)
    assert document["reason"] == "signature" and document["exit_code"] == 1
    canary.assert_unchanged()
    assert_cache_verifies(cache)


# --- hostile bundles, snapshots and keys ------------------------------------------------------------------------------


def test_hostile_bundles_are_one_line_errors(cache, keys, tmp_path) -> None:
    _private, public = keys
    canary = Canary(tmp_path)
    deep = tmp_path / "deep.sig.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    one_error_line(verify_signature(cache, deep, public), 2, "not a model-signing bundle", "not JSON", str(deep))
    nested = {"mediaType": "x", "verificationMaterial": {}, "dsseEnvelope": {
        "payload": base64.b64encode(b'{"a":' * 5000 + b"1" + b"}" * 5000).decode(), "payloadType": "x"}}
    deep_payload = tmp_path / "deep-payload.sig.json"
    deep_payload.write_text(json.dumps(nested))
    one_error_line(verify_signature(cache, deep_payload, public), 2, "payload is not a JSON statement")
    shards = json.loads(signed_bundle(cache, keys[0], tmp_path).read_bytes())
    statement = statement_of(json.dumps(shards).encode())
    statement["predicate"]["serialization"]["method"] = "shards"
    shards["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (tmp_path / "shards.sig.json").write_text(json.dumps(shards))
    one_error_line(verify_signature(cache, tmp_path / "shards.sig.json", public), 2, "per-file sha256")
    fifo = tmp_path / "fifo.sig.json"
    os.mkfifo(fifo)
    one_error_line(verify_signature(cache, fifo, public), 2, "not a regular file")
    one_error_line(verify_signature(cache, tmp_path / "absent.sig.json", public), 2, "cannot read the signature")
    canary.assert_unchanged()
    assert_cache_verifies(cache)


@pytest.mark.parametrize("rehash", [False, True])
def test_a_snapshot_entry_linking_outside_the_cache_is_never_read(cache, keys, tmp_path, rehash) -> None:
    private, public = keys
    canary = Canary(tmp_path)
    snapshot = snapshot_of(cache)
    bundle = signed_bundle(cache, private, tmp_path)
    (snapshot / "leak.txt").symlink_to(canary.secret)  # absolute: a member's plant
    (snapshot / "leak2.txt").symlink_to(os.path.relpath(canary.secret, snapshot))  # relative, leaving the cache
    extra = ("--rehash",) if rehash else ()
    out = tmp_path / "out"
    out.mkdir()
    one_error_line(sign(cache, private, out, *extra), 5, "leak", "left alone")
    assert list(out.iterdir()) == []
    one_error_line(verify_signature(cache, bundle, public, *extra), 5, "leak", "left alone")
    (snapshot / "leak.txt").unlink()
    (snapshot / "leak2.txt").unlink()
    os.mkfifo(snapshot / "pipe.txt")
    one_error_line(sign(cache, private, out, *extra, timeout=60), 5, "pipe.txt")
    canary.assert_unchanged()
    assert SECRET not in b"".join(p.read_bytes() for p in tmp_path.glob("*.sig.json"))


def test_bad_keys_outputs_and_arguments_are_exit_2(cache, keys, tmp_path) -> None:
    private, public = keys
    canary = Canary(tmp_path)
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    one_error_line(sign(cache, rsa_key, tmp_path / "x.sig.json"), 2, "not an EC P-256")
    one_error_line(sign(cache, public, tmp_path / "x.sig.json"), 2, "not a PEM private key")
    one_error_line(sign(cache, private, snapshot_of(cache)), 2, "inside the cache")
    one_error_line(sign(cache, private, cache / "x.sig.json"), 2, "inside the cache")
    one_error_line(run_hfcache(["sign", REPO, "--key", str(private), "--cache-dir", str(cache), "--lock", "x.lock"]),
                   2, "not both")
    one_error_line(run_hfcache(["sign", "--key", str(private), "--cache-dir", str(cache)]), 2, "name the snapshots")
    one_error_line(run_hfcache(["verify", REPO, "--signature", "b", "--cache-dir", str(cache)]), 2, "go together")
    one_error_line(run_hfcache(["verify", "--signature", "b", "--verify-key", str(public), "--cache-dir",
                                str(cache)]), 2, "exactly one")
    one_error_line(run_hfcache(["verify", REPO, "--signature", "b", "--verify-key", str(private), "--cache-dir",
                                str(cache)]), 2, "cannot read the signature")
    bundle = signed_bundle(cache, private, tmp_path)
    one_error_line(verify_signature(cache, bundle, private), 2, "not a PEM public key")
    one_error_line(run_hfcache(["sign", "other/repo", "--key", str(private), "--cache-dir", str(cache), "-o",
                                str(tmp_path)]), 1, "not in the cache")
    one_error_line(run_hfcache(["sign", f"{REPO}@nope", "--key", str(private), "--cache-dir", str(cache), "-o",
                                str(tmp_path)]), 1, "not in the cache")
    assert list(snapshot_of(cache).parent.parent.glob("**/*.sig.json")) == []
    canary.assert_unchanged()
    assert_cache_verifies(cache)


def test_without_the_sign_extra_the_error_says_how_to_install_it(cache, keys, tmp_path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "model_signing.py").write_text("raise ImportError('No module named model_signing', "
                                              "name='model_signing')\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(shadow), str(Path(__file__).resolve().parents[2])]))
    proc = sign(cache, keys[0], tmp_path / "x.sig.json", env=env)
    one_error_line(proc, 2, "model-signing library")
    assert "pip install 'hfcache[sign]'" in proc.stderr
    assert not (tmp_path / "x.sig.json").exists()


def test_several_snapshots_get_one_bundle_each_in_a_folder(cache, keys, tmp_path) -> None:
    private, public = keys
    commit = snapshot_of(cache).name
    out = tmp_path / "new-folder/"
    proc = run_hfcache(["sign", REPO, f"{REPO}@{commit}", "--key", str(private), "--cache-dir", str(cache),
                        "--output", f"{out}/", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert [b["commit"] for b in json.loads(proc.stdout)["bundles"]] == [commit]  # main is that commit: once
    assert [p.name for p in out.iterdir()] == [f"{FOLDER}@{commit}.sig.json"]
    assert verify_signature(cache, out / f"{FOLDER}@{commit}.sig.json", public).returncode == 0
    # Signing again replaces the bundle in place with --force (no temp file left behind).
    again = run_hfcache(["sign", REPO, "--key", str(private), "--cache-dir", str(cache), "-o", str(out), "--force"])
    assert again.returncode == 0 and [p.name for p in out.iterdir()] == [f"{FOLDER}@{commit}.sig.json"]


def test_sign_lock_signs_every_snapshot_the_lock_pins(cache, keys, tmp_path) -> None:
    from hfcache.warming.lockfile import LockedFile, LockedRepo, Lockfile, render_lock

    private, public = keys
    snapshot = snapshot_of(cache)
    commit = snapshot.name
    pins = tuple(LockedFile(p.name, p.stat().st_size, ("sha256:" if len(etag) == 64 else "git-sha1:") + etag)
                 for p in sorted(snapshot.iterdir()) for etag in (os.readlink(p).rsplit("/", 1)[1],))
    lock = tmp_path / "hfcache.lock"
    lock.write_bytes(render_lock(Lockfile((LockedRepo(WarmRequest.parse(REPO, kind="model"), REPO, commit, pins),))))
    out = tmp_path / "signed"
    out.mkdir()
    proc = run_hfcache(["sign", "--lock", str(lock), "--key", str(private), "--cache-dir", str(cache), "-o", str(out),
                        "--json"])
    assert proc.returncode == 0, proc.stderr
    (bundle,) = json.loads(proc.stdout)["bundles"]
    assert bundle["commit"] == commit and bundle["files"] == 6
    assert verify_signature(cache, Path(bundle["path"]), public).returncode == 0


# --- a group member of a shared cache ---------------------------------------------------------------------------------


@needs_root
def test_a_member_swapping_entries_never_gets_a_file_outside_the_cache_signed(runtime, model_repos_root,
                                                                              tmp_path) -> None:
    """Root signs (and checks) a snapshot of a shared cache while Alice, a member, exchanges a snapshot link and
    the LFS blob itself for links to a root-only file outside the cache (``renameat2(RENAME_EXCHANGE)``): every
    run either signs the true digests or refuses (exit 5, naming the entry); the secret's sha256 never appears."""
    cache = shared_cache(runtime, "sign-race")
    with HubServer(model_repos_root) as server:
        assert hfcache.warm([WarmRequest.parse(REPO, kind="model")], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok
    (runtime.base / "sign-race-canary").mkdir()
    canary = Canary(runtime.base / "sign-race-canary")
    snapshot = snapshot_of(cache)
    lfs_blob = cache / FOLDER / "blobs" / os.readlink(snapshot / LFS_FILE).rsplit("/", 1)[1]
    private, public = keys_in(tmp_path)
    good = signed_bundle(cache, private, tmp_path)
    truth = {r["name"]: r["digest"] for r in statement_of(good.read_bytes())["predicate"]["resources"]}
    secret_sha = hashlib.sha256(SECRET).hexdigest()
    stop = runtime.base / "stop-sign-swap"
    spec = {"stop": str(stop), "rounds": 2_000_000, "hold": 0.0005, "plant": [],
            "exchange": [[str(snapshot / SMALL_FILE), str(canary.secret)], [str(lfs_blob), str(canary.secret)]]}
    member = subprocess.Popen([*ALICE.setpriv(), runtime.python, "-c", SWAP, json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True, env=runtime.env(ALICE))
    codes = []
    try:
        for i in range(20):
            out = tmp_path / f"race-{i}.sig.json"
            proc = sign(cache, private, out, "--rehash")
            codes.append(proc.returncode)
            assert proc.returncode in (0, 5) and "Traceback" not in proc.stderr, proc.stderr
            if proc.returncode == 0:  # what the snapshot held then: the member may rename entries, never more
                signed = {r["name"]: r["digest"] for r in statement_of(out.read_bytes())["predicate"]["resources"]}
                assert set(signed.values()) <= set(truth.values()), signed
            else:
                # a link refused ("left alone") or an entry the member took away meanwhile ("gone while it was read")
                assert proc.stderr.startswith("hfcache: error: ") and not out.exists(), proc.stderr
            check = verify_signature(cache, good, public, "--rehash")
            # ok, a difference the member made at that moment (exit 1, named), or a refused link (exit 5)
            assert check.returncode in (0, 1, 5) and "Traceback" not in check.stderr, check.stderr
            assert secret_sha not in check.stderr
            codes.append(check.returncode)
    finally:
        stop.touch()
        swaps = int(member.communicate(timeout=60)[0].strip() or 0)
    assert swaps > 10, swaps  # the race ran
    assert 5 in codes, codes  # and was met at least once
    assert secret_sha not in b"".join(p.read_bytes() for p in tmp_path.glob("*.sig.json")).decode()
    canary.assert_unchanged()
    assert_cache_verifies(cache)
    assert verify_signature(cache, good, public, "--rehash").returncode == 0


def keys_in(folder: Path) -> tuple[Path, Path]:
    (folder / "keys").mkdir(exist_ok=True)
    return write_key(folder / "keys", "signer")


# --- where `sign --output` writes -------------------------------------------------------------------------------------


def _entry(path: Path) -> tuple:
    st = os.lstat(path)
    return st.st_ino, st.st_mode, st.st_rdev, os.readlink(path) if os.path.islink(path) else None


def _no_temp_left(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


@needs_root
def test_sign_output_never_replaces_a_device_a_fifo_or_a_link(cache, keys, tmp_path) -> None:
    import stat as stat_

    private, public = keys
    out = tmp_path / "out"
    out.mkdir()
    fake = out / "fakenull"
    os.mknod(fake, 0o666 | stat_.S_IFCHR, os.makedev(1, 3))
    fifo = out / "fifo.sig.json"
    os.mkfifo(fifo)
    target = out / "target.txt"
    target.write_bytes(b"keep me\n")
    link, dangling = out / "link.sig.json", out / "dangling.sig.json"
    link.symlink_to(target)
    dangling.symlink_to(out / "nowhere")
    canary = Canary(tmp_path)
    canary.watch(target)
    null_before = _entry(Path("/dev/null"))
    for path, kind in ((fake, "character device"), (fifo, "FIFO"), (link, "symlink"), (dangling, "symlink"),
                       (Path("/dev/null"), "character device")):
        before = _entry(path)
        one_error_line(sign(cache, private, path, timeout=60), 2, str(path), kind, "not a regular file")
        assert _entry(path) == before, path
    assert _entry(Path("/dev/null")) == null_before and stat_.S_ISCHR(os.stat("/dev/null").st_mode)
    assert target.read_bytes() == b"keep me\n" and not (out / "nowhere").exists()
    # In a folder, the bundle's own name is held to the same rule: a FIFO planted there is refused.
    commit = snapshot_of(cache).name
    planted = out / f"{FOLDER}@{commit}.sig.json"
    os.mkfifo(planted)
    one_error_line(sign(cache, private, out, timeout=60), 2, str(planted), "FIFO")
    assert stat_.S_ISFIFO(os.lstat(planted).st_mode)
    _no_temp_left(out)
    canary.assert_unchanged()
    assert_cache_verifies(cache)


def test_an_existing_bundle_is_replaced_only_with_force_and_dash_writes_stdout(cache, keys, tmp_path) -> None:
    private, public = keys
    canary = Canary(tmp_path)
    existing = tmp_path / "b.sig.json"
    existing.write_bytes(b"old\n")
    one_error_line(sign(cache, private, existing), 2, str(existing), "exists", "--force")
    assert existing.read_bytes() == b"old\n"
    proc = sign(cache, private, existing, "--force")
    assert proc.returncode == 0, proc.stderr
    assert verify_signature(cache, existing, public).returncode == 0
    # -o -: the bundle on stdout (the summary line on stderr); one snapshot only; not with --json.
    proc = sign(cache, private, Path("-"))
    assert proc.returncode == 0, proc.stderr
    assert "standard output" in proc.stderr
    (tmp_path / "stdout.sig.json").write_text(proc.stdout)
    assert verify_signature(cache, tmp_path / "stdout.sig.json", public).returncode == 0
    commit = snapshot_of(cache).name
    one_error_line(run_hfcache(["sign", REPO, f"{REPO}@{commit}", "hfcache-test/tiny-bert@main", "--key",
                                str(private), "--cache-dir", str(cache), "-o", "-", "--json"]), 2, "--json")
    _no_temp_left(tmp_path)
    canary.assert_unchanged()
    assert_cache_verifies(cache)


@needs_root
def test_an_output_that_cannot_be_written_is_a_one_line_error(cache, keys, tmp_path) -> None:
    private, _public = keys
    canary = Canary(tmp_path)
    # A path that does not exist or is not a folder: exit 2.
    one_error_line(sign(cache, private, Path("/proc/x/"), timeout=60), 2, "/proc/x")
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"x")
    one_error_line(run_hfcache(["sign", REPO, "--key", str(private), "--cache-dir", str(cache), "-o",
                                f"{plain}/sub/"]), 2, str(plain))
    one_error_line(run_hfcache(["sign", REPO, "--key", str(private), "--cache-dir", str(cache), "-o",
                                f"{plain}/"]), 2, str(plain), "Not a directory")
    # A read-only mount: exit 5 naming the path, for the folder itself and for a missing subfolder in it.
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        one_error_line(sign(cache, private, ro, timeout=60), 5, str(ro), "Read-only")
        one_error_line(sign(cache, private, ro / "a.sig.json", timeout=60), 5, "Read-only")
        one_error_line(run_hfcache(["sign", REPO, "--key", str(private), "--cache-dir", str(cache), "-o",
                                    f"{ro}/missing/sub/"]), 5, f"{ro}/missing", "Read-only")
        assert os.listdir(ro) == []
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    canary.assert_unchanged()
    assert_cache_verifies(cache)


def test_the_key_password_can_come_from_the_environment(cache, tmp_path) -> None:
    canary = Canary(tmp_path)
    locked, locked_pub = write_key(tmp_path, "locked", password=b"correct horse")
    first = one_error_line(sign(cache, locked, tmp_path / "a.sig.json"), 2, "the key is encrypted")
    proc = sign(cache, locked, tmp_path / "a.sig.json")
    assert "HFCACHE_SIGN_KEY_PASSWORD" in proc.stderr and "correct horse" not in first
    proc = sign(cache, locked, tmp_path / "b.sig.json", env=clean_env(HFCACHE_SIGN_KEY_PASSWORD="correct horse"))
    assert proc.returncode == 0, proc.stderr
    assert "correct horse" not in proc.stdout + proc.stderr
    assert b"correct horse" not in (tmp_path / "b.sig.json").read_bytes()
    assert verify_signature(cache, tmp_path / "b.sig.json", locked_pub).returncode == 0
    canary.assert_unchanged()


# --- what verify --signature says -------------------------------------------------------------------------------------


def _hint(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) >= 2 and lines[1].startswith("hint: "), proc.stderr
    return lines[1]


@pytest.mark.parametrize("content", [b"hello, not JSON", b"{}", b"[]", b'{"verificationMaterial": {}}', b"null"])
def test_a_file_that_is_no_bundle_is_exit_2_naming_it(cache, keys, tmp_path, content) -> None:
    canary = Canary(tmp_path)
    bad = tmp_path / "bad.sig.json"
    bad.write_bytes(content)
    proc = verify_signature(cache, bad, keys[1])
    one_error_line(proc, 2, str(bad), "not a model-signing bundle")
    _hint(proc)
    document = json.loads(verify_signature(cache, bad, keys[1], "--json").stdout or "{}")
    assert document.get("ok") is False and document.get("exit_code") == 2, document
    canary.assert_unchanged()
    assert_cache_verifies(cache)


def test_another_models_bundle_over_the_same_files_does_not_verify_this_one(cache, keys, tmp_path) -> None:
    """Every file matches, the signature is good, but the bundle names another model: exit 1 naming it (as ``pull
    --verify-key`` refuses it). It used to verify for any repo at any commit that holds those files."""
    from hfcache.integrity.signatures import sign_files
    from hfcache.integrity.signed_snapshot import snapshot_digests

    private, public = keys
    canary = Canary(tmp_path)
    commit = snapshot_of(cache).name
    files = dict(snapshot_digests(cache, REPO).files)
    foreign = tmp_path / "foreign.sig.json"
    foreign.write_bytes(sign_files(files, "evil/other@" + "3" * 40, private))
    proc = verify_signature(cache, foreign, public)
    one_error_line(proc, 1, "the bundle signs evil/other@" + "3" * 40, f"not {REPO}@{commit}")
    assert "sign this repo and commit" in _hint(proc)
    # The names the bundles hfcache and the model_signing CLI write: this repo at this commit, or the commit.
    for name in (f"{REPO}@{commit}", commit):
        named = tmp_path / "named.sig.json"
        named.write_bytes(sign_files(files, name, private))
        proc = verify_signature(cache, named, public)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    canary.assert_unchanged()


def test_every_exit_1_of_verify_signature_has_a_hint_and_another_models_bundle_says_so(cache, keys, tmp_path) -> None:
    from hfcache.integrity.signatures import sign_files
    from hfcache.integrity.signed_snapshot import snapshot_digests

    private, public = keys
    canary = Canary(tmp_path)
    _other, other_pub = write_key(tmp_path, "other")
    bundle = signed_bundle(cache, private, tmp_path)
    proc = verify_signature(cache, bundle, other_pub)
    one_error_line(proc, 1, "does not verify with this key")
    assert "--verify-key" in _hint(proc)
    # Repo A's bundle checked against repo B: the message says whose bundle it is, besides the files.
    commit = snapshot_of(cache).name
    files = dict(snapshot_digests(cache, REPO).files)
    files["other-model.safetensors"] = "1" * 64
    del files[SMALL_FILE]
    foreign = tmp_path / "foreign.sig.json"
    foreign.write_bytes(sign_files(files, f"other-org/other-model@{commit}", private))
    proc = verify_signature(cache, foreign, public)
    line = one_error_line(proc, 1, f"the bundle signs other-org/other-model@{commit}", f"{REPO}@{commit}",
                          "unsigned: " + SMALL_FILE, "missing: other-model.safetensors")
    assert "other-org/other-model" in _hint(proc), line
    # The same model with a changed file: the hint says what to do, without a foreign model named.
    (snapshot_of(cache) / SMALL_FILE).unlink()
    (snapshot_of(cache) / SMALL_FILE).write_bytes(b"[PAD]\n")
    proc = verify_signature(cache, bundle, public)
    line = one_error_line(proc, 1, "changed: " + SMALL_FILE)
    assert "the bundle signs" not in line and "hfcache verify" in _hint(proc)
    canary.assert_unchanged()
