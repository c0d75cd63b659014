"""Shared caches as several users see them: group permissions, unreadable parts, no flock (docs/shared-caches.md).

Other users are real uids (``setpriv``; root-only tests, see tests/users.py); flock is made to fail the way Lustre, NFS
without a lock manager or some FUSE mounts make it fail, with tests/sitecustom (``fcntl.flock`` raises ENOSYS or
ENOLCK in the hfcache subprocess: filelock and hfcache run their real code on real files).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from tests.helpers import GOLDEN, clean_env, golden_ids, run_hfcache
from tests.users import ALICE, BOB, EVE, GROUP, Runtime, needs_root

SITECUSTOM = Path(__file__).resolve().parent.parent / "sitecustom"
BERT = "google-bert/bert-base-uncased"
GPT2 = "openai-community/gpt2"

pytestmark = pytest.mark.slow


def folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def shared_cache(runtime: Runtime, name: str) -> Path:
    cache = runtime.base / name
    cache.mkdir()
    os.chown(cache, 0, GROUP)
    os.chmod(cache, 0o2775)  # the recipe: chgrp GROUP; chmod 2775
    return cache


def assert_group_shared(cache: Path) -> None:
    """Every folder below the root is setgid, group-writable and of the root's group; every file group-writable."""
    for root, dirs, files in os.walk(cache):
        for name in dirs:
            st = os.lstat(os.path.join(root, name))
            assert st.st_gid == GROUP and st.st_mode & 0o2070 == 0o2070, (root, name, oct(st.st_mode), st.st_gid)
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if stat.S_ISREG(st.st_mode):
                assert st.st_gid == GROUP and st.st_mode & 0o060 == 0o060, (root, name, oct(st.st_mode), st.st_gid)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def no_crash(proc: subprocess.CompletedProcess[str]) -> str:
    """What a person reads: the report (stdout) then the diagnostics (stderr), after checking there is no crash."""
    assert proc.returncode != 70 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, \
        proc.stderr
    return proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------ group sharing


@needs_root
def test_two_users_share_a_setgid_cache(runtime: Runtime, hub_server) -> None:
    cache = shared_cache(runtime, "shared-two-users")
    common = ["--cache-dir", str(cache), "--endpoint", hub_server.endpoint]
    ok(runtime.hfcache(ALICE, "warm", BERT, *common))  # umask 022 (Runtime.run's default)
    assert_group_shared(cache)
    assert folder(cache, BERT).stat().st_uid == ALICE.uid

    # A blob of Alice's repo is lost (with its lock file): Bob re-warms it into her folders and her .locks/ folder.
    bert = folder(cache, BERT)
    lost = sorted((bert / "blobs").iterdir())[0]
    lost.unlink()
    (cache / ".locks" / bert.name / f"{lost.name}.lock").unlink(missing_ok=True)
    warm = json.loads(ok(runtime.hfcache(BOB, "warm", BERT, *common, "--json")).stdout)
    assert warm["ok"] and lost.stat().st_uid == BOB.uid
    # Bob warms a repo of his own; Alice re-warms it after its ref vanished (she writes into Bob's refs/).
    ok(runtime.hfcache(BOB, "warm", GPT2, *common))
    (folder(cache, GPT2) / "refs" / "main").unlink()
    ok(runtime.hfcache(ALICE, "warm", GPT2, *common))
    assert (folder(cache, GPT2) / "refs" / "main").stat().st_uid == ALICE.uid
    assert_group_shared(cache)
    ok(runtime.hfcache(BOB, "verify", "--cache-dir", str(cache)))

    # Each loads the other's repo offline, with transformers, by repo id.
    assert runtime.load(BOB, cache, [BERT], GOLDEN["text"])[BERT]["input_ids"] == golden_ids(BERT)
    assert runtime.load(ALICE, cache, [GPT2], GOLDEN["text"])[GPT2]["input_ids"] == golden_ids(GPT2)

    # Bob prunes Alice's repo (snapshot, blobs, ref and lock files she created), keeping his.
    proc = ok(runtime.hfcache(BOB, "prune", "--cache-dir", str(cache), "--max-size", "0", "--keep", GPT2,
                              "--yes", "--json"))
    outcomes = json.loads(proc.stdout)["items"]
    assert outcomes and {o["status"] for o in outcomes} == {"removed"}, outcomes
    assert any(o["path"].startswith(f".locks/{bert.name}/") for o in outcomes)
    assert not (bert / "blobs").exists() or not list((bert / "blobs").iterdir())
    info = scan_cache_dir(cache)
    assert not info.warnings and {r.repo_id for r in info.repos if r.nb_files} == {GPT2}


