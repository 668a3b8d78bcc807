"""One verdict on an arriving copy, from its token's state (bus.protocol.tokens.verdict)."""

from __future__ import annotations

import pytest

from bus.protocol.delivery import Outcome, dropped
from bus.protocol.tokens.inbox import Token, TokenState
from bus.protocol.tokens.verdict import Verdict, verdict


def _token(state: TokenState) -> Token:
    return Token("orders", "a1", state, "m1", 0.0, "etag")


@pytest.mark.parametrize(("state", "expected", "outcome"), [
    (TokenState.LIVE, Verdict.PROCESS, None),
    (TokenState.PENDING, Verdict.PROCESS, None),
    (None, Verdict.CONSUMED, Outcome.DUPLICATE),
    (TokenState.FENCED, Verdict.FENCED, Outcome.DUPLICATE),
    (TokenState.POISONED, Verdict.POISONED, Outcome.ALREADY_POISONED),
    (TokenState.DEFERRED, Verdict.DEFERRED, Outcome.DUPLICATE),
])
def test_every_token_state_has_one_verdict(state: TokenState | None, expected: Verdict,
                                           outcome: Outcome | None) -> None:
    found = verdict(None if state is None else _token(state))
    assert found is expected
    if outcome is not None:
        assert dropped(found) is outcome


def test_only_consumed_and_fenced_copies_leave_their_payload_behind() -> None:
    assert {v for v in Verdict if v.payload_is_garbage} == {Verdict.CONSUMED, Verdict.FENCED}
    assert {v for v in Verdict if v.duplicate} == {Verdict.CONSUMED, Verdict.FENCED,
                                                   Verdict.DEFERRED}


def test_every_state_is_covered() -> None:
    assert {verdict(_token(state)) for state in TokenState} == set(Verdict) - {Verdict.CONSUMED}


def test_a_token_stored_as_parked_reads_as_poisoned() -> None:
    """Earlier versions stored the poisoned state under another name; such rows still say
    poisoned, and nothing else unknown is accepted."""
    from bus.protocol.tokens.inbox import STORED_BEFORE
    from bus.protocol.tokens.inbox import _token as read_row
    from bus.storage import Entity

    row = read_row(Entity("orders", "a1", {"state": STORED_BEFORE, "message_id": "m1"}, "etag"))
    assert row.state is TokenState.POISONED and verdict(row) is Verdict.POISONED
    assert TokenState("poisoned") is TokenState.POISONED
    with pytest.raises(ValueError):
        TokenState("dead")
