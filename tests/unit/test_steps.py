"""One numbering of a delivery's steps: bus.protocol.steps names them, docs/protocol.md's
tables explain the same codes in the same order, and Bus.pipeline lists them."""

from __future__ import annotations

import re
from pathlib import Path

import bus.protocol
from bus import Bus, Endpoint
from bus.protocol.steps import COMPLETE, RECEIVE, pipeline
from bus.testing import InMemoryStorage

PROTOCOL_DOC = Path(bus.protocol.__file__).parents[2] / "docs" / "protocol.md"


def test_the_protocol_doc_explains_the_same_steps_in_order() -> None:
    rows = re.findall(r"^\| ([RD]\d) \|", PROTOCOL_DOC.read_text(encoding="utf-8"), re.M)
    assert rows == [step.code for step in (*RECEIVE, *COMPLETE)]


def test_each_step_names_a_module_of_the_protocol() -> None:
    package = Path(bus.protocol.__file__).parent
    assert [s.module for s in (*RECEIVE, *COMPLETE)
            if not (package / f"{s.module.replace('.', '/')}.py").exists()] == []


def test_the_pipeline_follows_the_steps_claim_before_token() -> None:
    stages = pipeline(("Audit",))
    assert stages.index("R3 claim") < stages.index("R4 deduplicate") < stages.index("[Audit]")
    assert stages.index("[Audit]") < stages.index("R6 commit")
    assert Bus(InMemoryStorage(), [Endpoint("e")]).pipeline("e") == pipeline(())
