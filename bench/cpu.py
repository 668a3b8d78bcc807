"""Where the time goes: CPU seconds of this process and of the Azurite it started.

On a 2-core machine the Python process (one GIL) and Azurite (one Node thread) share the
cores; the CPU each spends per message says which of them a scenario is bound by.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children_cpu(marker: str) -> float:
    """CPU seconds (user + system) of this process's children whose command line contains
    ``marker`` (Linux /proc; 0 elsewhere)."""
    total = 0.0
    me = str(os.getpid())
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[1] != me:  # fields[1] is the parent pid
                continue
            if marker not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                continue
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass(frozen=True)
class CpuSample:
    python: float
    azurite: float
    wall: float


def sample() -> CpuSample:
    return CpuSample(time.process_time(), _children_cpu("azurite"), time.perf_counter())


@dataclass(frozen=True)
class CpuUse:
    python_s: float
    azurite_s: float
    wall_s: float

    @classmethod
    def between(cls, start: CpuSample, end: CpuSample) -> CpuUse:
        return cls(end.python - start.python, end.azurite - start.azurite,
                   end.wall - start.wall)

    def per_unit_ms(self, units: int) -> tuple[float, float]:
        """(Python, Azurite) CPU milliseconds per unit."""
        return self.python_s * 1000 / units, self.azurite_s * 1000 / units

    def as_dict(self) -> dict[str, float]:
        return {"python_s": self.python_s, "azurite_s": self.azurite_s, "wall_s": self.wall_s}
