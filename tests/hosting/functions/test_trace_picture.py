"""devhost.trace_picture on hand-made OTLP JSON lines: which spans make one order, in which
rows, and the PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devhost import trace_picture
from devhost.trace_picture import choose, load, rows

pytest.importorskip("matplotlib")

PRODUCER, CONSUMER, CLIENT = 4, 5, 3
MS = 1_000_000


def span(trace: str, span_id: str, name: str, kind: int, at_ms: tuple[int, int], *,
         parent: str | None = None, links: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    start_ms, end_ms = at_ms
    out: dict[str, Any] = {
        "traceId": trace.ljust(32, "0"), "spanId": span_id.ljust(16, "0"), "name": name,
        "kind": kind, "startTimeUnixNano": str(1_700_000_000_000 * MS + start_ms * MS),
        "endTimeUnixNano": str(1_700_000_000_000 * MS + end_ms * MS),
        "attributes": [{"key": "messaging.system", "value": {"stringValue": "eobus"}}],
        "status": {}}
    if parent:
        out["parentSpanId"] = parent.ljust(16, "0")
    if links:
        out["links"] = [{"traceId": t.ljust(32, "0"), "spanId": s.ljust(16, "0")}
                        for t, s in links]
    return out


def line(service: str, spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name",
                                     "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "bus"}, "spans": spans}]}]})


def order_by_invocations(prefix: str, t: int) -> tuple[list[dict[str, Any]],
                                                        list[dict[str, Any]]]:
    """One order as the Functions host makes it: the client's trace, then one trace per
    invocation, each process span parented on the (unexported) invocation and linked to
    the creation context. (client spans, app spans)"""
    client = [span(f"{prefix}1", "c1", "send orders", PRODUCER, (t, t + 5))]
    app = [
        span(f"{prefix}2", "p1", "process orders", CONSUMER, (t + 10, t + 40), parent="ffff",
             links=((f"{prefix}1", "c1"),)),
        span(f"{prefix}2", "p2", "create billing", PRODUCER, (t + 15, t + 16), parent="p1"),
        span(f"{prefix}2", "p3", "create shipping", PRODUCER, (t + 17, t + 18), parent="p1"),
        span(f"{prefix}2", "p4", "send billing", CLIENT, (t + 41, t + 45),
             links=((f"{prefix}2", "p2"),)),
        span(f"{prefix}3", "b1", "process billing", CONSUMER, (t + 60, t + 80), parent="eeee",
             links=((f"{prefix}2", "p2"),)),
        span(f"{prefix}3", "b2", "create orders", PRODUCER, (t + 65, t + 66), parent="b1"),
        span(f"{prefix}4", "s1", "process shipping", CONSUMER, (t + 62, t + 70), parent="dddd",
             links=((f"{prefix}2", "p3"),)),
        span(f"{prefix}5", "o1", "process orders", CONSUMER, (t + 100, t + 110), parent="cccc",
             links=((f"{prefix}3", "b2"),)),
    ]
    return client, app


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    client_a, app_a = order_by_invocations("a", 0)
    client_b = [span("b1", "c1", "send orders", PRODUCER, (1, 3))]
    app_b = [span("b2", "p1", "process orders", CONSUMER, (20, 30), parent="ffff",
                  links=(("b1", "c1"),))]  # an order whose handlers have not run yet
    (tmp_path / "spans-100.jsonl").write_text(
        line("demo-client", client_a) + "\n" + line("demo-client", client_b) + "\n")
    (tmp_path / "spans-200.jsonl").write_text(
        line("eobus-functions", app_a[:4]) + "\n" + line("eobus-functions", app_a[4:] + app_b)
        + "\n\n")
    (tmp_path / "metrics-200.jsonl").write_text("{}\n")  # not spans: not read
    return tmp_path


def names(drawn: list[trace_picture.Row]) -> list[tuple[int, str, bool]]:
    return [(r.depth, r.span.name, r.via_link) for r in drawn]


def test_load_reads_every_span_of_every_spans_file(trace_dir: Path) -> None:
    spans = load(trace_dir)
    assert len(spans) == 11
    assert {s.service for s in spans} == {"demo-client", "eobus-functions"}
    send = next(s for s in spans if s.name == "send billing")
    assert send.kind == "CLIENT" and send.parent_span_id is None and len(send.links) == 1
    assert send.attributes == {"messaging.system": "eobus"} and send.duration_ms == 4.0


def test_the_default_is_the_order_with_its_handlers_joined_through_links(
        trace_dir: Path) -> None:
    chosen = choose(load(trace_dir))
    assert len({s.trace_id for s in chosen}) == 5 and len(chosen) == 9
    assert names(rows(chosen)) == [
        (0, "send orders", False),
        (1, "process orders", True),
        (2, "create billing", False),
        (3, "send billing", True),  # no parent here: under the create span it links to
        (3, "process billing", True),
        (4, "create orders", False),
        (5, "process orders", True),
        (2, "create shipping", False),
        (3, "process shipping", True),
    ]


def test_a_trace_id_picks_that_trace_and_the_traces_linked_to_it(trace_dir: Path) -> None:
    chosen = choose(load(trace_dir), "b1".ljust(32, "0"))
    assert names(rows(chosen)) == [(0, "send orders", False), (1, "process orders", True)]
    with pytest.raises(SystemExit, match="no span of trace"):
        choose(load(trace_dir), "9" * 32)


def test_one_trace_end_to_end_nests_by_parent(tmp_path: Path) -> None:
    """BUS_PROCESS_SPAN_PARENT=message: the process spans are children of the creation and
    link to invocations, whose spans are not in the files."""
    spans = [
        span("a", "c1", "send orders", PRODUCER, (0, 5)),
        span("a", "p1", "process orders", CONSUMER, (10, 40), parent="c1", links=(("f", "1"),)),
        span("a", "p2", "create billing", PRODUCER, (15, 16), parent="p1"),
        span("a", "b1", "process billing", CONSUMER, (60, 80), parent="p2", links=(("e", "1"),)),
    ]
    (tmp_path / "spans-1.jsonl").write_text(line("x", spans) + "\n")
    assert names(rows(choose(load(tmp_path)))) == [
        (0, "send orders", False), (1, "process orders", False), (2, "create billing", False),
        (3, "process billing", False)]


def test_no_order_with_handlers_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "spans-1.jsonl").write_text(
        line("x", [span("a", "c1", "send orders", PRODUCER, (0, 5))]) + "\n")
    with pytest.raises(SystemExit, match="no trace has a process span"):
        choose(load(tmp_path))


def test_the_picture_is_a_png(trace_dir: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "img" / "order.png"
    assert trace_picture.main([str(trace_dir), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "9 spans in 5 traces" in capsys.readouterr().out
