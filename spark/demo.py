"""``make spark-demo``: Spark producer -> the Functions sample app -> Spark consumer, checked.

On a fresh Azurite: provisions the app's topology, subscribes the ``analytics`` endpoint to
OrderBilled, starts the app on the local host (``python -m devhost``), runs the producer job
(``spark.place_orders``: a dataset of orders -> PlaceOrder, sent from the executors), runs it
again on purpose (it must publish nothing: every row already sent), and streams OrderBilled
into a Parquet table (``spark.stream_billed``) until every order is there. Then it checks both
ends: the app placed, billed, packed and charged each order exactly once, and the table holds
each order exactly once.
The last line printed is a JSON summary; the exit code is non-zero on any loss or duplicate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
SPARK_TRIES = 3
SPARK_STARTUP_FAILURES = ("Python worker failed to connect back",
                          "Java gateway process exited", "Connection refused")
"""Failures of a Spark that is slow to start its processes, not of the job (seen under load:
"Python worker failed to connect back")."""
T = TypeVar("T")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.demo", description=__doc__)
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from devhost.azurite import azurite

    with azurite() as connection:
        return SparkDemo(args, connection).run()


class SparkDemo:
    def __init__(self, args: argparse.Namespace, connection: str) -> None:
        self.args = args
        self.connection = connection
        self.env = dict(os.environ, AzureWebJobsStorage=connection, BUS_PREFIX="",
                        BUS_DURABLE_HUB="BusSparkDemo", AzureWebJobsScriptRoot=str(ROOT))
        os.environ.update(self.env)
        import function_app  # reads its settings at import, like under the worker

        self.app = function_app
        self.bus = function_app.bus_functions.bus
        self.options = {"connection_string": connection, "prefix": ""}
        self.workdir = Path(tempfile.mkdtemp(prefix="bus-spark-demo-"))
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"  {time.monotonic() - self.started:5.0f} s  {text}", flush=True)

    def run(self) -> int:
        import bus.spark
        from devhost.process import start_host, stop_host
        from spark import place_orders, stream_billed
        from spark.session import local_session

        print(f"Azurite is up; provisioning the app's topology (logs in {self.workdir})",
              flush=True)
        self.bus.provision()
        bus.spark.subscribe(stream_billed.ENDPOINT, [stream_billed.TOPIC], **self.options)
        self.say(f"{stream_billed.ENDPOINT!r} subscribed to {stream_billed.TOPIC}")
        host = start_host(self.workdir, self.env)
        try:
            spark = spark_step("starting Spark", lambda: local_session("bus-spark-demo"),
                               say=self.say, logs=self.workdir)[0]
            self.say("Spark session started (local[2,3])")
            dataset = place_orders.generate(self.workdir / "orders.csv", self.args.orders)
            first, tries = spark_step("running the producer job",
                                      lambda: place_orders.run(spark, dataset, self.options),
                                      say=self.say, logs=self.workdir)
            # A job run again after a failed try finds the rows that try sent already sent.
            published = first.published + (first.already_sent if tries > 1 else 0)
            self.say(f"producer: {published} PlaceOrder commands published from the "
                     f"executors in {first.seconds:.1f} s (df.write.format('bus'))")
            rerun = place_orders.run(spark, dataset, self.options, api="publish")
            self.say(f"producer run again on purpose (bus.spark.publish): {rerun.published} "
                     f"published, {rerun.already_sent} already sent")
            table = self.workdir / "billed"
            rows = stream_billed.run(
                spark, table, self.workdir / "checkpoint", self.options,
                expect=self.args.orders, timeout=self.args.timeout,
                done=lambda: self._quiet(host), progress=self._progress)
            self.say(f"consumer: {rows} rows in the Parquet table {table}")
            order_ids = [r.order_id for r in spark.read.schema(stream_billed.TABLE_SCHEMA)
                         .parquet(str(table)).select("order_id").collect()]
            spark.stop()
        finally:
            stop_host(host)
        result = self._verify(published, rerun, order_ids)
        print()
        ok = result["lost"] == result["duplicates"] == 0 and rerun.published == 0
        print(f"{result['published']} orders published once (the re-run: {rerun.published} "
              f"published, {result['already_sent']} already sent); "
              f"{result['messages_processed']} messages processed by the Functions app; "
              f"{result['consumed']} OrderBilled rows in Parquet. Duplicates: "
              f"{result['duplicates']}; lost: {result['lost']}.  "
              f"{'EXACTLY ONCE' if ok else 'FAILED'}")
        print(json.dumps(result), flush=True)
        return 0 if ok else 1

    # -- the Functions app -------------------------------------------------------------------
    def _quiet(self, host: subprocess.Popen[bytes]) -> bool:
        """Everything the app will do is done: no message left in any queue."""
        if host.poll() is not None:
            log = (self.workdir / "devhost.log").read_text(errors="replace")
            raise SystemExit(f"the local host exited with {host.returncode}:\n{log[-3000:]}")
        endpoints = [*self.bus.topology.endpoints, "analytics"]
        return sum(self._depth(self.bus.names.queue(e)) for e in endpoints) == 0

    def _progress(self, rows: int) -> None:
        billed = sum(1 for r in self._rows("orders") if r.get("billed"))
        packed = sum(1 for r in self._rows("shipping") if r.get("packed"))
        waiting = self._depth(self.bus.names.queue("analytics"))
        self.say(f"app: billed {billed}/{self.args.orders}  packed {packed}/{self.args.orders}"
                 f"  |  stream: {rows} rows in Parquet, {waiting} waiting for it")

    # -- checks -------------------------------------------------------------------------------
    def _rows(self, endpoint: str) -> list[dict[str, Any]]:
        table = self.bus.names.state_table(endpoint)
        return [dict(e.properties, _pk=e.partition_key, _rk=e.row_key)
                for e in self.bus.storage.tables.query(table) if not e.row_key.startswith("~")]

    def _depth(self, queue: str) -> int:
        return int(self.bus.storage.queues.depth(queue))

    def _verify(self, published: int, rerun: Any, order_ids: list[str]) -> dict[str, Any]:
        expected = [f"order-{i:05d}" for i in range(self.args.orders)]
        by_order = {r["_pk"]: r for r in self._rows("orders") if r["_rk"] == "order"}
        shipped = {r["_pk"]: r for r in self._rows("shipping") if r["_rk"] == "shipment"}
        invoices = {r["_rk"].removeprefix("invoice-"): r for r in self._rows("billing")
                    if r["_rk"].startswith("invoice-")}
        effects: Counter[str] = Counter()
        for order_id in expected:
            for value in (by_order.get(order_id, {}).get("placed", 0),
                          by_order.get(order_id, {}).get("billed", 0),
                          shipped.get(order_id, {}).get("packed", 0),
                          invoices.get(order_id, {}).get("charged", 0)):
                effects["lost" if value == 0 else "twice" if value > 1 else "once"] += 1
        consumed = Counter(order_ids)
        return {
            "published": published,
            "already_sent": rerun.already_sent,
            "rerun_published": rerun.published,
            "messages_processed": effects["once"] + effects["twice"],
            "consumed": len(order_ids),
            "duplicates": effects["twice"] + sum(n - 1 for n in consumed.values() if n > 1)
            + max(0, published - len(expected)) + rerun.published,
            "lost": effects["lost"] + sum(1 for o in expected if o not in consumed)
            + max(0, len(expected) - published),
            "seconds": round(time.monotonic() - self.started, 1),
        }



def spark_step(what: str, step: Callable[[], T], *, say: Callable[[str], None], logs: Path,
               sleep: Callable[[float], None] = time.sleep) -> tuple[T, int]:
    """``step``'s result and how many tries it took: tried again (up to ``SPARK_TRIES`` in
    all) when Spark fails the way a busy machine makes it fail - a Python worker or the JVM
    that did not start in time. Any other failure, or the last try's, ends the demo saying
    what failed, instead of a Java trace. Safe for the producer job: a row it sent is never
    sent again."""
    for tries in range(1, SPARK_TRIES + 1):
        try:
            return step(), tries
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            transient = any(marker in str(exc) for marker in SPARK_STARTUP_FAILURES)
            if not transient or tries == SPARK_TRIES:
                after = f"after {tries} tries: " if transient else ""
                raise SystemExit(
                    f"Spark failed while {what} ({after}{first_line[:300]}). A loaded "
                    "machine starts Spark's Python workers slowly: run `make spark-demo` "
                    f"again when it is quieter; logs in {logs}") from exc
            say(f"Spark failed while {what} ({first_line[:120]}): a busy machine; trying "
                f"again ({tries + 1} of {SPARK_TRIES})")
            sleep(5.0 * tries)
    raise AssertionError("unreachable: the last try returns or raises")

if __name__ == "__main__":
    sys.exit(main())
