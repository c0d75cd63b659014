"""One tokenizer's time or memory fails only that tokenizer in ``hfcache check`` (docs/security.md, the tokenizer
rows). The hostile repos are served by the test Hub and warmed by hfcache, check runs as a real process.

- A ``tokenizer.json`` whose ``Split`` pre-tokenizer regex backtracks (``(?:.?.?){14}$``, Oniguruma: seconds per
  encode, no panic). check's single 600 s budget was shared by every repo: all of them failed "did not finish within
  600 s", the healthy ones mis-diagnosed. Now each tokenizer has its own budget (``HFCACHE_CHECK_REPO_TIMEOUT``) from
  its start: one that runs past it fails alone, named; one that loaded keeps its result and only its fast-path
  comparison (bounded too) is refused; the others get their results.
- A normalizer ``Sequence`` of ``Replace("l" -> "ll")`` N times doubles the text at each step; in check's child,
  unlimited, N=40 aborted after taking the machine's memory. The child now runs under ``RLIMIT_AS``
  (``HFCACHE_CHECK_MEMORY``) and its budget: only that tokenizer fails.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hfcache.integrity.check import MEMORY, REPO_TIMEOUT
from hfcache.integrity.check_child import CRASHED
from tests.helpers import GOLDEN, clean_env, run_hfcache
from tests.hostile_tokenizer_repos import HEALTHY, assert_healthy_rows, t5_backend, warmed

#: The red team's regex, one step slower, four times in a row: about 25 s per encode of :data:`SLOW_TEXT` (tokenizers
#: 0.23, 2 cores; one step more hits Oniguruma's retry limit, a panic, so the text's length makes it slow), under a
#: millisecond for the golden text (Oniguruma's backtracking depends on the text).
SLOW_REGEX = "(?:.?.?){14}$"
SLOW_TEXT = "Hello world, 深度学习 café 😀 <s> [CLS] hello" * 4
BUDGET = "8"


SLOW = t5_backend(pre_tokenizer={"type": "Sequence", "pretokenizers": [
    *[{"type": "Split", "pattern": {"Regex": SLOW_REGEX}, "behavior": "Isolated", "invert": False}] * 4,
    {"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                  "split": True}]})


def _doubling(steps: int) -> dict[str, str]:
    return t5_backend(normalizer={"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "l"}, "content": "ll"}] * steps})


def _check(cache: Path, *args: str, **settings: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    proc = run_hfcache(["check", "--cache-dir", str(cache), "--json", *args], env=clean_env(**settings), timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), time.monotonic() - started


def _rows(report: dict) -> dict[str, dict]:
    return {r["repo_id"]: r for r in report["tokenizers"]}


@pytest.fixture(scope="module")
def slow_cache(tmp_path_factory) -> Path:
    return warmed(tmp_path_factory.mktemp("budgets"), {"slow": SLOW})


def test_the_defaults_are_documented_values():
    assert (REPO_TIMEOUT, MEMORY) == (120.0, 8 * 1024**3)


def test_a_tokenizer_past_its_own_budget_fails_alone_and_the_others_load(slow_cache):
    """The probe text itself takes a minute to encode with hostile/slow: it is stopped at its budget, named; the healthy
    repos after it are loaded by a new child and keep their results (they were "did not finish within 600 s")."""
    code, report, seconds = _check(slow_cache, "--text", SLOW_TEXT, HFCACHE_CHECK_REPO_TIMEOUT=BUDGET)
    assert code == 1, report
    rows = _rows(report)
    assert [r["repo_id"] for r in report["tokenizers"]] == [HEALTHY[0], "hostile/slow", HEALTHY[1]]
    slow = rows["hostile/slow"]
    assert slow["ok"] is False and slow["input_ids"] is None, slow
    assert slow["error"] == (f"not loaded: the offline load ran past {BUDGET} s (each tokenizer's own budget), so "
                             "it was stopped"), slow
    assert slow["cause"].startswith("this tokenizer's load or encode ran past its own time budget"), slow
    for repo_id in HEALTHY:
        assert rows[repo_id]["ok"] is True and rows[repo_id]["input_ids"], rows[repo_id]
        assert rows[repo_id]["fast_path"] == "equal", rows[repo_id]
        assert rows[repo_id]["cause"] is None and "did not finish" not in json.dumps(rows[repo_id])
    assert seconds < 300, seconds
    people = run_hfcache(["check", "--cache-dir", str(slow_cache), "--text", SLOW_TEXT],
                         env=clean_env(HFCACHE_CHECK_REPO_TIMEOUT=BUDGET, COLUMNS="400"), timeout=600)
    assert people.returncode == 1 and "2 loaded, 1 failed" in people.stdout, people.stdout + people.stderr
    assert f"hostile/slow@main: not loaded: the offline load ran past {BUDGET} s" in people.stdout


def test_a_tokenizer_whose_comparison_is_slow_keeps_its_load_and_its_fast_path_is_refused(slow_cache):
    """With the golden text hostile/slow loads and encodes at once; the fast path's comparison (its smoke text, the
    corpus) would take hours: it is cut at the budget, the load's result stands, the fast path is refused (and not
    recorded), and the healthy repos keep theirs. Exit 0: every tokenizer loaded."""
    code, report, seconds = _check(slow_cache, "--text", GOLDEN["text"], HFCACHE_CHECK_REPO_TIMEOUT=BUDGET)
    assert code == 0, report
    rows = _rows(report)
    slow = rows["hostile/slow"]
    assert slow["ok"] is True and slow["input_ids"], slow
    assert slow["fast_path"].startswith("refused: the comparison on the corpus "), slow
    assert slow["commit"] is None
    assert_healthy_rows(report)
    assert seconds < 300, seconds


@pytest.mark.parametrize("steps", [25, 40])
def test_a_normalizer_that_doubles_the_text_fails_alone_under_the_memory_limit(tmp_path, steps):
    """F3b in check: the transformers load of hostile/boom encodes the probe text through 25 or 40 doublings. Under
    ``HFCACHE_CHECK_MEMORY`` the child's allocation fails (or its budget ends a slow one): hostile/boom fails, named;
    the healthy repos keep their results."""
    cache = warmed(tmp_path, {"boom": _doubling(steps)})
    code, report, seconds = _check(cache, "--text", GOLDEN["text"], HFCACHE_CHECK_MEMORY="2GiB",
                                   HFCACHE_CHECK_REPO_TIMEOUT="60")
    assert code == 1, report
    boom = _rows(report)["hostile/boom"]
    assert boom["ok"] is False and boom["input_ids"] is None, boom
    assert boom["error"].startswith((f"{CRASHED} (killed by SIGABRT): memory allocation of ",
                                     "not loaded: the offline load ran past 60 s")), boom
    assert_healthy_rows(report)
    assert seconds < 400, seconds


def test_a_malformed_setting_is_exit_2(slow_cache):
    for name, value in (("HFCACHE_CHECK_REPO_TIMEOUT", "soon"), ("HFCACHE_CHECK_MEMORY", "lots")):
        proc = run_hfcache(["check", "--cache-dir", str(slow_cache)], env=clean_env(**{name: value}), timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("hfcache: error: HFCACHE_CHECK_REPO_TIMEOUT / HFCACHE_CHECK_MEMORY: invalid")


def test_a_load_error_quoting_megabytes_of_the_repo_is_diagnosed_at_once(tmp_path):
    """A second red team: transformers quotes a 200,000-character ``extra_special_tokens`` key in its error, and
    check's parent ran a quadratic regex over the whole text (287 s after the child had exited, where no budget
    reaches). The child keeps 2,000 characters of an error and the diagnosis reads no more."""
    files = t5_backend()
    files["tokenizer_config.json"] = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                 "extra_special_tokens": {"offline" + "a" * 200_000: 5}})
    cache = warmed(tmp_path, {"long-error": files})
    code, report, seconds = _check(cache)
    assert code == 1, report
    rows = _rows(report)
    bad = rows["hostile/long-error"]
    assert bad["ok"] is False and len(bad["error"]) <= 2000, len(bad["error"])
    for repo_id in HEALTHY:
        assert rows[repo_id]["ok"] is True, rows[repo_id]
    assert seconds < 120, seconds
