"""Start and stop a real Azurite (installed into node_modules by `make test` / `make demo`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURITE = ROOT / "node_modules" / "azurite" / "dist" / "src" / "azurite.js"
ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
       "K1SZFPTOtr/KBHBeksoGMGw==")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connection_string(blob: int, queue: int, table: int) -> str:
    base = f"http://127.0.0.1:{{}}/{ACCOUNT}"
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={base.format(blob)};QueueEndpoint={base.format(queue)};"
            f"TableEndpoint={base.format(table)};")


@contextlib.contextmanager
def azurite() -> Iterator[str]:
    """Yield a connection string to a fresh in-memory Azurite; always stop it afterwards."""
    if not AZURITE.exists():
        raise RuntimeError(f"Azurite is not installed at {AZURITE}: run `make test` "
                           "(it runs `npm ci`), or `npm ci` yourself")
    ports = [_free_port() for _ in range(3)]
    process = subprocess.Popen(
        ["node", str(AZURITE), "--inMemoryPersistence", "--silent", "--skipApiVersionCheck",
         "--loose", "--disableTelemetry", "--blobHost", "127.0.0.1", "--queueHost",
         "127.0.0.1", "--tableHost", "127.0.0.1", "--blobPort", str(ports[0]),
         "--queuePort", str(ports[1]), "--tablePort", str(ports[2])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_listening(process, ports)
        yield connection_string(*ports)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_listening(process: subprocess.Popen[bytes], ports: list[int]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"Azurite exited with {process.returncode}: {err[-2000:]}")
        if all(_listening(port) for port in ports):
            return
        time.sleep(0.1)
    raise RuntimeError("Azurite did not listen within 30 s")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
