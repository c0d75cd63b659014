"""The metadata deadline rule (hfcache/pace.py ``metadata_deadline``, docs/security.md "Deadlines"): ``--timeout``
tightens the 120 s deadline to 12 timeouts, never below 10 s; ``HFCACHE_METADATA_DEADLINE`` set explicitly wins.
The end-to-end checks against a dripping peer are tests/integration/test_deadline_from_timeout.py."""

from __future__ import annotations

import pytest

from hfcache.errors import UsageError
from hfcache.hub.client import HubClient
from hfcache.pace import metadata_deadline
from hfcache.serve.upstream_pool import resolve_deadline


@pytest.mark.parametrize(("timeout", "seconds"), [
    (None, 120.0),  # no --timeout known: the default
    (10.0, 120.0),  # the Hub commands' default --timeout: unchanged
    (60.0, 120.0),  # the registry commands' default: a larger --timeout never loosens it
    (1e9, 120.0),
    (3.0, 36.0),
    (1.0, 12.0),
    (0.5, 10.0),  # the floor
    (0.001, 10.0),
])
def test_timeout_tightens_the_deadline(monkeypatch, timeout, seconds):
    monkeypatch.delenv("HFCACHE_METADATA_DEADLINE", raising=False)
    assert metadata_deadline(timeout) == seconds


@pytest.mark.parametrize(("setting", "timeout", "seconds"), [
    ("2", 3.0, 2.0),  # tighter than the derived 36 s
    ("500", 3.0, 500.0),  # looser than the derived 36 s and than 120 s
    ("5", 0.5, 5.0),  # below the floor too: it is the user's figure
    ("0", 3.0, 36.0),  # 0 or empty: not set
    ("", 3.0, 36.0),
])
def test_an_explicit_setting_wins(monkeypatch, setting, timeout, seconds):
    monkeypatch.setenv("HFCACHE_METADATA_DEADLINE", setting)
    assert metadata_deadline(timeout) == seconds


@pytest.mark.parametrize("setting", ["soon", "-1", "inf", "nan", "1e12"])
def test_a_malformed_or_huge_setting_is_a_usage_error(monkeypatch, setting):
    """1e12 s would end in a timer thread's OverflowError (threading.TIMEOUT_MAX): refused like the others."""
    monkeypatch.setenv("HFCACHE_METADATA_DEADLINE", setting)
    with pytest.raises(UsageError, match="HFCACHE_METADATA_DEADLINE"):
        metadata_deadline(3.0)


def test_the_hub_client_and_the_mirror_wait_use_their_timeout(monkeypatch):
    monkeypatch.delenv("HFCACHE_METADATA_DEADLINE", raising=False)
    client = HubClient("http://127.0.0.1:9", timeout=3.0)
    assert client.deadline == 36.0
    assert client.sibling("http://127.0.0.1:8", with_token=False).deadline == 36.0  # verify --repair's other endpoint
    assert HubClient("http://127.0.0.1:9").deadline == 120.0
    assert resolve_deadline("org/x@main from upstream", 0.5).seconds == 10.0
