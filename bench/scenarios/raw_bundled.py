"""Scenario 1b, the raw hop with bundling sends (see ``bench.scenarios.raw``)."""

from __future__ import annotations

from bench.scenarios.raw import run_bundled as run

__all__ = ["run"]
