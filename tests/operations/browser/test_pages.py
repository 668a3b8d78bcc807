"""The dashboard in a real browser (Debian's Chromium through Playwright) against Azurite: each
page loads and shows what the shop's traffic left (tests/operations/browser/shop.py), a poisoned
group is replayed from the page and processed once, an endpoint is paused and resumed from the
page, a conversation is followed; read-only, the actions are absent and the API refuses them.

Elements are found by their ``data-testid`` (and ``data-*`` fields), never by layout. Each test
saves its page to docs/img/dashboard-<page>.png (docs/dashboard.md, "Screenshots").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from bus.testing import drain
from tests.operations.browser.conftest import Server
from tests.operations.browser.shop import Shop

pytestmark = pytest.mark.azurite

Screenshot = Callable[[Page, str], Path]


def group(page: Page, endpoint: str) -> Locator:
    """The Poisoned messages page's group of ``endpoint`` (the shop has one per endpoint)."""
    return page.locator(f'[data-testid^="group-"][data-endpoint="{endpoint}"]')


def field(row: Locator, name: str) -> Locator:
    return row.locator(f'[data-field="{name}"]')


def no_errors(page: Page) -> None:
    """Nothing on the page says an API call or a reading failed."""
    expect(page.locator(".error:visible")).to_have_count(0)


# -- pages, read-only ------------------------------------------------------------------------
def test_endpoints_page_shows_each_endpoint(page: Page, readonly: Server, shop: Shop,
                                            screenshot: Screenshot) -> None:
    page.goto(readonly.url + "/")
    expect(page.get_by_test_id("mode")).to_have_text("read-only")
    for name in ("orders", "billing", "shipping", "tracking"):
        expect(page.get_by_test_id(f"endpoint-row-{name}")).to_be_visible()
    billing, orders = page.get_by_test_id("endpoint-row-billing"), \
        page.get_by_test_id("endpoint-row-orders")
    expect(field(billing, "poison")).to_have_text(str(len(shop.declined_orders)))
    expect(field(page.get_by_test_id("endpoint-row-tracking"), "poison")).to_have_text("1")
    expect(field(orders, "poison")).to_have_text("1")  # the undecodable body
    expect(field(orders, "depth")).not_to_have_text("0")  # three orders wait in its queue
    expect(field(orders, "paused")).to_have_text("no")
    expect(field(orders, "scheduled")).to_have_text("1")  # the PlaceOrder due in an hour
    expect(field(orders, "deferred")).to_have_text("1")  # the ShipOrder waiting for payment
    # Every order reached billing; the declined ones failed once, then were poisoned.
    declined = len(shop.declined_orders)
    expect(field(billing, "processed")).to_have_text(str(len(shop.orders) - declined))
    expect(field(billing, "failed")).to_have_text(str(declined))
    no_errors(page)
    expect(page.get_by_test_id("pause-orders")).to_be_hidden()  # read-only: no actions
    # Orders wait and nothing serves the endpoint (no process beats in this test).
    expect(field(orders, "live")).to_contain_text("0")
    expect(page.get_by_test_id("unserved-orders")).to_be_visible()
    expect(page.get_by_test_id("instances-table")).to_contain_text("no instance")
    screenshot(page, "endpoints")


def test_trends_of_an_endpoint(page: Page, actions: Server, fresh_shop: Shop,
                               screenshot: Screenshot) -> None:
    """Billing's trends: its processed messages per minute, their critical time, its queue's
    length as maintenance records it, and the per-type table."""
    import time

    from bus.observability import stats

    shop = fresh_shop
    bus = shop.bus
    stats.record_depth(bus.storage.tables, bus.names.state_table("billing"), time.time(), 0)
    page.goto(actions.url + "/")
    billing = page.get_by_test_id("endpoint-row-billing")
    expect(field(billing, "critical")).not_to_have_text("\u2013")  # the page's dash for none
    expect(field(billing, "drain")).to_have_text("empty")
    page.get_by_test_id("trends-billing").click()
    expect(page.get_by_test_id("trends")).to_be_visible()
    expect(page.get_by_test_id("chart-throughput").locator("rect")).not_to_have_count(0)
    expect(page.get_by_test_id("chart-critical").locator("circle")).not_to_have_count(0)
    expect(page.get_by_test_id("chart-depth").locator("circle")).to_have_count(1)
    placed = page.get_by_test_id("type-row-OrderPlaced")
    declined = len(shop.declined_orders)
    expect(field(placed, "processed")).to_have_text(str(len(shop.orders) - declined))
    no_errors(page)
    screenshot(page, "trends")


