"""The public surface: what ``import bus`` offers, and every error a user may catch under
``BusError``."""

from __future__ import annotations

import inspect

import bus
import bus.errors
from bus.integrations.spark.options import OptionError
from bus.integrations.spark.writer import RowError


def test_the_package_exports_exactly_these_names() -> None:
    assert bus.__all__ == sorted(bus.__all__)
    assert set(bus.__all__) == {
        "connect",
        "Abandon", "Bus", "BusError", "Command", "ConfigurationError", "Contention", "Context",
        "Endpoint", "Event", "JsonSerializer", "Message", "MessageKindError", "Middleware",
        "NamingError", "NotProvisioned", "Outgoing", "PartitionState", "PayloadError",
        "QueueFull", "RecordTooLarge", "Reject", "RetryAfter", "RetryPolicy", "RoutingError",
        "SendFailed", "Serializer", "Settings", "StateError", "StorageError", "TopicError",
        "TransientError", "UnreadableRecord", "UnreadableVersion"}
    for internal in ("Envelope", "PayloadRef", "Outcome", "HandlerFailed", "Names"):
        assert not hasattr(bus, internal), internal


def test_every_error_is_a_bus_error() -> None:
    errors = [value for _, value in inspect.getmembers(bus.errors, inspect.isclass)
              if issubclass(value, Exception)]
    assert len(errors) >= 20
    for error in [*errors, OptionError, RowError]:
        assert issubclass(error, bus.errors.BusError), error
    exported = [getattr(bus, name) for name in bus.__all__]
    assert all(issubclass(e, bus.errors.BusError) for e in exported
               if isinstance(e, type) and issubclass(e, Exception)
               and e.__module__ != "bus.retry")  # RetryAfter, Reject: requests, not errors


def test_one_contention() -> None:
    import importlib
    import pkgutil

    import bus.protocol
    modules = [importlib.import_module(info.name) for info in
               pkgutil.walk_packages(bus.protocol.__path__, "bus.protocol.")]
    assert len(modules) > 30
    for module in modules:
        for name, value in vars(module).items():
            if name.endswith("Contention") and isinstance(value, type):
                assert value is bus.errors.Contention, (module.__name__, name)
