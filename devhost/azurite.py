"""Start and stop a real Azurite (installed into node_modules by `make test` / `make demo`).

``python -m devhost.azurite`` (``make azurite``) starts it for a person: the default ports, so
``UseDevelopmentStorage=true`` reaches it, data kept in ``.azurite/``, and the one flag the
pinned SDKs need (``--skipApiVersionCheck``: they send a newer storage API version than the
newest Azurite on npm accepts).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURITE = ROOT / "node_modules" / "azurite" / "dist" / "src" / "azurite.js"
ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
       "K1SZFPTOtr/KBHBeksoGMGw==")
DEFAULT_PORTS = (10000, 10001, 10002)
FLAGS = ("--skipApiVersionCheck", "--loose", "--disableTelemetry")
"""What the project always passes: the pinned SDKs' API version, lenient headers, no
telemetry."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports() -> tuple[int, int, int]:
    return (_free_port(), _free_port(), _free_port())


class PortTaken(RuntimeError):
    """Azurite could not listen on a port: another process had it."""


def connection_string(blob: int, queue: int, table: int, scheme: str = "http") -> str:
    base = f"{scheme}://127.0.0.1:{{}}/{ACCOUNT}"
    return (f"DefaultEndpointsProtocol={scheme};AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={base.format(blob)};QueueEndpoint={base.format(queue)};"
            f"TableEndpoint={base.format(table)};")


class Azurite:
    """One Azurite process; ``stop()`` then ``start()`` brings it back on the same ports (with
    a ``location``, with the same data)."""

    def __init__(self, *, location: Path | None = None,
                 ports: tuple[int, int, int] | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: a certificate and its key (PEM): then it serves HTTPS and also takes
        Entra ID bearer tokens (``--oauth basic``: it checks a token's audience, issuer and
        expiry, not its signature)."""
        if not AZURITE.exists():
            raise RuntimeError(f"Azurite is not installed at {AZURITE}: run `make test` "
                               "(it runs `npm ci`), or `npm ci` yourself")
        self.location = location
        self._chosen = ports is None  # ours to choose again if another process takes one
        self.ports = ports or _free_ports()
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def connection_string(self) -> str:
        return connection_string(*self.ports, scheme=self.scheme)

    @property
    def endpoints(self) -> dict[str, str]:
        """Service -> URL, for a connection by account (``AzureStorage.from_endpoints``)."""
        return {service: f"{self.scheme}://127.0.0.1:{port}/{ACCOUNT}"
                for service, port in zip(("blob", "queue", "table"), self.ports, strict=True)}

    def command(self) -> list[str]:
        storage = (["--location", str(self.location)] if self.location
                   else ["--inMemoryPersistence"])
        blob, queue, table = self.ports
        secure = (["--oauth", "basic", "--cert", str(self.tls[0]), "--key", str(self.tls[1])]
                  if self.tls else [])
        return ["node", str(AZURITE), *storage, "--silent", *FLAGS, *secure,
                "--blobHost", "127.0.0.1", "--queueHost", "127.0.0.1", "--tableHost",
                "127.0.0.1", "--blobPort", str(blob), "--queuePort", str(queue),
                "--tablePort", str(table)]

    def start(self) -> str:
        """Start it and wait until every port listens; the connection string. Ports it chose
        itself are free when chosen, but another process may bind one before Azurite does:
        then it chooses again (a few times) instead of failing."""
        for attempt in range(3):
            self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, start_new_session=True)
            try:
                _wait_listening(self.process, list(self.ports))
                return self.connection_string
            except PortTaken:
                self.stop()
                if not self._chosen or attempt == 2:
                    raise
                self.ports = _free_ports()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def azurite() -> Iterator[str]:
    """Yield a connection string to a fresh in-memory Azurite; always stop it afterwards."""
    emulator = Azurite()
    try:
        yield emulator.start()
    finally:
        emulator.stop()


def _wait_listening(process: subprocess.Popen[bytes], ports: list[int]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr else ""
            failure = PortTaken if "EADDRINUSE" in err else RuntimeError
            raise failure(f"Azurite exited with {process.returncode}: {err[-2000:]}")
        if all(_listening(port) for port in ports):
            return
        time.sleep(0.1)
    raise RuntimeError("Azurite did not listen within 30 s")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devhost.azurite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--location", type=Path, default=ROOT / ".azurite",
                        help="folder for Azurite's data (default: .azurite)")
    args = parser.parse_args()
    args.location.mkdir(parents=True, exist_ok=True)
    busy = [port for port in DEFAULT_PORTS if _listening(port)]
    if busy:
        raise SystemExit(f"ports {busy} are in use: another Azurite is probably running "
                         "(stop it, or use it: it needs --skipApiVersionCheck)")
    emulator = Azurite(location=args.location, ports=DEFAULT_PORTS)
    emulator.start()
    print("Azurite is running on 127.0.0.1:10000-10002 (blob, queue, table), data in "
          f"{args.location}.\nlocal.settings.json: \"AzureWebJobsStorage\": "
          "\"UseDevelopmentStorage=true\".  Ctrl-C stops it.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while emulator.process is not None and emulator.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
