"""hfcache doctor's runtime traps, each built for real (the traps no load shows until later):

- a read-only cache (a read-only bind mount; folders another uid cannot write) used online with a revision that can
  move upstream: ``cache.read_only_online``, an error; the trap itself is shown (transformers 5.24 raises EROFS once
  the test Hub's ``main`` moves, huggingface/transformers#47852); offline or commit-pinned: no error;
- an application writing a group-shared cache with umask 022: ``umask.not_shared``, a warning; the trap itself is
  shown (huggingface_hub leaves a folder the other member cannot write, huggingface/datasets#7900), and the umask
  doctor prints fixes it;
- the enforcement probe of ``exec --no-network`` in the report.

Mounting and other uids need root (tests/users.py); each mount is undone in a ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import hfcache
from hfcache.records import WarmRequest
from tests.canary import Canary
from tests.helpers import clean_env, run_hfcache
from tests.testhub import HubServer
from tests.users import ALICE, BOB, GROUP, Runtime, needs_root

HUB = Path(__file__).parent.parent / "data" / "hub"
BERT = "google-bert/bert-base-uncased"
GPT2 = "openai-community/gpt2"
FOLDER = "models--google-bert--bert-base-uncased"

LOAD = """\
import sys
from transformers import AutoTokenizer
try:
    print("OK", AutoTokenizer.from_pretrained(sys.argv[1])("hello")["input_ids"])
except Exception as exc:
    print("ERR", type(exc).__name__, exc)
"""

#: hf_hub_download of one file as the current user (the application's own download, not hfcache's)
DOWNLOAD = """\
import sys
from huggingface_hub import hf_hub_download
try:
    print("OK", hf_hub_download(sys.argv[1], sys.argv[2]))
except Exception as exc:
    print("ERR", type(exc).__name__, exc)
