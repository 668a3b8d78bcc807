"""The Spark scenario's pieces that need neither Spark nor Azurite: the counted task on the
in-memory backend, the medians and ratios, the JSON keys and the markdown section.

(A run of the scenario itself starts two SparkSessions, 30-60 s: ``python -m bench --only
spark``; it is not a test. Nothing here checks a speed.)"""

from __future__ import annotations

import json

import pytest

from bench import prices, report
from bench.config import FULL, QUICK
from bench.harness import ScenarioResult
from bench.scenarios import SCENARIOS, spark_publish
from bench.scenarios.spark_publish import CountedConnection, CountedPublish, ReadRun, Run
from bus.integrations.spark.options import WriteOptions
from bus.integrations.spark.writer import JobWriter

pa = pytest.importorskip("pyarrow")


def test_the_scenario_is_declared_and_sized_for_the_time_budget() -> None:
    assert "spark" in SCENARIOS
    assert FULL.spark_cores == (1, 2) and QUICK.spark_cores == (2,)
    assert FULL.spark_runs >= 2 and QUICK.spark_runs >= 2  # alternating, at least two each
    assert QUICK.spark_rows <= FULL.spark_rows <= 5000


def test_the_counted_task_reports_its_rows_and_storage_calls() -> None:
    connection = "memory:bench-spark-counted-task"
    import bus.spark

    bus.spark.subscribe("sink", connection_string=connection)
    job = JobWriter(WriteOptions(CountedConnection(connection_string=connection),
                                 spark_publish.CONTRACT, destination="sink",
                                 key_columns=("order_id",)))
    job.prepare()
    rows = [{"order_id": f"order-{i:07d}", "customer": "c", "amount_cents": i}
            for i in range(120)]
    batches = [pa.RecordBatch.from_pylist(rows[:70]), pa.RecordBatch.from_pylist(rows[70:])]
    [out] = list(CountedPublish(job, connection)(iter(batches)))
    [report_row] = out.to_pylist()
    assert report_row["rows"] == report_row["published"] == 120
    ops = json.loads(report_row["ops"])
    # 120 copies: marks and tokens 50 copies to a transaction (3); signals 32 to a bundle (4);
    # the notes that the signals went, 100 marks to a transaction (2); the marks' log row (1).
    assert ops == {"queue.send": 4, "table.transact": 6}
    assert json.loads(report_row["requests"]) == {}  # the in-memory backend sends no HTTP
    rerun = JobWriter(job.options)  # another job, the same message ids
    [again] = list(CountedPublish(rerun, connection)(iter(batches)))
    assert again.to_pylist()[0]["already_sent"] == 120  # the marks: nothing sent twice


def _run(variant: str, cores: int, index: int, seconds: float, **extra: object) -> Run:
    return Run(variant, cores, index, rows=1000, seconds=seconds, **extra)  # type: ignore[arg-type]


def _runs() -> list[Run]:
    ops = {"queue.send": 32, "table.transact": 20}
    return [
        _run("raw", 2, 0, 5.0), _run("bus", 2, 0, 1.0),
        _run("publish", 2, 0, 0.8, ops=ops, requests=ops, driver_ops={"table.create_table": 7}),
        _run("raw", 2, 1, 4.0), _run("bus", 2, 1, 2.0),
        _run("publish", 2, 1, 1.0, ops=ops, requests=ops, driver_ops={"table.create_table": 7}),
        _run("raw", 1, 0, 10.0), _run("bus", 1, 0, 2.0),
        _run("publish", 1, 0, 2.0, ops={"queue.send": 40, "table.transact": 20}),
    ]


def test_ratios_pair_each_bus_run_with_the_raw_run_of_its_round() -> None:
    summary = spark_publish.summarize(_runs())
    two = summary[2]
    assert two["raw_rows_per_s"] == pytest.approx(225.0)  # median of 200 and 250
    assert two["bus_rows_per_s"] == pytest.approx(750.0)  # median of 1000 and 500
    assert two["bus_ratios"] == pytest.approx([5.0, 2.0])  # 1000/200, 500/250
    assert two["bus_to_raw_ratio"] == pytest.approx(3.5)
    assert two["ops_per_row"] == pytest.approx(0.052) and two["counted_rows"] == 2000
    assert summary[1]["bus_to_raw_ratio"] == pytest.approx(5.0)
    assert summary[1]["ops_per_row"] == pytest.approx(0.06)
    assert summary[1]["requests_per_row"] == 0  # HTTP requests not counted in that run


def _result() -> ScenarioResult:
    runs = _runs()
    return ScenarioResult(
        key="spark", title="spark", units=2000, seconds=3.0, verified="ok",
        extra={"spark_runs": runs, "spark_summary": spark_publish.summarize(runs),
               "spark_sessions": {c: {"session_s": 9.0, "warmup_s": 12.0, "small_raw_s": 0.4,
                                      "small_bus_s": 0.5, "small_publish_s": 0.4}
                                  for c in (1, 2)},
               "spark_read": ReadRun(1000, 8.0, 1.5), "spark_rows": 1000})


def test_the_json_line_has_the_spark_keys_and_null_when_it_did_not_run() -> None:
    data = report.summary({"spark": _result()}, prices.load(), FULL, "abc")
    assert data["spark_publish_rows_per_s"] == 750.0 and data["spark_raw_rows_per_s"] == 225.0
    assert data["spark_publish_to_raw_ratio"] == 3.5
    assert data["spark_requests_per_row"] == 0.052
    assert data["spark_read_rows_per_s"] == 125.0
    empty = report.summary({}, prices.load(), FULL, "abc")
    assert all(empty[key] is None for key in report.SPARK_KEYS)
    json.dumps(data)


def test_the_markdown_has_a_spark_section_per_setting() -> None:
    info = report.RunInfo(cfg=FULL, machine={"CPU": "2 x test"}, started="now", seconds=1.0,
                          command="python -m bench --only spark")
    text = report.markdown(info, results={"spark": _result()}, failures={},
                           titles={"spark": "spark"}, data={}, prices=prices.load())
    section = text.split("## Spark")[1].split("## Prices")[0]
    assert "local[1]" in section and "local[2]" in section
    assert "**3.50**" in section and "**0.0520**" in section and "125 rows/s" in section
    failed = report.markdown(info, results={}, failures={"spark": "FAILED: spark: boom"},
                             titles={"spark": "spark"}, data={}, prices=prices.load())
    assert "FAILED: spark: boom" in failed.split("## Spark")[1]
