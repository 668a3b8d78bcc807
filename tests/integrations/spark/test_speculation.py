"""Speculative execution for real: Spark copies a slow publishing task while it still runs, on
a standalone cluster of two workers (tests/integrations/spark/cluster.py), and both attempts send
the same rows at once. Each row is still sent once, and the job reports every row published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark[sql] is pinned in requirements-dev.txt")

import pyspark

import bus.spark
from bus import Bus
from bus.adapters.azure import AzureStorage
from tests.integrations.spark.cluster import ROOT, standalone_cluster
from tests.integrations.spark.contracts import RecordSale
from tests.integrations.spark.speculate import PARTITIONS, ROWS_PER_PARTITION

pytestmark = pytest.mark.azurite

ROWS = PARTITIONS * ROWS_PER_PARTITION
SPARK_4 = int(pyspark.__version__.split(".")[0]) >= 4


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as url:
        yield url


@pytest.mark.parametrize("via", [
    pytest.param("format", marks=pytest.mark.skipif(
        not SPARK_4, reason="format('bus') needs Spark 4's Python Data Source API")),
    "publish"])
def test_a_speculative_copy_sending_beside_its_task_sends_each_row_once(
        master: str, azurite_connection: str, prefix: str, tmp_path: Path, via: str) -> None:
    bus.spark.subscribe("sink", connection_string=azurite_connection, prefix=prefix)
    markers = tmp_path / "markers"
    markers.mkdir()
    job = subprocess.run(
        [sys.executable, "-m", "tests.integrations.spark.speculate", master, azurite_connection,
         prefix, str(markers), via],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert job.returncode == 0, job.stderr[-3000:]
    attempts = sorted(p.name for p in markers.iterdir())
    assert "attempt-0-1" in attempts, attempts  # Spark did copy partition 0's task
    result = json.loads(job.stdout.strip().splitlines()[-1])
    assert (result["rows"], result["published"], result["already_sent"]) == (ROWS, ROWS, 0)
    client = Bus(AzureStorage.from_connection_string(azurite_connection), prefix=prefix,
                 routes={RecordSale: "sink"})
    tokens = list(client.parts.inbox.all("sink"))
    assert len(tokens) == ROWS  # one token per row: nothing sent twice, nothing lost
