"""One worker thread draining command hops on a fresh Azurite: the endpoint side's CPU per hop
without the benchmark's thread contention, for A/B comparisons of the hot path.

    .venv/bin/python -m bench.single --messages 800

The client first queues ``messages`` Pings (not measured); then one ``Worker`` of ``bench-a``
drains them in batches of 16 while the Python process's and Azurite's CPU are sampled.
Prints one line: Python and Azurite CPU ms per hop, wall ms per hop, storage operations per
hop, and the outcomes.
"""

from __future__ import annotations

import argparse
import logging
import time

from bench.cpu import CpuUse, sample
from bench.workload import HOP_FROM, Ping, hop_endpoints, partition_key
from bus import Bus
from bus.adapters.azure import AzureStorage
from bus.hosting.worker import Worker
from bus.testing.counting import counting_storage
from devhost.azurite import azurite


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.single", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=800)
    parser.add_argument("--partitions", type=int, default=512)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with azurite() as connection:
        client = Bus(AzureStorage.from_connection_string(connection), hop_endpoints(),
                     prefix="single")
        client.provision()
        storage, counter = counting_storage(AzureStorage.from_connection_string(connection))
        bus = Bus(storage, hop_endpoints(), prefix="single")
        for seq in range(args.messages):
            client.send(Ping(seq=seq, key=partition_key(seq, args.partitions),
                             sent_at=time.time()))
        worker = Worker(bus, HOP_FROM, batch_size=16, retry_delay=0)
        counter.reset()
        begin, done = sample(), 0
        while done < args.messages:
            done += worker.poll_once()
        used = CpuUse.between(begin, sample())
    python_ms, azurite_ms = used.per_unit_ms(args.messages)
    print(f"python {python_ms:.2f} ms/hop, azurite {azurite_ms:.2f} ms/hop, wall "
          f"{used.wall_s * 1000 / args.messages:.2f} ms/hop, storage operations "
          f"{counter.total() / args.messages:.2f}/hop, outcomes {worker.outcomes}")


if __name__ == "__main__":
    main()
