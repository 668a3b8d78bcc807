"""``make dashboard``: the operations dashboard over the sample app on a fresh Azurite.

Starts Azurite, provisions function_app.py's topology, starts the local host on the app (as
``make demo`` does) and sends some orders through it:

* ``--orders`` PlaceOrder commands, placed, billed and packed by the app;
* the orders of one customer whose account row is corrupt (not a number): billing fails on
  every delivery and the host poisons them after host.json's maxDequeueCount. Once they are
  all in the poison queue the row is repaired, so replaying the group from the Poisoned
  messages page bills each of them once;
* two undecodable bodies on the orders queue (poisoned without invoking the app, not
  replayable: purge them);
* two orders scheduled an hour out.

Then ``python -m bus dashboard --app function_app --allow-actions`` serves the dashboard on
``--host``:``--port`` until Ctrl-C; the local host keeps running the app meanwhile (replayed
messages are processed, a paused endpoint waits). Everything is stopped afterwards.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devhost.azurite import azurite
from devhost.process import start_host, stop_host

ROOT = Path(__file__).resolve().parent.parent
CORRUPT_CUSTOMER = "customer-corrupt"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devhost.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (loopback)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--orders", type=int, default=60, help="orders processed (default 60)")
    parser.add_argument("--failing", type=int, default=4,
                        help="orders of the customer whose account row is corrupt (default 4)")
    args = parser.parse_args()
    # Ctrl-C and SIGTERM stop everything, also when started from a script in the background
    # (where a shell leaves SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with azurite() as connection:
        return Dashboard(args, connection).run()


class Dashboard:
    def __init__(self, args: argparse.Namespace, connection: str) -> None:
        self.args = args
        self.env = dict(os.environ, AzureWebJobsStorage=connection, BUS_PREFIX="",
                        BUS_DURABLE_HUB="BusDashboard", AzureWebJobsScriptRoot=str(ROOT))
        os.environ.update(self.env)
        sys.path.insert(0, str(ROOT))
        import function_app  # reads its settings at import, like under the worker

        self.app: Any = function_app
        self.bus = function_app.bus_functions.bus
        self.workdir = Path(tempfile.mkdtemp(prefix="bus-dashboard-"))

    def run(self) -> int:
        print(f"Azurite is up; provisioning the sample app (logs in {self.workdir})", flush=True)
        self.bus.provision()
        self._corrupt_account()
        host = start_host(self.workdir, self.env)
        dashboard: subprocess.Popen[bytes] | None = None
        try:
            self._send()
            url = f"http://{self.args.host}:{self.args.port}/"
            dashboard = subprocess.Popen(
                [sys.executable, "-m", "bus", "dashboard", "--app", "function_app",
                 "--allow-actions", "--host", self.args.host, "--port", str(self.args.port)],
                cwd=ROOT, env=self.env, start_new_session=True)  # Ctrl-C is ours to pass on
            print(f"\nThe dashboard (actions allowed): {url}\nCtrl-C stops it, the local host "
                  "and Azurite.\n", flush=True)
            self._repair_when_poisoned(host, dashboard)
            return dashboard.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            if dashboard is not None and dashboard.poll() is None:
                dashboard.send_signal(signal.SIGINT)
                try:
                    dashboard.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    dashboard.kill()
            stop_host(host)
            print("stopped the dashboard, the local host and Azurite", flush=True)

    def _corrupt_account(self) -> None:
        """An account row billing cannot add to: every OrderPlaced of that customer fails."""
        from bus.storage import Entity

        self.bus.storage.tables.insert(
            self.bus.names.state_table("billing"),
            Entity(CORRUPT_CUSTOMER, "account", {"balance_cents": 0.5, "invoices": 0}))

    def _send(self) -> None:
        place = self.app.PlaceOrder
        for i in range(self.args.orders):
            self.bus.send(place(order_id=f"order-{i:04d}", customer=f"customer-{i % 7:02d}",
                                amount_cents=500 + (i * 37) % 9500),
                          correlation_id=f"conversation-{i:04d}")
        for i in range(self.args.failing):
            self.bus.send(place(order_id=f"order-corrupt-{i}", customer=CORRUPT_CUSTOMER,
                                amount_cents=1200 + i),
                          correlation_id=f"conversation-corrupt-{i}")
        for i in range(2):
            self.bus.send(place(order_id=f"order-later-{i}", customer="customer-00",
                                amount_cents=700), delay=3600.0)
        queue = self.bus.names.queue("orders")
        self.bus.storage.queues.send(queue, "%%% not base64 %%%")
        self.bus.storage.queues.send(queue, "e29vcHM=")  # base64 of "{oops": not an envelope
        print(f"sent {self.args.orders} orders, {self.args.failing} of {CORRUPT_CUSTOMER} "
              "(its account row is corrupt), 2 scheduled an hour out, 2 undecodable bodies",
              flush=True)

    def _repair_when_poisoned(self, host: subprocess.Popen[bytes],
                              dashboard: subprocess.Popen[bytes]) -> None:
        """Wait until billing has poisoned every order of the corrupt customer, then repair
        the row: replaying them from the dashboard then bills each once."""
        letters = self.bus.poisoned("billing")
        deadline = time.monotonic() + 300
        while len(letters.entries()) < self.args.failing:
            if host.poll() is not None or dashboard.poll() is not None or \
                    time.monotonic() > deadline:
                which = "the local host" if host.poll() is not None else "the dashboard"
                print(f"{which} stopped, or billing's poison queue did not fill in 5 minutes "
                      f"(logs in {self.workdir})", flush=True)
                return
            time.sleep(1)
        from bus.storage import Entity

        self.bus.storage.tables.replace(
            self.bus.names.state_table("billing"),
            Entity(CORRUPT_CUSTOMER, "account", {"balance_cents": 0, "invoices": 0}))
        print(f"billing poisoned the {self.args.failing} orders of {CORRUPT_CUSTOMER}; its "
              "account row is repaired now: replay them from the Poisoned messages page",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
