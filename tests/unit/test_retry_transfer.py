"""Pure parts of the transport: which failures are retried, Retry-After, budgets, and the trusted resume prefix."""

from __future__ import annotations

import os
import threading
import time
from email.utils import formatdate

import httpx2
import pytest

from hfcache.cache.extents import trusted_prefix
from hfcache.errors import HubError
from hfcache.hub import retry
from hfcache.hub.client import HubClient, is_transient
from hfcache.hub.retry import Interrupted, RetryCounter, retry_after


class _StatusError(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.response = httpx2.Response(status, headers=headers or {})


@pytest.mark.parametrize("status, transient", [(429, True), (502, True), (503, True), (504, True), (500, False),
                                               (404, False), (401, False), (403, False), (416, False)])
def test_only_rate_limits_and_gateway_errors_are_transient(status, transient):
    assert is_transient(_StatusError(status)) is transient


def test_cut_connections_are_transient_timeouts_and_refusals_are_not():
    assert is_transient(httpx2.RemoteProtocolError("peer closed connection"))
    assert is_transient(httpx2.ReadError("reset"))
    assert not is_transient(httpx2.ReadTimeout("slow"))
    assert not is_transient(httpx2.ConnectError("refused"))
    assert not is_transient(ValueError("bad json"))


def test_the_retry_module_alone_knows_no_http_client_but_hub_counters_do():
    # hub/retry.py may not import an HTTP client (test_import_graph); HubClient's counters recognise httpx2's cuts.
    cut = httpx2.ReadError("reset")
    assert not retry.is_transient(cut) and retry.is_transient(ConnectionResetError())
    assert not RetryCounter(retries=1).budget().backoff(cut, "x")
    counter = HubClient(endpoint="http://127.0.0.1:9").counter()
    assert counter.budget().backoff(cut, "x") and counter.count == 1


def test_retry_after_seconds_and_http_date():
    assert retry_after(_StatusError(429, {"Retry-After": "3"})) == 3.0
    in_ten = retry_after(_StatusError(503, {"Retry-After": formatdate(time.time() + 10, usegmt=True)}))
    assert in_ten is not None and 8 <= in_ten <= 10
    assert retry_after(_StatusError(429)) is None
    assert retry_after(_StatusError(429, {"Retry-After": "soon"})) is None


def test_budget_is_bounded_counted_and_shared_by_the_repo_counter():
    counter = RetryCounter(retries=2)
    calls = []

    def failing():
        calls.append(1)
        raise _StatusError(503, {"Retry-After": "0"})

    with pytest.raises(_StatusError):
        counter.budget().call(failing, "x")
    assert len(calls) == 3 and counter.count == 2
    with pytest.raises(_StatusError):  # a new request gets a new budget; the repo's count keeps growing
        counter.budget().call(failing, "x")
    assert counter.count == 4


def test_non_transient_errors_are_raised_at_once():
    counter = RetryCounter(retries=5)
    calls = []

    def not_found():
        calls.append(1)
        raise _StatusError(404)

    with pytest.raises(_StatusError):
        counter.budget().call(not_found, "x")
    assert len(calls) == 1 and counter.count == 0


def test_a_stop_interrupts_the_backoff_wait():
    stop = threading.Event()
    counter = RetryCounter(retries=5, stop=stop)
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Interrupted):
        counter.budget().call(lambda: (_ for _ in ()).throw(_StatusError(429, {"Retry-After": "30"})), "x")
    assert time.monotonic() - started < 5


def test_an_excessive_retry_after_fails_instead_of_stalling():
    with pytest.raises(HubError, match="retry after 3600"):
        RetryCounter(retries=5).budget().call(
            lambda: (_ for _ in ()).throw(_StatusError(429, {"Retry-After": "3600"})), "x")


def test_trusted_prefix_of_sequential_and_sparse_leftovers(tmp_path):
    mib = 1024 * 1024
    sequential = tmp_path / "seq.incomplete"
    sequential.write_bytes(os.urandom(1_234_567))
    sparse = tmp_path / "sparse.incomplete"
    fd = os.open(sparse, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, os.urandom(3 * mib + 5000), 0)  # part 1 got 3 MiB and a bit
        os.pwrite(fd, os.urandom(mib), 20 * mib)  # part 2, further on, left a hole before it
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
        prefix = trusted_prefix(fd, 40 * mib)
        too_big = trusted_prefix(fd, 10 * mib)  # longer than the blob: not this blob's download
    finally:
        os.close(fd)
    with open(sequential, "rb") as f:
        assert trusted_prefix(f.fileno(), 2_000_000) == 1_234_567
    if hole >= 21 * mib:
        pytest.skip("this filesystem reports no holes (every byte counts as data)")
    assert prefix == 3 * mib
    assert too_big == 0


def test_server_fault_switches_parse_from_the_command_line():
    from tests.testhub import Faults, parse_faults

    assert parse_faults(["no_blobs", "no_range=false", "rate_limit=3", "body_failure=reset"]) == \
        Faults(no_blobs=True, rate_limit=3, body_failure="reset")
    for bad in (["nope"], ["rate_limit=many"], ["body_failure=418"], ["no_range=maybe"]):
        with pytest.raises(ValueError):
            parse_faults(bad)
