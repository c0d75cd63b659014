"""Offline at runtime: `hfcache exec` (environment + network guard), enforce_offline() and load_tokenizer(), end to end.

Everything runs in real child processes against a real Hub server on loopback; the server's request log is the proof
that nothing reached it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hfcache
from hfcache.offline.env import offline_environment
from hfcache.records import WarmRequest
from tests.helpers import GOLDEN, LOAD_SCRIPT, clean_env, golden_ids, run_hfcache, silent_server
from tests.testhub import HubServer

HUB = Path(__file__).parent.parent / "data" / "hub"
FIXTURES = ["google-bert/bert-base-uncased", "openai-community/gpt2", "google-bert/bert-base-chinese",
            "FacebookAI/roberta-base", "mistralai/Mistral-7B-v0.1", "sentence-transformers/all-MiniLM-L6-v2",
            "distilbert/distilbert-base-uncased", "google-t5/t5-small", "microsoft/Phi-3-mini-4k-instruct"]
LEGACY = {"bert-base-uncased": "google-bert/bert-base-uncased", "gpt2": "openai-community/gpt2"}

#: A child that opens one HTTP connection and reports how it went and how long it took.
CONNECT_SCRIPT = textwrap.dedent("""
    import json, sys, time, urllib.request
    started = time.monotonic()
    try:
        body = urllib.request.urlopen(sys.argv[1], timeout=30).read()
        result = {"ok": True}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = time.monotonic() - started
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> Path:
    """Every fixture repo, plus two legacy ids, warmed once for this module."""
    cache = tmp_path_factory.mktemp("offline") / "cache"
    with HubServer(HUB) as server:
        report = hfcache.warm([WarmRequest.parse(s) for s in [*FIXTURES, *LEGACY]], cache_dir=cache,
                              endpoint=server.endpoint, token=False)
    assert report.ok, [r.error for r in report.repos if not r.ok]
    return cache


def exec_hfcache(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_hfcache(["exec", *args], env=env, timeout=timeout, cwd=cwd)


def last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ exec


@pytest.mark.slow
def test_exec_loads_every_warmed_tokenizer_and_the_running_server_sees_no_request(warm_cache, hub_server):
    ids = [*FIXTURES, *LEGACY]
    env = clean_env(HF_ENDPOINT=hub_server.endpoint)  # the Hub is up and reachable: nothing stops a request but hfcache
    proc = exec_hfcache(["--cache-dir", str(warm_cache), "--", sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], *ids],
                        env=env)
    assert proc.returncode == 0, proc.stderr
    loaded = last_json(proc)
    for repo_id in ids:
        canonical = LEGACY.get(repo_id, repo_id)
        assert loaded[repo_id].get("input_ids") == golden_ids(canonical), (repo_id, loaded[repo_id])
        assert loaded[repo_id]["class"] == GOLDEN["repos"][canonical]["class"]
    assert hub_server.requests == []

    # The same load without exec, same cache, same environment otherwise: it does talk to the server.
    plain = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], "google-bert/bert-base-uncased"],
                           capture_output=True, text=True, timeout=300,
                           env={**env, "HF_HUB_CACHE": str(warm_cache)})
    assert plain.returncode == 0, plain.stderr
    assert len(hub_server.requests) > 0


def test_exec_guard_fails_a_connection_at_once_and_allow_host_lets_it_through(tmp_path, hub_server):
    url = f"{hub_server.endpoint}/api/models/openai-community/gpt2"
    host_port = hub_server.endpoint.removeprefix("http://")
    common = ["--cache-dir", str(tmp_path / "cache")]

    started = time.monotonic()
    blocked = exec_hfcache([*common, "--", sys.executable, "-c", CONNECT_SCRIPT, url])
    wall = time.monotonic() - started
    result = last_json(blocked)
    assert result["ok"] is False
    assert result["seconds"] < 1.0, result
    assert result["error"].startswith(f"NetworkBlocked: hfcache blocked a connection to {host_port}")
    assert f"--allow-host {host_port}" in result["error"]
    assert hub_server.requests == []
    assert wall < 60  # start-up included; the hang this replaces has no bound

    allowed = exec_hfcache([*common, "--allow-host", host_port, "--", sys.executable, "-c", CONNECT_SCRIPT, url])
    assert last_json(allowed)["ok"] is True, allowed.stdout
    assert [r.path for r in hub_server.requests] == ["/api/models/openai-community/gpt2"]

    # `localhost` allows the loopback addresses (by name and by address); another port stays blocked.
    port = int(host_port.rsplit(":", 1)[1])
    by_name = url.replace("127.0.0.1", "localhost")
    assert last_json(exec_hfcache([*common, "--allow-host", f"localhost:{port}", "--", sys.executable, "-c",
                                   CONNECT_SCRIPT, by_name]))["ok"] is True
    other = last_json(exec_hfcache([*common, "--allow-host", f"localhost:{port + 1}", "--", sys.executable, "-c",
                                    CONNECT_SCRIPT, by_name]))
    assert other["ok"] is False and f"127.0.0.1:{port}" in other["error"]


