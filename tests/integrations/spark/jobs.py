"""Functions the Spark tests ship to the workers (importable there as
tests.integrations.spark.jobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


class FailOnce:
    """A mapInPandas function that passes rows through in chunks of 50 and, in partition
    ``partition``'s first attempt, raises after ``after`` rows: a task failing mid-partition
    that Spark then retries. Leaves ``marker`` behind as proof that it failed."""

    def __init__(self, marker: Path, partition: int = 1, after: int = 150) -> None:
        self.marker = str(marker)
        self.partition = partition
        self.after = after

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        failing = context.partitionId() == self.partition and context.attemptNumber() == 0
        emitted = 0
        for frame in frames:
            for start in range(0, len(frame), 50):
                chunk = frame.iloc[start:start + 50]
                yield chunk
                emitted += len(chunk)
                if failing and emitted >= self.after:
                    Path(self.marker).write_text(f"failed after {emitted} rows")
                    raise RuntimeError("injected failure in the middle of a partition")


def azurite_sas() -> Any:
    """A ``credential_provider`` for the tests: an account SAS for Azurite's well-known account,
    made in whichever process needs it (the driver, each Python worker)."""
    from datetime import datetime, timedelta, timezone

    from azure.core.credentials import AzureSasCredential
    from azure.storage.blob import generate_account_sas

    from devhost.azurite import ACCOUNT, KEY

    return AzureSasCredential(generate_account_sas(
        ACCOUNT, KEY, resource_types="sco", permission="rwdlacup",
        expiry=datetime.now(timezone.utc) + timedelta(hours=1), services="bqt"))


class StallUntilCopied:
    """A mapInPandas function that passes rows through in chunks of 50 and lets a task's
    speculative copy run beside it: partition ``partition``'s first attempt, after ``after``
    rows, waits until a later attempt of it has started (at most ``patience`` seconds), then
    goes on, so both attempts send the partition's rows at the same time. Every attempt leaves a
    marker ``attempt-<partition>-<number>`` in ``markers``."""

    def __init__(self, markers: Path, partition: int = 0, after: int = 700,
                 patience: float = 120.0) -> None:
        self.markers = str(markers)
        self.partition = partition
        self.after = after
        self.patience = patience

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        markers = Path(self.markers)
        (markers / f"attempt-{context.partitionId()}-{context.attemptNumber()}").touch()
        stalling = context.partitionId() == self.partition and context.attemptNumber() == 0
        emitted = 0
        for frame in frames:
            for start in range(0, len(frame), 50):
                chunk = frame.iloc[start:start + 50]
                yield chunk
                emitted += len(chunk)
                if stalling and emitted >= self.after:
                    stalling = False
                    deadline = time.monotonic() + self.patience
                    while (not list(markers.glob(f"attempt-{self.partition}-[1-9]*"))
                           and time.monotonic() < deadline):
                        time.sleep(0.2)