def test_instances_live_and_stopped(page: Page, actions: Server, fresh_shop: Shop,
                                    screenshot: Screenshot) -> None:
    """Two processes' heartbeats: a worker serving orders, live; a Spark stream that
    stopped. Orders is served, so not flagged."""
    import time

    from bus.observability.heartbeat import Heartbeat

    bus = fresh_shop.bus
    table = bus.names.instances_table
    live = Heartbeat(bus.storage.tables, table, "worker", 3600.0, time.time, instance="w-live")
    live._endpoints["orders"] = 1
    live.beat()
    gone = Heartbeat(bus.storage.tables, table, "spark", 10.0, time.time, instance="s-gone")
    gone._endpoints["tracking"] = 1
    gone.beat(stopped=True)
    page.goto(actions.url + "/")
    expect(field(page.get_by_test_id("endpoint-row-orders"), "live")).to_contain_text("1")
    expect(page.get_by_test_id("unserved-orders")).to_be_hidden()
    expect(field(page.get_by_test_id("instance-row-w-live"), "state")).to_have_text("live")
    expect(field(page.get_by_test_id("instance-row-s-gone"), "state")).to_have_text("stopped")
    no_errors(page)
    screenshot(page, "instances")


def test_poisoned_page_groups_the_poison_entries(page: Page, readonly: Server, shop: Shop,
                                                 screenshot: Screenshot) -> None:
    page.goto(readonly.url + "/poisoned")
    billing = group(page, "billing")
    expect(billing).to_have_count(1)
    expect(billing).to_have_attribute("data-message-type", "OrderPlaced")
    expect(billing).to_have_attribute("data-exception-type", "RuntimeError")
    expect(billing.locator('[data-testid^="group-count-"]')).to_have_text(
        str(len(shop.declined_orders)))
    tracking = group(page, "tracking")
    expect(tracking).to_have_attribute("data-exception-type", "Reject")
    expect(tracking.locator('[data-testid^="group-count-"]')).to_have_text("1")
    expect(group(page, "orders").locator('[data-testid^="group-count-"]')).to_have_text("1")
    no_errors(page)
    # read-only: nothing to select, replay or purge
    expect(page.get_by_test_id("replay-selected")).to_be_hidden()
    expect(page.locator('[data-testid^="group-replay-"]')).to_have_count(0)
    expect(page.locator('[data-testid^="group-select-"]:visible')).to_have_count(0)
    screenshot(page, "poisoned")


def test_filtering_the_poisoned_messages(page: Page, readonly: Server, shop: Shop,
                                        screenshot: Screenshot) -> None:
    """The filter form narrows the groups down: by reason text, by endpoint and type, by an
    exception's text; Clear shows every group again."""
    page.goto(readonly.url + "/poisoned")
    expect(group(page, "billing")).to_have_count(1)
    page.get_by_test_id("filter-reason").fill("rejected")
    page.get_by_test_id("filter-apply").click()
    expect(group(page, "tracking")).to_have_count(1)
    expect(group(page, "billing")).to_have_count(0)
    page.get_by_test_id("filter-clear").click()
    page.get_by_test_id("filter-endpoint").select_option("billing")
    page.get_by_test_id("filter-type").fill("OrderPlaced")
    page.get_by_test_id("filter-exception").fill("declined")
    page.get_by_test_id("filter-apply").click()
    expect(group(page, "billing").locator('[data-testid^="group-count-"]')).to_have_text(
        str(len(shop.declined_orders)))
    expect(group(page, "orders")).to_have_count(0)
    no_errors(page)
    screenshot(page, "poisoned-filtered")
    page.get_by_test_id("filter-clear").click()
    expect(group(page, "orders")).to_have_count(1)


def test_a_poisoned_message_in_detail(page: Page, readonly: Server, shop: Shop,
                                      screenshot: Screenshot) -> None:
    # Read before the page loads: a reading leases the entries while it reads, and the page's
    # own reading would hide them from this one.
    [letter] = [x for x in shop.bus.poisoned("billing").entries()
                if x.entry.envelope is not None
                and x.entry.envelope.correlation_id == f"conv-{shop.declined_orders[0]}"]
    page.goto(readonly.url + "/poisoned")
    page.get_by_test_id(f"entry-show-{letter.id}").click()
    detail = page.get_by_test_id("poisoned-detail")
    expect(detail).to_be_visible()
    expect(detail).to_be_in_viewport()  # drawn below the groups, and scrolled to
    expect(detail).to_contain_text("RuntimeError: card declined for c-declined")
    expect(detail).to_contain_text("max delivery count")  # the reason
    expect(detail).to_contain_text(shop.declined_orders[0])  # the payload
    expect(detail).to_contain_text("replayable")
    detail.scroll_into_view_if_needed()
    screenshot(page, "poisoned-detail")


