"""The protocol's safeguards, as switches. All on in production.

The simulation (``python -m bus.testing.simulate --break NAME``) turns one off to show that the
invariants it checks really depend on it: every break must produce violations.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Safeguards:
    claim_cas: bool = True
    """Commit the outbox record with the slot's ETag (If-Match) or create-only."""
    fresh_attempt_ids: bool = True
    """A retried token pass uses new attempt ids, persisted before any token is created."""
    ack_after_commit: bool = True
    """Delete the queue message only after the outbox record is committed and dispatched."""
    token_check: bool = True
    """Process a message only while its inbox token exists."""
    send_ledger: bool = True
    """``send_once`` looks a message id up in the send ledger before sending it."""
    fresh_retry_state: bool = True
    """An immediate retry of a handler starts from fresh reads and an empty outbox."""
    confirm_pending: bool = True
    """Finishing a record confirms its pending outgoing tokens before it consumes its own."""
    fence_origin: bool = True
    """The sweeper rewrites a pending token's origin slot before deleting it as an orphan."""
    whole_bundle_ack: bool = True
    """A worker deletes a bundle's queue message only once every signal in it is settled."""
    fence_unknown_sends: bool = True
    """A client send whose token request has an unknown outcome (alone or in a group) fences
    that attempt id and tries again with a fresh one."""
    complete_unfinished: bool = True
    """A claim that finds an unfinished record in the slot completes it before it commits a
    record of its own over it."""
    check_origin_record: bool = True
    """The sweeper keeps a pending token that a committed record in its origin slot lists."""
    snapshot_claim: bool = True
    """A claim reads its slot and declared rows in one request: one snapshot."""
    fence_superseded: bool = True
    """Finishing a record leaves tombstones for the attempt ids it replaced with fresh ones."""
    token_before_payload: bool = True
    """A copy's token is created before its claim-check blob, so a blob without a token is
    garbage the sweeper may delete."""
    process_presumed_orphans: bool = True
    """A copy whose token the sweeper poisoned as a presumed orphan (no signal within
    ``orphan_age``) is processed when it comes after all."""
    own_record_steps: bool = True
    """An orchestration's step acts only on the record it was started for (message id,
    incoming attempt id, generation), never on a later record of the same message id that
    the slot holds now (a released deferral processed again)."""
    release_seen_deferral: bool = True
    """A handler's release request releases only the deferral its handler saw (the token's
    generation then), never a later deferral of the same message."""
    apply_poisoned_deferral: bool = True
    """A claim completes a deferring record whose incoming token was poisoned meanwhile (the
    host gave up on the message after its commit and maintenance adopted the host's copy): the
    deferral is still to apply, so the record is not finished."""
    send_marks: bool = True
    """A marked send (``Bus.send_once_many``) creates each copy's token with a send mark
    naming it, so a message id never gets a second token at a destination."""
    marks_with_tokens: bool = True
    """A marked send writes the marks and the tokens in one transaction: a mark never exists
    without its token."""
    note_after_signal: bool = True
    """A marked send notes on a mark that its token's signal went only after the send
    answered: a call made again never leaves a copy without a signal."""
    stage_before_settle: bool = True
    """The Spark reader stages the messages it takes before it consumes their tokens and
    deletes their queue messages, so a batch that stops in between loses nothing."""
    settle_reads_on_commit: bool = True
    """A Spark batch read settles what it takes only when it is committed (its results are
    stored), so a run that fails leaves its messages to the next read, whatever its run key."""
    abandon_failed_reads: bool = True
    """A Spark batch read first gives up the reads of its endpoint that were never committed
    (their run keys can no longer be read or committed), so a failed run's messages, read
    again by a later run, are not delivered by a re-run of the failed one as well."""
    finish_commits: bool = True
    """A Spark batch read first finishes the commits of its endpoint that stopped half-way, so
    it does not take again the messages of a read that counts already."""
    sequence_check: bool = True
    """A message in a session is handled only when it is its stream's next: one ahead of its
    turn is set aside, one the session moved past is refused (``sessions``)."""
    session_in_commit: bool = True
    """A session row's progress is written in the commit's transaction, with the effects it
    stands for."""
    release_after_commit: bool = True
    """The next waiting message of a session is released once the commit that makes it next
    is durable (the record's release requests), never before."""
    swap_before_resend: bool = True
    """A poison-queue replay that finds the token live (or pending) rewrites it live with a
    compare-and-swap before it sends a copy and removes the entry, as it revives a poisoned
    one: a poisoning that wrote the entry and has yet to poison the token (by the ETag it read
    before) then fails that poisoning, instead of poisoning a token whose entry is gone."""
    poison_before_purge: bool = True
    """A purge that finds the entry's token live (its poisoning wrote the entry and has yet
    to poison the token) poisons it itself, by a compare-and-swap, before it deletes token and
    entry: the poisoning then fails, instead of poisoning a token whose entry is gone - a
    message nothing can replay or purge, and its payload kept for good."""
    expire_after_claim: bool = True
    """A receiver judges a copy's time-to-live after its claim: a copy whose handler committed
    already (its sends waiting for room, say) has its record completed, never poisoned as
    expired (a Spark read, which commits nothing, still expires copies early)."""
    recheck_before_expiry: bool = True
    """Before it poisons a copy as expired, the receiver reads the partition's slot again:
    another copy of the message may have committed it while this one read its token (the
    slot read first), and is then completed instead (one more read, for expired copies only)."""
    settle_before_purge: bool = True
    """A purge first completes the unfinished record of the message whose entry it deletes:
    a handler that committed has its sends go out, though its token and entry go."""
    room_before_numbers: bool = True
    """A client send looks at its destinations' room before it numbers a copy in its stream:
    one refused for a full queue (QueueFull) takes no number, so it leaves no gap that would
    hold its session up at an endpoint that blocks."""
    refuse_reserved_keys: bool = True
    """A receiver poisons a copy whose partition key starts with the bus's reserved prefix
    (``~bus.``): the bus's own rows (the statistics' days, which maintenance deletes whole)
    never share a partition with a handler's state."""
    reserve_record_growth: bool = True
    """A commit's check leaves room in its outbox record for what later passes add (an ETag
    per outgoing token, the attempt ids a helper pass supersedes): a record that passed never
    outgrows its row on the way out."""
    complete_before_session_action: bool = True
    """An operator's skip or close first completes the partition's unfinished record: a copy
    set aside by a commit is deferred only when its record finishes, so a release before
    then misses it, and it would wait for good, neither handled nor poisoned."""
    one_entry_per_token: bool = True
    """The poison-queue tools keep one entry per poisoned token (the oldest): two poisonings
    of one message that raced (concurrent copies rejected, each writing its entry before one
    of them poisons the token) leave two entries, which would overstate every count and
    replay the message twice."""


