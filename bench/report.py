"""The results: one JSON summary (the last line printed) and the markdown table file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.config import BenchConfig
from bench.harness import ScenarioResult
from bench.partitions import Ceiling, describe, target
from bench.prices import PriceTable

OpKey = tuple[str, str]
IDLE = ("queue", "receive_empty")
"""Empty receives: the cost of idle polling, which depends on the load and the poll interval,
not on what moving a message takes. Reported, but not part of the per-hop count."""

# The keys of the JSON line (docs/performance.md), in order.
REQUIRED = ("raw_hop_msgs_per_s", "eo_hop_msgs_per_s", "eo_to_raw_ratio", "fanout3_msgs_per_s",
            "kombu_msgs_per_s", "ops_per_eo_hop", "usd_per_million_eo_hops", "p50_ms",
            "p99_ms", "latency_ms_per_request", "raw_bundled_hop_msgs_per_s",
            "eo_to_raw_bundled_ratio", "functions_hop_msgs_per_s", "functions_to_eo_ratio",
            "functions_requests_per_hop", "usd_per_million_functions_hops", "token_shards",
            "endpoint_ceiling_msgs_per_s_azure", "sessions_set_aside_ratio")


@dataclass(frozen=True)
class RunInfo:
    cfg: BenchConfig
    machine: dict[str, str]
    started: str
    """UTC, ISO 8601."""
    seconds: float
    """Wall time of the whole run, Azurite starts included."""
    command: str
    round_trips: tuple[float, float] | None = None
    """The median round trip of a tiny request to Azurite, direct and through the delay proxy
    (ms); None when no latency was injected."""


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

    raw, eo, bundled = rate("raw"), rate("eo_hop"), rate("raw_bundled")
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
    kombu = rate("kombu")
    spark = _spark_keys(results.get("spark"))
    sessions = _session_keys(results.get("sessions"))
    tracing = _tracing_keys(results.get("tracing"))
    out: dict[str, Any] = {
        "raw_hop_msgs_per_s": _round(raw, 1),
        "eo_hop_msgs_per_s": _round(eo, 1),
        "eo_to_raw_ratio": _round(eo / raw, 3) if eo is not None and raw else None,
        "latency_ms_per_request": cfg.latency_ms,
        "raw_bundled_hop_msgs_per_s": _round(bundled, 1),
        "eo_to_raw_bundled_ratio": _round(eo / bundled, 3) if eo is not None and bundled
        else None,
        "eo_to_kombu_ratio": _round(eo / kombu, 3) if eo is not None and kombu else None,
        **_functions_keys(results.get("functions_hop"), eo, prices),
        **_ceiling_keys(results.get("eo_hop")),
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
        **spark,
        **sessions,
        **tracing,
        "quick": cfg.quick,
        "messages": cfg.messages,
        "concurrency": cfg.concurrency,
        "commit": commit,
    }
    return out


FUNCTIONS_KEYS = ("functions_hop_msgs_per_s", "functions_to_eo_ratio",
                  "functions_requests_per_hop", "usd_per_million_functions_hops",
                  "functions_grouped_hop_msgs_per_s", "functions_grouped_requests_per_hop",
                  "usd_per_million_functions_grouped_hops")
"""The Functions-path keys of the JSON line (``bench.scenarios.functions_hop``): msgs/s, its
ratio to scenario 2 (the polling worker's hop), requests per hop (the host's and the
worker's, polling included) and their cost, with single sends; then the same with grouped
sends."""


def _functions_keys(result: ScenarioResult | None, eo: float | None,
                    prices: PriceTable) -> dict[str, Any]:
    if result is None:
        return dict.fromkeys(FUNCTIONS_KEYS)
    runs = {r.variant: r for r in result.extra["functions_runs"]}
    single, grouped = runs["single"], runs["grouped"]

    def usd(run: Any) -> float:
        return prices.usd_per_million(per_unit(run.ops, run.messages))

    return {
        "functions_hop_msgs_per_s": _round(single.rate, 1),
        "functions_to_eo_ratio": _round(single.rate / eo, 3) if eo else None,
        "functions_requests_per_hop": _round(single.requests_per_hop, 2),
        "usd_per_million_functions_hops": _round(usd(single), 3),
        "functions_grouped_hop_msgs_per_s": _round(grouped.rate, 1),
        "functions_grouped_requests_per_hop": _round(grouped.requests_per_hop, 2),
        "usd_per_million_functions_grouped_hops": _round(usd(grouped), 3),
    }


def _functions_section(result: ScenarioResult, eo: float | None,
                       prices: PriceTable) -> list[str]:
    lines: list[str] = []
    rows: list[list[Any]] = []
    runs = result.extra["functions_runs"]
    for r in runs:
        per = per_unit(r.ops, r.messages)
        rows.append([r.variant, r.messages, f"{r.seconds:.1f}", f"**{r.rate:.1f}**",
                     f"{r.rate / eo:.3f}" if eo else "-", f"{r.requests_per_hop:.2f}",
                     f"{prices.usd_per_million(per):.3f}"])
    lines += _table(["client sends", "messages", "seconds", "msgs/s", "ratio to scenario 2",
                     "requests per hop", "USD per million hops"], rows)
    ops = sorted({key for r in runs for key in r.ops})
    lines += ["", "Requests per hop by operation (the host's and the worker's, counted at the "
              "delay proxy; polling included):", ""]
    lines += _table(["service", "request", *(r.variant for r in runs)],
                    [[s, o, *(f"{r.ops.get((s, o), 0) / r.messages:.3f}" for r in runs)]
                     for s, o in ops])
    return lines


CEILING_KEYS = ("token_shards", "endpoint_ceiling_msgs_per_s_azure",
                "account_ceiling_msgs_per_s_azure")
"""The partition-budget model's keys (``bench.partitions``): the token partitions the hop's
endpoint used, the modelled ceiling of an endpoint in a chain of handlers at Azure's
per-partition and per-queue targets, and the account's at its request target."""


def _ceiling_keys(result: ScenarioResult | None) -> dict[str, Any]:
    if result is None or "ceiling" not in result.extra:
        return dict.fromkeys(CEILING_KEYS)
    found: Ceiling = result.extra["ceiling"]
    return {"token_shards": result.extra["token_shards"],
            "endpoint_ceiling_msgs_per_s_azure": round(found.msgs_per_s),
            "account_ceiling_msgs_per_s_azure": round(found.account_msgs_per_s)}


def _ceiling_section(result: ScenarioResult) -> list[str]:
    found: Ceiling = result.extra["ceiling"]
    per = sorted(result.extra["chained"].items(), key=lambda item: -item[1])[:8]
    rows = [["/".join(budget), f"{n / result.units:.3f}", f"{target(budget):,.0f}",
             f"{target(budget) * result.units / n:,.0f}"] for budget, n in per]
    return [f"The exactly-once hop's requests replayed against Azure's scalability targets "
            f"(`bench.partitions`), for an endpoint in a chain of handlers like it: "
            f"**{describe(found)}**.", "",
            *_table(["budget", "draw per message", "target per s", "ceiling msgs/s"], rows)]


SPARK_KEYS = ("spark_publish_rows_per_s", "spark_raw_rows_per_s", "spark_publish_to_raw_ratio",
              "spark_requests_per_row", "spark_read_rows_per_s", "spark_rows")
"""The Spark scenario's keys of the JSON line: rows/s of ``df.write.format("bus")`` and of the
raw send loop at local[2] (medians of the alternating runs), the median of the runs' ratios,
storage requests per row (port calls, counted in the executors), the batch read's rows/s."""


def _spark_keys(result: ScenarioResult | None) -> dict[str, Any]:
    if result is None:
        return dict.fromkeys(SPARK_KEYS)
    summary: dict[int, dict[str, Any]] = result.extra["spark_summary"]
    top = summary[max(summary)]
    read = result.extra.get("spark_read")
    return {
        "spark_publish_rows_per_s": _round(top.get("bus_rows_per_s"), 1),
        "spark_raw_rows_per_s": _round(top.get("raw_rows_per_s"), 1),
        "spark_publish_to_raw_ratio": _round(top.get("bus_to_raw_ratio"), 3),
        "spark_requests_per_row": _round(top.get("ops_per_row"), 4),
        "spark_read_rows_per_s": _round(read.rate, 1) if read is not None else None,
        "spark_rows": result.extra["spark_rows"],
    }


SESSION_KEYS = ("sessions_msgs_per_s", "sessions_eo_msgs_per_s", "sessions_to_eo_ratio",
                "sessions_ops_per_msg", "sessions_eo_ops_per_msg", "sessions_set_aside",
                "sessions_set_aside_ratio",
                "sessions_messages", "sessions_client_requests_per_msg",
                "sessions_eo_client_requests_per_msg", "sessions_same_partitions_msgs_per_s",
                "sessions_to_same_partitions_ratio", "sessions_same_partitions_ops_per_msg")
"""The sessions scenario's keys of the JSON line: msgs/s of the session hop and of the
unordered hop run alternating with it (medians), the median of the rounds' ratios, the
endpoint's storage operations per message of each, the copies set aside over the session runs
(of ``sessions_messages`` messages), the client's requests per send of each, and the same for
the unordered hop over the session hop's partitions."""


def _session_keys(result: ScenarioResult | None) -> dict[str, Any]:
    if result is None:
        return dict.fromkeys(SESSION_KEYS)
    s: dict[str, Any] = result.extra["session_summary"]
    ses, eo, same = s["sessions"], s["unordered"], s["same_partitions"]
    return {
        "sessions_msgs_per_s": _round(ses["msgs_per_s"], 1),
        "sessions_eo_msgs_per_s": _round(eo["msgs_per_s"], 1),
        "sessions_to_eo_ratio": _round(s["ratio_to_unordered"], 3),
        "sessions_ops_per_msg": _round(ses["ops_per_msg"], 2),
        "sessions_eo_ops_per_msg": _round(eo["ops_per_msg"], 2),
        "sessions_set_aside": ses["set_aside"],
        "sessions_set_aside_ratio": _round(ses["set_aside"] / ses["messages"], 3)
        if ses["messages"] else None,
        "sessions_messages": ses["messages"],
        "sessions_client_requests_per_msg": _round(ses["client_per_msg"], 2),
        "sessions_eo_client_requests_per_msg": _round(eo["client_per_msg"], 2),
        "sessions_same_partitions_msgs_per_s": _round(same["msgs_per_s"], 1),
        "sessions_to_same_partitions_ratio": _round(s["ratio_to_same_partitions"], 3),
        "sessions_same_partitions_ops_per_msg": _round(same["ops_per_msg"], 2),
    }


TRACING_KEYS = ("tracing_off_msgs_per_s", "tracing_on_msgs_per_s", "tracing_on_to_off_ratio",
                "tracing_on_to_off_ratios", "tracing_python_cpu_ms_per_msg_off",
                "tracing_python_cpu_ms_per_msg_on", "tracing_cpu_on_to_off_ratio",
                "tracing_spans_per_msg", "tracing_spans_dropped", "tracing_off_traced_pongs",
                "tracing_messages", "tracing_recommended_msgs_per_s",
                "tracing_recommended_to_off_ratio", "tracing_recommended_to_off_ratios")
"""The tracing scenario's keys of the JSON line: msgs/s of the exactly-once hop with tracing off
and with an SDK recording (medians), the median of the rounds' ratios (on over off) and each
round's, Python CPU per message of each (medians) and the median of the rounds' ratios, spans
the SDK recorded per message, spans its processor dropped, the off runs' Pongs that carried a
trace context (0: nothing recorded), and the messages of each variant's runs."""


def _tracing_keys(result: ScenarioResult | None) -> dict[str, Any]:
    if result is None:
        return dict.fromkeys(TRACING_KEYS)
    s: dict[str, Any] = result.extra["tracing_summary"]
    return {
        "tracing_off_msgs_per_s": _round(s["off"]["msgs_per_s"], 1),
        "tracing_on_msgs_per_s": _round(s["on"]["msgs_per_s"], 1),
        "tracing_on_to_off_ratio": _round(s["ratio"], 3),
        "tracing_recommended_msgs_per_s": _round(s["sampled"]["msgs_per_s"], 1),
        "tracing_recommended_to_off_ratio": _round(s["sampled_ratio"], 3),
        "tracing_recommended_to_off_ratios": [round(r, 3) for r in s["sampled_ratios"]],
        "tracing_on_to_off_ratios": [round(r, 3) for r in s["ratios"]],
        "tracing_python_cpu_ms_per_msg_off": _round(s["off"]["python_ms_per_msg"], 2),
        "tracing_python_cpu_ms_per_msg_on": _round(s["on"]["python_ms_per_msg"], 2),
        "tracing_cpu_on_to_off_ratio": _round(s["cpu_ratio"], 3),
        "tracing_spans_per_msg": _round(s["spans_per_msg"], 2),
        "tracing_spans_dropped": s["spans_dropped"],
        "tracing_off_traced_pongs": s["off"]["traced_pongs"],
        "tracing_messages": s["on"]["messages"],
    }


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
                     "and one bundle per destination: `bus.protocol.send.group`).")
    return lines


