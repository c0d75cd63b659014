"""What a registry can make ``hfcache pull`` do, in requests and time, and what a malformed record of an earlier pull
can (docs/security.md, "How many requests a pull makes"; docs/oci.md; red team, round four):

- a ``--verify-key`` pull reads the signatures (the referrers listing, each referrer's manifest and bundle) under one
  deadline for all of them, three metadata deadlines: 150 referrers, each dripped just inside its own deadline, held
  a ``--timeout 1`` pull for 4 min 42 s before it refused; now 36 s, before any layer;
- that phase is at most 2 + 2 x 100 requests, and a pull's layers at most 10,000 (``MAX_LAYERS``) in either format,
  refused before any layer is fetched; a ModelPack artifact of N files is 2 + N requests;
- a ``.locks/hfcache-pulled.json`` entry that is no cache-layout name (``CACHEDIR.TAG``, with its matching stamp) made
  the pull exit 70 after it published; such a record is ignored (every layer fetched, the record rewritten).

The registries are hand-written servers on 127.0.0.1 (tests/hostile.py ``PeerServer``) that log every
request, and Debian's ``docker-registry`` (tests/registry.py) for the record.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import hfcache
from hfcache.oci.pull import MAX_LAYERS
from hfcache.oci.pull_record import stamp_of
from hfcache.oci.referrers import MAX_REFERRERS
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.hostile import PeerServer, body, drip
from tests.oci_peer import NAME, Image, pull, refused, serve_image
from tests.registry import available, running_registry
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
GPT2 = "models--openai-community--gpt2"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
RAW = "application/vnd.cncf.model.weight.config.v1.raw"


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture
def home(tmp_path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def public_key(tmp_path_factory) -> Path:
    from tests.artifacts import key_pair

    return key_pair(tmp_path_factory.mktemp("bounds-keys"), "team")[1]


def serve_referrers(peer: PeerServer, image: Image, count: int, interval: float = 0.0) -> list[str]:
    """``count`` referrers of ``image``'s manifest listed at its fallback tag (no referrers API), each a distinct
    bundle (not a valid one); their manifests dripped one byte every ``interval`` seconds. Returns their digests."""
    subject = {"mediaType": MANIFEST, "digest": sha(image.manifest), "size": len(image.manifest)}
    empty = b"{}"
    peer.routes[f"/v2/{NAME}/blobs/{sha(empty)}"] = body(empty)
    listed = []
    for i in range(count):
        bundle = json.dumps({"mediaType": BUNDLE, "n": i}).encode()
        peer.routes[f"/v2/{NAME}/blobs/{sha(bundle)}"] = body(bundle)
        manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": BUNDLE,
                               "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": sha(empty),
                                          "size": 2},
                               "layers": [{"mediaType": BUNDLE, "digest": sha(bundle), "size": len(bundle)}],
                               "subject": subject}).encode()
        headers = {"Content-Type": MANIFEST, "Docker-Content-Digest": sha(manifest)}
        peer.routes[f"/v2/{NAME}/manifests/{sha(manifest)}"] = drip(manifest, interval, headers) if interval \
            else body(manifest, **headers)
        listed.append({"mediaType": MANIFEST, "digest": sha(manifest), "size": len(manifest), "artifactType": BUNDLE})
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": listed}).encode()
    peer.routes[f"/v2/{NAME}/manifests/sha256-{sha(image.manifest)[7:]}"] = body(index, **{"Content-Type": INDEX})
    return [entry["digest"] for entry in listed]


def gets(peer: PeerServer, kind: str, digests) -> int:
    wanted = {f"/v2/{NAME}/{kind}/{d}" for d in digests}
    return sum(1 for method, path, _ in peer.log if method == "GET" and path in wanted)


# --- F5a: the referrer phase ----------------------------------------------------------------------------------------


def test_dripped_referrers_end_within_one_deadline_for_the_whole_phase(tmp_path, home, public_key):
    """The red team's registry: 150 referrers whose manifests drip in 2.4 s each (each well inside its own 12 s
    deadline at ``--timeout 1``). The signatures are read under one deadline of 3 x 12 s: refused at 36 s (was
    4 min 42 s), exit 3 naming the phase, no layer fetched, no target created."""
    image, fresh, canary = Image(), tmp_path / "fresh", Canary(tmp_path)
    with PeerServer() as peer:
        ref = serve_image(peer, image)
        referrers = serve_referrers(peer, image, 150, interval=0.004)
        proc = pull(ref, fresh, home, "--timeout", "1", "--verify-key", str(public_key))
        layer = f"/v2/{NAME}/blobs/{sha(image.layer)}"
        assert not any(path == layer for _, path, _ in peer.log)
        read = gets(peer, "manifests", referrers)
    refused(proc, 3, f"the signatures of {sha(image.manifest)[:19]}", "every referrer together",
            "no complete answer within 36 s")
    assert 35 < proc.elapsed < 75, proc.elapsed  # 36 s and a process start (a loaded machine: slower)
    assert 0 < read < 30, read  # about 36 s / 2.4 s of them (of 100 it read before), then the phase ended
    assert not fresh.exists()
    canary.assert_unchanged()


def test_the_referrer_phase_is_at_most_two_requests_per_referrer_and_a_hundred_referrers(tmp_path, home,
                                                                                         public_key):
    """150 listed, answered at once: the pull reads the listing (the referrers API, then the fallback tag) and 100
    referrers (the newest: listed last), a manifest and a bundle each, then refuses: none is a signature."""
    image = Image()
    with PeerServer() as peer:
        ref = serve_image(peer, image)
        referrers = serve_referrers(peer, image, 150)
        proc = pull(ref, tmp_path / "fresh", home, "--verify-key", str(public_key))
        phase = [(m, p) for m, p, _ in peer.log if "/referrers/" in p or "/manifests/sha256" in p
                 or (p.startswith(f"/v2/{NAME}/blobs/") and p != f"/v2/{NAME}/blobs/{sha(image.layer)}"
                     and p != f"/v2/{NAME}/blobs/{sha(image.config)}")]
        newest = set(referrers[-MAX_REFERRERS:])
        assert gets(peer, "manifests", referrers) == gets(peer, "manifests", newest) == MAX_REFERRERS
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(phase) == 2 + 2 * MAX_REFERRERS, phase[:5]


# --- F5a: layers, the same bound in both formats -------------------------------------------------------------------


def _many(fmt: str, count: int) -> tuple[dict, bytes]:
    """A manifest (and its config) listing ``count`` layers of ``fmt`` that are never served."""
    digests = [f"sha256:{i:064x}" for i in range(count)]
    if fmt == "image":
        layers = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": 1}
                  for d in digests]
        return {"mediaType": "application/vnd.oci.image.config.v1+json", "layers": layers}, \
            json.dumps({"rootfs": {"type": "layers", "diff_ids": digests}}).encode()
    layers = [{"mediaType": RAW, "digest": d, "size": 1, "annotations": {
        "org.cncf.model.filepath": f"models--a--b/snapshots/{'2' * 40}/f{i}", "io.hfcache.etag": f"{i:040x}"}}
        for i, d in enumerate(digests)]
    config = json.dumps({"descriptor": {"version": "2" * 40}, "modelfs": {"type": "layers", "diffIds": digests}})
    return {"mediaType": "application/vnd.cncf.model.config.v1+json", "layers": layers,
            "artifactType": "application/vnd.cncf.model.manifest.v1+json"}, config.encode()


@pytest.mark.parametrize("fmt", ["image", "modelpack"])
def test_more_layers_than_a_pull_reads_are_refused_before_any_layer_in_both_formats(tmp_path, home, fmt):
    """One bound for both formats (each layer is a request): MAX_LAYERS + 1 layers is exit 2 naming both numbers,
    with the manifest and config read and no layer requested."""
    shape, config = _many(fmt, MAX_LAYERS + 1)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"mediaType": shape.pop("mediaType"), "digest": sha(config), "size": len(config)},
                           **shape}).encode()
    with PeerServer() as peer:
        peer.routes["/v2/"] = body(b"{}")
        peer.routes[f"/v2/{NAME}/manifests/v1"] = body(manifest, **{"Content-Type": MANIFEST,
                                                                    "Docker-Content-Digest": sha(manifest)})
        peer.routes[f"/v2/{NAME}/blobs/{sha(config)}"] = body(config)
        proc = pull(f"{peer.host}/{NAME}:v1", tmp_path / "fresh", home)
        requested = [path for _, path, _ in peer.log]
    refused(proc, 2, f"{MAX_LAYERS + 1} layers, more than the {MAX_LAYERS} hfcache pulls")
    assert requested == [f"/v2/{NAME}/manifests/v1", f"/v2/{NAME}/blobs/{sha(config)}"], requested
    assert not (tmp_path / "fresh").exists()


def test_a_modelpack_artifact_of_n_files_is_two_plus_n_requests(tmp_path, home):
    """The red team's artifact (one tiny raw layer per file; theirs had 3,000: 3,002 requests), at 300 files: the
    manifest, the config and one request per file, nothing else."""
    count, commit, folder = 300, "2" * 40, "models--evil--many"
    with PeerServer() as peer:
        layers = []
        for i in range(count):
            data = f"{i}\n".encode()
            peer.routes[f"/v2/{NAME}/blobs/{sha(data)}"] = body(data)
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id
            layers.append({"mediaType": RAW, "digest": sha(data), "size": len(data), "annotations": {
                "org.cncf.model.filepath": f"{folder}/snapshots/{commit}/f{i}.txt", "io.hfcache.etag": etag}})
        config = json.dumps({"descriptor": {"version": commit},
                             "modelfs": {"type": "layers", "diffIds": [x["digest"] for x in layers]}}).encode()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                               "artifactType": "application/vnd.cncf.model.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                                          "digest": sha(config), "size": len(config)}, "layers": layers}).encode()
        peer.routes[f"/v2/{NAME}/manifests/v1"] = body(manifest, **{"Content-Type": MANIFEST,
                                                                    "Docker-Content-Digest": sha(manifest)})
        peer.routes[f"/v2/{NAME}/blobs/{sha(config)}"] = body(config)
        proc = pull(f"{peer.host}/{NAME}:v1", tmp_path / "target", home)
        requests = len(peer.log)
    assert proc.returncode == 0, proc.stderr
    assert requests == 2 + count, requests


# --- F4a: a malformed pull record ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pushed(tmp_path_factory) -> tuple[str, Path]:
    """gpt2 pushed (image format) to a real registry: (reference, the registry's folder)."""
    root = tmp_path_factory.mktemp("bounds-record")
    with HubServer(HUB) as server:
        assert hfcache.warm([WarmRequest.parse("openai-community/gpt2")], cache_dir=root / "seed",
                            endpoint=server.endpoint, token=False).ok
    with running_registry(root / "registry") as registry:
        ref = f"{registry.host}/bounds/gpt2:v1"
        proc = run_hfcache(["push", ref, "--cache-dir", str(root / "seed"), "--plain-http"], env=clean_env())
        assert proc.returncode == 0, proc.stderr
        yield ref, root


def _pull_json(ref: str, target: Path) -> dict:
    proc = run_hfcache(["pull", ref, "--cache-dir", str(target), "--plain-http", "--json"], env=clean_env())
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))
@pytest.mark.parametrize("planted", ["CACHEDIR.TAG", f"{GPT2}/blobs", f"{GPT2}/refs"])
def test_a_record_naming_what_no_layer_holds_is_ignored_never_exit_70(pushed, tmp_path, planted):
    """The caller's own record (it passes the trust rules), with one more entry per layer that is no name a layer
    holds, stamped as it is on disk: the layer would be skipped and the counts split the name (IndexError, exit 70,
    after publishing). The record is ignored: every layer fetched again, exit 0, the record rewritten."""
    ref, _ = pushed
    target = tmp_path / "target"
    assert _pull_json(ref, target)["skipped_layers"] == []
    layers = _pull_json(ref, target)["skipped_layers"]
    assert layers, "the record of the first pull was not honoured"
    record = target / ".locks" / "hfcache-pulled.json"
    data = json.loads(record.read_bytes())
    for layer in data["layers"].values():
        layer["entries"][planted] = stamp_of(str(target), planted)
    assert all(layer["entries"][planted] is not None for layer in data["layers"].values())
    fresh = record.with_name("planted.tmp")
    fresh.write_text(json.dumps(data))
    fresh.chmod(0o644)
    fresh.replace(record)
    before = {p: os.readlink(p) if p.is_symlink() else p.stat().st_size for p in (target / GPT2).rglob("*")}
    again = _pull_json(ref, target)
    assert again["skipped_layers"] == [] and again["bytes_downloaded"] > 0
    assert {p: os.readlink(p) if p.is_symlink() else p.stat().st_size for p in (target / GPT2).rglob("*")} == before
    assert planted not in json.loads(record.read_bytes())["layers"][next(iter(data["layers"]))]["entries"]
    assert run_hfcache(["verify", "--cache-dir", str(target)], env=clean_env()).returncode == 0
    assert _pull_json(ref, target)["skipped_layers"] == layers  # the rewritten record is honoured again
