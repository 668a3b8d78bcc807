"""``python -m bus host --until-idle``'s rule (``bus.hosting.local.queues.all_idle``): idle when
nothing runs and every poller found nothing in a receive it started after the last work
anywhere ended - work can send to another poller's queue - and a receive that failed is not
quiet (the quickstart tests run the whole command on Azurite)."""

from __future__ import annotations

from bus.hosting.local.queues import Activity, all_idle


def test_idle_needs_a_quiet_receive_after_the_last_work_anywhere() -> None:
    orders, billing = Activity(), Activity()
    assert not all_idle([orders, billing])  # nobody has polled yet
    orders.polled(1.0, quiet=True)
    billing.polled(1.0, quiet=True)
    assert all_idle([orders, billing])
    orders.begin()
    assert not all_idle([orders, billing])  # orders is working
    orders.end()  # done now, after billing's quiet receive: it may have sent to billing
    assert not all_idle([orders, billing])
    billing.polled(orders.done_at + 1, quiet=True)
    orders.polled(orders.done_at + 1, quiet=True)
    assert all_idle([orders, billing])
    assert not all_idle([orders, billing], done_at=orders.done_at + 2)  # a timer ran since


def test_a_receive_that_failed_or_found_work_is_not_quiet() -> None:
    poller = Activity()
    poller.polled(5.0, quiet=True)
    poller.polled(6.0, quiet=False)  # storage did not answer, or there were messages
    assert poller.quiet_since is None and not all_idle([poller])
