"""What an endpoint says when it refuses: its own text (``X-Error-Message``) is in the error line,
and the hint fits the refusal: a pull-through mirror's ``--allow`` list is not a token problem; a gated repo or a
401 is."""

from __future__ import annotations

import json
from pathlib import Path

from hfcache.serve.pullthrough import PullThroughConfig
from tests.helpers import HUB, one_error_line, run_hfcache
from tests.testhub import HubServer


def warm(cache: Path, endpoint: str, repo: str, *extra: str):
    return run_hfcache(["warm", repo, "--cache-dir", str(cache), "--endpoint", endpoint, *extra])


def hint_of(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("hint: "))


def test_a_mirrors_allow_refusal_says_why_and_hints_allow_not_a_token(tmp_path):
    (tmp_path / "mirror").mkdir()
    with HubServer(HUB) as upstream:
        config = PullThroughConfig(upstreams=(upstream.endpoint,), allow=("openai-community/*",))
        with HubServer(tmp_path / "mirror", layout="cache", lfs_redirect=False, upstream=config) as mirror:
            proc = warm(tmp_path / "cache", mirror.endpoint, "google-t5/t5-small")
            as_json = warm(tmp_path / "cache", mirror.endpoint, "google-t5/t5-small", "--json")
        assert upstream.requests == []
    one_error_line(proc, 3, "refused by the mirror", "this mirror's --allow list does not let it be fetched")
    hint = hint_of(proc.stderr)
    assert "--allow" in hint and "token" not in hint, hint
    report = json.loads(as_json.stdout)["repos"][0]
    assert "--allow list" in report["error"] and "--allow" in report["hint"] and report["exit_code"] == 3


def test_gated_and_401_refusals_quote_the_endpoint_and_hint_a_token(tmp_path):
    with HubServer(HUB, gated={"openai-community/gpt2"}) as gated_hub:
        gated = warm(tmp_path / "cache", gated_hub.endpoint, "openai-community/gpt2")
    with HubServer(HUB, token="hf_secret_test_token") as private_hub:
        unauthorized = warm(tmp_path / "cache", private_hub.endpoint, "openai-community/gpt2")
    for proc, server in ((gated, gated_hub), (unauthorized, private_hub)):
        one_error_line(proc, 3, f"at {server.endpoint}", "(it said: ")
        assert "token" in hint_of(proc.stderr) and "--allow" not in proc.stderr
    assert "is restricted and you are not in the authorized list" in gated.stderr
    assert "Invalid username or password" in unauthorized.stderr and "hf_secret_test_token" not in unauthorized.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("*--*/refs/*"))
