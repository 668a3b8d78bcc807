"""``make demo``: the sample app on Azurite through the local host, checked for exactly-once.

Starts a fresh Azurite, provisions the topology, starts ``python -m devhost`` on
function_app.py, sends PlaceOrder commands (a share of the signals duplicated on purpose, a
few malformed messages too), shows progress, waits until everything is quiet, and checks the
business tables: every order placed, billed and packed exactly once, every customer balance
right. The last line printed is a JSON summary; the exit code is non-zero on any loss or
doubled effect - and on a run that did not finish within ``--timeout``: what had not happened
by then is reported as unfinished, not lost (a loaded machine is slow, nothing more).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bus.hosting.local.durable import work_queue_name
from bus.hosting.local.host import hub_name
from bus.hosting.local.serve import without_auth_level_warning
from devhost.azurite import azurite
from devhost.process import start_host, stop_host

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devhost.demo", description=__doc__)
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--duplicate-rate", type=float, default=0.12,
                        help="share of the client's signals sent twice (default 0.12)")
    parser.add_argument("--malformed", type=int, default=5,
                        help="malformed messages to put on the orders queue (poisoned)")
    parser.add_argument("--inline-max", type=int, default=1,
                        help="BUS_INLINE_DISPATCH_MAX for the run; 1 sends OrderPlaced (two "
                             "copies) through the Durable orchestration and OrderBilled inline")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds to wait for the work to finish (default: 120 plus 0.5 "
                             "per order: 620 for 1,000; a quiet 2-core machine needs ~150)")
    parser.add_argument("--traces", type=Path, metavar="DIR",
                        help="export the client's and the app's spans and metrics to DIR "
                             "(BUS_TRACE_DIR; python -m devhost.trace_picture DIR draws one)")
    args = parser.parse_args()
    with azurite() as connection:
        return Demo(args, connection).run()


class Demo:
    def __init__(self, args: argparse.Namespace, connection: str) -> None:
        self.args = args
        if args.timeout is None:
            args.timeout = timeout_for(args.orders)
        self.env = dict(os.environ, AzureWebJobsStorage=connection, BUS_PREFIX="",
                        BUS_INLINE_DISPATCH_MAX=str(args.inline_max),
                        BUS_DURABLE_HUB="BusDemo", AzureWebJobsScriptRoot=str(ROOT),
                        # the endpoints' statistics written within a second (read at the end)
                        BUS_STATS_FLUSH_SECONDS="1")
        if args.traces is not None:
            self.env["BUS_TRACE_DIR"] = str(_fresh_trace_dir(args.traces))
        os.environ.update(self.env)
        sys.path.insert(0, str(ROOT))
        if args.traces is not None:  # before the app is imported: this process's own name
            from bus.hosting.functions.telemetry import configure_telemetry

            print("demo client telemetry:", configure_telemetry(
                dict(self.env, OTEL_SERVICE_NAME="eobus-demo-client")), flush=True)
        import function_app  # the app reads its settings at import, like under the worker
        from bus.testing import with_duplicates

        self.app = function_app
        # What the worker must load, every one (get_functions() may be called once per app).
        with without_auth_level_warning():
            self.functions_defined = len(function_app.app.get_functions())
        self.bus = function_app.bus_functions.bus
        storage, self.duplicates = with_duplicates(self.bus.storage, args.duplicate_rate, seed=7)
        from bus import Bus, Settings

        # One queue message per PlaceOrder: a duplicated signal is one order's (a bundle's
        # would duplicate several).
        self.client = Bus(storage, list(self.bus.topology.endpoints.values()),
                          settings=Settings(group_sends=False))
        self.workdir = Path(tempfile.mkdtemp(prefix="bus-demo-"))

    def run(self) -> int:
        started = time.monotonic()
        print(f"Azurite is up; provisioning queues, tables, containers and topics "
              f"(logs in {self.workdir})", flush=True)
        self.bus.provision()
        host = start_host(self.workdir, self.env)
        try:
            orders = self._send()
            finished = self._wait(orders, started, host)
        finally:
            stats = self._stop_host(host)
        result = self._verify(orders, stats, self._outcomes(started),
                              time.monotonic() - started, finished=finished)
        if self.args.traces is not None:
            result.update(self._traces())
        self._summary(result)
        print(json.dumps(result), flush=True)
        return 0 if _good(result) else 1

    # -- steps ------------------------------------------------------------------------------
    def _send(self) -> dict[str, tuple[str, int]]:
        n, customers = self.args.orders, self.args.customers
        orders = {f"order-{i:05d}": (f"customer-{i % customers:04d}", 500 + (i * 37) % 9500)
                  for i in range(n)}

        def send(item: tuple[str, tuple[str, int]]) -> None:
            order_id, (customer, amount) = item
            self.client.send(self.app.PlaceOrder(order_id=order_id, customer=customer,
                                                 amount_cents=amount))

        with ThreadPoolExecutor(16) as pool:
            for done, _ in enumerate(pool.map(send, orders.items()), start=1):
                if done % 250 == 0 or done == n:
                    print(f"  sent {done}/{n} PlaceOrder "
                          f"({self.duplicates.duplicated} signals duplicated)", flush=True)
        queue = self.bus.names.queue("orders")
        for i in range(self.args.malformed):  # half not base64, half not an envelope
            body = "%%% not base64 %%%" if i % 2 else base64.b64encode(b"{oops").decode()
            self.bus.storage.queues.send(queue, body)
        return orders

    def _wait(self, orders: dict[str, tuple[str, int]], started: float,
              host: subprocess.Popen[bytes]) -> bool:
        """Wait until everything is quiet (True) or the timeout (False)."""
        deadline = time.monotonic() + self.args.timeout
        hub = hub_name(json.loads((ROOT / "host.json").read_text()))
        quiet = 0
        while time.monotonic() < deadline and quiet < 3:
            time.sleep(2)
            if host.poll() is not None:
                log = (self.workdir / "devhost.log").read_text(errors="replace")
                raise SystemExit(f"the local host exited with code {host.returncode}; the end "
                                 f"of its log:\n{log[-3000:]}")
            billed = sum(1 for row in self._rows("orders") if row.get("billed"))
            packed = sum(1 for row in self._rows("shipping") if row.get("packed"))
            depth = sum(self._depth(self.bus.names.queue(e))
                        for e in self.bus.topology.endpoints)
            waiting = self._hub_depth(work_queue_name(hub))
            print(f"  {time.monotonic() - started:5.0f} s  billed {billed}/{len(orders)}  "
                  f"packed {packed}/{len(orders)}  messages in queues {depth}  "
                  f"orchestrations waiting {waiting}", flush=True)
            quiet = quiet + 1 if depth == 0 and billed == packed == len(orders) else 0
        return quiet >= 3

    def _outcomes(self, started: float) -> dict[str, int]:
        """What the endpoints' receivers counted (their per-minute statistics,
        ``bus.observability.stats``): copies processed, and the others - duplicates dropped
        (in this app nothing is deferred, scheduled or put back while paused)."""
        from bus.observability import stats

        since = time.time() - (time.monotonic() - started) - 60
        tally = stats.Tally()
        for endpoint in self.bus.topology.endpoints:
            for minute in stats.read(self.bus.storage.tables, self.bus.names.state_table(
                    endpoint), since, time.time() + 60).values():
                tally += minute.tally
        return {"copies_processed": tally.processed, "duplicates_dropped": tally.other}

    def _stop_host(self, host: subprocess.Popen[bytes]) -> dict[str, Any]:
        stop_host(host)
        path = self.workdir / "stats.json"
        return json.loads(path.read_text()) if path.exists() else {}

    # -- checks -----------------------------------------------------------------------------
    def _rows(self, endpoint: str) -> list[dict[str, Any]]:
        table = self.bus.names.state_table(endpoint)
        return [dict(e.properties, _pk=e.partition_key, _rk=e.row_key)
                for e in _patiently(self.bus.storage.tables.query, table)
                if not e.row_key.startswith("~")]

    def _depth(self, queue: str) -> int:
        return int(_patiently(self.bus.storage.queues.depth, queue))

    def _hub_depth(self, queue: str) -> int:
        """The Durable task hub's work queue: the host creates it when it starts the hub,
        which a loaded machine can make later than the first look."""
        from bus.storage import Missing

        try:
            return self._depth(queue)
        except Missing:
            return 0

    def _verify(self, orders: dict[str, tuple[str, int]], stats: dict[str, Any],
                outcomes: dict[str, int], seconds: float, *,
                finished: bool = True) -> dict[str, Any]:
        """The run's outcome. Effects missing from a run that finished are lost; from one
        that ran out of time, unfinished: they may still have been on their way."""
        counts: Counter[str] = Counter()
        by_order = {r["_pk"]: r for r in self._rows("orders") if r["_rk"] == "order"}
        shipped = {r["_pk"]: r for r in self._rows("shipping") if r["_rk"] == "shipment"}
        billing = self._rows("billing")
        invoices = {r["_rk"].removeprefix("invoice-"): r for r in billing
                    if r["_rk"].startswith("invoice-")}
        accounts = {r["_pk"]: r for r in billing if r["_rk"] == "account"}
        for order_id in orders:
            for _effect, value in (
                    ("placed", by_order.get(order_id, {}).get("placed", 0)),
                    ("billed", by_order.get(order_id, {}).get("billed", 0)),
                    ("packed", shipped.get(order_id, {}).get("packed", 0)),
                    ("charged", invoices.get(order_id, {}).get("charged", 0))):
                counts["lost" if value == 0 else "twice" if value > 1 else "once"] += 1
        expected: Counter[str] = Counter()
        for customer, amount in orders.values():
            expected[customer] += amount
        wrong_balances = sum(1 for c, total in expected.items()
                             if accounts.get(c, {}).get("balance_cents") != total)
        functions = stats.get("functions", {})
        succeeded = sum(f["succeeded"] for f in functions.values())
        processed = 4 * len(orders)  # PlaceOrder, OrderPlaced x2, OrderBilled per order
        poisoned = sum(self._depth(self.bus.names.poison_queue(e))
                       for e in self.bus.topology.endpoints)
        return {
            "worker": stats.get("worker"),
            "functions_loaded": stats.get("functions_loaded", 0),
            "functions_defined": self.functions_defined,
            "worker_threads": stats.get("worker_threads"),
            "sent": len(orders),
            "duplicates_injected": self.duplicates.duplicated,
            "finished": finished,
            "processed": processed - counts["lost"],
            "copies_processed": outcomes["copies_processed"],
            "duplicates_dropped": outcomes["duplicates_dropped"],
            "effects_applied_twice": counts["twice"],
            "lost": counts["lost"] if finished else 0,
            "unfinished": 0 if finished else counts["lost"],
            "wrong_balances": wrong_balances,
            "poisoned": poisoned,
            "orchestrations": stats.get("durable", {}).get("completed", 0),
            "invocations": succeeded + sum(f["failed"] for f in functions.values()),
            "seconds": round(seconds, 1),
        }

    def _traces(self) -> dict[str, Any]:
        """What was exported to the trace dir: the host wrote its spans when it stopped; this
        process's are flushed here."""
        from opentelemetry import trace

        from devhost.trace_picture import load, summary

        provider: Any = trace.get_tracer_provider()
        if hasattr(provider, "force_flush"):
            provider.force_flush()
        spans, traces = summary(load(self.args.traces))
        return {"trace_dir": str(self.args.traces), "spans_exported": spans,
                "traces_exported": traces}

    def _summary(self, r: dict[str, Any]) -> None:
        ok = _good(r)
        print()
        print(f"{r['worker']} loaded {r['functions_loaded']} of the app's "
              f"{r['functions_defined']} functions ({r['worker_threads']} threads for sync "
              "functions).")
        print(f"{r['sent']} orders sent with {r['duplicates_injected']} duplicated signals and "
              f"{self.args.malformed} malformed messages, in {r['seconds']} s.")
        print(f"{r['processed']} messages processed ({r['orchestrations']} outbox "
              f"orchestrations), {r['duplicates_dropped']} duplicate deliveries dropped, "
              f"{r['poisoned']} messages poisoned with a reason.")
        if not r["finished"]:
            print(f"UNFINISHED at the {self.args.timeout:.0f} s timeout: {r['unfinished']} "
                  "effects had not happened yet: the machine is slow or loaded, which is no "
                  "loss. Run again with a longer --timeout, or fewer --orders.")
            print(f"Effects applied twice so far: {r['effects_applied_twice']}.")
            return
        print(f"Effects applied twice: {r['effects_applied_twice']}; lost: {r['lost']}; "
              f"wrong customer balances: {r['wrong_balances']}.  "
              f"{'EXACTLY ONCE' if ok else 'FAILED'}")
        if "spans_exported" in r:
            print(f"{r['spans_exported']} spans in {r['traces_exported']} traces exported to "
                  f"{r['trace_dir']} (python -m devhost.trace_picture {r['trace_dir']} "
                  "--out docs/img/order-trace.png draws one order).")