"""


def warm(cache: Path, *specs: str, root: Path = HUB) -> None:
    with HubServer(root) as server:
        assert hfcache.warm([WarmRequest.parse(s) for s in specs], cache_dir=cache, endpoint=server.endpoint,
                            token=False).ok


def doctor(env: dict[str, str], *args: str, json_out: bool = True, **popen) -> tuple[int, dict | str]:
    """``hfcache doctor [--json]`` in a child: (exit code, the report or the table)."""
    proc = subprocess.run([sys.executable, "-m", "hfcache", "doctor", *(["--json"] if json_out else []), *args],
                          capture_output=True, text=True, env=env, timeout=120, **popen)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout) if json_out else proc.stdout


def codes(report: dict, severity: str | None = None) -> dict[str, dict]:
    return {f["code"]: f for f in report["findings"] if severity is None or f["severity"] == severity}


def online_env(cache: Path, home: Path, **extra: str) -> dict[str, str]:
    return clean_env(HF_HUB_CACHE=str(cache), HF_HOME=str(home), COLUMNS="250", **extra)


@contextmanager
def read_only_view(source: Path, target: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``target`` (a bind mount takes ``ro`` only on a remount)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to bind-mount")
    target.mkdir(parents=True)
    result = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {result.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        yield target
    finally:
        subprocess.run(["umount", str(target)], capture_output=True)


def outside(runtime: Runtime, name: str) -> Path:
    """A folder beside the caches of ``runtime`` (not below any), for a :class:`Canary`."""
    path = runtime.base / name
    path.mkdir()
    return path


def verify_ok(cache: Path) -> None:
    proc = run_hfcache(["verify", "--cache-dir", str(cache)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------- read-only cache, online, unpinned


def test_read_only_mount_online_with_a_branch_ref_is_an_error(tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    shutil.copytree(HUB / BERT, upstream / BERT)
    cache, home = tmp_path / "hub", tmp_path / "home"
    warm(cache, BERT, root=upstream)
    assert (cache / FOLDER / "refs" / "main").is_file()
    canary = Canary(tmp_path)
    with read_only_view(cache, tmp_path / "ro") as ro:
        code, report = doctor(online_env(ro, home))
        assert code == 1 and report["exit_code"] == 1 and report["cache"]["read_only_fs"] is True
        finding = codes(report, "error")["cache.read_only_online"]
        assert finding["message"].startswith(f"the cache {ro} is on a read-only filesystem and offline mode is off")
        assert f"{BERT}@main" in finding["message"] and "Errno 30" in finding["message"]
        assert "huggingface/transformers#47852" in finding["message"]
        assert f'eval "$(hfcache env --cache-dir {ro})"' in finding["fix"] and "REPO@COMMIT" in finding["fix"]
        assert list(codes(report, "error")) == ["cache.read_only_online"], report["findings"]
        code, table = doctor(online_env(ro, home), json_out=False)
        assert code == 1 and table.splitlines()[-1].startswith("1 error(s)"), table

        # Offline, by either variable huggingface_hub reads: the recommended image layout, no error.
        for extra in ({"HF_HUB_OFFLINE": "1"}, {"TRANSFORMERS_OFFLINE": "1"}):
            code, report = doctor(online_env(ro, home, **extra))
            assert code == 0 and "cache.read_only_online" not in codes(report), (extra, report["findings"])
            assert codes(report, "info")["cache.read_only_fs"]
        # HF_HUB_OFFLINE=0 masks TRANSFORMERS_OFFLINE=1 (constants.py reads HF_HUB_OFFLINE first): online, trapped.
        code, report = doctor(online_env(ro, home, HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="1"))
        assert code == 1 and {"cache.read_only_online", "offline.masked"} <= set(codes(report, "error"))

        # The trap is real: upstream main moves, and an online load from the read-only cache fails with EROFS
        # (transformers 5.24 re-raises it instead of returning the stale file); offline, the same load works.
        config = upstream / BERT / "tokenizer_config.json"
        config.write_text(config.read_text() + "\n")
        with HubServer(upstream) as server:
            env = online_env(ro, home, HF_ENDPOINT=server.endpoint)
            online = subprocess.run([sys.executable, "-c", LOAD, BERT], capture_output=True, text=True, env=env,
                                    timeout=120)
            offline = subprocess.run([sys.executable, "-c", LOAD, BERT], capture_output=True, text=True,
                                     env={**env, "HF_HUB_OFFLINE": "1"}, timeout=120)
        assert online.stdout.startswith("ERR OSError [Errno 30] Read-only file system"), online.stdout + online.stderr
        assert offline.stdout.startswith("OK [101,"), offline.stdout + offline.stderr
    canary.assert_unchanged()
    verify_ok(cache)


def test_read_only_mount_with_only_commit_pinned_snapshots_is_fine(tmp_path: Path) -> None:
    branch, pinned, home = tmp_path / "branch", tmp_path / "pinned", tmp_path / "home"
    warm(branch, BERT)
    commit = (branch / FOLDER / "refs" / "main").read_text()
    warm(pinned, f"{BERT}@{commit}")
    assert not (pinned / FOLDER / "refs").exists()  # a commit revision leaves no ref: nothing can move
    canary = Canary(tmp_path)
    with read_only_view(pinned, tmp_path / "ro") as ro:
        code, report = doctor(online_env(ro, home))
        assert "cache.read_only_online" not in codes(report), report["findings"]
        assert code == 0 and codes(report, "error") == {}, report["findings"]
    canary.assert_unchanged()
    verify_ok(pinned)


def test_tags_pr_refs_and_hostile_ref_names_are_listed_inert(tmp_path: Path) -> None:
    """A tag and a PR ref move like a branch; a ref name a group member planted (ESC, a newline) is shown escaped."""
    cache, home = tmp_path / "hub", tmp_path / "home"
    warm(cache, BERT)
    refs = cache / FOLDER / "refs"
    commit = (refs / "main").read_text()
    (refs / "main").rename(refs / "v1.0")
    (refs / "pr").mkdir()
    (refs / "pr" / "1").write_text(commit)
    canary = Canary(tmp_path)
    with read_only_view(cache, tmp_path / "ro") as ro:
        code, report = doctor(online_env(ro, home))
        assert code == 1 and f"{BERT}@pr/1, {BERT}@v1.0" in codes(report, "error")["cache.read_only_online"]["message"]
    verify_ok(cache)
    (refs / "\x1b[2J\nok: all good").write_text(commit)
    with read_only_view(cache, tmp_path / "ro2") as ro:
        code, report = doctor(online_env(ro, home))
        message = codes(report, "error")["cache.read_only_online"]["message"]
        assert code == 1 and f"{BERT}@\\x1b[2J\\x0aok: all good" in message, message
        code, table = doctor(online_env(ro, home), json_out=False)
        assert code == 1 and "\x1b" not in table and not any(line.startswith("ok: all") for line in table.splitlines())
    canary.assert_unchanged()


@needs_root
def test_cache_another_uid_cannot_write_used_online_is_an_error(runtime: Runtime) -> None:
    """The image built as root, the pod run as uid 4101: not a read-only filesystem, a PermissionError."""
    cache = runtime.base / "ro-by-owner"
    warm(cache, BERT)
    for path in [cache, *cache.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    canary = Canary(outside(runtime, "canary-owner"))
    proc = runtime.hfcache(ALICE, "doctor", "--json", "--cache-dir", str(cache), HF_HUB_CACHE=str(cache))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["cache"]["read_only_fs"] is False and report["cache"]["writable"] is False
    finding = codes(report, "error")["cache.read_only_online"]
    assert finding["message"].startswith(f"the cache {cache} is not writable by uid {ALICE.uid} and offline mode")
    assert "PermissionError" in finding["message"] and f"{BERT}@main" in finding["message"]
    assert "cache.not_writable" in codes(report, "warning")
    proc = runtime.hfcache(ALICE, "doctor", "--json", "--cache-dir", str(cache), HF_HUB_CACHE=str(cache),
                           HF_HUB_OFFLINE="1")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and "cache.read_only_online" not in codes(report), report["findings"]
    canary.assert_unchanged()
    verify_ok(cache)


# ------------------------------------------------------------------------------- umask in a group-shared cache


def shared_cache(runtime: Runtime, name: str) -> Path:
    cache = runtime.base / name
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)  # the recipe: chgrp GROUP; chmod 2775 (tests/integration/test_shared.py)
    return cache


def umask_codes(runtime: Runtime, cache: Path, umask: int, **extra: str) -> dict[str, dict]:
    proc = runtime.hfcache(ALICE, "doctor", "--json", "--cache-dir", str(cache), umask=umask,
                           HF_HUB_CACHE=str(cache), **extra)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["user"]["umask"] == f"{umask:04o}"
    return {code: f for code, f in codes(report).items() if code.startswith("umask.")}


@needs_root
def test_umask_022_on_a_group_shared_cache_warns(runtime: Runtime, hub_server) -> None:
    cache = shared_cache(runtime, "shared-umask")
    warm(cache, BERT)
    canary = Canary(outside(runtime, "canary-umask"))

    found = umask_codes(runtime, cache, 0o022)
    assert list(found) == ["umask.not_shared"] and found["umask.not_shared"]["severity"] == "warning"
    message, fix = found["umask.not_shared"]["message"], found["umask.not_shared"]["fix"]
    assert message.startswith("your umask 0022 drops write for the group in the shared folder(s) the hub cache "
                              f"{cache} (gid {GROUP}, mode 2775)"), message
    assert "huggingface/datasets#7900" in message and "umask 002" in fix and "Kubernetes has no umask" in fix
    assert umask_codes(runtime, cache, 0o002) == {}
    # Offline, huggingface_hub writes nothing in the hub cache: an info, not a warning.
    assert list(umask_codes(runtime, cache, 0o022, HF_HUB_OFFLINE="1")) == ["umask.not_shared_offline"]

    # The trap is real: Alice's own download (huggingface_hub, umask 022) leaves a folder Bob cannot write, so
    # Bob's download of another file of that repo fails; with the umask doctor prints, it works.
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub_server.endpoint}
    for umask, bob_ok in ((0o022, False), (0o002, True)):
        shutil.rmtree(cache / "models--openai-community--gpt2", ignore_errors=True)
        shutil.rmtree(cache / ".locks" / "models--openai-community--gpt2", ignore_errors=True)
        alice = runtime.run(ALICE, ["-c", DOWNLOAD, GPT2, "vocab.json"], umask=umask, **env)
        assert alice.stdout.startswith("OK "), alice.stdout + alice.stderr
        bob = runtime.run(BOB, ["-c", DOWNLOAD, GPT2, "merges.txt"], umask=umask, **env)
        assert bob.stdout.startswith("OK ") is bob_ok, (oct(umask), bob.stdout + bob.stderr)
        if not bob_ok:
            assert "PermissionError" in bob.stdout, bob.stdout
    canary.assert_unchanged()
    verify_ok(cache)


@needs_root
def test_umask_022_on_a_private_cache_or_a_shared_modules_folder(runtime: Runtime) -> None:
    private = runtime.base / "private-umask"
    warm(private, BERT)
    for path in [private, *private.rglob("*")]:
        os.chown(path, ALICE.uid, ALICE.gid, follow_symlinks=False)
    assert umask_codes(runtime, private, 0o022) == {}  # nobody else writes it: the umask is Alice's business

    # The same kind of trap outside the hub cache: a shared HF_MODULES_CACHE is written even offline.
    modules = runtime.base / "shared-modules"
    modules.mkdir()
    os.chown(modules, 0, GROUP)
    os.chmod(modules, 0o2775)
    found = umask_codes(runtime, private, 0o022, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(modules))
    assert list(found) == ["umask.not_shared"], found
    assert f"HF_MODULES_CACHE (custom code) {modules}" in found["umask.not_shared"]["message"]
    verify_ok(private)


# ------------------------------------------------------------------------------- enforcement


def test_doctor_reports_which_enforcement_this_machine_allows(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    warm(cache, BERT)
    code, report = doctor(online_env(cache, tmp_path / "home", HF_HUB_OFFLINE="1"))
    finding = codes(report)["offline.network_filter"]
    assert finding["severity"] in ("info", "warning") and "exec --no-network" in finding["message"]
    assert code == 0 and codes(report, "error") == {}, report["findings"]
    code, table = doctor(online_env(cache, tmp_path / "home", HF_HUB_OFFLINE="1"), json_out=False)
    assert code == 0 and "process-tree network filter" in table


# ------------------------------------------------------------------------------- aliases other runtimes read


def test_aliases_hfcache_env_prints_are_healthy_and_disagreeing_ones_are_named(tmp_path: Path) -> None:
    """`hfcache env` prints HUGGINGFACE_HUB_CACHE (TGI, TEI) and the other aliases beside the canonical variables:
    no warning; an alias a base image set to something else is a warning naming who reads it."""
    cache, other, home = tmp_path / "hub", tmp_path / "elsewhere", tmp_path / "home"
    warm(cache, BERT)
    proc = run_hfcache(["env", "--cache-dir", str(cache), "--format", "json"])
    assert proc.returncode == 0, proc.stderr
    variables = json.loads(proc.stdout)
    assert variables["HUGGINGFACE_HUB_CACHE"] == str(cache), variables
    env = clean_env(**{"HF_HOME": str(home), **{k: str(v) for k, v in variables.items()}})
    code, report = doctor(env)
    assert code == 0 and codes(report, "error") == {} and codes(report, "warning") == {}, report["findings"]

    cases = [({"HUGGINGFACE_HUB_CACHE": str(other)}, "text-generation-inference"),
             ({"SENTENCE_TRANSFORMERS_HOME": str(other)}, "sentence-transformers"),
             ({"HF_DATASETS_OFFLINE": "0"}, "datasets"),
             ({"LLAMA_OFFLINE": "no"}, "llama.cpp")]
    for extra, reader in cases:
        code, report = doctor({**env, **extra})
        finding = codes(report, "warning").get("env.alias_mismatch")
        name, value = next(iter(extra.items()))
        assert finding and finding["message"].startswith(f"{name}={value} ") and reader in finding["message"], \
            (extra, report["findings"])
        assert code == 0 and "hfcache env prints every alias" in finding["fix"]
