"""Running the local host as a subprocess, as the demos do: start it, stop it gracefully."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_host(workdir: Path, env: Mapping[str, str],
               script_root: Path = ROOT) -> subprocess.Popen[bytes]:
    """``python -m devhost`` on the function_app.py of ``script_root`` (this repository's by
    default); its log goes to ``workdir/devhost.log`` and its counters to
    ``workdir/stats.json`` when it stops."""
    log = open(workdir / "devhost.log", "wb")  # noqa: SIM115 - lives with the host
    return subprocess.Popen(
        [sys.executable, "-m", "devhost", "--script-root", str(script_root), "--log-level",
         "WARNING", "--stats-file", str(workdir / "stats.json")],
        cwd=ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT)


def stop_host(host: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM (the host finishes what it is doing and writes its stats), SIGKILL after
    ``timeout`` seconds."""
    host.send_signal(signal.SIGTERM)
    try:
        host.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        host.kill()
        host.wait()