def _cpu(result: ScenarioResult) -> tuple[str, str]:
    use = result.extra.get("cpu")
    if use is None:
        return "-", "-"
    python, azurite = use.per_unit_ms(result.units)
    return f"{python:.1f}", f"{azurite:.1f}"


_VARIANT_NAMES = {"raw": "raw loop (`foreachPartition`, `send_message` per row)",
                  "bus": '`df.write.format("bus")`',
                  "publish": "`bus.spark.publish`'s task, counted"}


def _ms_per_row(seconds: float | None, rows: int) -> str:
    return "-" if seconds is None else f"{seconds * 1000 / rows:.2f}"


def _spark_section(result: ScenarioResult) -> list[str]:
    x = result.extra
    rows_per_run = x["spark_rows"]
    summary: dict[int, dict[str, Any]] = x["spark_summary"]
    lines = [f"{rows_per_run} rows per timed write, one partition per core; the three writes "
             "alternate (raw, bus, publish, raw, ...), each into a queue of its own. Seconds: "
             "the Spark action's wall time (the bus's include provisioning on the driver and "
             "storing the job's result). Task CPU: the Python workers' own CPU, measured in "
             "the tasks. Two cores in all: at local[2] the tasks compete with Azurite.", ""]
    rows: list[list[Any]] = []
    for r in x["spark_runs"]:
        rows.append([f"local[{r.cores}]", r.index + 1, _VARIANT_NAMES[r.variant], r.rows,
                     f"{r.seconds:.2f}", f"**{r.rate:.0f}**",
                     _ms_per_row(r.worker_cpu_s, r.rows), _ms_per_row(r.azurite_cpu_s, r.rows),
                     ", ".join(f"{s:.2f}" for s in r.task_seconds) or "-"])
    lines += _table(["setting", "round", "write", "rows", "seconds", "rows/s",
                     "task CPU ms/row", "Azurite CPU ms/row", "task seconds"], rows)
    lines += [""]
    rows = []
    for cores, s in summary.items():
        rows.append([f"local[{cores}]", f"{s.get('raw_rows_per_s', 0):.0f}",
                     f"**{s.get('bus_rows_per_s', 0):.0f}**",
                     f"{s.get('publish_rows_per_s', 0):.0f}",
                     f"**{s['bus_to_raw_ratio']:.2f}**" if s["bus_to_raw_ratio"] else "-",
                     ", ".join(f"{v:.2f}" for v in s["bus_ratios"]),
                     f"{s['publish_to_raw_ratio']:.2f}" if s["publish_to_raw_ratio"] else "-"])
    lines += _table(["setting", "raw rows/s", "format(\"bus\") rows/s", "publish rows/s",
                     "bus/raw (median)", "bus/raw per round", "publish/raw (median)"], rows)
    lines += ["", "Medians over the rounds; a ratio is a bus run's rows/s over the raw run's "
              "of the same round.", "", "Storage requests per row of the bus writes, counted "
              "in the executors (the counted publish runs: `counting_storage` port calls and "
              "the SDK's HTTP requests, returned with each task's report; "
              "`df.write.format(\"bus\")` runs the same `JobWriter.publish`):", ""]
    rows = []
    for cores, s in summary.items():
        counted = s["counted_rows"]
        if not counted:
            continue
        for key, n in sorted(s["ops"].items()):
            rows.append([f"local[{cores}]", key, n, f"{n / counted:.4f}"])
        rows.append([f"local[{cores}]", "**total port calls**", sum(s["ops"].values()),
                     f"**{s['ops_per_row']:.4f}**"])
        rows.append([f"local[{cores}]", "HTTP requests", sum(s["requests"].values()),
                     f"{s['requests_per_row']:.4f}"])
        driver = sum(s["driver_ops"].values())
        rows.append([f"local[{cores}]", "on the driver, per job (provisioning, result row)",
                     f"{driver / max(1, s['counted_jobs']):.0f}", "-"])
    lines += _table(["setting", "operation", "count", "per row"], rows)
    lines += ["", "The raw loop makes one request (`queue.send`) per row.", ""]
    rows = [[f"local[{cores}]", f"{info['session_s']:.1f}", f"{info['warmup_s']:.1f}",
             f"{info['small_raw_s']:.2f}", f"{info['small_bus_s']:.2f}",
             f"{info['small_publish_s']:.2f}"]
            for cores, info in x["spark_sessions"].items()]
    lines += _table(["setting", "session start s", "warm-up s (3 small jobs)",
                     "20-row raw job s", "20-row format(\"bus\") job s",
                     "20-row publish job s"], rows)
    read = x.get("spark_read")
    if read is not None:
        lines += ["", f"Batch read (`spark.read.format(\"bus\")` of the last local[2] bus run's "
                  f"destination; drained and staged on the driver): {read.rows} rows in "
                  f"{read.seconds:.2f} s, **{read.rate:.0f} rows/s**, Azurite CPU "
                  f"{read.azurite_cpu_s * 1000 / read.rows:.2f} ms/row."]
    return lines


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _sessions_section(result: ScenarioResult) -> list[str]:
    x = result.extra
    names: dict[str, str] = x["variants"]  # variant -> what it is, in the order they run
    summary: dict[str, Any] = x["session_summary"]
    lines = [f"{x['rounds']} round(s); in each, on fresh Azurites: the unordered exactly-once "
             "hop (scenario 2: 512 partitions round-robin), the same hop over the session "
             f"hop's {x['sessions']} partitions, and the session hop ({x['sessions']} sessions, "
             "each its own state partition; the client numbers each send from a counter row), "
             "the order reversed every other round. Operations: the endpoint's port calls per "
             "message, counted as in scenario 5; client requests: the producer threads' HTTP "
             "requests per send. Failed commits: entity-group transactions refused (lost "
             "claims), counted in the operations. Empty receives: the consumers' idle polls "
             "(many when they wait for the producers; not in the operations). Load average "
             f"before -> after the scenario: {x.get('load', '-')}.", ""]
    rows: list[list[Any]] = []
    for r in x["session_runs"]:
        python, azurite = r.cpu.per_unit_ms(r.messages)
        lost = sum(n for (_, op, _), n in r.errors.items() if op == "transact")
        rows.append([r.index + 1, names[r.variant], r.messages, f"{r.seconds:.1f}",
                     f"**{r.rate:.1f}**", f"{sum(_per(r.ops, r.messages).values()):.2f}",
                     f"{sum(_per(r.client_requests, r.messages).values()):.2f}",
                     r.set_aside, lost, r.ops.get(IDLE, 0), f"{python:.1f}",
                     f"{azurite:.1f}"])
    lines += _table(["round", "hop", "messages", "seconds", "msgs/s", "ops/msg",
                     "client requests/msg", "set aside", "failed commits", "empty receives",
                     "Python CPU ms/msg", "Azurite CPU ms/msg"], rows)
    ses = summary["sessions"]
    medians = ", ".join(f"{names[v]} {_fmt(summary[v]['msgs_per_s'], 1)}" for v in names)
    ratios = "; ".join(
        f"to the {names[base]} **{_fmt(summary[f'ratio_to_{base}'], 3)}** (per round: "
        + ", ".join(f"{v:.3f}" for v in summary[f"ratios_to_{base}"]) + ")"
        for base in ("unordered", "same_partitions"))
    lines += ["", f"Medians, msgs/s: {medians}. The session hop's ratio {ratios}. Copies set "
              f"aside: {ses['set_aside']} of {ses['messages']} messages.", ""]
    keys = sorted({key for v in names for key in summary[v]["ops"]})
    rows = [[service, op, *(f"{summary[v]['ops'].get((service, op), 0.0):.3f}"
                            for v in names)] for service, op in keys]
    rows.append(["**total**", "", *(f"**{_fmt(summary[v]['ops_per_msg'], 3)}**"
                                    for v in names)])
    rows.append(["client", "requests per send",
                 *(_fmt(summary[v]["client_per_msg"], 3) for v in names)])
    lines += _table(["service", "operation", *(f"{names[v]}, per msg" for v in names)],
                    rows)
    return lines