BREAKS: dict[str, tuple[Safeguards, str]] = {
    "skip-claim-cas": (Safeguards(claim_cas=False),
                       "commit without the ETag compare-and-swap on the outbox slot"),
    "reuse-attempt-ids": (Safeguards(fresh_attempt_ids=False),
                          "retry token creation with the attempt ids of the failed pass"),
    "ack-before-commit": (Safeguards(ack_after_commit=False),
                          "delete the queue message before the handler's commit"),
    "skip-token-check": (Safeguards(token_check=False),
                         "process a message without checking its inbox token"),
    "forget-sent": (Safeguards(send_ledger=False),
                    "send_once records every call as a new message (no ledger lookup)"),
    "dirty-retry": (Safeguards(fresh_retry_state=False),
                    "an immediate retry keeps the writes and sends of the failed attempt"),
    "skip-confirm": (Safeguards(confirm_pending=False),
                     "finish a record without confirming its pending outgoing tokens"),
    "skip-origin-fence": (Safeguards(fence_origin=False),
                          "delete an orphan-looking pending token without fencing its slot"),
    "ack-bundle-early": (Safeguards(whole_bundle_ack=False),
                         "delete a bundle's queue message when its first signal is settled"),
    "reuse-send-ids": (Safeguards(fence_unknown_sends=False),
                       "a client send retries a token request of unknown outcome with the same "
                       "attempt id (an existing token counts as created)"),
    "commit-over-unfinished": (Safeguards(complete_unfinished=False),
                               "commit over an unfinished record without completing it first"),
    "skip-origin-check": (Safeguards(check_origin_record=False),
                          "the sweeper removes old pending tokens a committed record lists"),
    "split-claim-read": (Safeguards(snapshot_claim=False),
                         "a claim reads its declared rows and then its slot, in two requests"),
    "skip-fence-superseded": (Safeguards(fence_superseded=False),
                              "finish a record without fencing the attempt ids it replaced"),
    "payload-before-token": (Safeguards(token_before_payload=False),
                             "write a copy's claim-check blob before its token"),
    "drop-presumed-orphans": (Safeguards(process_presumed_orphans=False),
                              "a copy arriving after its token was poisoned as a presumed orphan "
                              "is dropped"),
    "steps-by-message-id": (Safeguards(own_record_steps=False),
                            "an orchestration step finds its record by message id alone"),
    "release-any-deferral": (Safeguards(release_seen_deferral=False),
                             "a handler's release request releases whatever deferral the "
                             "message has now"),
    "poisoned-ends-deferral": (Safeguards(apply_poisoned_deferral=False),
                               "a claim commits over a deferring record whose token was poisoned "
                               "after its commit, as if it were finished"),
    "duplicate-entries": (Safeguards(one_entry_per_token=False),
                          "the poison-queue tools keep every entry of a poisoned token"),
    "numbers-before-room": (Safeguards(room_before_numbers=False),
                            "a client send numbers its copies, then finds the queue full"),
    "admit-reserved-keys": (Safeguards(refuse_reserved_keys=False),
                            "a receiver admits partition keys in the bus's reserved prefix"),
    "unreserved-growth": (Safeguards(reserve_record_growth=False),
                          "a commit's check takes the record as committed, with no room for "
                          "the ETags and superseded attempt ids later passes add"),
    "expire-before-claim": (Safeguards(expire_after_claim=False),
                            "a receiver poisons an expired copy before its claim, whether or "
                            "not its handler committed"),
    "expire-on-stale-slot": (Safeguards(recheck_before_expiry=False),
                             "a receiver poisons an expired copy on the slot it read before "
                             "the token, though another copy may have committed it since"),
    "purge-unsettled": (Safeguards(settle_before_purge=False),
                        "a purge deletes a message's token without completing its unfinished "
                        "record"),
    "unmarked-sends": (Safeguards(send_marks=False),
                       "send_once_many creates tokens without send marks"),
    "mark-apart": (Safeguards(marks_with_tokens=False),
                   "send_once_many writes the send marks and the tokens in two requests"),
    "note-before-signal": (Safeguards(note_after_signal=False),
                           "send_once_many notes the signals on the send marks before "
                           "sending them"),
    "settle-before-stage": (Safeguards(stage_before_settle=False),
                            "the Spark reader settles what it takes before staging it"),
    "settle-reads-early": (Safeguards(settle_reads_on_commit=False),
                           "a Spark batch read settles what it takes when it stages it, "
                           "before its results are stored"),
    "keep-failed-reads": (Safeguards(abandon_failed_reads=False),
                          "a Spark batch read leaves the uncommitted reads before it as they "
                          "are (they can still be read again and committed)"),
    "skip-unfinished-commits": (Safeguards(finish_commits=False),
                                "a Spark batch read does not finish a commit that stopped "
                                "half-way before it takes messages"),
    "skip-sequence-check": (Safeguards(sequence_check=False),
                            "a message in a session is handled as it arrives, whatever its "
                            "sequence number"),
    "session-apart": (Safeguards(session_in_commit=False),
                      "a session row's progress is written before the commit, in a request "
                      "of its own"),
    "release-before-commit": (Safeguards(release_after_commit=False),
                              "the next waiting message of a session is released before the "
                              "commit that makes it next"),
    "act-on-unfinished": (Safeguards(complete_before_session_action=False),
                          "an operator's skip or close releases what waits without completing "
                          "the partition's unfinished record first"),
    "resend-without-swap": (Safeguards(swap_before_resend=False),
                            "a poison-queue replay that finds the token live sends a copy and "
                            "removes the entry without rewriting the token"),
    "purge-around-poisoning": (Safeguards(poison_before_purge=False),
                               "a purge that finds the entry's token live deletes the entry "
                               "and leaves the token to its poisoning"),
}
