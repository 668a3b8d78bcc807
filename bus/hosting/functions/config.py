"""App settings of the Functions app, read and checked once at start-up: the host's own (the
connection, the prefix, dispatch, threads, host.json) here, the bus's through
``Settings.read`` (``bus.settings``, the one reader of them).

Every problem is reported together, each with what to set, so a misconfigured app fails at
indexing time (before any message is taken) with a message a person can act on.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bus.adapters.select import DEFAULT_CONNECTION, has_connection, storage_from_settings
from bus.errors import ConfigurationError
from bus.naming import PREFIX_PATTERN
from bus.settings import Settings, setting_name
from bus.storage import Storage

INLINE_DISPATCH_MAX = 4
"""Default of ``BUS_INLINE_DISPATCH_MAX``: a record with at most this many outgoing copies is
dispatched inside the queue-triggered function; larger fan-outs go to the orchestration.
docs/performance.md has the measurement behind the number."""

STALLED_OUTBOX_SECONDS = 600.0
"""Default of ``BUS_STALLED_OUTBOX_SECONDS``: maintenance finishes outbox records older than
this (an orchestration that failed for good, or a host that died between commit and start)."""

DELIVERY_THREADS = 32
"""Default of ``BUS_DELIVERY_THREADS``: threads that run the endpoints' deliveries. An
invocation waiting for its shared claim round holds one (``bus.hosting.functions.rounds``), so
the threads bound how many invocations a round can hold: the event loop's default executor has
``min(32, cpus + 4)``, six on two cores (docs/functions.md, "Threads")."""


@dataclass(frozen=True)
class AppConfig:
    """What the bus needs from the Functions app's settings and host.json."""

    connection: str
    """Name of the app setting (or ``<name>__*`` identity settings) for the storage account."""
    prefix: str
    inline_dispatch_max: int
    stalled_outbox_seconds: float
    max_dequeue_count: int
    """host.json ``extensions.queues.maxDequeueCount``: the host poisons after this many."""
    hosted: tuple[str, ...] | None
    """``BUS_ENDPOINTS``: the endpoints this app runs (comma-separated; default all), so one
    codebase can be deployed as several apps that scale separately."""
    environ: Mapping[str, str]
    delivery_threads: int = DELIVERY_THREADS
    """``BUS_DELIVERY_THREADS``: threads the queue triggers run deliveries on (blocking storage
    calls); 0 uses the event loop's default executor."""
    settings: Settings = dataclasses.field(default_factory=Settings, repr=False)
    """The bus's settings: those given in code with every ``BUS_<NAME>`` app setting over them
    (docs/configuration.md; signing and encryption: docs/signing.md), and host.json's
    ``maxDequeueCount`` as the max delivery count."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         host_json: Path | None = None, *,
                         settings: Settings | None = None) -> AppConfig:
        """The app's configuration from ``environ`` (default ``os.environ``) and host.json;
        ``settings``: the bus's settings given in code, under the app settings."""
        env = dict(os.environ if environ is None else environ)
        problems: list[str] = []
        connection = env.get("BUS_CONNECTION", DEFAULT_CONNECTION)
        if not has_connection(env):
            problems.append(
                f"app setting {connection!r} is missing: set it to a storage connection string "
                f"(UseDevelopmentStorage=true for Azurite in local.settings.json), or set "
                f"'{connection}__accountName' to use the app's managed identity")
        prefix = env.get("BUS_PREFIX", "")
        if not PREFIX_PATTERN.match(prefix):
            problems.append(f"BUS_PREFIX={prefix!r} is invalid: up to 16 lower-case letters and "
                            "digits, starting with a letter (or empty)")
        inline = _number(env, "BUS_INLINE_DISPATCH_MAX", INLINE_DISPATCH_MAX, int, problems)
        stalled = _number(env, "BUS_STALLED_OUTBOX_SECONDS", STALLED_OUTBOX_SECONDS, float,
                          problems)
        max_dequeue = _max_dequeue_count(host_json or _default_host_json(), problems)
        hosted = tuple(n.strip() for n in env.get("BUS_ENDPOINTS", "").split(",") if n.strip())
        threads = _number(env, "BUS_DELIVERY_THREADS", DELIVERY_THREADS, int, problems)
        bus_settings = _with_host_deliveries(Settings.read(env, problems, base=settings),
                                             max_dequeue, env, problems)
        if problems:
            raise ConfigurationError("the bus cannot start:\n  - " + "\n  - ".join(problems))
        return cls(connection, prefix, int(inline), float(stalled), max_dequeue, hosted or None,
                   env, int(threads), bus_settings)

    def hosted_endpoints(self, defined: Sequence[str]) -> list[str]:
        """The endpoints to run here; an unknown name in ``BUS_ENDPOINTS`` is an error."""
        if self.hosted is None:
            return list(defined)
        unknown = [name for name in self.hosted if name not in defined]
        if unknown:
            raise ConfigurationError(
                f"BUS_ENDPOINTS names unknown endpoint(s) {', '.join(map(repr, unknown))}: this "
                f"app defines {', '.join(defined)}. Fix the setting or define the endpoint.")
        return list(self.hosted)

    def storage(self) -> Storage:
        """The configured backend (``bus.adapters.select``: a connection string, or
        ``memory:`` for the in-memory one), or the account with an identity; no request is
        made here."""
        return storage_from_settings({**self.environ, "BUS_CONNECTION": self.connection})


def _with_host_deliveries(settings: Settings, max_dequeue: int, env: Mapping[str, str],
                          problems: list[str]) -> Settings:
    """The host poisons after host.json's ``maxDequeueCount``: that is the max delivery count,
    and an app setting that says otherwise is a mistake to report, not a value to use."""
    name = setting_name("max_delivery_count")
    if env.get(name, "").strip() and settings.max_delivery_count != max_dequeue:
        problems.append(f"{name}={env[name]!r} disagrees with host.json's "
                        f"extensions.queues.maxDequeueCount ({max_dequeue}), which decides in "
                        f"a Functions app: remove {name} or change host.json")
    return settings.model_copy(update={"max_delivery_count": max_dequeue})


def _number(env: Mapping[str, str], name: str, default: float, kind: type[float] | type[int],
            problems: list[str]) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        problems.append(f"{name}={raw!r} is not a number")
        return default
    if value < 0:
        problems.append(f"{name}={raw!r} must not be negative")
    return value


def _default_host_json() -> Path:
    # The worker runs with the app's root as the working directory; so does the local host.
    root = os.environ.get("AzureWebJobsScriptRoot", ".")  # noqa: SIM112 - the host's name
    return Path(root) / "host.json"


def _max_dequeue_count(path: Path, problems: list[str]) -> int:
    if not path.exists():
        return 5  # the host's default
    try:
        queues = json.loads(path.read_text()).get("extensions", {}).get("queues", {})
    except ValueError as exc:
        problems.append(f"{path} is not valid JSON: {exc}")
        return 5
    value = queues.get("maxDequeueCount", 5)
    if not isinstance(value, int) or value < 1:
        problems.append(f"{path}: extensions.queues.maxDequeueCount must be a positive integer")
        return 5
    return value