def test_exec_guard_fails_a_dns_lookup_at_once(tmp_path):
    result = last_json(exec_hfcache(["--cache-dir", str(tmp_path), "--", sys.executable, "-c", CONNECT_SCRIPT,
                                     "https://huggingface.co/api/models/gpt2"]))
    assert result["ok"] is False and result["seconds"] < 1.0
    assert "hfcache blocked a DNS lookup of huggingface.co" in result["error"]
    assert "--allow-host huggingface.co" in result["error"]


def test_exec_does_not_hang_on_an_endpoint_that_never_answers(warm_cache):
    with silent_server() as endpoint:
        env = clean_env(HF_ENDPOINT=endpoint)
        started = time.monotonic()
        proc = exec_hfcache(["--cache-dir", str(warm_cache), "--", sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"],
                             "google-bert/bert-base-uncased", "FacebookAI/roberta-base"], env=env, timeout=120)
        elapsed = time.monotonic() - started
        assert proc.returncode == 0, proc.stderr
        loaded = last_json(proc)
        assert loaded["google-bert/bert-base-uncased"]["input_ids"] == golden_ids("google-bert/bert-base-uncased")
        assert loaded["FacebookAI/roberta-base"]["input_ids"] == golden_ids("FacebookAI/roberta-base")
        assert elapsed < 60

        # Without exec the same load waits on the silent endpoint (docs/cache-layout.md, 'Traps the libraries leave': the revision lookup has no timeout).
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run([sys.executable, "-c", LOAD_SCRIPT, GOLDEN["text"], "google-bert/bert-base-uncased"],
                           capture_output=True, env={**env, "HF_HUB_CACHE": str(warm_cache)}, timeout=5)


