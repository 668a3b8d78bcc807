"""``python -m bus``: the operator command line (commands in bus/operations/cli.py)."""

from __future__ import annotations

from bus.operations.cli import main

if __name__ == "__main__":
    main()
