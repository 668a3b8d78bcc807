"""The public surface the simulation must drive, listed from the code, and how often runs drove it.

Every public operation - the bus's client and operator API with each optional parameter, the
objects its operator API returns (poisoned messages, deferrals, sessions, the sweeper), what a
handler is given (its context, its partition's state, its session), the endpoint and handler
options, maintenance, every ``python -m bus`` command with each option, and every route of the
dashboard's API with each optional parameter - is found by introspection: the classes' public
methods and properties and their signatures, the command line's click tree, the dashboard's
OpenAPI document. Nothing here is a list kept by hand except ``EXEMPT``: what is public but
not an operation on the bus, each with the reason.

``counting()`` wraps each of those operations (for the API, the methods themselves; for the
command line, each command's callback; the dashboard's routes are counted by the simulation's
driver, which calls the same route functions the API serves) and counts every call, and every
optional parameter given a value other than its default. ``python -m bus.testing.simulate
--surface`` prints the counts; tests/sim/test_surface.py fails when one is 0.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import click

from bus.client import Client
from bus.context import Context, PartitionState, SessionView
from bus.endpoint import Endpoint
from bus.hosting import maintenance
from bus.operations.cli import main as cli
from bus.operator import Operator

COMMAND = "python -m bus"
"""How command-line operations are named: ``python -m bus dlq replay --drop-expiry``."""
DASHBOARD = "dashboard"
"""How dashboard routes are named: ``dashboard POST /api/poisoned/{endpoint}/replay``."""

EXEMPT: dict[str, str] = {
    "Bus.pipeline": "reads the app's middleware names: no storage, no message",
    "Sessions.now": "the clock the session views are computed at",
    "PartitionState.operations": "the writes a commit collects: the bus calls it, not a user",
    "Context.outgoing": "what the handler has sent so far, for middleware: a view",
    f"{COMMAND} topology export": "writes the topology file from the app's code: no storage",
    f"{COMMAND} topology export --out": "as topology export",
    f"{COMMAND} topology export --prefix": "as topology export",
    f"{COMMAND} topology export --app": "as topology export",
    f"{COMMAND} topology show": "prints the app's topology: no storage",
    f"{COMMAND} topology show --app": "as topology show",
    f"{COMMAND} topology show --prefix": "as topology show",
    f"{COMMAND} topology check": "compares the topology file with the app's code: no storage",
    f"{COMMAND} topology check --app": "as topology check",
    f"{COMMAND} topology check --file": "as topology check",
    f"{COMMAND} contracts export": "writes the app's contracts as JSON Schema: no storage",
    f"{COMMAND} contracts export --app": "as contracts export",
    f"{COMMAND} contracts export --out": "as contracts export",
    f"{COMMAND} contracts check": "compares two sets of contracts: no storage",
    f"{COMMAND} contracts check --app": "as contracts check",
    f"{COMMAND} contracts check NEW": "as contracts check",
    f"{COMMAND} init": "writes a new app's files into a folder: no storage",
    f"{COMMAND} provision": "calls Bus.provision once, which every run drives",
    f"{COMMAND} provision --app": "as provision",
    f"{COMMAND} worker": "runs the polling worker (Worker.poll_once and maintenance_pass), "
                         "which the simulation's polling hosts and maintenance run",
    f"{COMMAND} worker --app": "as worker",
    f"{COMMAND} worker --endpoint": "as worker",
    f"{COMMAND} worker --until-idle": "as worker",
    f"{COMMAND} send": "calls Bus.send or Bus.publish once, which every run drives (delays, "
                       "correlation ids and destinations too)",
    f"{COMMAND} send PAYLOAD": "as send",
    f"{COMMAND} send --app": "as send",
    f"{COMMAND} send --to": "as send",
    f"{COMMAND} send --delay": "as send",
    f"{COMMAND} send --correlation-id": "as send",
    f"{COMMAND} host": "runs a Functions app folder under the local host, whose queue "
                       "triggers are QueueTrigger.deliver, which the simulation's Functions "
                       "hosts drive",
    f"{COMMAND} host --script-root": "as host",
    f"{COMMAND} host --until-idle": "as host",
    f"{COMMAND} host --timer-seconds": "as host",
    f"{COMMAND} host --lease-seconds": "as host",
    f"{COMMAND} host --stats-file": "as host",
    f"{COMMAND} host --log-level": "as host",
    f"{COMMAND} dashboard": "serves the dashboard, whose every API route is listed itself",
    f"{COMMAND} dashboard --app": "as dashboard",
    f"{COMMAND} dashboard --host": "as dashboard",
    f"{COMMAND} dashboard --port": "as dashboard",
    f"{COMMAND} dashboard --allowed-host": "as dashboard",
    f"{COMMAND} dashboard --allow-actions": "as dashboard",
    f"{COMMAND} dashboard --depth-seconds": "as dashboard",
    f"{DASHBOARD} GET /api/settings": "the dashboard's own settings: no storage",
}
"""Public names that are not operations on the bus, and why. Anything else public is an
operation the simulation must drive."""

_API = "Bus"
_HANDLER = (Context, PartitionState, SessionView)


# -- listing --------------------------------------------------------------------------------------
def operations(*, dashboard: bool = True) -> list[str]:
    """Every public operation, options included, less ``EXEMPT``; sorted.

    ``dashboard``: list the dashboard's API routes too (they need the dashboard's web stack,
    FastAPI, to build its OpenAPI document)."""
    return sorted(set(public(dashboard=dashboard)) - set(EXEMPT))


def public(*, dashboard: bool = True) -> list[str]:
    """Every public name the introspection finds, ``EXEMPT`` included; sorted."""
    found = [name for name, _ in _api()]
    found += [name for name, _ in _handler_side()]
    found += [name for name, _ in _endpoint_options()]
    found += [name for name, _ in _maintenance()]
    found += [name for name, _ in _commands()]
    if dashboard:
        found += dashboard_routes()
    return sorted(set(found))


def _api() -> Iterator[tuple[str, Callable[..., Any]]]:
    """``Bus.<method>`` and its options; then the operator objects its methods return."""
    for owner, prefix in _api_owners():
        for name, function in _public_functions(owner):
            yield from _named(f"{prefix}.{name}", function)


def _api_owners() -> list[tuple[type, str]]:
    """The classes of the bus's API and how their operations are named: the client's and
    the operator's as ``Bus``, then each class of the bus's own that their methods return
    (from the return type hints), by its name."""
    owners: list[tuple[type, str]] = [(Client, _API), (Operator, _API)]
    returned: list[type] = []
    for owner, _ in owners:
        for _, function in _public_functions(owner):
            hinted = typing.get_type_hints(function).get("return")
            if isinstance(hinted, type) and hinted.__module__.startswith("bus.") \
                    and hinted not in returned:
                returned.append(hinted)
    return owners + [(owner, owner.__name__) for owner in returned]


def _handler_side() -> Iterator[tuple[str, Callable[..., Any]]]:
    """What a handler is given: its context, the partition's state, the session's view."""
    for owner in _HANDLER:
        for name, function in _public_functions(owner):
            yield from _named(f"{owner.__name__}.{name}", function)


def _endpoint_options() -> Iterator[tuple[str, Callable[..., Any]]]:
    """An endpoint's options and a handler's (``Endpoint.handles``): the declarations that
    change what the protocol does, each given a value in some run."""
    yield from _named("Endpoint", Endpoint.__init__, plain=False)
    yield from _named("Endpoint.handles", Endpoint.handles, plain=False)


def _maintenance() -> Iterator[tuple[str, Callable[..., Any]]]:
    yield from _named("maintenance_pass", maintenance.maintenance_pass)


def _public_functions(owner: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    for name, value in vars(owner).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) and value.fget is not None:
            yield name, value.fget
        elif inspect.isfunction(value):
            yield name, value


def _named(operation: str, function: Callable[..., Any], *,
           plain: bool = True) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The operation, then ``operation(option=)`` for each parameter with a default."""
    if plain:
        yield operation, function
    for parameter in _options(function):
        yield f"{operation}({parameter.name}=)", function


