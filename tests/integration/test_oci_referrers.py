"""Signatures as OCI referrers (hfcache/oci/referrers.py) against the real registry: Debian's ``docker-registry``
(distribution 2.8), which has no referrers API, so the distribution-spec v1.1 tag fallback (``sha256-<hex>``) is
what is exercised: attached twice, both are listed and both come back; other referrers in the index are kept; a
subject without any gives an empty list; what a registry holds at the fallback tag or in a listed manifest is
checked (an index only, the referrer's own subject, digests), and the raw manifests read back with skopeo.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import hfcache
from hfcache.errors import HubError
from hfcache.integrity.signatures import SignatureMismatch, sign_files, verify_files
from hfcache.integrity.signed_snapshot import snapshot_digests
from hfcache.oci import referrers
from hfcache.oci.registry import connect, network_errors, parse_reference
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.hostile import PeerServer, send
from tests.registry import Registry, available, push_image, put_blob, put_manifest, running_registry, tar_bytes
from tests.testhub import HubServer

pytestmark = pytest.mark.skipif(available() is not None and not os.environ.get("CI"), reason=str(available()))

REPO = "hfcache-test/tiny-bert"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("referrers-registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def digests(tmp_path_factory, model_repos_root):
    cache = tmp_path_factory.mktemp("referrers-src") / "cache"
    with HubServer(model_repos_root) as server:
        assert hfcache.warm([WarmRequest.parse(REPO, kind="model")], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok
    return snapshot_digests(cache, REPO)


def key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def subject_image(registry: Registry, name: str, tag: str, content: bytes = b"x") -> dict:
    """Push a small image; return its manifest descriptor as the registry serves it."""
    info = __import__("tarfile").TarInfo("file.txt")
    info.size = len(content)
    push_image(registry.host, name, tag, [tar_bytes([(info, content)])])
    raw = get(registry, f"{name}/manifests/{tag}", MANIFEST_TYPE)
    return {"mediaType": MANIFEST_TYPE, "digest": f"sha256:{hashlib.sha256(raw).hexdigest()}", "size": len(raw)}


def get(registry: Registry, path: str, accept: str = "*/*") -> bytes:
    request = urllib.request.Request(f"http://{registry.host}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:  # loopback registry
        return response.read()


def client_for(registry: Registry, name: str):
    container = parse_reference(f"{registry.host}/{name}:latest")
    return connect(container, True, None, 30), container


def fallback_index(registry: Registry, name: str, subject_digest: str) -> dict:
    return json.loads(get(registry, f"{name}/manifests/sha256-{subject_digest.split(':')[1]}", INDEX_TYPE))


def test_two_signatures_attached_are_both_listed_and_both_verify(registry, digests, tmp_path) -> None:
    canary = Canary(tmp_path)
    subject = subject_image(registry, "hf/signed", "v1")
    client, container = client_for(registry, "hf/signed")
    first_key, first_pub = key_pair(tmp_path, "team")
    second_key, second_pub = key_pair(tmp_path, "release")
    name = f"{REPO}@{digests.commit}"
    first, second = (sign_files(digests.files, name, k) for k in (first_key, second_key))
    with network_errors(container.registry, True):
        assert referrers.bundles(client, container, subject["digest"]) == []
        one = referrers.attach(client, container, subject, first)
        two = referrers.attach(client, container, subject, second)
        assert referrers.attach(client, container, subject, second) == two  # once only
        found = referrers.bundles(client, container, subject["digest"])
    assert found == [second, first]  # the newest first
    index = fallback_index(registry, "hf/signed", subject["digest"])
    assert index["mediaType"] == INDEX_TYPE
    assert [(m["digest"], m["artifactType"], m["mediaType"]) for m in index["manifests"]] == [
        (one, BUNDLE_TYPE, MANIFEST_TYPE), (two, BUNDLE_TYPE, MANIFEST_TYPE)]
    # Read by an independent client: the referrer manifest names the subject and carries the bundle as its layer.
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{registry.host}/hf/signed@{one}"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    manifest = json.loads(raw)
    assert manifest["artifactType"] == BUNDLE_TYPE and manifest["subject"] == subject
    assert manifest["layers"] == [{"mediaType": BUNDLE_TYPE, "digest": f"sha256:{hashlib.sha256(first).hexdigest()}",
                                   "size": len(first)}]
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    # Each bundle checks out against the snapshot, with its own key only.
    found = found[::-1]
    assert verify_files(found[0], digests.files, first_pub).signed == tuple(sorted(digests.files))
    assert verify_files(found[1], digests.files, second_pub).key_fingerprint != verify_files(
        found[0], digests.files, first_pub).key_fingerprint
    with pytest.raises(SignatureMismatch, match="does not verify with this key"):
        verify_files(found[0], digests.files, second_pub)
    canary.assert_unchanged()


def test_a_subject_without_signatures_gives_an_empty_list(registry) -> None:
    subject = subject_image(registry, "hf/unsigned", "v1")
    client, container = client_for(registry, "hf/unsigned")
    with network_errors(container.registry, True):
        assert referrers.bundles(client, container, subject["digest"]) == []
        assert referrers.bundles(client, container, "sha256:" + "0" * 64) == []


def test_other_referrers_in_the_fallback_index_are_kept_and_skipped(registry, digests, tmp_path) -> None:
    subject = subject_image(registry, "hf/sbom", "v1")
    host, name = registry.host, "hf/sbom"
    # An SBOM referrer another tool attached, listed in the fallback index by that tool.
    sbom = b'{"spdxVersion": "SPDX-2.3"}'
    empty = put_blob(host, name, b"{}")
    sbom_manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": "application/spdx+json",
                                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty,
                                           "size": 2},
                                "layers": [{"mediaType": "application/spdx+json", "digest": put_blob(host, name, sbom),
                                            "size": len(sbom)}],
                                "subject": subject}).encode()
    sbom_digest = put_manifest(host, name, f"sha256:{hashlib.sha256(sbom_manifest).hexdigest()}", sbom_manifest,
                               MANIFEST_TYPE)
    listed = {"mediaType": MANIFEST_TYPE, "digest": sbom_digest, "size": len(sbom_manifest),
              "artifactType": "application/spdx+json", "annotations": {"org.example": "kept"}}
    put_manifest(host, name, f"sha256-{subject['digest'].split(':')[1]}",
                 json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [listed]}).encode(),
                 INDEX_TYPE)
    client, container = client_for(registry, name)
    key, _pub = key_pair(tmp_path, "k")
    bundle = sign_files(digests.files, REPO, key)
    with network_errors(container.registry, True):
        ours = referrers.attach(client, container, subject, bundle)
        assert referrers.bundles(client, container, subject["digest"]) == [bundle]
    manifests = fallback_index(registry, name, subject["digest"])["manifests"]
    assert manifests[0] == listed and [m["digest"] for m in manifests] == [sbom_digest, ours]


def test_concurrent_attaches_all_end_up_listed(registry, digests, tmp_path) -> None:
    subject = subject_image(registry, "hf/busy", "v1")
    bundles = [sign_files(digests.files, f"{REPO}#{i}", key_pair(tmp_path, f"k{i}")[0]) for i in range(4)]
    errors: list[BaseException] = []

    def attach(bundle: bytes) -> None:
        client, container = client_for(registry, "hf/busy")
        try:
            with network_errors(container.registry, True):
                referrers.attach(client, container, subject, bundle)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=attach, args=(b,)) for b in bundles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    client, container = client_for(registry, "hf/busy")
    with network_errors(container.registry, True):
        assert sorted(referrers.bundles(client, container, subject["digest"])) == sorted(bundles)


def test_a_fallback_tag_holding_an_image_is_left_alone(registry, digests, tmp_path) -> None:
    subject = subject_image(registry, "hf/taken", "v1")
    tag = f"sha256-{subject['digest'].split(':')[1]}"
    subject_image(registry, "hf/taken", tag, b"someone else's image")
    before = get(registry, f"hf/taken/manifests/{tag}", MANIFEST_TYPE)
    client, container = client_for(registry, "hf/taken")
    bundle = sign_files(digests.files, REPO, key_pair(tmp_path, "k")[0])
    with network_errors(container.registry, True), pytest.raises(HubError, match="is not an image index"):
        referrers.attach(client, container, subject, bundle)
    with network_errors(container.registry, True), pytest.raises(HubError, match="is not an image index"):
        referrers.bundles(client, container, subject["digest"])
    assert get(registry, f"hf/taken/manifests/{tag}", MANIFEST_TYPE) == before


def test_listed_referrers_are_checked_before_a_bundle_is_returned(registry, digests, tmp_path) -> None:
    """A referrer listed for the subject whose own subject is another is skipped; a bundle blob altered in the
    registry's storage is refused (its digest), never returned."""
    subject = subject_image(registry, "hf/checked", "v1")
    other = subject_image(registry, "hf/checked", "v2", b"another image")
    client, container = client_for(registry, "hf/checked")
    key, _pub = key_pair(tmp_path, "k")
    bundle = sign_files(digests.files, REPO, key)
    with network_errors(container.registry, True):
        about_other = referrers.attach(client, container, other, bundle)
    misplaced = fallback_index(registry, "hf/checked", other["digest"])["manifests"]
    assert [m["digest"] for m in misplaced] == [about_other]
    put_manifest(registry.host, "hf/checked", f"sha256-{subject['digest'].split(':')[1]}",
                 json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": misplaced}).encode(),
                 INDEX_TYPE)
    with network_errors(container.registry, True):
        assert referrers.bundles(client, container, subject["digest"]) == []
    blob = registry.blob_path(f"sha256:{hashlib.sha256(bundle).hexdigest()}")
    altered = bytearray(blob.read_bytes())
    altered[10] ^= 1
    blob.write_bytes(bytes(altered))
    with network_errors(container.registry, True), pytest.raises(HubError, match="does not match its digest"):
        referrers.bundles(client, container, other["digest"])


