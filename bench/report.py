"""The results: one JSON summary (the last line printed) and the markdown table file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.config import BenchConfig
from bench.harness import ScenarioResult
from bench.prices import PriceTable

OpKey = tuple[str, str]
IDLE = ("queue", "receive_empty")
"""Empty receives: the cost of idle polling, which depends on the load and the poll interval,
not on what moving a message takes. Reported, but not part of the per-hop count."""

# The keys of the JSON line (docs/performance.md), in order.
REQUIRED = ("raw_hop_msgs_per_s", "eo_hop_msgs_per_s", "eo_to_raw_ratio", "fanout3_msgs_per_s",
            "kombu_msgs_per_s", "ops_per_eo_hop", "usd_per_million_eo_hops", "p50_ms",
            "p99_ms")


@dataclass(frozen=True)
class RunInfo:
    cfg: BenchConfig
    machine: dict[str, str]
    started: str
    """UTC, ISO 8601."""
    seconds: float
    """Wall time of the whole run, Azurite starts included."""
    command: str


def per_unit(ops: Mapping[OpKey, int], units: int) -> dict[OpKey, float]:
    """Operations per unit (hop, delivery), idle polls left out."""
    return {key: n / units for key, n in sorted(ops.items()) if key != IDLE and n}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def summary(results: Mapping[str, ScenarioResult], prices: PriceTable,
            cfg: BenchConfig, commit: str) -> dict[str, Any]:
    """The JSON summary. A scenario that failed or did not run reports null, never a number."""
    def rate(key: str) -> float | None:
        return results[key].rate if key in results else None

    raw, eo = rate("raw"), rate("eo_hop")
    ops_eo = per_unit(results["eo_hop"].extra["ops"], results["eo_hop"].units) \
        if "eo_hop" in results else None
    ops_fan = per_unit(results["fanout3"].extra["ops"], results["fanout3"].units) \
        if "fanout3" in results else None
    ops_raw = per_unit(results["raw"].extra["ops"], results["raw"].units) \
        if "raw" in results else None
    latency = results["latency"].extra if "latency" in results else {}
    wire_eo = per_unit(results["eo_hop"].extra["requests"], results["eo_hop"].units) \
        if "eo_hop" in results else None
    cpu_eo = results["eo_hop"].extra["cpu"].per_unit_ms(results["eo_hop"].units) \
        if "eo_hop" in results else (None, None)
    out: dict[str, Any] = {
        "raw_hop_msgs_per_s": _round(raw, 1),
        "eo_hop_msgs_per_s": _round(eo, 1),
        "eo_to_raw_ratio": _round(eo / raw, 3) if eo is not None and raw else None,
        "fanout3_msgs_per_s": _round(rate("fanout3"), 1),
        "kombu_msgs_per_s": _round(rate("kombu"), 1),
        "ops_per_eo_hop": _round(sum(ops_eo.values()), 2) if ops_eo is not None else None,
        "usd_per_million_eo_hops": _round(prices.usd_per_million(ops_eo), 3)
        if ops_eo is not None else None,
        "p50_ms": _round(latency.get("p50_ms"), 1),
        "p99_ms": _round(latency.get("p99_ms"), 1),
        "requests_per_eo_hop": _round(sum(wire_eo.values()), 2) if wire_eo is not None
        else None,
        "python_cpu_ms_per_eo_hop": _round(cpu_eo[0], 2),
        "azurite_cpu_ms_per_eo_hop": _round(cpu_eo[1], 2),
        "ops_per_fanout_delivery": _round(sum(ops_fan.values()), 2)
        if ops_fan is not None else None,
        "usd_per_million_raw_hops": _round(prices.usd_per_million(ops_raw), 3)
        if ops_raw is not None else None,
        "quick": cfg.quick,
        "messages": cfg.messages,
        "concurrency": cfg.concurrency,
        "commit": commit,
    }
    return out


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def _ops_table(result: ScenarioResult, prices: PriceTable, unit: str,
               units: str) -> list[str]:
    ops: dict[OpKey, int] = result.extra["ops"]
    rows: list[list[Any]] = []
    for (service, op), per in per_unit(ops, result.units).items():
        price = prices.price_of(service, op)
        rows.append([service, op, ops[(service, op)], f"{per:.3f}", price.name,
                     f"{per * price.per_operation * 1e6:.3f}"])
    total = per_unit(ops, result.units)
    rows.append(["**total**", "", sum(ops[k] for k in total), f"**{sum(total.values()):.3f}**",
                 "", f"**{prices.usd_per_million(total):.3f}**"])
    lines = _table(["service", "operation", "count", f"per {unit}", "price class",
                    f"USD per million {units}"], rows)
    idle = ops.get(IDLE, 0)
    errors: dict[tuple[str, str, str], int] = result.extra.get("errors", {})
    lines.append("")
    lines.append(f"Left out: {idle} empty receives (idle polling). Failed requests, counted "
                 "above as operations: " + (", ".join(
                     f"{s}.{o} {e} x{n}" for (s, o, e), n in sorted(errors.items())) or "none")
                 + ".")
    cache = result.extra.get("slot_cache")
    if cache is not None:
        lines.append(f"Claims from the slot cache (no read, `docs/protocol.md`): {cache['hits']}, "
                     f"of which {cache['stale']} were stale (lost their compare-and-swap).")
    return lines


def _wire_table(result: ScenarioResult, unit: str) -> list[str]:
    requests: dict[OpKey, int] = result.extra["requests"]
    per = per_unit(requests, result.units)
    rows: list[list[Any]] = [[service, op, requests[(service, op)], f"{n:.3f}"]
                             for (service, op), n in per.items()]
    rows.append(["**total**", "", sum(requests[k] for k in per), f"**{sum(per.values()):.3f}**"])
    lines = _table(["service", "request", "count", f"per {unit}"], rows)
    client: dict[OpKey, int] = result.extra.get("client_requests", {})
    if client:
        sent = sum(n for key, n in client.items() if key != IDLE)
        lines += ["", f"Not included: the client's {sent} requests to send the {result.units} "
                  f"incoming messages ({sent / result.units:.2f} per message: "
                  + ", ".join(f"{s}.{o} {n}" for (s, o), n in sorted(client.items())) + ")."]
    group = result.extra.get("client_group")
    if group:
        lines.append(f"The client's concurrent sends went out in {group['flushes']} flushes; "
                     f"{group['grouped']} copies shared one with others (one token transaction "
                     "and one bundle per destination: `bus.protocol.sendgroup`).")
    return lines


def _cpu(result: ScenarioResult) -> tuple[str, str]:
    use = result.extra.get("cpu")
    if use is None:
        return "-", "-"
    python, azurite = use.per_unit_ms(result.units)
    return f"{python:.1f}", f"{azurite:.1f}"


def markdown(info: RunInfo, *, results: Mapping[str, ScenarioResult],
             failures: Mapping[str, str], titles: Mapping[str, str], data: Mapping[str, Any],
             prices: PriceTable) -> str:
    cfg = info.cfg
    lines = [
        "# Benchmark results",
        "",
        f"`{info.command}` - {'quick' if cfg.quick else 'full'} mode, started {info.started}, "
        f"{info.seconds:.0f} s in all. Each scenario ran on its own fresh Azurite. "
        "See docs/performance.md for what each number means.",
        "",
        "## Machine and versions",
        "",
        *_table(["", ""], [[k, v] for k, v in info.machine.items()]),
        "",
        "## Settings",
        "",
        *_table(["setting", "value"], [[k, v] for k, v in cfg.as_dict().items()]),
        "",
        "## Throughput",
        "",
    ]
    raw = results["raw"].rate if "raw" in results else None
    rows: list[list[Any]] = []
    for number, (key, title) in enumerate(titles.items(), 1):
        if key == "latency":
            continue
        if key in results:
            r = results[key]
            ratio = f"{r.rate / raw:.3f}" if raw else "-"
            rows.append([number, r.title, r.units, f"{r.seconds:.1f}", f"**{r.rate:.1f}**",
                         ratio, *_cpu(r), r.extra.get("load", "-"), r.verified])
        else:
            rows.append([number, title, "-", "-", "-", "-", "-", "-", "-",
                         failures.get(key, "not run")])
    lines += _table(["#", "scenario", "messages", "seconds", "msgs/s", "ratio to raw",
                     "Python CPU ms/msg", "Azurite CPU ms/msg", "load avg", "checked"], rows)
    lines += ["", "Seconds: from the first send to the last acknowledgement. The fan-out counts "
              "deliveries (one subscriber processing one event). CPU: this Python process "
              "(producers and consumers, one GIL) and the Azurite Node process, over the same "
              "interval, per message; two cores in all. Load avg: the machine's 1-minute load "
              "average before -> after the scenario (above 2, other work shared the cores)."]
    lines += ["", "## Latency of a command hop", ""]
    if "latency" in results:
        x = results["latency"].extra
        lines += _table(
            ["load", "samples", "send->ack p50", "send->ack p99", "max",
             "send->handler p50", "send->handler p99"],
            [[f"{x['rate']:g} msg/s", x["samples"], f"**{x['p50_ms']:.1f} ms**",
              f"**{x['p99_ms']:.1f} ms**", f"{x['max_ms']:.1f} ms",
              f"{x['handler_p50_ms']:.1f} ms", f"{x['handler_p99_ms']:.1f} ms"]])
    else:
        lines.append(failures.get("latency", "not run"))
    lines += ["", "## Storage operations per exactly-once hop (counted)", ""]
    if "eo_hop" in results:
        lines += _ops_table(results["eo_hop"], prices, "hop", "hops")
        lines += ["", "On the wire, the same run's HTTP requests from the consuming threads "
                  "(the port counts above are what the protocol asks for; an adapter call can "
                  "take more than one request):", ""]
        lines += _wire_table(results["eo_hop"], "hop")
    else:
        lines.append(failures.get("eo_hop", "not run"))
    for key, unit, units, heading in (
            ("fanout3", "delivery", "deliveries", "per fan-out delivery"),
            ("raw", "hop", "hops", "per raw hop (for comparison; HTTP requests, both sides)")):
        if key in results:
            lines += ["", f"### Storage operations {heading}", ""]
            lines += _ops_table(results[key], prices, unit, units)
    lines += ["", "## Prices used", "", f"From `bench/prices.toml`: {prices.meta['note']}.", ""]
    lines += _table(["class", "USD", "per", "what", "source", "date"],
                    [[p.name, p.usd, f"{p.per:,}", p.unit, p.source, p.date]
                     for p in prices.prices.values()])
    lines += ["", "## Summary (the JSON line)", "", "```json", json.dumps(data), "```", ""]
    return "\n".join(lines)