def _options(function: Callable[..., Any]) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(function).parameters.values()
            if p.default is not inspect.Parameter.empty and not p.name.startswith("_")]


def _commands() -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every ``python -m bus`` command and each of its options (and optional arguments)."""
    for path, command in _leaves(cli, COMMAND):
        yield path, command.callback  # type: ignore[misc]
        for param in command.params:
            if not param.required:
                yield f"{path} {_flag(param)}", command.callback  # type: ignore[misc]


def _leaves(group: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    if isinstance(group, click.Group):
        for name, command in sorted(group.commands.items()):
            yield from _leaves(command, f"{path} {name}")
    else:
        yield path, group


def _flag(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name.upper()


def dashboard_routes() -> list[str]:
    """Each route of the dashboard's OpenAPI document, and ``<route> <name>=`` for each of its
    optional query parameters and optional fields of its body."""
    from bus.adapters.memory import InMemoryStorage
    from bus.bus import Bus
    from bus.operations.dashboard import create_app

    document = create_app(Bus(InMemoryStorage(), [Endpoint("any")])).openapi()
    schemas = document.get("components", {}).get("schemas", {})
    found: list[str] = []
    for path, methods in document["paths"].items():
        for method, spec in methods.items():
            route = f"{DASHBOARD} {method.upper()} {path}"
            found.append(route)
            found += [f"{route} {p['name']}=" for p in spec.get("parameters", [])
                      if p.get("in") == "query" and not p.get("required")]
            body = spec.get("requestBody", {}).get("content", {}).get("application/json", {})
            schema = _resolved(body.get("schema", {}), schemas)
            required = set(schema.get("required", ()))
            found += [f"{route} {name}=" for name in schema.get("properties", {})
                      if name not in required or not spec["requestBody"].get("required")]
    return found


def _resolved(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """A body's schema with its ``$ref`` (or a nullable body's ``anyOf`` of one) followed."""
    for option in schema.get("anyOf", ()):
        if "$ref" in option:
            schema = option
    ref = schema.get("$ref")
    return dict(schemas[ref.rsplit("/", 1)[1]]) if ref else schema


# -- counting -------------------------------------------------------------------------------------
@contextlib.contextmanager
def counting(counts: Counter[str]) -> Iterator[Counter[str]]:
    """Count into ``counts`` every call of a listed operation (and its options) while inside.

    Wraps the methods in their classes and the commands' callbacks in the click tree, and
    puts them back on the way out. The dashboard's routes are counted by ``count_route``."""
    undo: list[Callable[[], None]] = []
    try:
        for owner, names in _owners().items():
            for attribute, operation in names.items():
                undo.append(_wrap_attribute(owner, attribute, operation, counts))
        for path, command in _leaves(cli, COMMAND):
            undo.append(_wrap_command(path, command, counts))
        undo.append(_wrap_attribute(maintenance, "maintenance_pass", "maintenance_pass",
                                    counts))
        yield counts
    finally:
        for put_back in reversed(undo):
            put_back()