def test_malformed_arguments_are_usage_errors(registry) -> None:
    from hfcache.errors import UsageError

    client, container = client_for(registry, "hf/args")
    with pytest.raises(UsageError):
        referrers.bundles(client, container, "sha256:nothex")
    with pytest.raises(UsageError):
        referrers.attach(client, container, {"digest": "sha256:" + "0" * 64}, b"{}")
    assert shutil.which("skopeo"), "CI installs skopeo"


# --- a registry with the referrers API (distribution-spec v1.1), hand-written -------------------------------------


class _ReferrersRegistry(PeerServer):
    """A minimal distribution-spec v1.1 registry on 127.0.0.1 with the referrers API (docker-registry, the real
    registry of the other tests, has none): a manifest PUT with a ``subject`` is answered with ``OCI-Subject``;
    ``GET /v2/<name>/referrers/<digest>`` lists its referrers. ``hostile="huge-index"`` makes the referrers answer
    5 MiB of index."""

    def __init__(self, hostile: str = "") -> None:
        self.hostile = hostile
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.paths: list[str] = []
        super().__init__()

    def _answer(self, h, head: bool) -> None:
        {"HEAD": self._head, "POST": self._post, "PUT": self._put, "DELETE": self._delete}.get(h.command, self._get)(h)

    def _head(self, h) -> None:
        digest = h.path.rsplit("/", 1)[1]
        send(h, 200 if digest in self.blobs else 404)

    def _post(self, h) -> None:
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        send(h, 202, headers={"Location": "/upload/1"})

    def _put(self, h) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length", 0)))
        self.paths.append(f"PUT {h.path}")
        if h.path.startswith("/upload/"):
            self.blobs[h.path.split("digest=")[1]] = body
            return send(h, 201)
        ref = h.path.rsplit("/", 1)[1]
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        self.manifests[ref] = self.manifests[digest] = (body, h.headers["Content-Type"])
        subject = json.loads(body).get("subject")
        send(h, 201, headers={"Docker-Content-Digest": digest,
                              **({"OCI-Subject": subject["digest"]} if subject else {})})

    def _delete(self, h) -> None:
        self.paths.append(f"DELETE {h.path}")
        ref = h.path.rsplit("/", 1)[1]
        send(h, 202 if self.manifests.pop(ref, None) else 404)

    def _get(self, h) -> None:
        self.paths.append(f"GET {h.path}")
        path = h.path.split("?")[0]
        if "/referrers/" in path:
            subject = path.rsplit("/", 1)[1]
            entries = []
            for digest, (body, media_type) in sorted(self.manifests.items()):
                doc = json.loads(body)
                if digest.startswith("sha256:") and (doc.get("subject") or {}).get("digest") == subject:
                    entries.append({"mediaType": media_type, "digest": digest, "size": len(body),
                                    "artifactType": doc.get("artifactType"),
                                    **({"annotations": doc["annotations"]} if doc.get("annotations") else {})})
            index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": entries}
            if self.hostile == "huge-index":
                index["padding"] = "x" * (5 * 1024 * 1024)
            return send(h, 200, json.dumps(index).encode(), {"Content-Type": INDEX_TYPE})
        kind, ref = path.split("/")[-2:]
        if kind == "manifests" and ref in self.manifests:
            body, media_type = self.manifests[ref]
            return send(h, 200, body, {"Content-Type": media_type})
        if kind == "blobs" and ref in self.blobs:
            return send(h, 200, self.blobs[ref], {"Content-Type": "application/octet-stream"})
        send(h, 404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}')