def test_waiting_page_shows_sessions_deferred_and_scheduled(page: Page, readonly: Server,
                                                            shop: Shop,
                                                            screenshot: Screenshot) -> None:
    page.goto(readonly.url + "/waiting")
    session = page.get_by_test_id(f"session-tracking-{shop.stuck_session}")
    expect(session).to_contain_text("stuck")
    expect(page.get_by_test_id("sessions-table").locator("tbody tr").first).to_contain_text(
        "stuck")  # stuck sessions first
    deferred = page.get_by_test_id(f"deferred-{shop.deferred}")
    expect(deferred).to_contain_text("orders")
    expect(deferred).to_contain_text("ShipOrder")
    expect(page.get_by_test_id(f"scheduled-{shop.scheduled}")).to_contain_text("PlaceOrder")
    expect(page.get_by_test_id(f"release-{shop.deferred}")).to_be_hidden()
    expect(page.get_by_test_id(f"session-skip-tracking-{shop.stuck_session}")).to_be_hidden()
    no_errors(page)
    screenshot(page, "waiting")


def test_a_stuck_session_links_to_the_entry_that_blocks_it(page: Page, readonly: Server,
                                                          shop: Shop) -> None:
    page.goto(readonly.url + "/waiting")
    page.get_by_test_id(f"session-blocked-tracking-{shop.stuck_session}").click()
    page.wait_for_url("**/poisoned?endpoint=tracking&entry=*")
    detail = page.get_by_test_id("poisoned-detail")
    expect(detail).to_contain_text('"lost"')  # the rejected event the session waits for
    expect(detail).to_be_in_viewport()
    no_errors(page)


def test_following_a_conversation(page: Page, readonly: Server, shop: Shop,
                                  screenshot: Screenshot) -> None:
    page.goto(readonly.url + "/conversation")
    states = page.get_by_test_id("conversation-table").locator("tbody tr")
    # a whole order: placed, then billed and packed - every copy processed
    page.get_by_test_id("conversation-id").fill(shop.conversation)
    page.get_by_test_id("conversation-go").click()
    expect(page.get_by_test_id("message-count")).to_have_text("3")
    expect(states).to_have_count(3)
    assert {row.get_attribute("data-state") for row in states.all()} == {"processed"}
    # an order whose card was declined: placed and packed, its billing copy poisoned
    failed = shop.declined_orders[0]
    page.get_by_test_id("conversation-id").fill(f"conv-{failed}")
    page.get_by_test_id("conversation-go").click()
    expect(page.locator('[data-testid="conversation-table"] tbody tr[data-state="poisoned"]')
           ).to_have_count(1)
    expect(states.filter(has_text="billing")).to_have_attribute("data-state", "poisoned")
    expect(states.filter(has_text="shipping")).to_have_attribute("data-state", "processed")
    picture = page.get_by_test_id("conversation-picture")
    expect(picture.locator("svg")).to_have_count(1)  # the flow picture
    expect(picture).to_contain_text("billing")
    no_errors(page)
    screenshot(page, "conversation")


def test_an_id_typed_while_the_page_loads_is_kept(page: Page, readonly: Server,
                                                  shop: Shop) -> None:
    # The page loads its settings first; an id typed meanwhile must survive that load.
    held: list[Route] = []

    def hold(route: Route) -> None:  # a bound method will not do: Playwright tags the handler
        held.append(route)

    page.route("**/api/settings", hold)
    page.goto(readonly.url + "/conversation")
    page.get_by_test_id("conversation-id").fill(shop.conversation)
    page.wait_for_function("() => true")  # let the held settings requests reach us
    assert held
    for route in held:
        route.continue_()
    page.wait_for_load_state("networkidle")
    expect(page.get_by_test_id("conversation-id")).to_have_value(shop.conversation)
    page.get_by_test_id("conversation-go").click()
    expect(page.get_by_test_id("message-count")).to_have_text("3")
    no_errors(page)


def test_read_only_refuses_actions(page: Page, readonly: Server, shop: Shop) -> None:
    api = page.request
    for path, body in (("/api/endpoints/orders/pause", {"seconds": 60, "reason": "x"}),
                       ("/api/endpoints/orders/resume", {}),
                       ("/api/poisoned/billing/replay", {"ids": []}),
                       ("/api/poisoned/billing/purge", {"ids": []})):
        response = api.post(readonly.url + path, data=body)
        assert response.status == 403, (path, response.status, response.text())
        assert "read-only" in response.json()["detail"]
    assert shop.bus.paused("orders") is None
    assert shop.poisoned("billing") == len(shop.declined_orders)