def timeout_for(orders: int) -> float:
    """The default wait for ``orders``: a loaded machine took over 600 s for 1,000, a quiet
    one 146 s."""
    return 120.0 + 0.5 * orders


def _good(result: dict[str, Any]) -> bool:
    """Finished exactly once: nothing lost or doubled, every balance right, every function
    loaded."""
    return bool(result["finished"] and result["lost"] == 0
                and result["effects_applied_twice"] == 0 and result["wrong_balances"] == 0
                and result["functions_loaded"] == result["functions_defined"])


def _fresh_trace_dir(directory: Path) -> Path:
    """``directory``, made, without the span and metric files of an earlier run (the counts
    and the picture are of this run)."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    old = [*directory.glob("spans-*.jsonl"), *directory.glob("metrics-*.jsonl")]
    for path in old:
        path.unlink()
    if old:
        print(f"{directory}: {len(old)} span and metric files of an earlier run removed",
              flush=True)
    return directory


def _patiently(call: Any, *args: Any) -> Any:
    """Retry a read through Azurite's occasional connection resets under load."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    from bus.storage import TransientError

    retrying = Retrying(stop=stop_after_attempt(6), wait=wait_exponential(0.2, max=5),
                        retry=retry_if_exception_type(TransientError), reraise=True)
    return retrying(call, *args)


if __name__ == "__main__":
    sys.exit(main())

