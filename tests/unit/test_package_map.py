"""The protocol's package maps: bus/protocol/__init__.py names each part (module or
sub-package) and each sub-package's docstring names each of its modules."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import bus.protocol

PROTOCOL = Path(bus.protocol.__file__).parent
SUBPACKAGES = sorted(p.parent.name for p in PROTOCOL.glob("*/__init__.py"))


def named(doc: str | None) -> set[str]:
    return set(re.findall(r"^\* ``(\w+)``", doc or "", re.M))


def test_every_protocol_part_is_in_the_map() -> None:
    parts = {p.stem for p in PROTOCOL.glob("*.py") if p.stem != "__init__"} | set(SUBPACKAGES)
    found = named(bus.protocol.__doc__)
    assert found == parts, f"missing from the map: {parts - found}; gone: {found - parts}"


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_every_module_is_in_its_package_map(package: str) -> None:
    module = importlib.import_module(f"bus.protocol.{package}")
    modules = {p.stem for p in (PROTOCOL / package).glob("*.py") if p.stem != "__init__"}
    found = named(module.__doc__)
    assert found == modules, (f"missing from {package}'s map: {modules - found}; "
                              f"gone: {found - modules}")


def test_the_protocol_has_parts() -> None:
    assert len(SUBPACKAGES) >= 7