# -- actions -------------------------------------------------------------------------------
def test_replaying_a_poisoned_group_processes_each_message_once(
        page: Page, actions: Server, fresh_shop: Shop, screenshot: Screenshot) -> None:
    shop = fresh_shop
    failed = len(shop.declined_orders)
    assert [shop.charged(order) for order in shop.declined_orders] == [0] * failed
    shop.declined.clear()  # the card gateway accepts them now
    page.goto(actions.url + "/poisoned")
    expect(page.get_by_test_id("mode")).to_have_text("actions allowed")
    billing = group(page, "billing")
    billing.locator('[data-testid^="group-select-"]').check()
    expect(page.get_by_test_id("replay-selected")).to_contain_text(f"({failed})")
    page.get_by_test_id("replay-selected").click()
    dialog = page.get_by_test_id("confirm-dialog")
    expect(dialog).to_be_visible()
    expect(page.get_by_test_id("confirm-text")).to_contain_text(  # names how many
        re.compile(rf"\b{failed}\b[^0-9]*message"))
    screenshot(page, "replay")
    page.get_by_test_id("confirm-yes").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("action-result")).to_contain_text(str(failed))
    expect(group(page, "billing")).to_have_count(0)  # the page reloads: the group is gone
    assert shop.poisoned("billing") == 0
    # the replayed messages go through billing once each (and nothing else is redone)
    outcomes = drain(shop.bus).total()
    assert outcomes.get("processed", 0) >= failed and "poisoned" not in outcomes
    assert [shop.charged(order) for order in shop.declined_orders] == [1] * failed
    assert [shop.packed(order) for order in shop.declined_orders] == [1] * failed
    assert shop.poisoned("billing") == 0
    page.get_by_test_id("refresh").click()
    expect(group(page, "billing")).to_have_count(0)


def test_an_undecodable_entry_shows_its_body_and_offers_no_replay(
        page: Page, actions: Server, fresh_shop: Shop) -> None:
    """A body that is not a message of the bus cannot be sent again: its group offers a purge,
    says why there is no replay, and its detail shows the body as it arrived."""
    page.goto(actions.url + "/poisoned")
    orders = group(page, "orders")  # (reading the entries here would lease them from the page)
    expect(orders.locator('[data-testid^="group-replay-"]')).to_be_hidden()
    expect(orders.locator('[data-testid^="group-not-replayable-"]')).to_have_text(
        "1 not replayable (no message to send again: purge)")
    expect(group(page, "billing").locator('[data-testid^="group-replay-"]')).to_have_text(
        f"Replay group ({len(fresh_shop.declined_orders)})")
    orders.locator('[data-testid^="entry-show-"]').click()
    expect(page.get_by_test_id("poisoned-detail")).to_be_in_viewport()
    expect(page.get_by_test_id("detail-original-body")).to_have_text("%%% not base64 %%%")
    no_errors(page)


def test_pausing_and_resuming_an_endpoint(page: Page, actions: Server, fresh_shop: Shop,
                                          screenshot: Screenshot) -> None:
    bus = fresh_shop.bus
    page.goto(actions.url + "/")
    row = page.get_by_test_id("endpoint-row-orders")
    page.get_by_test_id("pause-orders").click()
    page.get_by_test_id("pause-minutes").fill("30")
    page.get_by_test_id("pause-reason").fill("database migration")
    page.get_by_test_id("pause-submit").click()
    expect(field(row, "paused")).to_contain_text("database migration")
    expect(page.get_by_test_id("resume-orders")).to_be_visible()
    paused = bus.paused("orders")
    assert paused is not None and paused.reason == "database migration"
    screenshot(page, "paused")
    page.get_by_test_id("resume-orders").click()
    expect(field(row, "paused")).to_have_text("no")
    expect(page.get_by_test_id("pause-orders")).to_be_visible()
    assert bus.paused("orders") is None

    # The audit trail shows both, newest first, as the dashboard's.
    page.goto(actions.url + "/audit")
    expect(page.get_by_test_id("audit-0")).to_have_attribute("data-action", "resume")
    expect(page.get_by_test_id("audit-1")).to_have_attribute("data-action", "pause")
    expect(page.get_by_test_id("audit-1")).to_contain_text("database migration")
    expect(page.get_by_test_id("audit-1")).to_contain_text("(dashboard)")
    screenshot(page, "audit")
