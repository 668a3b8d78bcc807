"""Completing a committed outbox record: the steps after the commit, in order (D1-D6:
``bus.protocol.steps``, docs/protocol.md).

D1. (helpers only) issue fresh attempt ids and persist them with a compare-and-swap, so that no
   two workers ever create tokens for the same attempt id (what an earlier pass superseded is
   fenced first, so the record keeps one pass's superseded ids at most);
D2. create an inbox token (and claim-check payload) for every outgoing copy;
D3. persist phase SENDING (compare-and-swap): from here on tokens are never created again;
D4. send the signals (repeating them is harmless: tokens deduplicate) - a helper's pass only
   those whose tokens a receiver would not drop now (one read per destination): a record
   whose passes keep failing part-way still gets closer to its end with each of them;
D5. fence the attempt ids that were superseded in D1; confirm the outgoing tokens created
   pending (see below);
D6. release the deferred messages the handler asked for (``deferral``), then consume (delete)
   the incoming message's token and its claim-check payload - or, when the handler deferred
   the message, set the token aside and keep the payload.

Usually D2 and D3 happen *before* the commit instead (``place_ahead``): the worker that ran
the handler creates the outgoing tokens in state pending, naming the record's slot as their
origin, and commits the record directly in phase SENDING with their ETags - one table write
per message fewer. A pending token is processable (its signal exists only after the commit);
the handler run that created it may also never commit (a crash, a lost claim), which leaves an
orphan the sweeper collects. D5's confirmation (pending -> live, by ETag) happens before
the record is finished, so a pending token whose origin slot has moved on is an orphan.

The finished record stays in the slot: "its incoming token is gone" (or set aside, for a
record that deferred its message: ``inbox.finished``) is what finished means (D6 is the
last step, and nothing else deletes a token of a committed message), so the
next commit in the partition simply replaces it - one write per message fewer than emptying
the slot. Any step may be interrupted; whoever loads the slot next resumes from the persisted
phase.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from bus.envelope import Envelope
from bus.errors import QueueFull
from bus.ids import IdFactory
from bus.observability import Telemetry
from bus.protocol.copies.courier import Courier, due_at
from bus.protocol.outbox.deferral import release, set_aside
from bus.protocol.outbox.slot import Outbox, Slot
from bus.protocol.records import OutboxRecord, Phase
from bus.protocol.safeguards import Safeguards
from bus.protocol.tokens.inbox import Lineage, Origin, finished
from bus.protocol.tokens.verdict import verdict
from bus.storage import StorageError


class Dispatcher:
    def __init__(self, *, courier: Courier, outbox: Outbox, new_id: IdFactory,
                 safeguards: Safeguards, telemetry: Telemetry | None = None) -> None:
        self._courier = courier
        self._telemetry = telemetry or Telemetry()
        self._outbox = outbox
        self._new_id = new_id
        self._safeguards = safeguards

    def complete(self, slot: Slot, *, committed_by_me: bool) -> None:
        """Drive ``slot.record`` to the end. ``committed_by_me``: the caller's own commit
        produced ``slot`` (so nobody else can have used its attempt ids yet).

        Raises ClaimLost when another worker moved the slot on (that worker finishes the
        job), a StorageError when the outcome is unknown (the next completer resumes), or
        QueueFull when a destination has no room (the record waits in the outbox).
        """
        problem = self.complete_many([slot], committed_by_me=committed_by_me)[0]
        if problem is not None:
            raise problem

    def complete_many(self, slots: Sequence[Slot], *,
                      committed_by_me: bool) -> list[Exception | None]:
        """``complete`` for several records at once (a worker's batch: one record per
        partition), with the sends of D4 bundled per destination, the confirmations of
        D5 and the consumes of D6 one request per destination for them all.

        Returns, per slot, None (completed) or the exception ``complete`` raises for it.
        """
        results: list[Exception | None] = [None] * len(slots)
        sending: list[tuple[int, OutboxRecord]] = []
        for index, slot in enumerate(slots):
            try:
                record = self.prepare(slot, committed_by_me=committed_by_me).record
                assert record is not None
                sending.append((index, record))
            except Exception as exc:
                results[index] = exc
        self._finish_all(self._signal_all(sending, results, every=committed_by_me), results)
        return results

    def finish(self, slot: Slot) -> None:
        """Steps 5-6, once every signal was sent at least once."""
        record = slot.record
        assert record is not None and (record.phase is Phase.SENDING or not record.outgoing)
        results: list[Exception | None] = [None]
        self._finish_all([(0, record)], results)
        if results[0] is not None:
            raise results[0]

    def _signal_all(self, sending: list[tuple[int, OutboxRecord]],
                    results: list[Exception | None], *,
                    every: bool) -> list[tuple[int, OutboxRecord]]:
        """D4 for several records at once (their signals bundled per destination);
        returns those whose every signal was sent. ``every``: all the copies (the pass of
        the commit's own worker), else those still to deliver (``_undelivered``)."""
        chosen = [record.outgoing if every else self._undelivered(record)
                  for _, record in sending]
        problems = self._signal_many([e for copies in chosen for e in copies])
        sent: list[tuple[int, OutboxRecord]] = []
        for (index, record), copies in zip(sending, chosen, strict=True):
            mine, problems = problems[:len(copies)], problems[len(copies):]
            problem = _first_problem(mine)
            if problem is None:
                sent.append((index, record))
            else:
                results[index] = problem
        return sent

    def _undelivered(self, record: OutboxRecord) -> tuple[Envelope, ...]:
        """The copies of a record in phase SENDING whose signal may still be needed: all but
        those a receiver would drop as duplicates now (token consumed, fenced or set aside:
        ``Verdict.duplicate``) - every token exists from D3 on, so a missing one was consumed.
        A helper's pass (a crash, a full queue, a failed send before it) sends only these:
        where every pass re-sent every copy, a fan-out whose sends fail now and then, or
        whose bounded destination fills with its own earlier copies, could fail part-way for
        good. One request per destination and ``keys_per_read`` copies; copies whose tokens
        could not be read are sent."""
        inbox = self._courier.inbox
        per = inbox.limits.keys_per_read
        by_destination: dict[str, list[str]] = {}
        for envelope in record.outgoing:
            by_destination.setdefault(envelope.destination, []).append(envelope.attempt_id)
        delivered: set[tuple[str, str]] = set()
        for destination, attempt_ids in by_destination.items():
            for start in range(0, len(attempt_ids), per):
                try:
                    tokens = inbox.read_many(destination, attempt_ids[start:start + per])
                except StorageError:
                    continue
                delivered.update((destination, a) for a in attempt_ids[start:start + per]
                                 if verdict(tokens.get(a)).duplicate)
        return tuple(e for e in record.outgoing
                     if (e.destination, e.attempt_id) not in delivered)

    def _finish_all(self, finishing: list[tuple[int, OutboxRecord]],
                    results: list[Exception | None]) -> None:
        """Steps 5-6 for records whose every signal was sent, in order: fences, confirmations
        (shared), releases and set-asides (per record), consumes (shared), payloads."""
        finishing = self._each(finishing, results, self.fence_superseded)
        try:
            self.confirm([record for _, record in finishing])
        except Exception as exc:
            for index, _ in finishing:
                results[index] = exc
            return
        finishing = self._each(finishing, results, self.release_requested)
        consume = [(i, r) for i, r in finishing if r.deferred_signal is None]
        self._each([(i, r) for i, r in finishing if r.deferred_signal is not None], results,
                   lambda record: set_aside(self._courier, record))  # the payload stays
        for endpoint, records in _by_endpoint(consume).items():
            try:
                self._courier.inbox.consume_many(endpoint, [r.attempt_id for _, r in records])
            except Exception as exc:
                for index, _ in records:
                    results[index] = exc
                continue
            self._each(records, results, self._drop_payload)

    def _drop_payload(self, record: OutboxRecord) -> None:
        """The consumed message's claim-check blob, if it had one."""
        if record.payload_ref is not None:
            self._courier.payloads.delete(record.payload_ref)

    @staticmethod
    def _each(items: list[tuple[int, OutboxRecord]], results: list[Exception | None],
              step: Callable[[OutboxRecord], object]) -> list[tuple[int, OutboxRecord]]:
        """Run ``step`` on each record; returns those it succeeded for (the others' results
        say why)."""
        done: list[tuple[int, OutboxRecord]] = []
        for index, record in items:
            try:
                step(record)
            except Exception as exc:
                results[index] = exc
                continue
            done.append((index, record))
        return done

    def place_ahead(self, records: Sequence[tuple[str, OutboxRecord]]) -> list[OutboxRecord]:
        """Steps 2-3 before the commit, for ``(partition, record)`` pairs a worker is about
        to commit: every outgoing token created pending (one request per destination for them
        all) and each record in phase SENDING with its tokens' ETags, ready to commit.

        Raises on an unknown outcome: the handler runs again on redelivery, with fresh ids,
        and whatever these requests created is left to the sweeper.
        """
        envelopes = [e for _, record in records for e in record.outgoing]
        origins = [Origin(record.endpoint, partition, record.attempt_id)
                   for partition, record in records for _ in record.outgoing]
        etags = self._courier.place_many(envelopes, origins)
        placed: list[OutboxRecord] = []
        for _, record in records:
            count = len(record.outgoing)
            placed.append(record.placed(tuple(etags[:count])))
            etags = etags[count:]
        return placed

    def withdraw(self, record: OutboxRecord) -> None:
        """Delete the pending tokens of a record whose commit lost its claim (best effort:
        the sweeper collects what this leaves)."""
        for envelope, etag in zip(record.outgoing, record.pending, strict=False):
            try:
                self._courier.inbox.withdraw(envelope.destination, envelope.attempt_id, etag)
                if not self._courier.fits(envelope):  # only such a copy has a blob
                    self._courier.payloads.delete(
                        self._courier.payloads.ref(envelope.destination, envelope.attempt_id))
            except StorageError:
                return

    def confirm(self, records: Sequence[OutboxRecord]) -> None:
        """D5's confirmation: the records' pending outgoing tokens made live, one request
        per destination. Idempotent: a token that changed since is left alone."""
        if not self._safeguards.confirm_pending:
            return  # the "skip-confirm" break
        by_destination: dict[str, list[tuple[Envelope, str]]] = {}
        for record in records:
            for envelope, etag in zip(record.outgoing, record.pending, strict=False):
                by_destination.setdefault(envelope.destination, []).append((envelope, etag))
        for destination, copies in by_destination.items():
            self._courier.inbox.confirm_many(
                destination, [(e.attempt_id, e.message_id, etag) for e, etag in copies],
                self._courier.now(), dues=[due_at(e) for e, _ in copies],
                lineages=[Lineage.of(e) for e, _ in copies])

    def prepare(self, slot: Slot, *, committed_by_me: bool) -> Slot:
        """Steps 1-3: make sure every outgoing copy has its token; returns the slot in phase
        SENDING (or unchanged when there is nothing to send)."""
        record = slot.record
        assert record is not None
        if record.phase is Phase.COMMITTED and record.outgoing:
            slot, record = self._place_tokens(slot, record, committed_by_me)
        return slot

    def signal(self, record: OutboxRecord, indexes: Iterable[int] | None = None) -> None:
        """D4 for the chosen copies (all by default), bundled per destination
        (``Courier.signal_many``). Only for a record in phase SENDING.

        A copy that cannot be signalled does not stop the others. Afterwards the first storage
        failure is raised, else QueueFull for a full destination: the record waits in the
        outbox until a later ``complete`` finds room.
        """
        assert record.phase is Phase.SENDING or not record.outgoing
        chosen = range(len(record.outgoing)) if indexes is None else indexes
        problem = _first_problem(self._signal_many([record.outgoing[i] for i in chosen]))
        if problem is not None:
            raise problem

    def _signal_many(self, envelopes: list[Envelope]) -> list[StorageError | None]:
        """D4's sends, in a ``send`` span linked to the copies' ``create`` spans."""
        if not envelopes:
            return []
        with self._telemetry.signalling(envelopes):
            return self._courier.signal_many(envelopes)

    def release_requested(self, record: OutboxRecord) -> None:
        """The deferred messages the handler released (idempotent: safe to repeat)."""
        named = self._safeguards.release_seen_deferral  # off: the "release-any-deferral" break
        for wanted in record.releases:
            release(self._courier, wanted.endpoint, wanted.message_id,
                    wanted.generation if named else None)

    def fence_superseded(self, record: OutboxRecord) -> None:
        """D5: tombstones for the attempt ids D1 replaced (none were signalled)."""
        if not self._safeguards.fence_superseded:
            return  # the "skip-fence-superseded" break
        self._courier.fence_many([(a.destination, a.attempt_id) for a in record.superseded],
                                 record.message_id)

    def is_finished(self, record: OutboxRecord) -> bool:
        """Whether ``record`` was finished (``inbox.finished``). One read."""
        return finished(record, self._courier.inbox.read(record.endpoint, record.attempt_id))

    def _place_tokens(self, slot: Slot, record: OutboxRecord,
                      committed_by_me: bool) -> tuple[Slot, OutboxRecord]:
        if not committed_by_me and self._safeguards.fresh_attempt_ids:
            # Someone else may have created tokens for the current ids, and one of their
            # requests may still be in flight: never reuse an id a token may exist for. What
            # an earlier pass superseded is fenced first, and the record keeps only the ids
            # this pass supersedes: it never outgrows its slot however many passes there are.
            self.fence_superseded(record)
            record = record.with_fresh_attempts(self._new_id, self._courier.sealer.resign)
            slot = self._outbox.update(slot, record)
        for envelope in record.outgoing:
            self._courier.place(envelope)
        record = record.sending()
        return self._outbox.update(slot, record), record


def _first_problem(problems: Sequence[StorageError | None]) -> StorageError | None:
    """What stops a record: the first storage failure, else the first full queue (a full
    queue does not stop the other copies, but the record waits in the outbox for room)."""
    found = [p for p in problems if p is not None]
    failed = [p for p in found if not isinstance(p, QueueFull)]
    first = failed or found
    return first[0] if first else None


def _by_endpoint(items: list[tuple[int, OutboxRecord]],
                 ) -> dict[str, list[tuple[int, OutboxRecord]]]:
    grouped: dict[str, list[tuple[int, OutboxRecord]]] = {}
    for index, record in items:
        grouped.setdefault(record.endpoint, []).append((index, record))
    return grouped