def test_exec_sets_the_offline_environment(tmp_path):
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    env = clean_env(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    child = last_json(exec_hfcache(["--cache-dir", str(tmp_path / "hub"), "--", sys.executable, "-c", script],
                                   env=env))
    expected = offline_environment(tmp_path / "hub").as_dict()
    assert {k: child[k] for k in expected} == expected
    assert child["HF_HOME"] == str(tmp_path)  # the cache is $HF_HOME/hub
    assert child["HF_ENDPOINT"] == "http://127.0.0.1:9"  # everything else is inherited


def test_exec_passes_the_exit_code_through_and_reports_a_missing_command(tmp_path):
    code = exec_hfcache(["--cache-dir", str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(7)"]).returncode
    assert code == 7
    # without `--`, options after the command belong to the command
    proc = exec_hfcache(["--cache-dir", str(tmp_path), sys.executable, "-c", "print('ran')"])
    assert proc.returncode == 0 and proc.stdout.strip() == "ran"
    missing = exec_hfcache(["--cache-dir", str(tmp_path), "--", "hfcache-no-such-command"])
    assert missing.returncode == 127 and "command not found: hfcache-no-such-command" in missing.stderr
    assert exec_hfcache(["--cache-dir", str(tmp_path)]).returncode == 2


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_exec_signals_reach_the_command(tmp_path, signum):
    """hfcache execs: the command has hfcache's PID, so a signal sent to it is the command's to handle."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        signal.signal({int(signum)}, lambda *_: sys.exit(42))
        print(os.getpid(), flush=True)
        time.sleep(60)
        sys.exit(1)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path), "--",
                             sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert int(proc.stdout.readline()) == proc.pid
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 42
    finally:
        proc.kill()
        proc.wait()


def test_exec_keeps_pythonpath_and_chains_an_existing_sitecustomize(tmp_path, hub_server):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "sitecustomize.py").write_text("import os\nos.environ['APP_SITECUSTOMIZE'] = 'ran'\n")
    (lib / "applib.py").write_text("VALUE = 'from PYTHONPATH'\n")
    script = textwrap.dedent("""
        import json, os, subprocess, sys, applib
        grandchild = subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]], capture_output=True, text=True)
        print(json.dumps({"applib": applib.VALUE, "site": os.environ.get("APP_SITECUSTOMIZE"),
                          "grandchild": json.loads(grandchild.stdout)}))
    """)
    env = clean_env(PYTHONPATH=str(lib))
    result = last_json(exec_hfcache(["--cache-dir", str(tmp_path / "c"), "--", sys.executable, "-c", script,
                                     hub_server.endpoint + "/api/models/gpt2", CONNECT_SCRIPT], env=env))
    assert result["applib"] == "from PYTHONPATH" and result["site"] == "ran"
    assert result["grandchild"]["ok"] is False and "hfcache blocked" in result["grandchild"]["error"]
    assert hub_server.requests == []


def test_enforce_offline_inside_exec_shares_the_one_guard(tmp_path, hub_server):
    """An application under exec that also calls enforce_offline(): one guard, its NetworkBlocked catchable by name,
    and the hosts it allows added to exec's."""
    url = f"{hub_server.endpoint}/api/models/gpt2"
    host_port = hub_server.endpoint.removeprefix("http://")
    script = textwrap.dedent(f"""
        import json, sys, urllib.request
        import hfcache, hfcache.offline.guard
        out = {{}}
        try:
            urllib.request.urlopen({url!r}, timeout=30)
        except hfcache.offline.guard.NetworkBlocked as exc:
            out["before"] = exc.target
        hfcache.enforce_offline({str(tmp_path / "c")!r}, allow_hosts=[{host_port!r}])
        urllib.request.urlopen({url!r}, timeout=30).read()
        out["after"] = "ok"
        out["hooks"] = hfcache.offline.guard.current() is sys._hfcache_network_guard
        print(json.dumps(out))
    """)
    out = last_json(exec_hfcache(["--cache-dir", str(tmp_path / "c"), "--", sys.executable, "-c", script]))
    assert out == {"before": host_port, "after": "ok", "hooks": True}
    assert len(hub_server.requests) == 1


def lock_and_warm(tmp_path: Path, *repo_ids: str) -> Path:
    with HubServer(HUB) as server:
        entries = "".join(f'[[repos]]\nrepo_id = "{r}"\n' for r in repo_ids)
        (tmp_path / "hfcache.toml").write_text(f'endpoint = "{server.endpoint}"\ncache_dir = "cache"\n{entries}')
        assert run_hfcache(["lock"], cwd=tmp_path).returncode == 0
        assert run_hfcache(["warm", "--lock", "hfcache.lock"], cwd=tmp_path).returncode == 0
    return tmp_path / "hfcache.lock"


