"""doctor's reading of the environment, checked against huggingface_hub's own rules (in-process, no cache needed)."""

from __future__ import annotations

import itertools

import pytest
from huggingface_hub import constants

from hfcache.offline.doctor import doctor, hub_cache_setting

VALUES = [None, "", "0", "1", "true", "FALSE", "yes", "off", "y"]


def codes(report, severity=None):
    return {f.code for f in report.findings if severity is None or f.severity == severity}


@pytest.mark.parametrize("hub, tf", list(itertools.product(VALUES, VALUES)))
def test_offline_mode_is_computed_as_huggingface_hub_does(tmp_path, hub, tf):
    env = {"HF_HUB_CACHE": str(tmp_path)}
    env.update({k: v for k, v in (("HF_HUB_OFFLINE", hub), ("TRANSFORMERS_OFFLINE", tf)) if v is not None})
    report = doctor(environ=env)
    # huggingface_hub constants.py: HF_HUB_OFFLINE = _is_true(os.environ.get("HF_HUB_OFFLINE") or
    # os.environ.get("TRANSFORMERS_OFFLINE"))
    assert report.offline is constants._is_true(hub or tf)
    masked = "offline.masked" in codes(report, "error")
    assert masked is (not report.offline and constants._is_true(tf))


def test_hub_cache_setting_precedence(tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    assert hub_cache_setting({"HF_HUB_CACHE": a, "HUGGINGFACE_HUB_CACHE": b, "HF_HOME": c}) == (tmp_path / "a",
                                                                                              "HF_HUB_CACHE")
    assert hub_cache_setting({"HUGGINGFACE_HUB_CACHE": b, "HF_HOME": c}) == (tmp_path / "b", "HUGGINGFACE_HUB_CACHE")
    assert hub_cache_setting({"HF_HOME": c, "XDG_CACHE_HOME": a}) == (tmp_path / "c" / "hub", "HF_HOME")
    assert hub_cache_setting({"XDG_CACHE_HOME": a}) == (tmp_path / "a" / "huggingface" / "hub", "XDG_CACHE_HOME")
    assert hub_cache_setting({})[1] == "default"


def test_an_empty_hf_hub_cache_is_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_cache_setting({"HF_HUB_CACHE": ""}) == (tmp_path, "HF_HUB_CACHE")
    report = doctor(environ={"HF_HUB_CACHE": "", "HF_HUB_OFFLINE": "1"})
    assert "env.empty" in codes(report, "error") and report.exit_code == 1


def test_a_missing_cache_is_an_error(tmp_path):
    report = doctor(environ={"HF_HUB_CACHE": str(tmp_path / "none"), "HF_HUB_OFFLINE": "1"})
    assert "cache.missing" in codes(report, "error") and not report.ok
    assert report.owner_uid is None and report.free_bytes is not None  # measured on the nearest existing parent


def test_findings_are_sorted_errors_first(tmp_path):
    report = doctor(environ={"HF_HUB_CACHE": str(tmp_path / "none"), "HF_HUB_OFFLINE": "0",
                             "TRANSFORMERS_OFFLINE": "1"})
    severities = [f.severity for f in report.findings]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert all(f.fix for f in report.findings if f.severity != "info")