def _tracing_section(result: ScenarioResult) -> list[str]:
    x = result.extra
    names: dict[str, str] = x["variants"]
    summary: dict[str, Any] = x["tracing_summary"]
    lines = [f"{x['rounds']} round(s) of scenario 2 (the exactly-once command hop, same "
             "workload and checks), each run on a fresh Azurite, the order swapped every "
             "other round: tracing off (`Telemetry()`: the global providers, the API's "
             "no-ops), on (both buses given an SDK that records every span and measurement: "
             f"{x['processor']}) and sampled (the same SDK at the recommended settings: "
             "parent-based ratio sampling at 0.1, exemplars off). Spans: ended, as the "
             "processor saw them; dropped: ended but never exported. Traced Pongs: the Pongs "
             "carrying a `traceparent` header (the bus writes none without a recording "
             f"span). Load average before -> after the scenario: {x.get('load', '-')}.", ""]
    rows: list[list[Any]] = []
    for r in x["tracing_runs"]:
        python, azurite = r.cpu.per_unit_ms(r.messages)
        rows.append([r.index + 1, r.variant, r.messages, f"{r.seconds:.1f}",
                     f"**{r.rate:.1f}**", f"{python:.1f}", f"{azurite:.1f}",
                     f"{sum(_per(r.ops, r.messages).values()):.2f}",
                     f"{r.spans_ended / r.messages:.2f}" if r.variant != "off" else "0",
                     f"{r.traced_pongs} of {r.pongs}"])
    lines += _table(["round", "tracing", "messages", "seconds", "msgs/s", "Python CPU ms/msg",
                     "Azurite CPU ms/msg", "ops/msg", "spans/msg", "traced Pongs"], rows)
    off, on = summary["off"], summary["on"]
    lines += ["", f"Medians, msgs/s: {names['off']} {_fmt(off['msgs_per_s'], 1)}, "
              f"{names['on']} {_fmt(on['msgs_per_s'], 1)}. **Ratio on/off "
              f"{_fmt(summary['ratio'], 3)}** (per round: "
              + ", ".join(f"{v:.3f}" for v in summary["ratios"]) + "). Python CPU per "
              f"message: off {_fmt(off['python_ms_per_msg'], 2)} ms, on "
              f"{_fmt(on['python_ms_per_msg'], 2)} ms, ratio on/off "
              f"{_fmt(summary['cpu_ratio'], 3)} (per round: "
              + ", ".join(f"{v:.3f}" for v in summary["cpu_ratios"]) + "). Spans recorded: "
              f"**{_fmt(summary['spans_per_msg'], 2)} per message**, "
              f"{summary['spans_dropped']} dropped.", ""]
    sampled = summary.get("sampled")
    if sampled and sampled["messages"]:
        lines += [f"{names['sampled']}: {_fmt(sampled['msgs_per_s'], 1)} msgs/s (median), "
                  f"**ratio to off {_fmt(summary['sampled_ratio'], 3)}** (per round: "
                  + ", ".join(f"{v:.3f}" for v in summary["sampled_ratios"]) + "), "
                  f"{_fmt(summary['sampled_spans_per_msg'], 2)} spans per message, "
                  f"{sampled['traced_pongs']} of {sampled['pongs']} Pongs traced.", ""]
    rows = [[name, f"{n:.3f}"] for name, n in summary["spans_by_name_per_msg"].items()]
    lines += _table(["span (kind)", "per message, tracing on"], rows)
    lines += [""]
    rows = [[name, f"{n:.3f}"] for name, n in summary["measurements_per_msg"].items()]
    lines += _table(["instrument", "measurements per message (counters: their sum)"], rows)
    return lines


