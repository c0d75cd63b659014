"""examples/k8s: every manifest validates against Kubernetes' schemas (kubernetes-validate, bundled schemas), and
the hfcache commands inside them run for real: the mirror's warm against a local Hub, its serve on loopback, the
applications' init containers against that serve, then the applications themselves, offline.

Paths inside the pods (volume mount points) become temporary folders; ``https://huggingface.co`` becomes a local
HubServer over the fixture repos; ``http://hfcache-mirror:8080`` becomes the local serve; ``0.0.0.0:8080`` becomes
``127.0.0.1:0``. Nothing else in the commands is changed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import kubernetes_validate
import pytest
import yaml
from huggingface_hub import hf_hub_download

from hfcache.serve import HubServer
from tests.helpers import clean_env, golden_ids, refused_endpoint

PROJECT = Path(__file__).parents[2]
K8S = PROJECT / "examples" / "k8s"
EXAMPLES = PROJECT / "examples"
MANIFESTS = sorted(K8S.glob("*.yaml"))
MINE = ["app-emptydir.yaml", "app-shared-rwx.yaml", "mirror.yaml", "app-image-volume.yaml", "oci-push-cronjob.yaml"]
K8S_VERSION = "1.30"  # a version clusters still run; the schemas ship with kubernetes-validate
# `image` volumes (KEP-4639) are on by default from 1.35: the manifests that use them are validated against 1.35.
K8S_VERSIONS = {"app-image-volume.yaml": "1.35", "oci-push-cronjob.yaml": "1.35"}
REGISTRY = "registry.example.com/"  # the examples' registry; a local docker-registry in the run-for-real test
UPSTREAM, MIRROR = "https://huggingface.co", "http://hfcache-mirror:8080"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pod_spec(doc: dict) -> dict | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"] if doc["kind"] == "Pod" else None


def workloads() -> Iterator[tuple[str, dict, dict]]:
    """(file name, document, pod spec) of every workload in examples/k8s."""
    for path in MANIFESTS:
        for doc in documents(path):
            spec = pod_spec(doc)
            if spec is not None:
                yield path.name, doc, spec


def all_containers(spec: dict) -> list[tuple[bool, dict]]:
    return [(True, c) for c in spec.get("initContainers", [])] + [(False, c) for c in spec["containers"]]


def argv(container: dict) -> list[str]:
    """The process a container runs: command + args, or the hfcache image's entrypoint + args."""
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    assert "hfcache" in container["image"], container["name"]  # docker/Dockerfile: ENTRYPOINT ["hfcache"]
    return ["hfcache", *container.get("args", [])]


# --- static checks -------------------------------------------------------------------------------------


def test_examples_exist():
    assert set(MINE) <= {p.name for p in MANIFESTS}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_strictly(path):
    docs = documents(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS.get(path.name, K8S_VERSION), strict=True)


def test_image_volume_needs_1_35_schemas():
    doc = documents(K8S / "app-image-volume.yaml")[0]
    with pytest.raises(kubernetes_validate.ValidationError):  # 1.30 has no `image` volume source
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    doc = copy.deepcopy(doc)
    image = doc["spec"]["template"]["spec"]["volumes"][0]["image"]
    image["referense"] = image.pop("reference")  # misspelt field: strict 1.35 knows the image volume source
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.35", strict=True)