def _owners() -> dict[Any, dict[str, str]]:
    """The classes whose attributes are wrapped: attribute -> operation name."""
    owners: dict[Any, dict[str, str]] = {}
    named = [*_api_owners(), *((owner, owner.__name__) for owner in _HANDLER)]
    for owner, prefix in named:
        for name, _ in _public_functions(owner):
            owners.setdefault(owner, {})[name] = f"{prefix}.{name}"
    owners[Endpoint] = {"__init__": "Endpoint", "handles": "Endpoint.handles"}
    return owners


def _wrap_attribute(owner: Any, attribute: str, operation: str,
                    counts: Counter[str]) -> Callable[[], None]:
    original = inspect.getattr_static(owner, attribute)
    plain = attribute not in ("__init__", "handles") or owner is not Endpoint
    if isinstance(original, property):
        assert original.fget is not None
        getter = _counted(original.fget, operation, counts, plain=plain)
        setattr(owner, attribute, property(getter, original.fset, original.fdel,
                                           original.__doc__))
    else:
        setattr(owner, attribute, _counted(original, operation, counts, plain=plain))
    return lambda: setattr(owner, attribute, original)


def _counted(function: Callable[..., Any], operation: str, counts: Counter[str], *,
             plain: bool = True) -> Callable[..., Any]:
    signature = inspect.signature(function)
    options = {p.name: p.default for p in _options(function)}

    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        if plain:
            counts[operation] += 1
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            given = {}
        for name, default in options.items():
            if name in given and not _same(given[name], default):
                counts[f"{operation}({name}=)"] += 1
        return function(*args, **kwargs)

    return counted


def _same(value: object, default: object) -> bool:
    try:
        return value is default or bool(value == default)
    except Exception:  # a value that cannot be compared is not the default
        return False


def _wrap_command(path: str, command: click.Command,
                  counts: Counter[str]) -> Callable[[], None]:
    original = command.callback
    assert original is not None
    flags = {param.name: (_flag(param), param.default) for param in command.params
             if not param.required and param.name is not None}

    @functools.wraps(original)
    def counted(**kwargs: Any) -> Any:
        counts[path] += 1
        for name, (flag, default) in flags.items():
            value = kwargs.get(name)
            if value is not None and not _same(value, default) and value != ():
                counts[f"{path} {flag}"] += 1
        return original(**kwargs)

    command.callback = counted

    def put_back() -> None:
        command.callback = original

    return put_back


def count_route(counts: Counter[str], method: str, path: str, options: list[str]) -> None:
    """A call of the dashboard's route ``method path`` with ``options`` given values."""
    route = f"{DASHBOARD} {method} {path}"
    counts[route] += 1
    for name in options:
        counts[f"{route} {name}="] += 1
