"""Handling: R5 of receiving a signal - its handler run against its partition.

The handler (inside the endpoint's middleware) runs with the route's immediate retries, each
attempt from fresh reads and an empty outbox, so a failed attempt leaves nothing behind. What
it produced - the state changes and the outbox record - is returned for the commit; nothing
is written here. A handler that keeps failing is redelivered after the route's retry delay
(HandlerFailed) until the last delivery allowed, on which it is poisoned.
"""

from __future__ import annotations

import copy
import random as _random
import time
from collections.abc import Callable, Sequence

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from bus.addressing import Addressing
from bus.context import Context, PartitionState, SessionView
from bus.endpoint import Endpoint
from bus.errors import RecordTooLarge, StateError
from bus.middleware import HandleNext, Middleware, handling_chain
from bus.naming import RESERVED_PREFIX
from bus.protocol.delivery import HandlerFailed, Incoming
from bus.protocol.outbox.deferral import seen
from bus.protocol.outbox.slot import ClaimLost, Outbox, Slot
from bus.protocol.poison.poisoning import Poisoning
from bus.protocol.receive.admission import Admitted
from bus.protocol.records import OutboxRecord, Release
from bus.protocol.safeguards import Safeguards
from bus.protocol.sessions.order import (
    Gaps,
    Handle,
    Numbering,
    Plan,
    Refuse,
    SetAside,
    closing_releases,
    decode,
    handler_stream,
    json_state,
    plan,
    session_row_key,
    write_op,
)
from bus.protocol.tokens.inbox import Inbox, Token
from bus.retry import Reject, RetryAfter, RetryPolicy, backoff
from bus.storage import StorageError, TableOp, Tables