def test_exec_lock_refuses_to_start_when_the_cache_lacks_a_file(tmp_path):
    lock = lock_and_warm(tmp_path, "google-bert/bert-base-uncased", "FacebookAI/roberta-base")
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    # The cache comes from the manifest beside the lock, as for `warm --lock`.
    ok = exec_hfcache(["--lock", str(lock), "--", *command], cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert marker.exists()
    marker.unlink()

    vocab = next((tmp_path / "cache").glob("models--google-bert--bert-base-uncased/snapshots/*/vocab.txt"))
    vocab.unlink()
    refused = exec_hfcache(["--lock", str(lock), "--", *command], cwd=tmp_path)
    assert refused.returncode == 4
    assert "google-bert/bert-base-uncased" in refused.stderr and "vocab.txt: missing" in refused.stderr
    assert "hfcache warm --lock" in refused.stderr
    assert not marker.exists()  # the command never started


# ------------------------------------------------------------------------------------------------ Python API

#: A child application: optionally imports transformers first, then calls hfcache, then loads and reports.
def run_app(body: str, env: dict[str, str], timeout: float = 300) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


ENFORCE_APP = """
    import json, sys, urllib.request
    IMPORT_FIRST = {import_first}
    if IMPORT_FIRST:
        import transformers, huggingface_hub.constants
    import hfcache
    settings = hfcache.enforce_offline({cache!r}{extra})
    from transformers import AutoTokenizer
    import huggingface_hub.constants as constants
    out = {{"patched": list(settings.patched), "offline": constants.is_offline_mode(),
            "hub_cache": constants.HF_HUB_CACHE}}
    tok = AutoTokenizer.from_pretrained("google-bert/bert-base-uncased")
    out["ids"] = tok({text!r})["input_ids"]
    try:
        urllib.request.urlopen({url!r}, timeout=30)
        out["connect"] = "ok"
    except Exception as exc:
        out["connect"] = f"{{type(exc).__name__}}: {{exc}}"
    print(json.dumps(out))
"""


@pytest.mark.parametrize("import_first", [False, True], ids=["before-import", "already-imported"])
def test_enforce_offline_uses_only_the_cache(warm_cache, hub_server, tmp_path, import_first):
    # The environment points at the running server and at an empty cache: only enforce_offline can make this work.
    env = clean_env(HF_ENDPOINT=hub_server.endpoint, HF_HOME=str(tmp_path / "home"))
    url = f"{hub_server.endpoint}/api/models/gpt2"
    out = run_app(ENFORCE_APP.format(import_first=import_first, cache=str(warm_cache), extra="", text=GOLDEN["text"],
                                     url=url), env)
    assert out["ids"] == golden_ids("google-bert/bert-base-uncased")
    assert out["offline"] is True and out["hub_cache"] == str(warm_cache)
    assert out["connect"].startswith("NetworkBlocked: hfcache blocked a connection to 127.0.0.1")
    assert hub_server.requests == []
    if import_first:
        assert "huggingface_hub.constants.HF_HUB_OFFLINE" in out["patched"]
        assert "huggingface_hub.constants.HF_HUB_CACHE" in out["patched"]
    else:
        assert out["patched"] == []  # nothing was imported yet: the environment was enough

    # allow_hosts lets that one host through
    host_port = hub_server.endpoint.removeprefix("http://")
    out = run_app(ENFORCE_APP.format(import_first=import_first, cache=str(warm_cache),
                                     extra=f", allow_hosts=[{host_port!r}]", text=GOLDEN["text"], url=url), env)
    assert out["connect"] == "ok"
    assert [r.path for r in hub_server.requests] == ["/api/models/gpt2"]


def test_already_imported_without_enforce_offline_the_library_goes_online(warm_cache, hub_server, tmp_path):
    """The control for the test above: setting os.environ after the import changes nothing (huggingface_hub/constants.py reads HF_* at import time)."""
    env = clean_env(HF_ENDPOINT=hub_server.endpoint, HF_HOME=str(tmp_path / "home"))
    out = run_app(f"""
        import json, os
        from transformers import AutoTokenizer
        os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE={str(warm_cache)!r})
        import huggingface_hub.constants as constants
        print(json.dumps({{"offline": constants.is_offline_mode()}}))
    """, env)
    assert out["offline"] is False


def test_enforce_offline_with_a_lock_refuses_an_incomplete_cache(tmp_path):
    lock = lock_and_warm(tmp_path, "FacebookAI/roberta-base")
    env = clean_env(HF_HOME=str(tmp_path / "home"))
    body = f"""
        import json, os
        import hfcache
        out = {{}}
        try:
            out["cache"] = str(hfcache.enforce_offline(lock={str(lock)!r}).cache_dir)
        except hfcache.HfcacheError as exc:
            out["error"], out["exit_code"] = str(exc), exc.exit_code
        out["offline_env"] = os.environ.get("HF_HUB_OFFLINE")
        print(json.dumps(out))
    """
    assert run_app(body, env)["cache"] == str(tmp_path / "cache")
    next((tmp_path / "cache").glob("models--FacebookAI--roberta-base/snapshots/*/merges.txt")).unlink()
    out = run_app(body, env)
    assert out["exit_code"] == 4 and "merges.txt: missing" in out["error"]
    assert out["offline_env"] is None  # nothing was changed


LOAD_APP = """
    import json, sys
    if {import_first}:
        import transformers
    import hfcache
    out = {{}}
    for repo_id in {repo_ids!r}:
        try:
            tok = hfcache.load_tokenizer(repo_id, cache_dir={cache!r}{extra})
            out[repo_id] = {{"class": type(tok).__name__, "ids": tok({text!r})["input_ids"]}}
        except hfcache.HfcacheError as exc:
            out[repo_id] = {{"error": str(exc), "type": type(exc).__name__, "exit_code": exc.exit_code,
                            "cause": getattr(exc, "cause", None), "hint": exc.hint}}
    print(json.dumps(out))
"""


@pytest.mark.parametrize("import_first", [False, True], ids=["before-import", "already-imported"])
def test_load_tokenizer_loads_from_the_cache_without_a_request(warm_cache, hub_server, tmp_path, import_first):
    env = clean_env(HF_ENDPOINT=hub_server.endpoint, HF_HUB_CACHE=str(tmp_path / "elsewhere"))
    repo_ids = ["google-bert/bert-base-uncased", "FacebookAI/roberta-base", "bert-base-uncased"]
    out = run_app(LOAD_APP.format(import_first=import_first, repo_ids=repo_ids, cache=str(warm_cache), extra="",
                                  text=GOLDEN["text"]), env)
    for repo_id in repo_ids:
        canonical = LEGACY.get(repo_id, repo_id)
        assert out[repo_id]["ids"] == golden_ids(canonical), out[repo_id]
        assert out[repo_id]["class"] == GOLDEN["repos"][canonical]["class"]
    assert hub_server.requests == []


def test_load_tokenizer_names_what_the_cache_lacks(tmp_path, hub_server):
    cache = tmp_path / "cache"
    with HubServer(HUB) as other:
        assert hfcache.warm([WarmRequest.parse("FacebookAI/roberta-base")], cache_dir=cache, endpoint=other.endpoint,
                            token=False).ok
    next(cache.glob("models--FacebookAI--roberta-base/.no_exist/*/config.json")).unlink()
    env = clean_env(HF_ENDPOINT=hub_server.endpoint)
    out = run_app(LOAD_APP.format(import_first=False, repo_ids=["FacebookAI/roberta-base", "openai-community/gpt2"],
                                  cache=str(cache), extra="", text="hi"), env)
    roberta, gpt2 = out["FacebookAI/roberta-base"], out["openai-community/gpt2"]
    assert roberta["type"] == "OfflineLoadError" and roberta["exit_code"] == 4
    assert "no config.json and no .no_exist marker" in roberta["cause"]
    assert gpt2["type"] == "OfflineLoadError" and "not in the cache" in gpt2["error"]
    assert "hfcache warm openai-community/gpt2" in gpt2["hint"]
    assert hub_server.requests == []


def test_load_tokenizer_allow_network_fetches_what_is_missing(tmp_path, hub_server):
    env = clean_env(HF_ENDPOINT=hub_server.endpoint)
    out = run_app(LOAD_APP.format(import_first=False, repo_ids=["openai-community/gpt2"], cache=str(tmp_path / "c"),
                                  extra=", allow_network=True", text=GOLDEN["text"]), env)
    assert out["openai-community/gpt2"]["ids"] == golden_ids("openai-community/gpt2")
    assert len(hub_server.requests) > 0

    # ...but not in a process that enforce_offline() made offline: a clear error, still no request.
    hub_server.clear_log()
    enforce = f"    import hfcache\n    hfcache.enforce_offline({str(tmp_path / 'c')!r})\n"
    body = LOAD_APP.replace("    import hfcache\n", enforce)
    out = run_app(body.format(import_first=False, repo_ids=["google-bert/bert-base-uncased"],
                              cache=str(tmp_path / "c"), extra=", allow_network=True", text="hi"), env)
    assert "offline mode is on in this process" in out["google-bert/bert-base-uncased"]["error"]
    assert hub_server.requests == []


def test_load_tokenizer_does_not_hang_on_an_endpoint_that_never_answers(warm_cache):
    with silent_server() as endpoint:
        env = clean_env(HF_ENDPOINT=endpoint)
        out = run_app(LOAD_APP.format(import_first=False, repo_ids=["google-bert/bert-base-uncased"],
                                      cache=str(warm_cache), extra="", text=GOLDEN["text"]), env, timeout=120)
    assert out["google-bert/bert-base-uncased"]["ids"] == golden_ids("google-bert/bert-base-uncased")


def test_import_hfcache_stays_light():
    out = run_app("""
        import json, sys
        import hfcache
        hfcache.enforce_offline, hfcache.load_tokenizer
        print(json.dumps(sorted(m for m in ("huggingface_hub", "transformers", "click", "rich", "httpx")
                                if m in sys.modules)))
    """, clean_env())
    assert out == []
