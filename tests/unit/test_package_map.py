"""The package map in bus/protocol/__init__.py names every module of the protocol."""

from __future__ import annotations

import re
from pathlib import Path

import bus.protocol

PROTOCOL = Path(bus.protocol.__file__).parent


def test_every_protocol_module_is_in_the_map() -> None:
    named = set(re.findall(r"^\* ``(\w+)``", bus.protocol.__doc__ or "", re.M))
    modules = {p.stem for p in PROTOCOL.glob("*.py") if p.stem != "__init__"}
    assert named == modules, f"missing from the map: {modules - named}; gone: {named - modules}"