def _labels(bundle: bytes) -> dict[str, str]:
    """``attach``'s ``model`` and ``key`` labels of a bundle (:func:`bundle_identity`)."""
    from hfcache.integrity.signatures import bundle_identity

    return dict(zip(("model", "key"), bundle_identity(bundle), strict=True))


def _api_subject(registry: _ReferrersRegistry) -> dict:
    body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": {}, "layers": []}).encode()
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    registry.manifests[digest] = (body, MANIFEST_TYPE)
    return {"mediaType": MANIFEST_TYPE, "digest": digest, "size": len(body)}


def test_a_registry_with_the_referrers_api_is_asked_through_it(digests, tmp_path) -> None:
    key, public = key_pair(tmp_path, "k")
    bundle = sign_files(digests.files, REPO, key)
    with _ReferrersRegistry() as api:
        subject = _api_subject(api)
        client, container = client_for(api, "hf/api")
        with network_errors(container.registry, True):
            one = referrers.attach(client, container, subject, bundle)
            assert referrers.bundles(client, container, subject["digest"]) == [bundle]
        assert not [p for p in api.paths if "/manifests/sha256-" in p]  # no fallback tag where the API exists
        assert any(p.startswith(f"GET /v2/hf/api/referrers/{subject['digest']}?artifactType=") for p in api.paths)
        assert f"PUT /v2/hf/api/manifests/{one}" in api.paths
    assert verify_files(bundle, digests.files, public).signed


