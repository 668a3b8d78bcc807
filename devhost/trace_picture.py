"""One order's trace as a picture: ``python -m devhost.trace_picture DIR --out PNG``.

Reads the ``spans-*.jsonl`` files that ``BUS_TRACE_DIR`` makes (bus.hosting.functions.
telemetry: OTLP JSON lines, one export batch a line), picks one order's spans and draws them
as a Gantt chart: one row per span, indented by its depth, coloured by its kind, labelled with
its name and duration; links are dashed lines.

An order's spans can sit in several traces. Under the Functions host a handler's ``process``
span is parented on the invocation (a trace of its own) and *links* to the context the
message was created in; so the picture joins traces through links: the traces connected by
links form one group, and a trace's root that links into another trace is drawn under the
span it links to. With ``BUS_PROCESS_SPAN_PARENT=message`` the order is a single trace and
the links lead to invocations, which export no span here (the host's own spans are not in
these files).

Default choice: among the groups that have a ``process`` span of billing or shipping, the one
with the most distinct span names (then the most spans, then the earliest); ``--trace-id``
picks the group of that trace.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
COLOURS = {"PRODUCER": "#1f77b4", "CONSUMER": "#2ca02c", "CLIENT": "#ff7f0e",
           "SERVER": "#9467bd", "INTERNAL": "#7f7f7f", "UNSPECIFIED": "#7f7f7f"}
STATUS_ERROR = 2
MAX_GROUP_TRACES = 200
"""A group joined through links stops growing here (a span linking many traces, such as a
batch's, would otherwise pull in every order)."""


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    error: bool = False

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as Python."""
    for key, value in any_value.items():
        if key == "intValue":
            return int(value)
        if key == "arrayValue":
            return [_value(v) for v in value.get("values", [])]
        if key == "kvlistValue":
            return {kv["key"]: _value(kv["value"]) for kv in value.get("values", [])}
        return value
    return None


def _attributes(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items}


def parse_line(line: str) -> list[Span]:
    """The spans of one OTLP JSON line (an ExportTraceServiceRequest)."""
    spans = []
    for resource_spans in json.loads(line).get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
        service = str(resource.get("service.name", "?"))
        for scope in resource_spans.get("scopeSpans", []):
            for raw in scope.get("spans", []):
                spans.append(Span(
                    trace_id=raw["traceId"], span_id=raw["spanId"],
                    parent_span_id=raw.get("parentSpanId") or None, name=raw["name"],
                    kind=KINDS.get(int(raw.get("kind", 0)), "UNSPECIFIED"),
                    start_ns=int(raw["startTimeUnixNano"]), end_ns=int(raw["endTimeUnixNano"]),
                    service=service, attributes=_attributes(raw.get("attributes", [])),
                    links=[Link(link["traceId"], link["spanId"]) for link in raw.get("links", [])],
                    error=raw.get("status", {}).get("code") == STATUS_ERROR))
    return spans


def load(directory: Path) -> list[Span]:
    """Every span of the ``spans-*.jsonl`` files in ``directory``."""
    spans: list[Span] = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                spans.extend(parse_line(line))
    return spans


def groups(spans: Sequence[Span]) -> list[set[str]]:
    """Trace ids joined through links (either way), each group a set."""
    parent: dict[str, str] = {s.trace_id: s.trace_id for s in spans}

    def find(trace_id: str) -> str:
        while parent[trace_id] != trace_id:
            parent[trace_id] = parent[parent[trace_id]]
            trace_id = parent[trace_id]
        return trace_id

    for span in spans:
        for link in span.links:
            if link.trace_id in parent:
                parent[find(span.trace_id)] = find(link.trace_id)
    joined: dict[str, set[str]] = defaultdict(set)
    for trace_id in parent:
        joined[find(trace_id)].add(trace_id)
    return list(joined.values())


def linked_group(spans: Sequence[Span], trace_id: str) -> set[str]:
    """The traces reachable from ``trace_id`` through links, at most MAX_GROUP_TRACES."""
    neighbours: dict[str, set[str]] = defaultdict(set)
    known = {s.trace_id for s in spans}
    for span in spans:
        for link in span.links:
            if link.trace_id in known and link.trace_id != span.trace_id:
                neighbours[span.trace_id].add(link.trace_id)
                neighbours[link.trace_id].add(span.trace_id)
    seen, todo = {trace_id}, [trace_id]
    while todo and len(seen) < MAX_GROUP_TRACES:
        for other in sorted(neighbours[todo.pop(0)] - seen):
            seen.add(other)
            todo.append(other)
    return seen


def is_order_handler(span: Span) -> bool:
    return span.name.startswith("process ") and ("billing" in span.name
                                                  or "shipping" in span.name)


def choose(spans: Sequence[Span], trace_id: str | None = None) -> list[Span]:
    """The spans of one order (module docstring)."""
    if trace_id is not None:
        if not any(s.trace_id == trace_id for s in spans):
            raise SystemExit(f"no span of trace {trace_id}")
        chosen = linked_group(spans, trace_id)
        return [s for s in spans if s.trace_id in chosen]
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    best: tuple[int, int, int] | None = None
    picked: list[Span] = []
    for group in groups(spans):
        if len(group) > MAX_GROUP_TRACES:
            continue
        members = [s for t in group for s in by_trace[t]]
        if not any(is_order_handler(s) for s in members):
            continue
        score = (len({s.name for s in members}), len(members),
                 -min(s.start_ns for s in members))
        if best is None or score > best:
            best, picked = score, members
    if not picked:
        raise SystemExit("no trace has a process span of billing or shipping")
    return picked


@dataclass(frozen=True)
class Row:
    span: Span
    depth: int
    via_link: bool
    """Drawn under a span it links to, not under its parent (which is not in the picture)."""


def rows(spans: Sequence[Span]) -> list[Row]:
    """Spans in drawing order: each under its parent, or, without one here, under the span it
    links to (the latest, if several); children by start time; depth-first."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    children: dict[tuple[str, str], list[tuple[Span, bool]]] = defaultdict(list)
    roots: list[Span] = []
    for span in spans:
        parent = (span.trace_id, span.parent_span_id) if span.parent_span_id else None
        if parent in by_id:
            assert parent is not None
            children[parent].append((span, False))
            continue
        targets = [by_id[(link.trace_id, link.span_id)] for link in span.links
                   if (link.trace_id, link.span_id) in by_id]
        if targets:
            target = max(targets, key=lambda t: t.start_ns)  # the latest: nearest in the flow
            children[(target.trace_id, target.span_id)].append((span, True))
        else:
            roots.append(span)
    out: list[Row] = []
    seen: set[tuple[str, str]] = set()

    def visit(span: Span, depth: int, via_link: bool) -> None:
        key = (span.trace_id, span.span_id)
        if key in seen:
            return
        seen.add(key)
        out.append(Row(span, depth, via_link))
        for child, linked in sorted(children[key], key=lambda c: c[0].start_ns):
            visit(child, depth + 1, linked)

    for root in sorted(roots, key=lambda s: s.start_ns):
        visit(root, 0, False)
    for span in sorted(spans, key=lambda s: s.start_ns):  # cycles of links: drawn flat
        visit(span, 0, False)
    return out


def draw(drawn: Sequence[Row], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = min(r.span.start_ns for r in drawn)
    t_end = max(r.span.end_ns for r in drawn)
    total_ms = max((t_end - t0) / 1e6, 1e-3)
    height = max(3.0, 0.32 * len(drawn) + 1.6)
    fig, ax = plt.subplots(figsize=(14, height))
    index = {(r.span.trace_id, r.span.span_id): i for i, r in enumerate(drawn)}
    min_width = total_ms * 0.002
    for i, row in enumerate(drawn):
        span = row.span
        start = (span.start_ns - t0) / 1e6
        ax.barh(i, max(span.duration_ms, min_width), left=start, height=0.6,
                color=COLOURS.get(span.kind, "#7f7f7f"),
                edgecolor="#d62728" if span.error else "none", linewidth=1.5)
        outcome = span.attributes.get("eobus.outcome")  # a process span's: processed, ...
        ax.text(start + max(span.duration_ms, min_width) + total_ms * 0.004, i,
                f"{span.duration_ms:.1f} ms" + (f" · {outcome}" if outcome else ""),
                va="center", fontsize=7)
    for i, row in enumerate(drawn):
        for link in row.span.links:
            j = index.get((link.trace_id, link.span_id))
            if j is None:
                continue
            target = drawn[j].span
            ax.plot([(target.start_ns - t0) / 1e6, (row.span.start_ns - t0) / 1e6], [j, i],
                    linestyle="--", color="#555555", linewidth=0.9)
    ax.set_yticks(range(len(drawn)))
    ax.set_yticklabels([("   " * r.depth) + ("↳ " if r.via_link else "") + r.span.name
                        + f"  [{r.span.service}]" for r in drawn],
                       fontsize=8, fontfamily="monospace")
    for label in ax.get_yticklabels():
        label.set_horizontalalignment("left")
    ax.tick_params(axis="y", pad=max(len(t.get_text()) for t in ax.get_yticklabels()) * 5.2)
    ax.invert_yaxis()
    ax.set_xlim(0, total_ms * 1.12)
    ax.set_xlabel("ms since the first span started")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    kinds = sorted({r.span.kind for r in drawn})
    handles = [Patch(color=COLOURS[k], label=k) for k in kinds]
    handles.append(Patch(facecolor="white", edgecolor="#555555", linestyle="--",
                         label="link (dashed)"))
    ax.legend(handles=handles, loc="upper right", fontsize=8)  # early spans sit left, late low
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def summary(spans: Sequence[Span]) -> tuple[int, int]:
    """(spans, distinct traces)."""
    return len(spans), len({s.trace_id for s in spans})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devhost.trace_picture",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the BUS_TRACE_DIR (spans-*.jsonl)")
    parser.add_argument("--out", type=Path, default=Path("order-trace.png"),
                        help="the picture to write (default: order-trace.png here; the "
                             "docs' own is docs/img/order-trace.png)")
    parser.add_argument("--trace-id", help="draw this trace and the traces linked to it")
    args = parser.parse_args(argv)
    spans = load(args.directory)
    if not spans:
        raise SystemExit(f"no spans in {args.directory}/spans-*.jsonl")
    chosen = choose(spans, args.trace_id)
    drawn = rows(chosen)
    traces = sorted({s.trace_id for s in chosen})
    title = (f"{len(drawn)} spans in {len(traces)} trace{'s' if len(traces) > 1 else ''} "
             f"(first {min(chosen, key=lambda s: s.start_ns).trace_id}); "
             f"{len({s.service for s in chosen})} services")
    draw(drawn, args.out, title)
    print(f"{args.out}: {title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