class Handling:
    """Runs the handlers of one endpoint."""

    def __init__(self, *, endpoint: Endpoint, tables: Tables, state_table: str,
                 addressing: Addressing, inbox: Inbox, outbox: Outbox, poisoning: Poisoning,
                 clock: Callable[[], float], max_delivery_count: int,
                 safeguards: Safeguards, middleware: Sequence[Middleware] = (),
                 sleep: Callable[[float], None] = time.sleep,
                 random: Callable[[], float] = _random.random) -> None:
        self.endpoint = endpoint.name
        self._gaps = Gaps(endpoint.reorder_window, endpoint.skip_gaps)
        self._middleware = tuple(middleware)
        self._chains: dict[str, HandleNext] = {
            message_type: handling_chain(self._middleware, route.handler)
            for message_type, route in endpoint.routes.items()}
        self._tables = tables
        self._state_table = state_table
        self._addressing = addressing
        self._inbox = inbox
        self._outbox = outbox
        self._poisoning = poisoning
        self._clock = clock
        self._max_delivery_count = max_delivery_count
        self._safeguards = safeguards
        self._sleep = sleep
        self._random = random

    def run(self, admitted: Admitted, slot: Slot, item: Incoming, token: Token | None,
            ) -> tuple[list[TableOp], OutboxRecord] | None:
        """The state changes and the outbox record to commit, or None when the message was
        poisoned; raises HandlerFailed when it is to be retried."""
        generation = token.generation if token is not None else 0
        session: Handle | None = None
        if admitted.session is not None:
            planned = self._plan(admitted, slot, generation)
            if isinstance(planned, Refuse):
                self._poisoning.bad(item.body, admitted.envelope, planned.reason,
                                    item.dequeue_count, item.ack)
                return None
            if isinstance(planned, SetAside):
                return self._set_aside(admitted, slot, item, generation, planned)
            session = planned
        try:
            operations, ctx = self._attempts(admitted, slot, item.dequeue_count, generation,
                                             session)
            record = OutboxRecord(
                endpoint=self.endpoint, message_id=admitted.envelope.message_id,
                attempt_id=admitted.envelope.attempt_id,
                message_type=admitted.envelope.message_type,
                payload_ref=admitted.envelope.payload_ref,
                outgoing=ctx.outgoing, committed_at=self._clock(),
                deferred_signal=item.body if ctx.deferred else None, generation=generation,
                releases=self._releases(ctx), sequences=_counters(ctx))
            if session is not None:
                row_op, releases = self._session_commit(admitted, session, ctx)
                operations = [*operations, row_op] if row_op is not None else operations
                record = record.model_copy(update={"releases": record.releases + releases})
            # Too big for storage: the handler's fault, found before any token is created.
            self._outbox.check_commit(admitted.partition, operations, record)
            return operations, record
        except (StorageError, ClaimLost):
            raise  # infrastructure or a lost race, not the handler's fault
        except Exception as exc:  # the handler's own failure, or what it asked for (too big)
            if item.dequeue_count < self._max_delivery_count and not isinstance(exc, Reject):
                delay = (exc.seconds if isinstance(exc, RetryAfter)
                         else admitted.route.retry.delay_after(item.dequeue_count))
                raise HandlerFailed(f"{admitted.route.contract.message_type} handler raised "
                                    f"{exc!r}", delay) from exc
            self._poisoning.failed(item.body, admitted.envelope, exc, item.dequeue_count,
                                   item.ack)
            return None

    def _plan(self, admitted: Admitted, slot: Slot, generation: int) -> Plan:
        """What the session row says of this copy (``sessions.plan``)."""
        assert admitted.session is not None
        row = decode(admitted.partition, slot.rows.get(session_row_key(admitted.session)))
        return plan(row, admitted.session, admitted.envelope, generation, self._clock(),
                    gaps=self._gaps, endpoint=self.endpoint,
                    check_sequence=self._safeguards.sequence_check)

    def _set_aside(self, admitted: Admitted, slot: Slot, item: Incoming, generation: int,
                   aside: SetAside) -> tuple[list[TableOp], OutboxRecord] | None:
        """A copy ahead of its turn: commit it to the session's waiting list and defer its
        token, without running the handler (poisoned when the row cannot hold it)."""
        assert admitted.session is not None
        envelope = admitted.envelope
        record = OutboxRecord(
            endpoint=self.endpoint, message_id=envelope.message_id,
            attempt_id=envelope.attempt_id, message_type=envelope.message_type,
            payload_ref=envelope.payload_ref,
            committed_at=self._clock(), deferred_signal=item.body, generation=generation,
            releases=aside.releases,
            sequences=dict(slot.record.sequences) if slot.record is not None else {})
        try:
            operations = [write_op(admitted.partition, admitted.session, aside.row,
                                   self._tables.limits)]
            self._outbox.check_commit(admitted.partition, operations, record)
        except (StateError, RecordTooLarge) as exc:
            self._poisoning.bad(item.body, envelope, f"cannot wait for its turn: {exc}",
                                item.dequeue_count, item.ack)
            return None
        return operations, record

    def _session_commit(self, admitted: Admitted, handle: Handle, ctx: Context,
                        ) -> tuple[TableOp | None, tuple[Release, ...]]:
        """The session row as the handler leaves it, and the releases its commit asks for:
        the stream's next waiting copy, or every waiting copy when the handler closed it."""
        assert admitted.session is not None and ctx.session is not None
        row = handle.row.model_copy(update={"state": json_state(ctx.session.state)})
        releases = handle.releases
        if ctx.session.closing:
            row = row.model_copy(update={"closed_at": self._clock()})
            releases = closing_releases(row, self.endpoint)
        op = write_op(admitted.partition, admitted.session, row, self._tables.limits)
        if not self._safeguards.session_in_commit:  # the "session-apart" break
            self._tables.transact(self._state_table, [op])
            return None, releases
        return op, releases

    def _releases(self, ctx: Context) -> tuple[Release, ...]:
        """The handler's release requests, each naming the deferral it is for: the one the
        handler named, or the one the message is in now."""
        return tuple(Release(endpoint=e, message_id=m,
                             generation=seen(self._inbox, e, m) if g is None else g)
                     for e, m, g in ctx.releases)

    def _attempts(self, admitted: Admitted, slot: Slot, dequeue_count: int,
                  generation: int, session: Handle | None = None,
                  ) -> tuple[list[TableOp], Context]:
        """The handler with the route's immediate retries: every attempt starts from fresh
        reads and an empty outbox, so a failed attempt leaves nothing behind."""
        policy = admitted.route.retry
        retrying = Retrying(
            stop=stop_after_attempt(policy.immediate),
            wait=self._backoff(policy),
            retry=retry_if_exception(_retried_at_once),
            sleep=self._sleep, reraise=True)
        handle = self._chains[admitted.route.contract.message_type]
        ctx = self._context(admitted, slot, dequeue_count, generation, session)
        for attempt in retrying:
            with attempt:
                if self._safeguards.fresh_retry_state:  # off: the "dirty-retry" break
                    ctx = self._context(admitted, slot, dequeue_count, generation, session)
                handle(admitted.message, ctx)
                operations = ctx.state.operations()
        return operations, ctx

    def _context(self, admitted: Admitted, slot: Slot, dequeue_count: int,
                 generation: int, session: Handle | None) -> Context:
        # The rows read with the claim are as of the slot's ETag, which the commit checks.
        state = PartitionState(self._tables, self._state_table, admitted.partition,
                               {k: v for k, v in slot.rows.items()
                                if not k.startswith(RESERVED_PREFIX)})
        counters = dict(slot.record.sequences) if slot.record is not None else {}
        view = None
        if session is not None:
            assert admitted.session is not None
            view = SessionView(admitted.session, copy.deepcopy(session.row.state),
                               sequence=admitted.envelope.sequence)
        return Context(self.endpoint, admitted.envelope, dequeue_count, state,
                       self._addressing, [], _sending=self._middleware, deferrals=generation,
                       session=view, _numbering=Numbering(
                           handler_stream(self.endpoint, admitted.partition), counters))

    def _backoff(self, policy: RetryPolicy) -> Callable[[RetryCallState], float]:
        return backoff(policy.backoff_initial, policy.backoff_max, self._random)


def _counters(ctx: Context) -> dict[str, int]:
    """The partition's sequence counters after this handler call's sends."""
    return dict(ctx._numbering.counters) if ctx._numbering is not None else {}


def _retried_at_once(exc: BaseException) -> bool:
    """Whether a handler attempt that raised ``exc`` gets an immediate retry: a failure of
    the handler's own (not storage, not a lost claim, not a request to wait or to give up),
    and never a BaseException - tenacity catches those too, and a KeyboardInterrupt or a
    SystemExit must stop the worker, not run the handler again."""
    return isinstance(exc, Exception) and not isinstance(
        exc, (StorageError, ClaimLost, RetryAfter, Reject))
