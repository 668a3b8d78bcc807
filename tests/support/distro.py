"""A stand-in for Microsoft's Azure Monitor distro (``azure.monitor.opentelemetry``): it records
the calls to ``configure_azure_monitor`` instead of installing exporters (no Application
Insights resource is reachable from the tests)."""

from __future__ import annotations

import types
from typing import Any


class FakeDistro(types.ModuleType):
    """``azure.monitor.opentelemetry`` with a configure_azure_monitor that only records."""

    def __init__(self) -> None:
        super().__init__("azure.monitor.opentelemetry")
        self.calls: list[dict[str, Any]] = []

    def configure_azure_monitor(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
