"""An app the Python worker refuses: an activity whose parameter is annotated
``dict[str, Any]`` (neither a class nor a ``typing`` generic)."""

from __future__ import annotations

from typing import Any

import azure.durable_functions as df

app = df.DFApp()


@app.activity_trigger(input_name="job")
def refused(job: dict[str, Any]) -> int:
    return len(job)


@app.activity_trigger(input_name="job")
def accepted(job: str) -> int:
    return len(job)
