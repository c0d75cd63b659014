"""examples/k8s: every manifest validates against Kubernetes' schemas (kubernetes-validate, bundled schemas), and
the hfcache commands inside them run for real: the mirror's warm against a local Hub, its serve on loopback, the
applications' init containers against that serve, then the applications themselves, offline.

Paths inside the pods (volume mount points) become temporary folders; ``https://huggingface.co`` becomes a local
HubServer over the fixture repos (in the run-for-real test, with a model card added so that its commits are not the
fixture lock's, as the public Hub's are not: the manifests' own ``hfcache lock`` step makes the lock they load);
``http://hfcache-mirror:8080`` becomes the local serve; ``0.0.0.0:8080`` becomes ``127.0.0.1:0``. Nothing else in
the commands is changed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
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

from tests.helpers import clean_env, golden_ids, refused_endpoint
from tests.s3 import moto_server
from tests.testhub import HubServer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

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


def header_commands(path: Path, program: str) -> list[list[str]]:
    """The commands of a manifest's header comment that start with ``program`` (``\\`` continuations joined, a
    trailing ``# comment`` left out), each as its words."""
    text = re.sub(r"\\\n#\s*", " ", path.read_text())
    lines = [line.lstrip("# ") for line in text.splitlines() if line.startswith("#")]
    return [shlex.split(line, comments=True) for line in lines if line.startswith(program + " ")]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


#: The lock of the bundled test Hub (the container test's): its commits are not huggingface.co's.
FIXTURE_LOCK = "examples/hfcache.lock"


# --- static checks -------------------------------------------------------------------------------------


def test_examples_exist():
    assert set(MINE) <= {p.name for p in MANIFESTS}


def test_the_lock_the_manifests_load_is_made_against_the_hub_they_warm_from():
    """The ConfigMap every manifest loads (and the lock its header pushes) is the output of a header's
    ``hfcache lock`` against ``https://huggingface.co``, the endpoint the pods warm from, never the fixture lock,
    whose commits the public Hub does not have (every restart of the init container would exit 3)."""
    made = {}
    for path in MANIFESTS:
        for command in header_commands(path, "hfcache lock"):
            assert flag(command, "--endpoint") == UPSTREAM and flag(command, "--manifest") == "examples/hfcache.toml"
            made[flag(command, "--output")] = path.name
    assert made and FIXTURE_LOCK not in made, made
    loaded = {}
    for path in MANIFESTS:
        for command in header_commands(path, "kubectl create configmap hfcache-lock"):
            [source] = [a.split("=", 2)[2] for a in command if a.startswith("--from-file=hfcache.lock=")]
            loaded[path.name] = source
        for command in header_commands(path, "hfcache push"):
            if "--lock" in command:
                loaded[path.name + " (push)"] = flag(command, "--lock")
    # Every manifest whose pods read /config/hfcache.lock says where the ConfigMap comes from.
    readers = {file for file, _, spec in workloads() if any(v.get("configMap", {}).get("name") == "hfcache-lock"
                                                            for v in spec.get("volumes", []))}
    assert readers <= set(loaded), readers - set(loaded)
    assert {file: source for file, source in loaded.items() if source not in made} == {}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_strictly(path):
    docs = documents(path)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("serving.kserve.io/"):
            continue  # a KServe CRD (no kubernetes-validate schema): test_kserve_example_validates_... checks it
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


# --- the offline NetworkPolicy (offline-networkpolicy.yaml) --------------------------------------------------

POLICY = K8S / "offline-networkpolicy.yaml"
APPS = ["app-emptydir.yaml", "app-shared-rwx.yaml", "app-image-volume.yaml"]
DNS_POD = ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})


