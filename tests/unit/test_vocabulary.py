"""One word for one thing: the words docs/architecture.md ("Words") retired stay out of the
code, the docs, the CLI and the dashboard. A line that names another broker (or continues one
that does) may name that broker's feature by its own name (Service Bus's dead-letter queue):
that is how the docs compare."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RETIRED = {
    "parked": re.compile(r"\b(un)?park(s|ed|ing)?\b", re.IGNORECASE),
    "dead letter": re.compile(r"dead[-_ ]?letter", re.IGNORECASE),
    "failed message": re.compile(r"\bfailed[-_ ]messages?\b", re.IGNORECASE),
}
"""Each synonym of "poison" (to set a message aside with a reason) that the project used."""

OTHER_BROKERS = re.compile(
    r"Service Bus|NServiceBus|ServicePulse|MassTransit|azure-service-bus|\$deadletterqueue"
    r"|\bdlq\b")
"""A line naming one of these speaks of that broker's feature (or of the CLI named after it)."""

SKIPPED = {"CHANGELOG.md", "tests/unit/test_vocabulary.py"}  # history; this file's own list
STORED = ('bus/protocol/tokens/inbox.py', 'STORED_BEFORE = "parked"')
"""The one place the old word stays: the token state earlier versions stored, read back."""


def tracked() -> list[Path]:
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return [ROOT / name for name in listing if name not in SKIPPED
            and name.endswith((".py", ".md", ".html", ".js", ".bicep", ".json", ".toml",
                               ".cfg", ".txt", ".sh", ".yml", ".yaml"))
            and "/vendor/" not in name and not name.startswith("node_modules/")]


def uses() -> list[str]:
    found = []
    for path in tracked():
        if not path.exists():
            continue
        previous = ""
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            exempt = (OTHER_BROKERS.search(line) or OTHER_BROKERS.search(previous)
                      or (path.relative_to(ROOT).as_posix(), line) == STORED)
            previous = line
            if exempt:
                continue
            for word, pattern in RETIRED.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {word!r}: {line.strip()}")
    return found


def test_no_retired_word_for_poison() -> None:
    found = uses()
    assert not found, "say poison/poisoned instead:\n" + "\n".join(found)


def test_the_patterns_catch_what_they_retire() -> None:
    assert RETIRED["parked"].search("its token parked") and RETIRED["parked"].search("unpark")
    assert not RETIRED["parked"].search("a Spark job")
    assert RETIRED["dead letter"].search("DeadLetters") and RETIRED["dead letter"].search(
        "dead-lettered")
    assert RETIRED["failed message"].search("Failed messages")
    assert OTHER_BROKERS.search("python -m bus dlq list")
