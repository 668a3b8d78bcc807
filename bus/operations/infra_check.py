"""``make infra-check``: every offline check of ``infra/``, summed up in one JSON line.

1. The topology file is in sync with the app (``python -m bus topology check``).
2. checkov over ``infra/`` (bicep framework): no failed check and no file it cannot parse;
   skips are inline in the Bicep, each with its reason, and listed here.
3. The structural tests (``tests/operations/infra``, pycep-parser): every queue, table and
   container of the topology is declared, the app's identity holds its roles, no keys in
   settings, outputs.

The last line printed is a JSON object with the counts; the exit code is 1 when a check fails.
checkov runs from its own venv (``--checkov``), the rest with this interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from bus.operations.apps import DEFAULT_APP
from bus.operations.topology_file import DEFAULT_PATH


@dataclass(frozen=True)
class CheckovSummary:
    """What one checkov run found. ``error`` is set when it did not produce a report."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    parsing_errors: int = 0
    failures: tuple[str, ...] = ()
    skips: tuple[str, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.failed == 0 and self.parsing_errors == 0


@dataclass(frozen=True)
class PytestSummary:
    """Counts of one pytest run (errors count as failures)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


def parse_checkov(output: str) -> CheckovSummary:
    """Read checkov's ``-o json`` report: one object per framework (a list when several)."""
    try:
        document = json.loads(output)
    except ValueError:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return CheckovSummary(error=f"checkov printed no JSON report: {tail[0]}")
    reports = document if isinstance(document, list) else [document]
    totals = {"passed": 0, "failed": 0, "skipped": 0, "parsing_errors": 0}
    failures: list[str] = []
    skips: list[str] = []
    for report in reports:
        summary = report.get("summary", report)  # a run without resources has no "results"
        for key in totals:
            totals[key] += int(summary.get(key, 0))
        results = report.get("results", {})
        failures += [_describe(check) for check in results.get("failed_checks", [])]
        skips += [f"{_describe(check)}: {_reason(check)}"
                  for check in results.get("skipped_checks", [])]
        failures += [f"cannot parse {path}" for path in results.get("parsing_errors", [])]
    return CheckovSummary(passed=totals["passed"], failed=totals["failed"],
                          skipped=totals["skipped"], parsing_errors=totals["parsing_errors"],
                          failures=tuple(failures), skips=tuple(skips))


def _describe(check: dict[str, Any]) -> str:
    return f"{check.get('check_id')} {check.get('resource')} ({check.get('file_path')})"


def _reason(check: dict[str, Any]) -> str:
    suppression = check.get("check_result", {}).get("suppress_comment", "")
    return str(suppression).strip() or "no reason given"


def parse_junit(path: Path) -> PytestSummary:
    """Sum the counts of a pytest ``--junitxml`` report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return PytestSummary(passed=tests - failed - skipped, failed=failed, skipped=skipped)


def check_topology(app: str, path: Path) -> bool:
    """Run ``python -m bus topology check``, showing its output; True when in sync."""
    result = subprocess.run([sys.executable, "-m", "bus", "topology", "check", "--app", app,
                             "--file", str(path)], check=False)
    return result.returncode == 0


def run_checkov(checkov: Path, infra: Path) -> CheckovSummary:
    """Run checkov over ``infra`` (bicep framework, no download of extra data)."""
    try:
        result = subprocess.run(
            [str(checkov), "--directory", str(infra), "--framework", "bicep", "--output", "json",
             "--skip-download"], capture_output=True, text=True, check=False, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CheckovSummary(error=f"cannot run checkov ({checkov}): {exc}")
    if result.returncode not in (0, 1):
        return CheckovSummary(error=f"checkov exited {result.returncode}: "
                                    f"{result.stderr.strip()[-500:]}")
    return parse_checkov(result.stdout)


def run_tests(tests: Path) -> PytestSummary:
    """Run the structural tests with pytest, showing its output."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        subprocess.run([sys.executable, "-m", "pytest", str(tests), "-q",
                        f"--junitxml={report}"], check=False)
        return parse_junit(report) if report.exists() else PytestSummary(failed=1)


@click.command()
@click.option("--checkov", "checkov", type=click.Path(path_type=Path), required=True,
              help="The checkov executable (from its own venv).")
@click.option("--infra", type=click.Path(file_okay=False, path_type=Path),
              default=Path("infra"), show_default=True)
@click.option("--tests", type=click.Path(path_type=Path), default=Path("tests/operations/infra"),
              show_default=True)
@click.option("--app", default=DEFAULT_APP, show_default=True)
@click.option("--topology", type=click.Path(dir_okay=False, path_type=Path),
              default=DEFAULT_PATH, show_default=True)
def main(checkov: Path, infra: Path, tests: Path, app: str, topology: Path) -> None:
    """Run the offline infrastructure checks; the last line printed is a JSON summary."""
    click.echo("== topology file")
    in_sync = check_topology(app, topology)
    click.echo("== checkov (bicep)")
    scan = run_checkov(checkov, infra)
    for line in scan.failures:
        click.echo(f"  FAILED  {line}")
    for line in scan.skips:
        click.echo(f"  skipped {line}")
    if scan.error:
        click.echo(f"  ERROR   {scan.error}")
    click.echo(f"  {scan.passed} passed, {scan.failed} failed, {scan.skipped} skipped, "
               f"{scan.parsing_errors} files not parsed")
    click.echo(f"== structural tests ({tests})")
    structure = run_tests(tests)
    ok = in_sync and scan.ok and structure.ok
    click.echo(f"== infra-check {'passed' if ok else 'FAILED'}")
    click.echo(json.dumps({
        "checkov_passed": scan.passed,
        "checkov_failed": scan.failed,
        "checkov_skipped": scan.skipped,
        "checkov_parsing_errors": scan.parsing_errors,
        "checkov_error": scan.error,
        "topology_in_sync": in_sync,
        "structural_tests_passed": structure.passed,
        "structural_tests_failed": structure.failed,
        "ok": ok,
    }, sort_keys=True))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