@pytest.mark.parametrize("hostile", ["huge-index", "huge-bundle"])
def test_oversized_referrer_answers_are_refused(digests, tmp_path, hostile) -> None:
    bundle = sign_files(digests.files, REPO, key_pair(tmp_path, "k")[0])
    with _ReferrersRegistry(hostile) as api:
        subject = _api_subject(api)
        client, container = client_for(api, "hf/api")
        with network_errors(container.registry, True):
            referrers.attach(client, container, subject, bundle)
            if hostile == "huge-bundle":  # a referrer (digest-consistent) whose bundle declares 10 GiB
                body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": BUNDLE_TYPE,
                                   "config": {}, "subject": subject, "layers": [
                                       {"mediaType": BUNDLE_TYPE, "digest": "sha256:" + "1" * 64,
                                        "size": 10 * 1024**3}]}).encode()
                api.manifests[f"sha256:{hashlib.sha256(body).hexdigest()}"] = (body, MANIFEST_TYPE)
            with pytest.raises(HubError, match="larger than|declares"):
                referrers.bundles(client, container, subject["digest"])


def test_verify_any_takes_the_signature_of_the_key_given(registry, digests, tmp_path) -> None:
    from hfcache.integrity.signatures import verify_any

    subject = subject_image(registry, "hf/any", "v1")
    client, container = client_for(registry, "hf/any")
    (a_key, a_pub), (b_key, b_pub), (_c, c_pub) = (key_pair(tmp_path, n) for n in "abc")
    name = f"{REPO}@{digests.commit}"
    with network_errors(container.registry, True):
        for key in (a_key, b_key):
            referrers.attach(client, container, subject, sign_files(digests.files, name, key))
        found = referrers.bundles(client, container, subject["digest"])
    assert verify_any(found, digests.files, b_pub, name=name).key_fingerprint != verify_any(
        found, digests.files, a_pub, name=name).key_fingerprint
    with pytest.raises(SignatureMismatch, match=r"none of the 2 signature\(s\) verifies") as failed:
        verify_any(found, digests.files, c_pub, name=name)
    assert failed.value.exit_code == 1 and failed.value.reason == "signature"
    with pytest.raises(SignatureMismatch, match="no signature is attached") as unsigned:
        verify_any([], digests.files, a_pub, name=name)
    assert unsigned.value.reason == "unsigned"
    changed = {**digests.files, "vocab.txt": "0" * 64}
    with pytest.raises(SignatureMismatch, match="changed: vocab.txt") as differs:
        verify_any(found, changed, a_pub, name=name)
    assert differs.value.changed == ("vocab.txt",)



