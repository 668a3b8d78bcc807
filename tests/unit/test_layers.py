"""No module under bus/ imports from a layer after its own, in the order docs/architecture.md
writes ("Layers"); every module is in a layer."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import bus

PACKAGE = Path(bus.__file__).parent
DOC = PACKAGE.parent / "docs" / "architecture.md"
LAYER_LINE = re.compile(r"^\d+\. \*\*(?P<name>[^*]+)\*\*: (?P<groups>.+)$")


def layers() -> list[tuple[str, list[list[str]]]]:
    """(layer name, its groups of module prefixes), in the document's order."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    found = [(m["name"], [re.findall(r"`([\w.]+)`", group) for group in m["groups"].split(";")])
             for line in section.splitlines() if (m := LAYER_LINE.match(line))]
    assert found, f"no layers listed under '## Layers' in {DOC}"
    return found


def place(module: str, order: list[tuple[str, list[list[str]]]]) -> tuple[int, int] | None:
    """(layer, group) of ``module``: the longest prefix listed that names it."""
    best: tuple[int, int, int] | None = None
    for index, (_, groups) in enumerate(order):
        for group_index, group in enumerate(groups):
            for prefix in group:
                if (module == prefix or module.startswith(prefix + ".")) and (
                        best is None or len(prefix) > best[0]):
                    best = (len(prefix), index, group_index)
    return None if best is None else (best[1], best[2])


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(module: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of the package in ``path``, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names
                        if alias.name.split(".")[0] == "bus")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*kept, *([node.module] if node.module else [])])
            if base.split(".")[0] == "bus":
                for alias in node.names:
                    name = f"{base}.{alias.name}"
                    yield node.lineno, name if name in known else base


def test_every_module_is_in_a_layer() -> None:
    order = layers()
    assert [m for m in sorted(modules()) if place(m, order) is None] == []


def test_no_module_imports_from_a_later_layer_or_a_sibling_group() -> None:
    order = layers()
    found = modules()
    against = []
    for module, path in sorted(found.items()):
        home = place(module, order)
        for line, target in imported(module, path, set(found)):
            there = place(target, order)
            if home is None or there is None:
                continue
            later = there[0] > home[0]
            sibling = there[0] == home[0] and there[1] != home[1]
            if later or sibling:
                against.append(f"{path.relative_to(PACKAGE.parent)}:{line} {module} "
                               f"({order[home[0]][0]}) imports {target} ({order[there[0]][0]})")
    assert against == [], "imports against docs/architecture.md's layers:\n" + "\n".join(against)


def test_the_check_sees_an_import_against_the_layers(tmp_path: Path) -> None:
    """The parser finds imports wherever they stand (a function, TYPE_CHECKING)."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from bus.hosting import worker\n"
                      "def f():\n    import bus.protocol.outbox.slot\n")
    names = [name for _, name in imported("bus.probe", source, set(modules()))]
    assert names == ["bus.hosting.worker", "bus.protocol.outbox.slot"]
    assert place("bus.hosting.worker", layers())[0] > place("bus.storage.ports", layers())[0]
