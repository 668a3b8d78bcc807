"""``python -m bus init FOLDER``: a new Functions app on the bus, ready to run on Azurite.

It writes what ``func init`` would, shaped for the bus: ``function_app.py`` with one endpoint
and its handler, ``host.json`` (the queue settings the bus expects), ``local.settings.json``
for Azurite, ``requirements.txt`` (this package, with the Functions extra), ``send.py`` (a
plain script that sends one message), ``.funcignore``, the Bicep that deploys it (``infra/``,
with ``infra/topology.json`` generated from the new app) and a README with the commands to
run next. It refuses a folder that already holds any of those files: nothing is overwritten.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bus.errors import ConfigurationError
from bus.operations.apps import AppError, load_bus
from bus.operations.topology_file import TopologyFile

INFRA = Path(__file__).resolve().parent / "infra"
"""The Bicep this package ships (the same files the project deploys its own app with)."""
DISTRIBUTION = "eobus"

CONTRACTS = '''"""The messages of {name}: shared by the app and whoever sends to it (send.py)."""

from bus import Command, Event


class Greet(Command):
    """Ask the greeter to greet someone."""

    name: str


class Greeted(Event):
    """Someone was greeted (every subscriber gets a copy)."""

    name: str
    times: int
'''

FUNCTION_APP = '''"""{name}: an Azure Functions app on the exactly-once bus.

Run it locally: README.md. Each handler's state changes and sends commit together, and each
message's effect happens exactly once, however often the queue delivers it.
"""

from __future__ import annotations

import azure.durable_functions as df

from bus import Context, Endpoint
from bus.hosting.functions import BusFunctions
from contracts import Greet, Greeted

greeter = Endpoint("greeter")


@greeter.handles(Greet, partition=lambda m: m.name)
def greet(message: Greet, ctx: Context) -> None:
    seen = (ctx.state.get("greetings") or {{}}).get("times", 0)
    ctx.state.put("greetings", {{"times": seen + 1}})
    ctx.publish(Greeted(name=message.name, times=seen + 1))


app = df.DFApp()
bus_functions = BusFunctions([greeter])
app.register_functions(bus_functions)
'''

SEND = '''"""Send one Greet to the app, from a plain script: python send.py [NAME]."""

import sys

from bus import connect
from contracts import Greet

bus = connect(routes={{Greet: "greeter"}})  # the storage and prefix of local.settings.json
bus.send(Greet(name=sys.argv[1] if len(sys.argv) > 1 else "world"))
print("sent")
'''

HOST_JSON = {
    "version": "2.0",
    "extensionBundle": {"id": "Microsoft.Azure.Functions.ExtensionBundle",
                        "version": "[4.*, 5.0.0)"},
    "extensions": {
        "queues": {"batchSize": 16, "newBatchThreshold": 8, "maxPollingInterval": "00:00:02",
                   "visibilityTimeout": "00:00:01", "maxDequeueCount": 5,
                   "messageEncoding": "base64"},
        "durableTask": {"hubName": "%BUS_DURABLE_HUB%",
                        "storageProvider": {"maxQueuePollingInterval": "00:00:10"}},
    },
    "functionTimeout": "00:10:00",
    "telemetryMode": "OpenTelemetry",
}

LOCAL_SETTINGS = {
    "IsEncrypted": False,
    "Values": {
        "FUNCTIONS_WORKER_RUNTIME": "python",
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        "BUS_PREFIX": "",
        "BUS_DURABLE_HUB": "{hub}",
    },
}

README = '''# {name}

An Azure Functions app on the exactly-once bus: `contracts.py` (its messages),
`function_app.py` (one endpoint, `greeter`), `send.py` (a plain script that sends it a
message), `infra/` (the Bicep that deploys it).

```sh
pip install -r requirements.txt     # once (from a wheel of yours: --find-links DIR)
npx azurite --silent --location .azurite --skipApiVersionCheck &   # storage, locally
python -m bus provision             # the queues, tables and topic files of local.settings.json
python send.py ada                  # a message, from a plain script
python -m bus host --until-idle     # the app handles what waits (or: func start)
python -m bus dashboard             # what happened, at http://127.0.0.1:8080/
```

Every command reads `local.settings.json` (the environment wins). After changing endpoints or
subscriptions, `python -m bus topology export` updates `infra/topology.json`; deploy with
`az deployment group create` and `func azure functionapp publish` (the bus's docs/deploy.md).
'''

FUNCIGNORE = ".venv\n.azurite\n__pycache__\nlocal.settings.json\ninfra\n"


class ScaffoldError(Exception):
    """The folder cannot take a new app: the message says why."""


def files(name: str) -> dict[str, str]:
    """The app's files (path -> text), the Bicep and its topology file aside."""
    hub = "".join(c for c in name.title() if c.isalnum())[:40] or "Bus"
    settings = json.loads(json.dumps(LOCAL_SETTINGS))
    settings["Values"]["BUS_DURABLE_HUB"] = f"{hub}Local"
    return {
        "contracts.py": CONTRACTS.format(name=name),
        "function_app.py": FUNCTION_APP.format(name=name),
        "send.py": SEND.format(),
        "host.json": json.dumps(HOST_JSON, indent=2) + "\n",
        "local.settings.json": json.dumps(settings, indent=2) + "\n",
        "requirements.txt": _requirement(),
        "README.md": README.format(name=name),
        ".funcignore": FUNCIGNORE,
    }


