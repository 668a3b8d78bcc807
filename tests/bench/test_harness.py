"""The harness pieces that need no Azurite: flow control, percentiles, request names, report."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bench import prices, report
from bench.config import QUICK
from bench.cpu import CpuUse
from bench.harness import Flow, ScenarioResult, shares
from bench.stats import percentile
from bench.wire import classify, service_ports


def test_the_window_bounds_messages_in_flight() -> None:
    flow = Flow(target=3, window=2)
    assert flow.before_send() and flow.before_send()
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    assert not flow.before_send(1, stop)  # full until something is acknowledged
    assert time.monotonic() - began >= 0.15
    flow.acked()
    assert flow.before_send()
    flow.acked()
    flow.acked()
    assert flow.done.is_set() and flow.seconds > 0


def test_shares_cover_every_message_once() -> None:
    parts = shares(10, 3)
    assert sorted(seq for part in parts for seq in part) == list(range(10))


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([5.0], 99) == 5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_requests_are_named_like_port_operations() -> None:
    base = "http://127.0.0.1:{}/devstoreaccount1"
    q, t, b = base.format(2), base.format(3), base.format(1)
    assert service_ports(f"BlobEndpoint={b};QueueEndpoint={q};TableEndpoint={t};") == {
        1: "blob", 2: "queue", 3: "table"}
    assert classify("queue", "POST", f"{q}/a/messages") == "send"
    assert classify("queue", "GET", f"{q}/a/messages?numofmessages=16") == "receive"
    assert classify("queue", "DELETE", f"{q}/a/messages/id?popreceipt=x") == "delete"
    assert classify("table", "POST", f"{t}/$batch") == "transact"
    assert classify("table", "GET", f"{t}/s(PartitionKey='p',RowKey='r')") == "get"
    assert classify("table", "GET", f"{t}/s()?$filter=x") == "query"
    assert classify("table", "POST", f"{t}/s") == "insert"
    assert classify("blob", "PUT", f"{b}/c/name") == "write"
    assert classify("blob", "GET", f"{b}/c?restype=container&comp=list") == "list"


def _result(key: str, units: int, seconds: float, **extra: object) -> ScenarioResult:
    return ScenarioResult(key=key, title=key, units=units, seconds=seconds, verified="ok",
                          extra=dict(extra))


def test_summary_has_the_issue_keys_and_null_for_what_did_not_run() -> None:
    cpu = CpuUse(1.0, 0.5, 2.0)
    ops = {("queue", "receive"): 1, ("queue", "receive_empty"): 50, ("queue", "send"): 10,
           ("queue", "delete"): 10, ("table", "transact"): 10}
    results = {
        "raw": _result("raw", 100, 1.0, ops={("queue", "send"): 100}, requests={}, cpu=cpu),
        "eo_hop": _result("eo_hop", 10, 0.5, ops=ops, errors={}, requests=ops,
                          client_requests={}, cpu=cpu),
    }
    data = report.summary(results, prices.load(), QUICK, "abc")
    assert set(report.REQUIRED) <= set(data)
    assert data["raw_hop_msgs_per_s"] == 100.0 and data["eo_hop_msgs_per_s"] == 20.0
    assert data["eo_to_raw_ratio"] == 0.2
    assert data["ops_per_eo_hop"] == 3.1  # the 50 empty receives are idle polling
    assert data["usd_per_million_eo_hops"] == pytest.approx(0.04 + 0.4 + 0.4 + 0.036, abs=1e-3)
    assert data["kombu_msgs_per_s"] is None and data["p99_ms"] is None
    json.dumps(data)


def test_markdown_names_the_failure_instead_of_a_number() -> None:
    info = report.RunInfo(cfg=QUICK, machine={"CPU": "2 x test"}, started="now", seconds=1.0,
                          command="python -m bench --quick")
    text = report.markdown(info, results={}, failures={"raw": "FAILED: lost 3"},
                           titles={"raw": "raw hop"}, data={"x": None}, prices=prices.load())
    assert "FAILED: lost 3" in text and "## Prices used" in text and '{"x": null}' in text
