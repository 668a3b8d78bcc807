"""docs/architecture.md's module table names every module of the package: a file by its
path, or the folder that holds it."""

from __future__ import annotations

import re
from pathlib import Path

import bus

PACKAGE = Path(bus.__file__).parent
ROOT = PACKAGE.parent
DOC = ROOT / "docs" / "architecture.md"


def listed() -> set[str]:
    """Paths the table names, relative to the repository: ``bus/endpoint.py``, then
    ``messages.py`` in the same folder; a folder ends with ``/``."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Modules and their one job", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for token in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            if "/" in token:
                folder = token if token.endswith("/") else token.rpartition("/")[0] + "/"
                names.add(token)
            else:
                names.add(folder + token)
    return names


def test_every_module_is_in_the_table() -> None:
    names = listed()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue  # the package's face: `import bus` (docs/architecture.md, "Layers")
        folders = {relative.rsplit("/", depth)[0] + "/" for depth in
                   range(1, relative.count("/") + 1)}
        if relative not in names and not (folders & names) and not (
                path.name == "__init__.py" and relative.removesuffix("__init__.py") in names):
            missing.append(relative)
    assert missing == [], ("docs/architecture.md's module table does not name: "
                           + ", ".join(missing))


def test_every_entry_names_a_module_or_folder() -> None:
    assert sorted(n for n in listed() if not (ROOT / n).exists()) == []