@dataclass(frozen=True)
class Scaffolded:
    """What ``init`` wrote (paths relative to the folder), and what it could not."""

    written: list[str]
    notes: list[str]


def init(folder: Path) -> Scaffolded:
    """Write a new app into ``folder`` (created if need be)."""
    written = {**files(folder.resolve().name), **{
        f"infra/{path.relative_to(INFRA)}": "" for path in _bicep()}}
    taken = sorted(p for p in [*written, "infra/topology.json"] if (folder / p).exists())
    if taken:
        raise ScaffoldError(f"{folder} already holds {', '.join(taken)}: choose an empty "
                            "folder (nothing is overwritten)")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files(folder.resolve().name).items():
        (folder / path).write_text(text, encoding="utf-8")
    for source in _bicep():
        target = folder / "infra" / source.relative_to(INFRA)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    notes = []
    try:
        _topology(folder)
    except (AppError, ConfigurationError) as exc:  # e.g. the Functions extra not installed
        notes.append(f"infra/topology.json not written ({exc}): run `python -m bus topology "
                     "export` in the folder once `pip install -r requirements.txt` is done")
    else:
        written["infra/topology.json"] = ""
    return Scaffolded(sorted(written), notes)


def _topology(folder: Path) -> None:
    """infra/topology.json from the new app (imported, as the topology commands do)."""
    for module in ("function_app", "contracts"):  # another app's, imported earlier
        sys.modules.pop(module, None)
    try:
        bus = load_bus("function_app", root=folder.resolve(), offline=True)
        text = TopologyFile.from_bus(bus, app="function_app").to_json()
    finally:
        for module in ("function_app", "contracts"):
            sys.modules.pop(module, None)
    (folder / "infra" / "topology.json").write_text(text, encoding="utf-8")


def _bicep() -> list[Path]:
    return sorted(p for p in INFRA.rglob("*")
                  if p.is_file() and p.suffix in (".bicep", ".sh", ".json")
                  and p.name != "topology.json")


def _requirement() -> str:
    """This package, at the version that wrote the app, with the Functions app's extra."""
    try:
        return f"{DISTRIBUTION}[functions]=={importlib.metadata.version(DISTRIBUTION)}\n"
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return (f"# pin the version of {DISTRIBUTION} you build or install\n"
                f"{DISTRIBUTION}[functions]\n")
