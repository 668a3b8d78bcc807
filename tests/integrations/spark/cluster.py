"""A Spark standalone cluster on this machine: a master and two one-core workers.

Spark launches a speculative copy of a slow task only on a host where no attempt of it runs
(``TaskSetManager``'s speculation skips hosts with an attempt), and not at all under a
``local`` master (the task scheduler starts its speculation thread only off local mode). So the
two workers bind to two loopback addresses, 127.0.0.2 and 127.0.0.3, which Spark takes for two
hosts. The processes are PySpark's own (``bin/spark-class``, shipped in the wheel).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@contextmanager
def standalone_cluster(logs: Path) -> Iterator[str]:
    """Start the cluster, yield its master URL once both workers registered; stop it."""
    port, ui = _free_port(), _free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "SPARK_HOME": str(_spark_class().parent.parent)}
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, host: str, *args: str) -> None:
        log = (logs / f"{name}.log").open("wb")
        processes.append(subprocess.Popen(
            [str(_spark_class()), *args, "--host", host],
            env={**env, "SPARK_LOCAL_IP": host}, stdout=log, stderr=subprocess.STDOUT))

    try:
        start("master", "127.0.0.1", "org.apache.spark.deploy.master.Master",
              "--port", str(port), "--webui-port", str(ui))
        master = f"spark://127.0.0.1:{port}"
        for number, host in enumerate(WORKER_HOSTS):
            start(f"worker-{number}", host, "org.apache.spark.deploy.worker.Worker",
                  "--cores", "1", "--memory", "1g", "--webui-port", "0", master)
        _wait_for_workers(ui, len(WORKER_HOSTS), processes, logs)
        yield master
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
            if process.poll() is None:
                process.kill()


def _wait_for_workers(ui: int, wanted: int, processes: list[subprocess.Popen[bytes]],
                      logs: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise RuntimeError(f"a Spark process exited; see the logs in {logs}")
        with suppress(OSError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as page:
                state = json.load(page)
            if int(state.get("aliveworkers", 0)) >= wanted:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the Spark workers did not register within 90 s; see {logs}")