@pytest.mark.parametrize("layers", [5, True, "x", None, {"a": 1}])
def test_a_referrer_whose_layers_are_not_a_list_is_skipped(layers) -> None:
    """A hostile referrer manifest with ``"layers": 5`` (or ``true``) was a TypeError, exit 70: it is no bundle.
    (Distribution refuses such a manifest on upload, so the hand-written registry serves it.)"""
    with _ReferrersRegistry() as api:
        subject = _api_subject(api)
        bad = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": BUNDLE_TYPE,
                          "config": {}, "subject": subject, "layers": layers}).encode()
        api.manifests[f"sha256:{hashlib.sha256(bad).hexdigest()}"] = (bad, MANIFEST_TYPE)
        client, container = client_for(api, "hf/api")
        with network_errors(container.registry, True):
            assert referrers.bundles(client, container, subject["digest"]) == []


# --- re-pushes replace their own signature ----------------------------------------------------------------------------


def test_a_signature_of_the_same_model_and_key_replaces_the_earlier_one_and_others_are_kept(registry, digests,
                                                                                             tmp_path) -> None:
    from hfcache.integrity.signatures import bundle_identity, public_key_fingerprint, verify_any

    canary = Canary(tmp_path)
    subject = subject_image(registry, "hf/resigned", "v1")
    client, container = client_for(registry, "hf/resigned")
    key_a, pub_a = key_pair(tmp_path, "a")
    key_b, pub_b = key_pair(tmp_path, "b")
    name = f"{REPO}@{digests.commit}"
    foreign = sign_files(digests.files, name, key_a)  # attached without labels: another tool's referrer
    other_model = sign_files(digests.files, f"{REPO}-other@{digests.commit}", key_a)
    with network_errors(container.registry, True):
        referrers.attach(client, container, subject, foreign)
        referrers.attach(client, container, subject, other_model, model=bundle_identity(other_model)[0],
                         key=bundle_identity(other_model)[1])
        for _ in range(5):  # an ECDSA signature differs each time: five different bundles of one model and key
            last_a = sign_files(digests.files, name, key_a)
            referrers.attach(client, container, subject, last_a, **_labels(last_a))
        bundle_b = sign_files(digests.files, name, key_b)
        referrers.attach(client, container, subject, bundle_b, **_labels(bundle_b))
        found = referrers.bundles(client, container, subject["digest"])
    assert found == [bundle_b, last_a, other_model, foreign]  # one per (model, key), the newest first
    index = fallback_index(registry, "hf/resigned", subject["digest"])
    labels = [(m.get("annotations") or {}).get(referrers.KEY_ANNOTATION) for m in index["manifests"]]
    assert labels == [None, public_key_fingerprint(pub_a), public_key_fingerprint(pub_a),
                      public_key_fingerprint(pub_b)]
    assert [(m.get("annotations") or {}).get(referrers.MODEL_ANNOTATION) for m in index["manifests"]] == [
        None, f"{REPO}-other@{digests.commit}", name, name]
    assert verify_any(found, digests.files, pub_b).key_fingerprint == public_key_fingerprint(pub_b)
    assert verify_any(found, digests.files, pub_a).key_fingerprint == public_key_fingerprint(pub_a)
    canary.assert_unchanged()


def test_concurrent_signatures_of_one_model_and_key_settle_on_one(registry, digests, tmp_path) -> None:

    subject = subject_image(registry, "hf/race", "v1")
    key, _public = key_pair(tmp_path, "k")
    bundles = [sign_files(digests.files, f"{REPO}@{digests.commit}", key) for _ in range(4)]
    errors: list[BaseException] = []

    def attach(bundle: bytes) -> None:
        client, container = client_for(registry, "hf/race")
        try:
            with network_errors(container.registry, True):
                referrers.attach(client, container, subject, bundle, **_labels(bundle))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=attach, args=(b,)) for b in bundles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    client, container = client_for(registry, "hf/race")
    with network_errors(container.registry, True):
        found = referrers.bundles(client, container, subject["digest"])
    assert len(found) == 1 and found[0] in bundles


def test_with_the_referrers_api_the_replaced_signature_is_deleted(digests, tmp_path) -> None:

    key, public = key_pair(tmp_path, "k")
    first, second = (sign_files(digests.files, f"{REPO}@{digests.commit}", key) for _ in range(2))
    with _ReferrersRegistry() as api:
        subject = _api_subject(api)
        client, container = client_for(api, "hf/api")
        with network_errors(container.registry, True):
            one = referrers.attach(client, container, subject, first, **_labels(first))
            referrers.attach(client, container, subject, second, **_labels(second))
            assert referrers.bundles(client, container, subject["digest"]) == [second]
        assert f"DELETE /v2/hf/api/manifests/{one}" in api.paths
    assert verify_files(second, digests.files, public).signed
