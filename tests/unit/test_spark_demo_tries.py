"""``make spark-demo`` tries a Spark step again when Spark fails the way a busy machine makes
it fail, and otherwise ends with what failed instead of a Java trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark.demo import SPARK_TRIES, spark_step


def flaky(failures: list[Exception]) -> object:
    def step() -> str:
        if failures:
            raise failures.pop(0)
        return "done"
    return step


def test_a_worker_that_did_not_connect_back_is_tried_again(tmp_path: Path) -> None:
    said: list[str] = []
    slow = RuntimeError("org.apache.spark.SparkException: Python worker failed to connect "
                        "back.\n\tat org.apache.spark...")
    result = spark_step("running the producer job", flaky([slow]), say=said.append,
                        logs=tmp_path, sleep=lambda s: None)
    assert result == ("done", 2)
    assert said == ["Spark failed while running the producer job (org.apache.spark."
                    "SparkException: Python worker failed to connect back.): a busy machine; "
                    "trying again (2 of 3)"]


def test_the_last_try_ends_the_demo_with_what_failed(tmp_path: Path) -> None:
    slow = [RuntimeError("Java gateway process exited before sending its port number")
            for _ in range(SPARK_TRIES)]
    with pytest.raises(SystemExit, match=r"Spark failed while starting Spark \(after 3 tries: "
                                         r"Java gateway process exited"):
        spark_step("starting Spark", flaky(slow), say=lambda s: None, logs=tmp_path,
                   sleep=lambda s: None)


def test_any_other_failure_is_not_tried_again(tmp_path: Path) -> None:
    tries: list[str] = []
    with pytest.raises(SystemExit, match=r"running the producer job \(ValueError: bad row"):
        spark_step("running the producer job", flaky([ValueError("ValueError: bad row")]),
                   say=tries.append, logs=tmp_path, sleep=lambda s: None)
    assert tries == []
