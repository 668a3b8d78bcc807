"""The pieces of ``make infra-check``, and the topic-file script with a stand-in ``az``."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from bus.adapters.memory import InMemoryStorage
from bus.operations.infra_check import parse_checkov, parse_junit
from bus.protocol.copies.topics import Topics

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "infra" / "app" / "topics.sh"
TOPOLOGY = json.loads((ROOT / "infra" / "topology.json").read_text())


def check(check_id: str, **extra: object) -> dict[str, object]:
    return {"check_id": check_id, "resource": "Microsoft.Web/sites.app",
            "file_path": "/app/function.bicep", **extra}


def test_checkov_report_counts_and_lists_failures_and_skips() -> None:
    report = {"check_type": "bicep",
              "results": {"passed_checks": [check("CKV_AZURE_3")],
                          "failed_checks": [check("CKV_AZURE_17")],
                          "skipped_checks": [check("CKV_AZURE_213", check_result={
                              "result": "SKIPPED", "suppress_comment": " no HTTP endpoint"})],
                          "parsing_errors": []},
              "summary": {"passed": 1, "failed": 1, "skipped": 1, "parsing_errors": 0}}
    summary = parse_checkov(json.dumps(report))
    assert (summary.passed, summary.failed, summary.skipped) == (1, 1, 1)
    assert summary.failures == ("CKV_AZURE_17 Microsoft.Web/sites.app (/app/function.bicep)",)
    assert summary.skips[0].endswith(": no HTTP endpoint")
    assert not summary.ok


def test_checkov_report_with_several_frameworks_or_no_resources() -> None:
    empty = {"passed": 0, "failed": 0, "skipped": 0, "parsing_errors": 0, "resource_count": 0}
    assert parse_checkov(json.dumps(empty)).ok
    both = [{"summary": {"passed": 2, "failed": 0, "skipped": 0, "parsing_errors": 1},
             "results": {"parsing_errors": ["/main.bicep"]}},
            {"summary": {"passed": 3, "failed": 0, "skipped": 1, "parsing_errors": 0}}]
    summary = parse_checkov(json.dumps(both))
    assert (summary.passed, summary.skipped, summary.parsing_errors) == (5, 1, 1)
    assert not summary.ok and "cannot parse /main.bicep" in summary.failures


def test_checkov_without_a_report_is_an_error() -> None:
    summary = parse_checkov("Traceback ...\nImportError: boom\n")
    assert not summary.ok and summary.error is not None and "ImportError: boom" in summary.error


def test_junit_counts(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text('<testsuites><testsuite tests="7" failures="1" errors="1" skipped="2"/>'
                      "</testsuites>")
    summary = parse_junit(report)
    assert (summary.passed, summary.failed, summary.skipped) == (3, 2, 2)


# -- infra/app/topics.sh ----------------------------------------------------------------------

FAKE_AZ = """#!/usr/bin/env bash
# A stand-in for `az storage blob upload|list|delete` on a local directory.
set -euo pipefail
echo "$*" >> "$AZ_LOG"
[[ " $* " == *" --auth-mode login "* ]] || { echo "not keyless: $*" >&2; exit 2; }
verb="$3"; name=""; file=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --name) name="${args[$((i + 1))]}" ;;
    --file) file="${args[$((i + 1))]}" ;;
  esac
done
if [[ "$verb" == upload && -e "$FAIL_ONCE" ]]; then rm "$FAIL_ONCE"; exit 1; fi
case "$verb" in
  upload) cp "$file" "$BLOBS/$name" ;;
  list) ls "$BLOBS" ;;
  delete) rm "$BLOBS/$name" ;;
esac
"""


def topics_variable() -> str:
    """TOPICS as topics.bicep builds it: '<blob> <base64(content)>' lines joined by newlines."""
    return "\n".join(f"{t['blob']} {base64.b64encode(t['content'].encode()).decode()}"
                     for t in TOPOLOGY["topics"])


@pytest.fixture
def fake_az(tmp_path: Path) -> dict[str, str]:
    bin_dir, blobs = tmp_path / "bin", tmp_path / "blobs"
    bin_dir.mkdir()
    blobs.mkdir()
    az = bin_dir / "az"
    az.write_text(FAKE_AZ)
    az.chmod(az.stat().st_mode | stat.S_IEXEC)
    (blobs / "Retired.json").write_text('{"topic": "Retired", "subscribers": ["gone"]}')
    (tmp_path / "fail-once").touch()
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "BLOBS": str(blobs),
            "AZ_LOG": str(tmp_path / "az.log"), "FAIL_ONCE": str(tmp_path / "fail-once"),
            "ACCOUNT": "stexample", "CONTAINER": TOPOLOGY["topicContainer"],
            "TOPICS": topics_variable(), "RETRY_SECONDS": "0"}


def test_topics_script_writes_the_exact_bytes_and_removes_retired_topics(
        fake_az: dict[str, str]) -> None:
    result = subprocess.run(["bash", str(SCRIPT)], env=fake_az, capture_output=True,
                            text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "attempt 1/10 failed" in result.stderr  # the first upload failed and was retried
    blobs = Path(fake_az["BLOBS"])
    assert sorted(p.name for p in blobs.iterdir()) == sorted(t["blob"] for t in TOPOLOGY["topics"])
    storage = InMemoryStorage()
    storage.blobs.create_container("topics")
    for topic in TOPOLOGY["topics"]:
        data = (blobs / topic["blob"]).read_bytes()
        assert data == topic["content"].encode()
        storage.blobs.write("topics", topic["blob"], data)
        assert Topics(storage.blobs, "topics").subscribers(topic["topic"]) == topic["subscribers"]
    assert "deleted" in result.stdout and "Retired.json" in result.stdout


def test_topics_script_fails_when_storage_keeps_refusing(
        fake_az: dict[str, str], tmp_path: Path) -> None:
    refusing = tmp_path / "bin" / "az"
    refusing.write_text("#!/usr/bin/env bash\nexit 1\n")
    result = subprocess.run(["bash", str(SCRIPT)], env={**fake_az, "RETRIES": "2"},
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode != 0
