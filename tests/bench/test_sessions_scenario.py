"""The sessions scenario: a set-aside copy counted once, when its released copy is handled (on
the in-memory backend); the medians, ratios, JSON keys and markdown from made-up runs; one tiny
run on Azurite. Nothing here checks a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.__main__ import main
from bench.busrun import AckProbe
from bench.config import FULL, QUICK
from bench.cpu import CpuUse
from bench.harness import ScenarioResult
from bench.scenarios import SCENARIOS, sessions
from bench.scenarios.sessions import HandlerRuns, HopRun, OrderCheck, session_endpoints
from bench.workload import HOP_FROM, Ping
from bus import Bus, Settings
from bus.envelope import decode_signal
from bus.hosting.worker import Worker
from bus.storage import QueueMessage, Storage
from bus.testing import InMemoryStorage


def test_the_scenario_is_declared_and_each_session_has_one_producer() -> None:
    assert "sessions" in SCENARIOS
    assert FULL.sessions == 64 and FULL.sessions % FULL.producers == 0
    assert FULL.session_rounds >= 2 and QUICK.session_rounds >= 1


def test_a_set_aside_copy_counts_once_its_released_copy_is_handled() -> None:
    memory = InMemoryStorage()
    probe = AckProbe(memory.queues)
    runs, order = HandlerRuns(), OrderCheck()
    bus = Bus(Storage(queues=probe, blobs=memory.blobs, tables=memory.tables),
              session_endpoints(runs, order), settings=Settings(signal_bundles=False))
    bus.provision()
    for seq in range(6):
        bus.send(Ping(seq=seq, key=sessions.session_key(seq, 2), sent_at=0.0))
    queue = bus.names.queue(HOP_FROM)
    bodies = [m.body for m in memory.queues.receive(queue, max_messages=32, lease=60)]
    for body in reversed(bodies):  # every copy but each session's first arrives early
        memory.queues.send(queue, body)
    acked: list[QueueMessage] = []
    probe.watched, probe.on_ack, probe.settled = frozenset({queue}), acked.append, runs.settled
    worker = Worker(bus, HOP_FROM, batch_size=1)
    while worker.poll_once():
        pass
    assert worker.outcomes["processed"] == 6 and worker.outcomes["deferred"] == 4
    ids = [decode_signal(m.body).message_id for m in acked]
    assert len(ids) == len(set(ids)) == 6  # each message once, set-aside acks not among them
    assert order.faults == []


def _run(variant: str, index: int, seconds: float, ops: int, client: int, *,
         set_aside: int = 0) -> HopRun:
    return HopRun(variant, index, 100, seconds, {("table", "transact"): ops,
                                                 ("queue", "receive_empty"): 50},
                  {("table", "get"): client}, {}, CpuUse(1.0, 0.5, seconds),
                  {"processed": 100, "deferred": set_aside}, {"hits": 0, "stale": 0})


def _runs() -> list[HopRun]:
    return [_run("unordered", 0, 1.0, 300, 50), _run("same_partitions", 0, 1.0, 250, 50),
            _run("sessions", 0, 2.0, 320, 250, set_aside=3),
            _run("sessions", 1, 1.0, 330, 250, set_aside=1),
            _run("same_partitions", 1, 0.5, 250, 50), _run("unordered", 1, 0.8, 300, 50)]


def test_ratios_pair_each_session_run_with_the_runs_of_its_round() -> None:
    summary = sessions.summarize(_runs())
    assert summary["ratios_to_unordered"] == pytest.approx([0.5, 0.8])  # 50/100, 100/125
    assert summary["ratio_to_unordered"] == pytest.approx(0.65)
    assert summary["ratios_to_same_partitions"] == pytest.approx([0.5, 0.5])
    ses = summary["sessions"]
    assert ses["msgs_per_s"] == pytest.approx(75.0)  # median of 50 and 100
    assert ses["ops_per_msg"] == pytest.approx(3.25)  # idle receives left out
    assert ses["client_per_msg"] == pytest.approx(2.5)
    assert (ses["set_aside"], ses["messages"]) == (4, 200)


def test_the_json_keys_and_the_markdown_section() -> None:
    result = ScenarioResult(sessions.KEY, sessions.TITLE, 200, 3.0, "checked",
                            extra={"session_runs": _runs(),
                                   "session_summary": sessions.summarize(_runs()),
                                   "variants": sessions.NAMES, "sessions": 64, "rounds": 2})
    keys = report._session_keys(result)
    assert set(keys) == set(report.SESSION_KEYS)
    assert keys["sessions_to_eo_ratio"] == 0.65 and keys["sessions_set_aside"] == 4
    assert keys["sessions_eo_ops_per_msg"] == 3.0 and keys["sessions_ops_per_msg"] == 3.25
    assert report._session_keys(None) == dict.fromkeys(report.SESSION_KEYS)
    text = "\n".join(report._sessions_section(result))
    assert "| 2 | session hop | 100 | 1.0 | **100.0** | 3.30 | 2.50 | 1 | 0 | 50 |" in text
    assert "Copies set aside: 4 of 200 messages" in text


@pytest.mark.azurite
def test_a_tiny_run_reports_consistent_counts(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--quick", "--only", "sessions", "--latency-ms", "0", "--messages", "16",
                 "--concurrency", "2",
                 "--producers", "1", "--sessions", "4", "--out", str(tmp_path / "r.md")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0, lines
    data = json.loads(lines[-1])
    assert set(report.SESSION_KEYS) <= set(data)
    assert data["sessions_messages"] == 16  # the quick run's one round
    assert 0 <= data["sessions_set_aside"] <= 16 * 4
    assert data["sessions_msgs_per_s"] > 0 and data["sessions_eo_msgs_per_s"] > 0
    assert data["sessions_ops_per_msg"] >= 1  # each message commits a transaction of its own
    # The client's counter: a read and a write per numbered send, besides the send itself.
    assert data["sessions_client_requests_per_msg"] >= 2 + 1
    assert data["raw_hop_msgs_per_s"] is None  # not run: null
