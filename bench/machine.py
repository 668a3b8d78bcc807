"""What the numbers were measured on: the machine, the versions, the commit."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("azure-core", "azure-storage-queue", "azure-storage-blob", "azure-data-tables",
            "pydantic", "kombu")


def _first(path: str, prefix: str, sep: str = ":") -> str:
    """The value of the first line of ``path`` that starts with ``prefix``."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix) and sep in line:
                return line.split(sep, 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def memory() -> str:
    kib = _first("/proc/meminfo", "MemTotal").split()[0]
    return f"{int(kib) / 1024 / 1024:.1f} GiB" if kib.isdigit() else "unknown"


def load_average() -> str:
    """The 1-minute load average: other work on the machine makes every number noisier."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except (OSError, IndexError):
        return "?"


def azurite_version() -> str:
    try:
        data = json.loads((ROOT / "node_modules" / "azurite" / "package.json").read_text())
        return str(data["version"])
    except (OSError, ValueError, KeyError):
        return "unknown"


def commit() -> str:
    head = _run("git", "rev-parse", "--short", "HEAD")
    dirty = _run("git", "status", "--porcelain", "--untracked-files=no")
    return f"{head} + uncommitted changes" if dirty and dirty != "unknown" else head


def describe() -> dict[str, str]:
    """Machine and versions, as label -> value, in display order."""
    info = {
        "CPU": f"{os.cpu_count()} x {_first('/proc/cpuinfo', 'model name')}",
        "RAM": memory(),
        "OS": _first("/etc/os-release", "PRETTY_NAME", "=").strip('"') + f" ({platform.release()})",
        "Python": platform.python_version(),
        "Node": _run("node", "--version"),
        "Azurite": azurite_version(),
    }
    for package in PACKAGES:
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = "not installed"
    info["commit"] = commit()
    return info