def _per(counts: Mapping[OpKey, int], units: int) -> dict[OpKey, float]:
    return per_unit(counts, units) if units else {}


def _latency_line(info: RunInfo) -> str:
    if info.round_trips is None:
        return ("No latency injected: every scenario ran against Azurite on loopback (about "
                "1 ms per request; Azure's is 5-10 ms).")
    direct, proxied = info.round_trips
    return (f"Latency: every storage request of every scenario went through a loopback proxy "
            f"adding {info.cfg.latency_ms:g} ms (`bench.delay`); a tiny request took "
            f"{direct:.1f} ms to Azurite directly and {proxied:.1f} ms through the proxy "
            "(Azure Storage from a function in the same region: 5-10 ms).")


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
        _latency_line(info),
        "",
        "## Throughput",
        "",
    ]
    raw = results["raw"].rate if "raw" in results else None
    rows: list[list[Any]] = []
    for number, (key, title) in enumerate(titles.items(), 1):
        if key in ("latency", "spark", "sessions", "tracing", "functions_hop"):
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
    lines += ["", "## The Functions path: the hop through the host and the real worker", ""]
    lines += _functions_section(
        results["functions_hop"], results["eo_hop"].rate if "eo_hop" in results else None,
        prices) if "functions_hop" in results else [failures.get("functions_hop", "not run")]
    lines += ["", "## Azure's per-partition budgets: the modelled ceiling of one endpoint", ""]
    lines += _ceiling_section(results["eo_hop"]) if "eo_hop" in results else [
        failures.get("eo_hop", "not run")]
    lines += ["", "## Spark: tasks publishing rows (bus vs raw send loop)", ""]
    lines += _spark_section(results["spark"]) if "spark" in results else [
        failures.get("spark", "not run")]
    lines += ["", "## Sessions: ordered delivery against the unordered hop", ""]
    lines += _sessions_section(results["sessions"]) if "sessions" in results else [
        failures.get("sessions", "not run")]
    lines += ["", "## Tracing: the hop with tracing off and with an SDK recording", ""]
    lines += _tracing_section(results["tracing"]) if "tracing" in results else [
        failures.get("tracing", "not run")]
    lines += ["", "## Prices used", "", f"From `bench/prices.toml`: {prices.meta['note']}.", ""]
    lines += _table(["class", "USD", "per", "what", "source", "date"],
                    [[p.name, p.usd, f"{p.per:,}", p.unit, p.source, p.date]
                     for p in prices.prices.values()])
    lines += ["", "## Summary (the JSON line)", "", "```json", json.dumps(data), "```", ""]
    return "\n".join(lines)