def test_the_validator_is_not_vacuous():
    doc = copy.deepcopy(documents(K8S / "mirror.yaml")[1])
    doc["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True  # misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    doc = copy.deepcopy(documents(K8S / "mirror.yaml")[1])
    doc["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", MINE)
def test_pods_run_non_root_on_a_read_only_root_filesystem(name):
    specs = [spec for file, _, spec in workloads() if file == name]
    assert specs
    for spec in specs:
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 1000 and context["fsGroup"] == 1000
        for _, container in all_containers(spec):
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, container["name"]
            assert security["allowPrivilegeEscalation"] is False, container["name"]
            assert security["capabilities"]["drop"] == ["ALL"], container["name"]
        volumes = {v["name"] for v in spec["volumes"]}
        for _, container in all_containers(spec):
            assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes


def test_offline_env_is_what_hfcache_env_prints():
    checked = 0
    for file, _, spec in workloads():
        for _, container in all_containers(spec):
            env = container.get("env", [])
            names = [e["name"] for e in env]
            if argv(container)[:2] == ["hfcache", "warm"]:
                assert "HF_HUB_OFFLINE" not in names, (file, container["name"])  # warm needs the network
            if "HF_HUB_OFFLINE" not in names:
                continue
            cache = next(e["value"] for e in env if e["name"] == "HF_HUB_CACHE")
            proc = subprocess.run([sys.executable, "-m", "hfcache", "env", "--cache-dir", cache, "--format", "k8s"],
                                  capture_output=True, text=True, env=clean_env(), cwd=PROJECT, timeout=60)
            assert proc.returncode == 0, proc.stderr
            assert env == yaml.safe_load(proc.stdout)["env"], (file, container["name"])
            checked += 1
    assert checked >= 2


def test_apps_warm_from_the_mirror_service():
    docs = documents(K8S / "mirror.yaml")
    service = next(d for d in docs if d["kind"] == "Service")
    mirror = next(d for d in docs if d["kind"] == "Deployment")
    labels = mirror["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    serve = mirror["spec"]["template"]["spec"]["containers"][0]
    assert port["targetPort"] in {p["name"] for p in serve["ports"]}
    assert argv(serve)[argv(serve).index("--port") + 1] == str(port["port"])
    url = f"http://{service['metadata']['name']}:{port['port']}"
    assert url == MIRROR
    for name in ("app-emptydir.yaml", "app-shared-rwx.yaml"):
        (warm,) = [c for file, _, spec in workloads() if file == name for init, c in all_containers(spec) if init]
        command = argv(warm)
        assert command[:4] == ["hfcache", "warm", "--lock", "/config/hfcache.lock"]
        assert command[command.index("--endpoint") + 1] == MIRROR


# --- the commands, for real ----------------------------------------------------------------------------


class Cluster:
    """Stand-ins for what the pods would mount, and the endpoints they would reach."""

    def __init__(self, base: Path, upstream: str, registry: str) -> None:
        self.base = base
        self.endpoints = {UPSTREAM: upstream}
        self.registry = registry  # host:port of a local registry standing for registry.example.com
        self.lock_dir = base / "configmaps" / "hfcache-lock"
        self.lock_dir.mkdir(parents=True)
        shutil.copyfile(EXAMPLES / "hfcache.lock", self.lock_dir / "hfcache.lock")

    def volume_dir(self, pod: str, volume: dict) -> Path:
        if "persistentVolumeClaim" in volume:
            path = self.base / "claims" / volume["persistentVolumeClaim"]["claimName"]
        elif "configMap" in volume:
            assert volume["configMap"]["name"] == "hfcache-lock", volume
            return self.lock_dir
        elif "secret" in volume:  # a token Secret: one file, ``token``
            path = self.base / "secrets" / volume["secret"]["secretName"]
            path.mkdir(parents=True, exist_ok=True)
            (path / "token").write_text("hf_example_upstream_token\n")
            return path
        elif "image" in volume:  # what the kubelet mounts: the image's root filesystem, here pulled by hfcache
            path = self.base / "images" / volume["image"]["reference"].replace("/", "_")
            if not path.exists():
                pulled = run(["hfcache", "pull", self.local(volume["image"]["reference"]), "--cache-dir", str(path),
                              "--plain-http"], {})
                assert pulled.returncode == 0, pulled.stderr
            return path
        else:
            path = self.base / "pods" / pod / volume["name"]
        path.mkdir(parents=True, exist_ok=True)
        return path

    def process(self, pod: str, spec: dict, container: dict) -> tuple[list[str], dict[str, str]]:
        """The container's command and environment, mount paths and endpoints replaced."""
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = sorted(((m["mountPath"], self.volume_dir(pod, volumes[m["name"]]))
                         for m in container.get("volumeMounts", [])), key=lambda m: -len(m[0]))

        def local(value: str) -> str:
            for point, folder in mounts:
                if value == point or value.startswith(point + "/"):
                    return str(folder) + value[len(point):]
            return self.local(value)

        env = {e["name"]: local(e["value"]) if "value" in e else self.field(e["valueFrom"])
               for e in container.get("env", [])}
        # Kubernetes expands $(VAR) in command and args from the container's env.
        command = [local(re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a))
                   for a in argv(container)]
        for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
            if command[:2] == ["hfcache", "serve"] and flag in command:
                command[command.index(flag) + 1] = value
        if command[:2] in (["hfcache", "push"], ["hfcache", "pull"]):
            command.append("--plain-http")  # the local registry has no TLS
        return command, env

    def local(self, value: str) -> str:
        if value.startswith(REGISTRY):
            return self.registry + "/" + value[len(REGISTRY):]
        return self.endpoints.get(value, value)

    @staticmethod
    def field(source: dict) -> str:
        """A downward-API value: the labels the Job controller puts on its pods."""
        path = source["fieldRef"]["fieldPath"]
        assert path == "metadata.labels['batch.kubernetes.io/job-name']", path
        return "hfcache-oci-push-29415281"


def run(command: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    executable = [sys.executable, "-m", "hfcache"] if command[0] == "hfcache" else [sys.executable]
    if command[0] == "python":
        command = [command[0], str(EXAMPLES / Path(command[1]).name), *command[2:]]  # /app/<script> of the image
    return subprocess.run([*executable, *command[1:]], capture_output=True, text=True, cwd=PROJECT,
                          env=clean_env(**env), timeout=timeout)


def container_of(file: str, name: str) -> tuple[str, dict, dict]:
    for f, doc, spec in workloads():
        for _, container in all_containers(spec):
            if f == file and container["name"] == name:
                return doc["metadata"]["name"], spec, container
    raise KeyError((file, name))


def check_pull_through(command: list[str], env: dict[str, str], upstream: HubServer, client: Path) -> None:
    """Run the pull-through container's serve; a client gets an allowed repo through it, not a refused one."""
    server = subprocess.Popen([sys.executable, "-m", "hfcache", *command[1:]], cwd=PROJECT, env=clean_env(**env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        endpoint = re.search(r" at (http://\S+)$", server.stderr.readline().strip()).group(1)
        before = len(upstream.requests)
        path = hf_hub_download("bert-base-uncased", "vocab.txt", cache_dir=client, endpoint=endpoint, token=False)
        refused = httpx2.get(f"{endpoint}/api/models/mistralai/Mistral-7B-v0.1")
        scraped = httpx2.get(f"{endpoint}/metrics").text
        health = httpx2.get(f"{endpoint}/healthz").json()
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    assert code == 0, server.stderr.read()
    assert Path(path).read_bytes() == (PROJECT / "tests/data/hub/google-bert/bert-base-uncased/vocab.txt").read_bytes()
    assert len(upstream.requests) > before and all(r.authorized for r in upstream.requests[before:]
                                                   if r.origin == "hub" and r.path != "/")
    assert (refused.status_code, refused.headers["x-error-code"]) == (403, "RepoNotAllowed")
    assert "hfcache_upstream_fetches_total 1.0" in scraped and health["upstream_reachable"] is True
    cache = command[command.index("--cache-dir") + 1]
    verified = run(["hfcache", "verify", "--cache-dir", cache], {})
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.slow
def test_the_manifests_commands_run_for_real(hub_root, tmp_path):
    from tests.registry import available, running_registry

    if available() and not os.environ.get("CI"):
        pytest.skip(available())
    ran = set()
    with HubServer(hub_root) as upstream, running_registry(tmp_path / "registry") as registry:
        cluster = Cluster(tmp_path, upstream.endpoint, registry.host)

        # 1. The mirror's init container fills its claim from "the Hub".
        pod, spec, warm = container_of("mirror.yaml", "warm")
        proc = run(*cluster.process(pod, spec, warm))
        assert proc.returncode == 0, proc.stderr
        ran.add(("mirror.yaml", "warm"))
        hub_requests = len(upstream.requests)
        assert hub_requests > 0

        # 2. Its server container serves the claim.
        pod, spec, serve = container_of("mirror.yaml", "mirror")
        command, env = cluster.process(pod, spec, serve)
        server = subprocess.Popen([sys.executable, "-m", "hfcache", *command[1:]], cwd=PROJECT,
                                  env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ran.add(("mirror.yaml", "mirror"))
        try:
            endpoint = re.search(r" at (http://\S+)$", server.stderr.readline().strip()).group(1)
            cluster.endpoints[MIRROR] = endpoint
            probe = serve["readinessProbe"]["httpGet"]["path"]
            assert httpx2.get(f"{endpoint}{probe}").status_code == 200

            # 3. Each application's init container warms from the mirror; the app then loads offline.
            for file in ("app-emptydir.yaml", "app-shared-rwx.yaml"):
                pod, spec, init = container_of(file, "warm-tokenizers")
                replicas = 3 if file == "app-shared-rwx.yaml" else 1  # pods racing on the shared claim
                with ThreadPoolExecutor(replicas) as pool:
                    results = list(pool.map(lambda _: run(*cluster.process(pod, spec, init)), range(replicas)))
                assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
                ran.add((file, "warm-tokenizers"))
                # A restarted pod: the volume already holds the lock, so warm needs no request (the mirror is
                # replaced by a port nobody listens on: any request would fail the command).
                cluster.endpoints[MIRROR] = refused_endpoint()
                again = run(*cluster.process(pod, spec, init))
                cluster.endpoints[MIRROR] = endpoint
                assert again.returncode == 0, again.stderr

                pod, spec, app = container_of(file, "app")
                loaded = run(*cluster.process(pod, spec, app))
                assert loaded.returncode == 0, loaded.stdout + loaded.stderr
                tokens = [json.loads(line) for line in loaded.stdout.splitlines() if line.startswith("{")]
                assert {t["repo_id"] for t in tokens} == {
                    "bert-base-uncased", "openai-community/gpt2", "FacebookAI/roberta-base"}
                for entry in tokens:
                    canonical = {"bert-base-uncased": "google-bert/bert-base-uncased"}.get(entry["repo_id"])
                    assert entry["input_ids"] == golden_ids(entry["repo_id"], canonical), entry
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=30)
        access = server.stdout.read().splitlines()
        assert code == 0, server.stderr.read()

        # The apps' downloads came from the mirror, not the Hub; a satisfied volume cost no request.
        assert len(upstream.requests) == hub_requests
        assert access and all(line.split()[3] in ("200", "307") for line in access)

        # 3b. The pull-through variant: an empty claim that fills itself from "the Hub", for allowed repos only.
        pod, spec, pull = container_of("mirror.yaml", "pullthrough")
        check_pull_through(*cluster.process(pod, spec, pull), upstream, tmp_path / "client")
        ran.add(("mirror.yaml", "pullthrough"))

        # 4. Any other hfcache command in the examples (e.g. the prune CronJob) runs too. A claim no example
        # creates stands for an existing cache volume: it gets a copy of the mirror's warmed claim.
        declared = {d["metadata"]["name"] for path in MANIFESTS for d in documents(path)
                    if d["kind"] == "PersistentVolumeClaim"}
        mirror_claim = tmp_path / "claims" / "hfcache-mirror-cache"
        for file, doc, spec in workloads():
            for _, container in all_containers(spec):
                command = argv(container)
                if command[0] != "hfcache" or (file, container["name"]) in ran:
                    continue
                for volume in spec["volumes"]:
                    claim = volume.get("persistentVolumeClaim", {}).get("claimName")
                    if claim and claim not in declared and not (tmp_path / "claims" / claim).exists():
                        shutil.copytree(mirror_claim, tmp_path / "claims" / claim, symlinks=True)
                proc = run(*cluster.process(doc["metadata"]["name"], spec, container))
                assert proc.returncode == 0, (file, container["name"], proc.stderr)
                ran.add((file, container["name"]))
                # Whatever it did, every cache it touched still holds the lock, intact.
                if "--cache-dir" in command:
                    cache = cluster.process(doc["metadata"]["name"], spec, container)[0]
                    cache = cache[cache.index("--cache-dir") + 1]
                    verified = run(["hfcache", "verify", "--lock", str(cluster.lock_dir / "hfcache.lock"),
                                    "--cache-dir", cache], {})
                    assert verified.returncode == 0, (file, container["name"], verified.stdout + verified.stderr)
        hub_requests_after_push = len(upstream.requests)

        # 5. The application that mounts the pushed image (image volume) loads offline from it.
        pod, spec, app = container_of("app-image-volume.yaml", "app")
        loaded = run(*cluster.process(pod, spec, app))
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        tokens = [json.loads(line) for line in loaded.stdout.splitlines() if line.startswith("{")]
        assert len(tokens) == 3
        for entry in tokens:
            canonical = {"bert-base-uncased": "google-bert/bert-base-uncased"}.get(entry["repo_id"])
            assert entry["input_ids"] == golden_ids(entry["repo_id"], canonical), entry
        assert len(upstream.requests) == hub_requests_after_push  # the image volume needs no Hub

    expected = {(f, c["name"]) for f, _, spec in workloads() for _, c in all_containers(spec)
                if argv(c)[0] == "hfcache"}
    assert ran == expected