@needs_root
def test_doctor_names_what_another_user_cannot_write(runtime: Runtime, hub_server) -> None:
    cache = shared_cache(runtime, "shared-doctor")
    ok(runtime.hfcache(ALICE, "warm", BERT, "--cache-dir", str(cache), "--endpoint", hub_server.endpoint))
    report = json.loads(ok(runtime.hfcache(BOB, "doctor", "--cache-dir", str(cache), "--json")).stdout)
    codes = {f["code"]: f for f in report["findings"]}
    assert "cache.shared" in codes and "cache.flock" in codes and "cache.repo_not_writable" not in codes

    # What a tool without group sharing leaves behind (umask 022): Alice's folders, private to her.
    bert = folder(cache, BERT)
    for path in (cache / ".locks" / bert.name, bert / "blobs"):
        os.chmod(path, 0o755)
    proc = runtime.hfcache(BOB, "doctor", "--cache-dir", str(cache), "--json")
    assert proc.returncode == 1, proc.stderr
    errors = {f["code"]: f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
    finding = errors["cache.repo_not_writable"]
    assert f".locks/{bert.name}/" in finding["message"] and f"{bert.name}/blobs/" in finding["message"]
    assert f"uid {BOB.uid}" in finding["message"] and "chmod -R g+rwX" in finding["fix"]
    # Bob's warm then fails as the doctor said (exit 5, naming the path), never as an internal error.
    sorted((bert / "blobs").iterdir())[0].unlink()
    proc = runtime.hfcache(BOB, "warm", BERT, "--cache-dir", str(cache), "--endpoint", hub_server.endpoint)
    assert proc.returncode == 5 and "Permission denied" in no_crash(proc)

    # The fix doctor printed, run as root, makes the cache whole for Bob again.
    fix = finding["fix"].split(": ", 1)[1].split(" (and add")[0]
    subprocess.run(fix, shell=True, check=True)  # the command doctor prints, on the test's cache
    assert runtime.hfcache(BOB, "doctor", "--cache-dir", str(cache)).returncode == 0
    ok(runtime.hfcache(BOB, "warm", BERT, "--cache-dir", str(cache), "--endpoint", hub_server.endpoint))

    # .locks/ itself not writable: named as such, to a user who can write the root (Eve is in no shared group: a
    # 2775 root is read-only to her, a warning, not errors about each folder).
    os.chmod(cache / ".locks", 0o755)
    os.chmod(cache, 0o2777)
    proc = runtime.hfcache(EVE, "doctor", "--cache-dir", str(cache), "--json")
    errors = {f["code"]: f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
    assert proc.returncode == 1 and str(cache / ".locks") in errors["cache.locks_not_writable"]["message"]


@needs_root
def test_doctor_tells_a_user_outside_the_group_to_join_it(runtime: Runtime, hub_server) -> None:
    cache = shared_cache(runtime, "shared-outsider")
    common = ["--cache-dir", str(cache), "--endpoint", hub_server.endpoint]
    ok(runtime.hfcache(ALICE, "warm", BERT, *common))
    ok(runtime.hfcache(BOB, "warm", GPT2, *common))
    # Eve is in no shared group: the 2775 cache is read-only to her. A chown -R to her would lock Alice and Bob out.
    proc = runtime.hfcache(EVE, "doctor", "--cache-dir", str(cache), "--json")
    findings = json.loads(proc.stdout)["findings"]
    errors = {f["code"]: f for f in findings if f["severity"] == "error"}
    assert proc.returncode == 1, proc.stdout
    finding = errors["cache.not_in_group"]
    assert f"uid {EVE.uid}" in finding["message"] and f"gid {GROUP}" in finding["message"]
    assert str(cache) in finding["message"] and f"{cache / '.locks'}/" in finding["message"]
    assert finding["fix"].startswith(f"add uid {EVE.uid} to group {GROUP} (usermod -aG {GROUP} ") \
        and finding["fix"].endswith("then log in again"), finding["fix"]
    assert not any("chown" in (f["fix"] or "") for f in findings), findings
    text = runtime.hfcache(EVE, "doctor", "--cache-dir", str(cache))
    assert text.returncode == 1 and "usermod -aG" in text.stdout + text.stderr
    # Her warm fails as doctor said: one line, exit 5, naming the cache, with the same fix.
    proc = runtime.hfcache(EVE, "warm", BERT, *common)
    lines = no_crash(proc).strip().splitlines()
    assert proc.returncode == 5 and [line for line in lines if line.startswith("hfcache: error:")] == \
        [f"hfcache: error: cannot write the cache {cache} (owned by uid 0 gid {GROUP}, mode 2775): permission denied "
         f"for uid {EVE.uid}"], lines
    assert f"hint: add uid {EVE.uid} to group {GROUP} (usermod -aG {GROUP}" in proc.stderr
    # Joined (and logged in again): doctor and warm pass.
    joined = type(EVE)(EVE.uid, EVE.gid, (GROUP,))
    assert runtime.hfcache(joined, "doctor", "--cache-dir", str(cache)).returncode == 0
    ok(runtime.hfcache(joined, "warm", BERT, *common))

    # A cache that is not group-writable but whose entries have several owners is shared too: no chown -R either.
    os.chmod(cache, 0o755)
    proc = runtime.hfcache(EVE, "doctor", "--cache-dir", str(cache), "--json")
    findings = {f["code"]: f for f in json.loads(proc.stdout)["findings"]}
    assert findings["cache.not_writable"]["severity"] == "warning" and "cache.not_in_group" not in findings
    assert "chown -R" not in findings["cache.not_writable"]["fix"] and f"chgrp -R {GROUP}" in \
        findings["cache.not_writable"]["fix"], findings["cache.not_writable"]


# ------------------------------------------------------------------------------------------------ unreadable parts


@needs_root
def test_unreadable_blobs_are_reported_per_repo(runtime: Runtime, hub_server) -> None:
    cache = runtime.base / "private-blobs"
    ok(run_hfcache(["warm", BERT, GPT2, "--cache-dir", str(cache), "--endpoint", hub_server.endpoint]))
    blobs = folder(cache, BERT) / "blobs"
    os.chmod(blobs, 0)
    where = f"{folder(cache, BERT).name}/blobs"
    args = ("--cache-dir", str(cache))

    proc = runtime.hfcache(EVE, "ls", *args, "--json")
    repos = {r["repo_id"]: r for r in json.loads(proc.stdout)["repos"]}
    assert proc.returncode == 1 and "permission denied" in repos[BERT]["health"] and repos[GPT2]["health"] == "ok"
    assert repos[BERT]["unreadable"] == ["blobs/"] and repos[GPT2]["unreadable"] == []
    proc = runtime.hfcache(EVE, "ls", *args)
    assert proc.returncode == 1 and "blobs/" in no_crash(proc)

    proc = runtime.hfcache(EVE, "verify", *args, "--json")
    problems = json.loads(proc.stdout)["problems"]
    assert proc.returncode == 1 and [(p["repo_id"], p["kind"], p["path"]) for p in problems if p["kind"] != "no_symlinks"] \
        == [(BERT, "unreadable", "blobs/")], problems
    no_crash(proc)

    proc = runtime.hfcache(EVE, "check", *args, "--json")
    results = {r["repo_id"]: r for r in json.loads(proc.stdout)["tokenizers"]}
    assert proc.returncode == 1 and results[GPT2]["ok"] and not results[BERT]["ok"]
    assert "permission denied" in (results[BERT]["cause"] or "").lower(), results[BERT]
    no_crash(proc)

    proc = runtime.hfcache(EVE, "prune", *args, "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert proc.returncode == 5 and plan["exit_code"] == 5 and plan["unreadable"] == [where + "/"], plan
    assert any(where in w for w in plan["warnings"])
    assert not any(folder(cache, BERT).name in i["path"] for i in plan["items"])
    no_crash(proc)

    proc = runtime.hfcache(EVE, "doctor", "--cache-dir", str(cache), "--json")
    errors = [f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"]
    assert proc.returncode == 1 and any(where in f["message"] for f in errors), errors
    os.chmod(blobs, 0o755)


@needs_root
@pytest.mark.parametrize("part", ["refs", "snapshots", ".no_exist", ""])
def test_check_fails_a_repo_whose_load_needs_an_unreadable_part(runtime: Runtime, hub_server, part: str) -> None:
    """refs/: a load by commit works, the application's by repo id does not; snapshots/: it used to abort the
    whole check; .no_exist/: offline absence of optional files cannot be seen. Each fails its repo only."""
    cache = runtime.base / f"private-{part.strip('.') or 'folder'}"
    ok(run_hfcache(["warm", BERT, GPT2, "--cache-dir", str(cache), "--endpoint", hub_server.endpoint]))
    target = folder(cache, BERT) / part if part else folder(cache, BERT)
    shown = f"{folder(cache, BERT).name}/{part + '/' if part else ''}"
    assert target.is_dir(), sorted(os.listdir(folder(cache, BERT)))  # warm writes .no_exist markers too
    os.chmod(target, 0)
    try:
        proc = runtime.hfcache(EVE, "check", "--cache-dir", str(cache), "--json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        results = {r["repo_id"]: r for r in json.loads(proc.stdout)["tokenizers"]}
        assert results[GPT2]["ok"] and not results[BERT]["ok"], results
        cause = results[BERT]["cause"]
        assert cause.startswith(f"{shown} cannot be read by this user (permission "
                                f"denied): the application's offline load of {BERT} needs it"), cause
        no_crash(proc)
        text = runtime.hfcache(EVE, "check", "--cache-dir", str(cache), BERT)
        assert text.returncode == 1 and shown in " ".join(
            (text.stdout + text.stderr).split()), text.stdout + text.stderr
        no_crash(text)
    finally:
        os.chmod(target, 0o755)
    ok(runtime.hfcache(EVE, "check", "--cache-dir", str(cache)))


@needs_root
def test_untraversable_hf_home_is_one_line_exit_5(runtime: Runtime, hub_server) -> None:
    home = runtime.base / "bob-home"
    ok(run_hfcache(["warm", GPT2, "--cache-dir", str(home / "hub"), "--endpoint", hub_server.endpoint]))
    shutil.chown(home, BOB.uid, BOB.gid)
    os.chmod(home, 0o700)  # a login's home on a shared host
    proc = runtime.hfcache(ALICE, "doctor", "--json", HF_HOME=str(home))
    errors = {f["code"]: f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"}
    assert proc.returncode == 1 and str(home) in errors["cache.unreachable"]["message"]
    assert f"uid {ALICE.uid}" in errors["cache.unreachable"]["message"]
    # The home's group is Bob's private group: "chmod g+rx" would not let Alice in; doctor and every command say so.
    fix = errors["cache.unreachable"]["fix"]
    assert fix.startswith(f"as its owner or root: chgrp <a group of uid {ALICE.uid}> {home} && chmod g+x {home}"), fix
    exported = runtime.base / "export-home"
    ok(run_hfcache(["export", str(exported), "--cache-dir", str(home / "hub")]))
    os.chmod(exported, 0o755)
    for command in (["ls"], ["verify"], ["check"], ["prune", "--dry-run"], ["prune", "--yes"],
                    ["export", str(runtime.base / "export-out")], ["import", str(exported)],
                    ["warm", GPT2, "--endpoint", hub_server.endpoint],
                    ["link", str(home / "hub"), str(runtime.base / "link-out"), "--mode", "copy"]):
        proc = runtime.hfcache(ALICE, *command, HF_HOME=str(home))
        lines = no_crash(proc).strip().splitlines()
        assert proc.returncode == 5, (command, proc.stderr)
        errors = [line for line in lines if line.startswith("hfcache: error:")]
        assert errors == [f"hfcache: error: cannot read the cache {home / 'hub'}: {home} cannot be entered (owned by "
                          f"uid {BOB.uid} gid {BOB.gid}, mode 0700): permission denied for uid {ALICE.uid}"], \
            (command, lines)
        assert f"hint: {fix} (see `hfcache doctor`)" in " ".join(proc.stderr.split()), (command, proc.stderr)
    # Bob, its owner, sees his cache.
    ok(runtime.hfcache(BOB, "ls", HF_HOME=str(home)))


@needs_root
def test_serve_warns_about_and_answers_for_unreadable_repos(runtime: Runtime, hub_server, tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    cache = runtime.base / "serve-private"
    ok(run_hfcache(["warm", BERT, GPT2, "--cache-dir", str(cache), "--endpoint", hub_server.endpoint]))
    os.chmod(folder(cache, BERT) / "blobs", 0)
    where = f"{folder(cache, BERT).name}/blobs/"
    server = subprocess.Popen([*EVE.setpriv(), runtime.python, "-m", "hfcache", "serve", "--cache-dir", str(cache),
                               "--port", "0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                              env=runtime.env(EVE), cwd=runtime.base)
    try:
        lines = []
        while not lines or " at http://" not in lines[-1]:
            line = server.stderr.readline()
            assert line, lines
            lines.append(line.strip())
        endpoint = lines[-1].rsplit(" ", 1)[1]
        warning = " ".join(" ".join(lines[:-1]).split())
        assert warning.startswith(f"hfcache: warning: 1 repo folder(s) of {cache} cannot be read by uid {EVE.uid}: "
                                  f"{where}; requests for them get 500 CacheUnreadable"), lines

        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(f"{endpoint}/api/models/{BERT}", timeout=30)
        answer = raised.value
        assert answer.code == 500 and answer.headers["X-Error-Code"] == "CacheUnreadable"
        message = answer.headers["X-Error-Message"]
        assert message.startswith(f"{where} cannot be read by the server (permission denied for uid {EVE.uid})")
        assert json.loads(answer.read())["error"] == message
        # What a huggingface_hub client sees: the message, as the download's cause (never "repository not found").
        with pytest.raises(Exception) as failed:
            hf_hub_download(BERT, "config.json", cache_dir=tmp_path / "client", endpoint=endpoint)
        cause = failed.value if isinstance(failed.value, HfHubHTTPError) else failed.value.__cause__
        assert isinstance(cause, HfHubHTTPError) and cause.response.status_code == 500 and where in str(cause)
        assert hf_hub_download(GPT2, "config.json", cache_dir=tmp_path / "client", endpoint=endpoint)
    finally:
        server.terminate()
        server.wait(timeout=30)
        os.chmod(folder(cache, BERT) / "blobs", 0o755)


# ------------------------------------------------------------------------------------------------ no flock


def noflock_env(code: str, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(SITECUSTOM), os.environ.get("PYTHONPATH", "")])
    return clean_env(PYTHONPATH=path, HFCACHE_TEST_FLOCK_ERRNO=code, **extra)


def age_locks(cache: Path, seconds: float = 120) -> list[Path]:
    """Make the lock files an earlier (flock-based) run left look as old as they would be."""
    files = [p for p in (cache / ".locks").rglob("*.lock")]
    then = time.time() - seconds
    for p in files:
        os.utime(p, (then, then))
    return files


@pytest.mark.parametrize("code", ["ENOSYS", "ENOLCK"])
def test_no_flock_warm_and_prune_go_past_leftover_lock_files(tmp_path: Path, hub_server, code: str) -> None:
    cache = tmp_path / "cache"
    common = ["--cache-dir", str(cache), "--endpoint", hub_server.endpoint]
    ok(run_hfcache(["warm", GPT2, BERT, *common]))  # flock works here: it leaves empty lock files behind
    left = age_locks(cache)
    assert left and all(p.stat().st_size == 0 for p in left)
    for blob in (folder(cache, GPT2) / "blobs").iterdir():
        blob.unlink()  # the re-warm must take every blob lock, not only the repo lock
    env = noflock_env(code)

    started = time.monotonic()
    ok(run_hfcache(["warm", GPT2, *common, "--lock-timeout", "600"], env=env))
    assert time.monotonic() - started < 60  # the soft lock waits on nothing: a hang would last 600 s
    ok(run_hfcache(["verify", "--cache-dir", str(cache)], env=env))

    started = time.monotonic()
    proc = ok(run_hfcache(["prune", "--cache-dir", str(cache), "--max-size", "0", "--keep", GPT2, "--yes",
                           "--json"], env=env))
    assert time.monotonic() - started < 60
    outcomes = json.loads(proc.stdout)["items"]
    assert outcomes and {o["status"] for o in outcomes} == {"removed"}, outcomes
    assert any(o["path"].startswith(".locks/") for o in outcomes)

    doctor = json.loads(run_hfcache(["doctor", "--cache-dir", str(cache), "--json"], env=env).stdout)
    finding = next(f for f in doctor["findings"] if f["code"] == "cache.no_flock")
    assert code in finding["message"] and "flock" in finding["message"]


#: Holds a lock of the shared cache argv[1] (as hfcache.cache.layout.file_lock takes it) and prints the lock file's mode and
#: group while held.
HOLD_SHARED = (
    "import os, sys\n"
    "from pathlib import Path\n"
    "from hfcache.cache.layout import file_lock\n"
    "cache = Path(sys.argv[1])\n"
    "lock = cache / '.locks' / 'models--org--name' / 'hfcache-repo.lock'\n"
    "with file_lock(lock, cache_dir=cache):\n"
    "    st = os.stat(lock)\n"
    "    print(oct(st.st_mode & 0o7777), st.st_gid, (lock.read_text().split() or ['-'])[0], flush=True)\n"
)


@pytest.mark.parametrize("code", ["ENOSYS", None])
def test_soft_markers_follow_the_sharing_policy(tmp_path: Path, code: str | None) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    gid = GROUP if os.geteuid() == 0 else os.getegid()  # root: a group it is not in, as a member's umask would miss
    os.chown(cache, -1, gid)
    os.chmod(cache, 0o2775)
    env = noflock_env(code) if code else clean_env(PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-c", HOLD_SHARED, str(cache)], capture_output=True, text=True, env=env,
                          preexec_fn=lambda: os.umask(0o022), timeout=120)
    assert proc.returncode == 0, proc.stderr
    mode, group, first = proc.stdout.split()
    assert int(mode, 8) & 0o060 == 0o060 and int(group) == gid, proc.stdout  # group-writable, the cache's group
    if code:
        assert first.isdigit()  # a soft marker (pid first), not a flock lock file


#: Holds an hfcache repo lock until stdin closes (a live warm, as far as any other process can tell).
HOLD = (
    "import sys\n"
    "from pathlib import Path\n"
    "from hfcache.cache.locking import file_lock\n"
    "with file_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


@pytest.mark.parametrize("code", ["ENOSYS", None])
def test_a_live_holder_is_waited_for_until_lock_timeout(tmp_path: Path, hub_server, code: str | None) -> None:
    cache = tmp_path / "cache"
    common = ["--cache-dir", str(cache), "--endpoint", hub_server.endpoint]
    lock = cache / ".locks" / folder(cache, GPT2).name / "hfcache-repo.lock"
    lock.parent.mkdir(parents=True)
    env = noflock_env(code) if code else clean_env(PYTHONPATH=os.getcwd())
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        if code:
            assert lock.read_text().split("\n")[0] == str(holder.pid)  # the soft marker names its holder
        started = time.monotonic()
        proc = run_hfcache(["warm", GPT2, *common, "--lock-timeout", "6"], env=env)
        waited = time.monotonic() - started
        assert proc.returncode == 5, proc.stderr
        assert 6 <= waited < 60
        assert f"waiting for the lock {lock}" in proc.stderr and f"held by pid {holder.pid}" in proc.stderr
        assert f"timed out after 6s waiting for the lock {lock}" in " ".join(proc.stderr.split())
        assert "one from another host only after 600s without a refresh" in " ".join(proc.stderr.split())
        # Released meanwhile: the next warm waits, then goes on.
        waiter = subprocess.Popen([sys.executable, "-m", "hfcache", "warm", GPT2, *common, "--lock-timeout", "120"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(12)  # its start (imports) plus NOTICE_AFTER, with room for a loaded machine
        holder.stdin.close()
        holder.wait(timeout=30)
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        assert f"waiting for the lock {lock}" in err
    finally:
        holder.kill()