def _selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector of these examples (matchLabels only: anything else is refused) against ``labels``."""
    assert set(selector) <= {"matchLabels"}, selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def egress_allowed(policies: list[dict], pod: dict, dest: tuple[dict, dict], protocol: str, port: int) -> bool:
    """Would the NetworkPolicy API let a pod with labels ``pod`` (in the policies' namespace, ``default``) send to
    a pod with (namespace labels, pod labels) ``dest`` on ``protocol``/``port``? The semantics of
    networking.k8s.io/v1 for the fields these examples use: a pod selected by no Egress policy may send anything;
    otherwise what any selecting policy's rule allows (rules are a union; an empty ``to``/``ports`` matches all)."""
    selecting = [p for p in policies
                 if "Egress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod)]
    if not selecting:
        return True
    namespace, labels = dest
    for policy in selecting:
        for rule in policy["spec"].get("egress") or []:
            peers = rule.get("to") or [{}]
            ports = rule.get("ports") or [{}]
            peer_ok = any(
                ("ipBlock" not in peer)
                and (_selects(peer["namespaceSelector"], namespace) if "namespaceSelector" in peer
                     else namespace == {"kubernetes.io/metadata.name": "default"})
                and _selects(peer.get("podSelector", {}), labels) for peer in peers)
            port_ok = any(p.get("protocol", "TCP") == protocol and p.get("port", port) == port for p in ports)
            if peer_ok and port_ok:
                return True
    return False


def app_pods() -> dict[str, tuple[dict, dict]]:
    """file -> (pod template labels, pod spec) of each application example."""
    found = {}
    for file, doc, spec in workloads():
        if file in APPS:
            found[file] = (doc["spec"]["template"]["metadata"]["labels"], spec)
    assert set(found) == set(APPS)
    return found


def test_offline_policy_denies_all_egress_and_validates_strictly():
    policies = documents(POLICY)
    assert [p["kind"] for p in policies] == ["NetworkPolicy", "NetworkPolicy"]
    for policy in policies:
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
        assert policy["spec"]["policyTypes"] == ["Egress"]  # ingress is left to the cluster: not ours to open
    base = next(p for p in policies if p["metadata"]["name"] == "hfcache-offline")
    assert base["spec"].get("egress", []) == []  # no rule: the selected pods send nothing, DNS included
    text = POLICY.read_text()
    assert "Calico" in text and "Cilium" in text and "doctor" in text  # says who enforces it and who cannot see it


def test_the_validator_refuses_a_broken_policy():
    policy = copy.deepcopy(documents(POLICY)[1])
    policy["spec"]["egress"][0]["to"][0]["podSelektor"] = policy["spec"]["egress"][0]["to"][0].pop("podSelector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    policy = copy.deepcopy(documents(POLICY)[0])
    policy["spec"]["policyTypes"] = "Egress"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)


def test_every_app_example_is_selected_by_the_policy_and_names_it():
    policies = documents(POLICY)
    base = next(p for p in policies if p["metadata"]["name"] == "hfcache-offline")
    for file, (labels, _) in app_pods().items():
        assert _selects(base["spec"]["podSelector"], labels), file
        assert POLICY.name in (K8S / file).read_text(), file  # the example tells the reader about it


def test_the_policy_lets_app_pods_reach_only_what_their_init_container_needs():
    policies = documents(POLICY)
    mirror = next(d for d in documents(K8S / "mirror.yaml")
                  if d["kind"] == "Deployment" and d["metadata"]["name"] == "hfcache-mirror")
    pullthrough = next(d for d in documents(K8S / "mirror.yaml")
                       if d["kind"] == "Deployment" and d["metadata"]["name"] == "hfcache-pullthrough")
    mirror_labels = mirror["spec"]["template"]["metadata"]["labels"]
    (mirror_port,) = [p["containerPort"] for c in mirror["spec"]["template"]["spec"]["containers"]
                      for p in c.get("ports", [])]
    default = {"kubernetes.io/metadata.name": "default"}
    mirror_pod = (default, mirror_labels)
    pull_pod = (default, pullthrough["spec"]["template"]["metadata"]["labels"])
    other_pod = (default, {"app.kubernetes.io/name": "something-else"})
    for file, (labels, spec) in app_pods().items():
        warms = any(argv(c)[:2] == ["hfcache", "warm"] for c in spec.get("initContainers", []))
        # The mirror on its port, and DNS to find it, only for pods whose init container warms from it.
        assert egress_allowed(policies, labels, mirror_pod, "TCP", mirror_port) is warms, file
        assert egress_allowed(policies, labels, DNS_POD, "UDP", 53) is warms, file
        assert egress_allowed(policies, labels, DNS_POD, "TCP", 53) is warms, file
        # Never the pull-through mirror (it reaches the Hub on a miss), another port, another pod, or DNS on a
        # pod that only carries the DNS label in another namespace.
        assert not egress_allowed(policies, labels, pull_pod, "TCP", 8080), file
        assert not egress_allowed(policies, labels, mirror_pod, "TCP", 443), file
        assert not egress_allowed(policies, labels, other_pod, "TCP", mirror_port), file
        assert not egress_allowed(policies, labels, (default, DNS_POD[1]), "UDP", 53), file
    # Without its label a pod is selected by no policy and may send anything: the label is what makes it offline.
    labels = dict(app_pods()["app-image-volume.yaml"][0])
    labels.pop("hfcache.io/offline")
    assert egress_allowed(policies, labels, other_pod, "TCP", 443)


# --- the commands, for real ----------------------------------------------------------------------------


class Cluster:
    """Stand-ins for what the pods would mount, and the endpoints they would reach."""

    def __init__(self, base: Path, upstream: str, registry: str, s3_env: dict[str, str] | None = None) -> None:
        self.base = base
        self.endpoints = {UPSTREAM: upstream}
        self.registry = registry  # host:port of a local registry standing for registry.example.com
        self.s3_env = s3_env or {}  # the Secret hfcache-s3 and the store behind AWS_ENDPOINT_URL (moto's server)
        self.lock_dir = base / "configmaps" / "hfcache-lock"
        self.lock_dir.mkdir(parents=True)
        shutil.copyfile(self.make_lock(), self.lock_dir / "hfcache.lock")
        self.locks_dir = base / "configmaps" / "hfcache-locks"  # node-sync.yaml's folder of locks
        self.locks_dir.mkdir(parents=True)
        shutil.copyfile(self.lock_dir / "hfcache.lock", self.locks_dir / "app.lock")

    def make_lock(self) -> Path:
        """mirror.yaml's first step, ``hfcache lock ... --endpoint https://huggingface.co --output X``, against the
        stand-in for the Hub; X (the file its ConfigMap step loads) in ``base``."""
        [command] = header_commands(K8S / "mirror.yaml", "hfcache lock")
        output = self.base / "checkout" / flag(command, "--output")
        output.parent.mkdir(parents=True)
        command = [str(output) if a == flag(command, "--output") else self.local(a) for a in command]
        proc = run(command, {})
        assert proc.returncode == 0, proc.stderr
        return output

    def volume_dir(self, pod: str, volume: dict) -> Path:
        if "persistentVolumeClaim" in volume:
            path = self.base / "claims" / volume["persistentVolumeClaim"]["claimName"]
        elif "configMap" in volume:
            assert volume["configMap"]["name"] in ("hfcache-lock", "hfcache-locks"), volume
            return self.lock_dir if volume["configMap"]["name"] == "hfcache-lock" else self.locks_dir
        elif "hostPath" in volume:  # one folder per host path, shared by the pods of the node
            path = self.base / "node" / volume["hostPath"]["path"].strip("/")
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
        for source in container.get("envFrom", []):
            assert source["secretRef"]["name"] == "hfcache-s3", source
            env.update(self.s3_env)
        # Kubernetes expands $(VAR) in command and args from the container's env.
        command = [local(re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a))
                   for a in argv(container)]
        for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
            if command[:2] == ["hfcache", "serve"] and flag in command:
                command[command.index(flag) + 1] = value
        if command[:2] in (["hfcache", "push"], ["hfcache", "pull"]) and not command[2].startswith("s3://"):
            command.append("--plain-http")  # the local registry has no TLS
        if command[:2] == ["hfcache", "sync"]:
            command.append("--once")  # one pass stands for the DaemonSet's loop
        # What the application image holds at /app: examples/ (show_tokenizers.py)
        command = [str(EXAMPLES / a[len("/app/"):]) if a.startswith("/app/") else a for a in command]
        if command[:2] == ["hfcache", "exec"] and command[command.index("--") + 1] == "python":
            command[command.index("--") + 1] = sys.executable  # the image's python, with transformers
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


def check_bucket_mirror(command: list[str], env: dict[str, str], client: Path) -> None:
    """Run the bucket mirror's serve (the bucket holds what bucket-push-cronjob.yaml pushed, or it pulls through);
    a client downloads an allowed repo through it, and another is refused."""
    server = subprocess.Popen([sys.executable, "-m", "hfcache", *command[1:]], cwd=PROJECT, env=clean_env(**env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        endpoint = re.search(r" at (http://\S+)$", server.stderr.readline().strip()).group(1)
        path = hf_hub_download("google-bert/bert-base-uncased", "vocab.txt", cache_dir=client, endpoint=endpoint,
                               token=False)
        refused = httpx2.get(f"{endpoint}/api/models/mistralai/Mistral-7B-v0.1")
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    assert code == 0, server.stderr.read()
    assert Path(path).read_bytes() == (PROJECT / "tests/data/hub/google-bert/bert-base-uncased/vocab.txt").read_bytes()
    assert (refused.status_code, refused.headers["x-error-code"]) == (403, "RepoNotAllowed")


@pytest.mark.slow
def test_the_manifests_commands_run_for_real(hub_root, tmp_path):
    from tests.registry import available, running_registry

    if available() and not os.environ.get("CI"):
        pytest.skip(available())
    ran = set()
    # "huggingface.co": the fixture repos with a model card each, so that its commits are not those of the fixture
    # lock (examples/hfcache.lock), as the public Hub's are not; the manifests' lock step is what makes them match.
    hub = tmp_path / "huggingface.co"
    shutil.copytree(hub_root, hub)
    fixture_lock = tomllib.loads((PROJECT / FIXTURE_LOCK).read_text())
    for repo in fixture_lock["repos"]:
        (hub / repo["canonical_id"] / "README.md").write_text(f"# {repo['canonical_id']}\n")
    with HubServer(hub) as upstream, running_registry(tmp_path / "registry") as registry, \
            moto_server(tmp_path) as s3:
        assert all(upstream.commit_of(r["repo_id"]) != r["commit_hash"] for r in fixture_lock["repos"])
        s3.bucket("models")
        cluster = Cluster(tmp_path, upstream.endpoint, registry.host, s3.env())

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
                    results = list(pool.map(lambda _, app=(pod, spec, init): run(*cluster.process(*app)), range(replicas)))
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
                if command[:2] == ["hfcache", "serve"]:  # mirror-bucket.yaml: replicas on the bucket
                    check_bucket_mirror(*cluster.process(doc["metadata"]["name"], spec, container), tmp_path / "b")
                    ran.add((file, container["name"]))
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


# --- the KServe example (kserve-oci.yaml): InferenceServices, validated against KServe's CRD schema ----------------

KSERVE_SCHEMA = PROJECT / "tests" / "data" / "kserve" / "inferenceservice-v1beta1.schema.json"


def _push_commands(path: Path) -> list[list[str]]:
    """The ``hfcache push ...`` commands of a manifest's header comment (``\\`` continuations joined)."""
    text = re.sub(r"\\\n#\s*", " ", path.read_text())
    return [line.split("#", 1)[1].split() for line in text.splitlines() if line.lstrip("# ").startswith("hfcache push")]


def test_kserve_example_validates_and_what_its_pushes_give_loads_at_mnt_models(hub_root, tmp_path):
    """Both InferenceServices validate strictly against KServe's v1beta1 CRD schema (pruned copy in tests/data);
    their env is what ``hfcache env --cache-dir /mnt/models`` prints; the header's push commands run against a local
    registry, and what KServe mounts at /mnt/models (the image's ``models/`` folder: the image volume's subPath, or
    the Modelcar's /models, whose image also runs ``sh``) loads the runtime's ``--model_id`` offline."""
    import gzip
    import io
    import tarfile

    import jsonschema

    from tests.helpers import GOLDEN
    from tests.registry import available, push_shell_base, running_registry

    if available() and not os.environ.get("CI"):
        pytest.skip(available())
    path = K8S / "kserve-oci.yaml"
    validator = jsonschema.Draft7Validator(json.loads(KSERVE_SCHEMA.read_text()))
    docs = documents(path)
    assert [d["kind"] for d in docs] == ["InferenceService", "InferenceService"]
    for doc in docs:
        validator.validate(doc)
    bad = copy.deepcopy(docs[0])
    bad["spec"]["predictor"]["model"]["storageURI"] = bad["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict: a misspelt field fails
        validator.validate(bad)
    models = {d["spec"]["predictor"]["model"]["storageUri"].split("://")[0]: d["spec"]["predictor"]["model"]
              for d in docs}
    assert set(models) == {"oci+native", "oci"}
    printed = subprocess.run([sys.executable, "-m", "hfcache", "env", "--cache-dir", "/mnt/models", "--format", "k8s"],
                             capture_output=True, text=True, env=clean_env(), cwd=PROJECT, timeout=60)
    assert printed.returncode == 0, printed.stderr
    for model in models.values():
        assert model["env"] == yaml.safe_load(printed.stdout)["env"]

    cache = tmp_path / "cache" / "hub"
    with HubServer(hub_root) as upstream:
        warmed = run(["hfcache", "warm", "google-bert/bert-base-uncased", "--cache-dir", str(cache),
                      "--endpoint", upstream.endpoint], {})
    assert warmed.returncode == 0, warmed.stderr
    commands = _push_commands(path)
    assert len(commands) == 2 and all("--prefix" in c and "models" in c for c in commands)
    with running_registry(tmp_path / "registry") as registry:
        base_layer, _, _ = push_shell_base(registry, "library/busybox")
        base_digest = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
                                      f"docker://{registry.host}/library/busybox:v1"],
                                     capture_output=True, text=True, timeout=60).stdout.strip()
        for command in commands:
            argv_ = [a.replace(REGISTRY, registry.host + "/").replace("<digest>", base_digest.split(":")[1])
                     .replace("/cache/hub", str(cache)) for a in command]
            pushed = run([*argv_, "--plain-http"], {})
            assert pushed.returncode == 0, (argv_, pushed.stderr)
        for scheme, model in models.items():
            reference = model["storageUri"].split("://", 1)[1].replace(REGISTRY, registry.host + "/")
            name, tag = reference.split("/", 1)[1].rsplit(":", 1)
            manifest = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                                  f"docker://{reference}"], capture_output=True, timeout=60).stdout)
            rootfs = tmp_path / scheme
            for layer in manifest["layers"]:
                with httpx2.Client() as client:
                    data = client.get(f"http://{registry.host}/v2/{name}/blobs/{layer['digest']}").content
                with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
                    tar.extractall(rootfs, filter="tar")
            if scheme == "oci":  # the Modelcar image starts with the shell base
                assert manifest["layers"][0]["digest"] == base_layer and (rootfs / "bin" / "sh").is_symlink()
            mnt = rootfs / "models"  # subPath: models (native), /models (Modelcar): KServe's /mnt/models
            model_id = next(a.split("=", 1)[1] for a in model["args"] if a.startswith("--model_id="))
            env = {e["name"]: e["value"].replace("/mnt/models", str(mnt)) for e in model["env"]}
            loaded = subprocess.run([sys.executable, "-c", "import json, sys\nfrom transformers import AutoTokenizer\n"
                                     "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
                                     "print(json.dumps(t(sys.argv[2])['input_ids']))", model_id, GOLDEN["text"]],
                                    capture_output=True, text=True, env=clean_env(**env), timeout=300)
            assert loaded.returncode == 0, loaded.stderr
            assert json.loads(loaded.stdout.strip().splitlines()[-1]) == golden_ids(model_id)
            verified = run(["hfcache", "verify", "--cache-dir", str(mnt)], {})
            assert verified.returncode == 0, verified.stdout + verified.stderr
