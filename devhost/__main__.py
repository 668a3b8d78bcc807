"""``python -m devhost``: this repository's name for ``python -m bus host`` (the local host)."""

from __future__ import annotations

import sys

from bus.operations.cli import main

if __name__ == "__main__":
    main(["host", *sys.argv[1:]], prog_name="python -m devhost")
