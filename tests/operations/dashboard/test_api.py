"""The dashboard's JSON API (bus.operations.dashboard) through FastAPI's TestClient, against
Azurite: endpoints, poisoned messages replayed exactly once and purged, pause and resume,
deferred and sessions, and every action refused in read-only mode."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from bus import Bus
from bus.adapters.azure import AzureStorage
from bus.operations.dashboard import create_app
from bus.operations.dashboard.poller import Poller
from bus.testing import drain
from tests.operations.dashboard import shop
from tests.operations.dashboard.shop import Charge, Ship, Track

pytestmark = pytest.mark.azurite

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _switches() -> Iterator[None]:
    shop.FAILING["on"] = shop.HOLD["on"] = True
    yield
    shop.FAILING["on"] = shop.HOLD["on"] = True


@pytest.fixture
def bus(azurite_connection: str, prefix: str) -> Bus:
    return shop.build(AzureStorage.from_connection_string(azurite_connection), prefix)


@pytest.fixture
def client(bus: Bus) -> TestClient:
    return TestClient(create_app(bus, allow_actions=True, depth_seconds=0))


@pytest.fixture
def readonly(bus: Bus) -> TestClient:
    return TestClient(create_app(bus, depth_seconds=0))


def poison(bus: Bus, *orders: str) -> None:
    for order in orders:
        bus.send(Charge(order_id=order, amount=5))
    assert drain(bus, fail_fast=False).total() == {"poisoned": len(orders)}


def row(client: TestClient, name: str) -> dict[str, object]:
    [found] = [e for e in client.get("/api/endpoints").json()["endpoints"] if e["name"] == name]
    return found


def test_endpoints_show_depth_poison_pause_and_deferred(bus: Bus, client: TestClient) -> None:
    poison(bus, "o1")
    bus.send(Ship(order_id="s1"))
    drain(bus)  # deferred
    bus.send(Ship(order_id="s2"))
    bus.send(Ship(order_id="s3"))  # queued, not processed
    body = client.get("/api/endpoints", params={"period": 900}).json()
    assert body["period"] == 900
    assert [e["name"] for e in body["endpoints"]] == ["orders", "payments", "tracking"]
    orders, payments = row(client, "orders"), row(client, "payments")
    assert orders["depth"] == 2 and orders["deferred"] == 1 and orders["poison"] == 0
    assert orders["queue"] == bus.names.queue("orders") and orders["paused"] is None
    assert payments["depth"] == 0 and payments["poison"] == 1
    assert 0 <= orders["oldest_age_seconds"] < 120 and payments["oldest_age_seconds"] is None
    assert client.get("/api/endpoints", params={"period": 5}).status_code == 422


def test_readings_are_shared_and_taken_once_per_interval(bus: Bus) -> None:
    web = create_app(bus, depth_seconds=3600)
    client = TestClient(web)
    bus.send(Ship(order_id="s1"))
    first = row(client, "orders")
    reads = web.state.monitor.poller.reads
    bus.send(Ship(order_id="s2"))
    second = row(client, "orders")  # another viewer, within the interval: the same reading
    assert web.state.monitor.poller.reads == reads
    assert first["depth"] == second["depth"] == 1 and first["read_at"] == second["read_at"]


def test_the_poller_takes_one_reading_for_concurrent_askers() -> None:
    now = [100.0]
    poller = Poller(30, clock=lambda: now[0])
    calls: list[int] = []
    gate = threading.Event()

    def read() -> int:
        calls.append(1)
        gate.wait(5)
        return len(calls)

    results: list[int | None] = []
    threads = [threading.Thread(target=lambda: results.append(poller.get("k", read).value))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    gate.set()
    for thread in threads:
        thread.join()
    assert calls == [1] and results == [1] * 8
    now[0] += 30  # due again
    assert poller.get("k", read).value == 2
    failing = poller.get("bad", lambda: 1 // 0)
    assert failing.value is None and failing.error and "ZeroDivisionError" in failing.error


def test_a_poisoned_group_replayed_through_the_api_is_processed_once(
        bus: Bus, client: TestClient) -> None:
    poison(bus, "o1", "o2", "o3")
    [group] = client.get("/api/poisoned").json()["groups"]
    assert (group["endpoint"], group["message_type"], group["exception_type"], group["count"]) \
        == ("payments", "tests.operations.dashboard.shop.Charge", "RuntimeError", 3) or \
        (group["endpoint"], group["exception_type"], group["count"]) == \
        ("payments", "RuntimeError", 3)
    assert group["first_seen"] <= group["last_seen"] and len(group["ids"]) == 3
    assert {e["token"] for e in group["entries"]} == {"poisoned"}
    detail = client.get(f"/api/poisoned/payments/{group['ids'][0]}").json()
    assert detail["exception"].startswith("RuntimeError: gateway down for o")
    assert detail["dequeue_count"] == 2 and detail["token"] == "poisoned"
    assert '"amount":5' in detail["payload_text"].replace(" ", "")
    assert detail["envelope"]["destination"] == "payments" and detail["replayable"]
    shop.FAILING["on"] = False  # the gateway is back
    replayed = client.post("/api/poisoned/payments/replay",
                           json={"ids": group["ids"], "count": 3}).json()
    assert replayed == {"results": dict.fromkeys(group["ids"], "replayed"), "replayed": 3,
                        "missing": []}
    assert drain(bus).total() == {"processed": 3}
    assert [shop.times(bus, "payments", o, "charge") for o in ("o1", "o2", "o3")] == [1, 1, 1]
    assert client.get("/api/poisoned").json()["groups"] == []
    again = client.post("/api/poisoned/payments/replay", json={"ids": group["ids"], "count": 3})
    assert again.json()["replayed"] == 0 and again.json()["missing"] == sorted(group["ids"])
    assert drain(bus).total() == {}


def test_an_entry_is_shown_without_reading_a_blob_it_names_but_its_own_claim_check(
        bus: Bus, client: TestClient) -> None:
    """A sender with add-message rights points a copy's ``payload_ref`` at another message's
    blob: the receiver poisons it unread, and so does the entry's page."""
    secret = bus.parts.payloads.ref("orders", "someone-elses-attempt")
    bus.storage.blobs.write(secret.container, secret.blob, b'{"card":"4111 1111 1111 1111"}')
    queue = bus.names.queue("payments")
    bus.send(Charge(order_id="o1", amount=5))
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=60)
    bus.storage.queues.delete(queue, message)
    document = json.loads(base64.b64decode(message.body))
    forged = {**document, "payload": None, "payload_ref": secret.model_dump()}
    bus.storage.queues.send(queue, base64.b64encode(json.dumps(forged).encode()).decode())
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    [group] = client.get("/api/poisoned").json()["groups"]
    response = client.get(f"/api/poisoned/payments/{group['ids'][0]}")
    assert "4111 1111" not in response.text  # (random ids may hold "4111"; none holds a space)
    detail = response.json()
    assert detail["payload_text"] is None
    assert "is not this message's claim check" in detail["payload_note"]


def test_an_action_must_carry_the_count_it_confirmed(bus: Bus, client: TestClient) -> None:
    poison(bus, "o1", "o2")
    [group] = client.get("/api/poisoned").json()["groups"]
    for body in ({"ids": group["ids"], "count": 1}, {"ids": group["ids"][:1], "count": 2},
                 {"ids": [group["ids"][0]] * 2, "count": 2}, {"ids": group["ids"]}):
        for action in ("replay", "purge"):
            response = client.post(f"/api/poisoned/payments/{action}", json=body)
            assert response.status_code in (400, 422), (action, body)
    assert client.get("/api/poisoned").json()["groups"][0]["count"] == 2  # nothing done


def test_purge_removes_entries_and_their_tokens(bus: Bus, client: TestClient) -> None:
    poison(bus, "o1", "o2")
    [group] = client.get("/api/poisoned").json()["groups"]
    gone, kept = group["ids"]
    purged = client.post("/api/poisoned/payments/purge", json={"ids": [gone], "count": 1}).json()
    assert purged == {"purged": [gone], "missing": [], "kept": {}}
    [left] = client.get("/api/poisoned").json()["groups"]
    assert left["ids"] == [kept]
    assert client.get(f"/api/poisoned/payments/{gone}").status_code == 404


def test_pause_and_resume(bus: Bus, client: TestClient) -> None:
    paused = client.post("/api/endpoints/orders/pause",
                         json={"seconds": 600, "reason": "deploying billing"}).json()
    assert paused["paused"]["reason"] == "deploying billing"
    assert paused["paused"]["until"] == pytest.approx(time.time() + 600, abs=30)
    assert bus.paused("orders") is not None
    assert row(client, "orders")["paused"]["reason"] == "deploying billing"
    assert client.post("/api/endpoints/orders/resume").json()["paused"] is None
    assert bus.paused("orders") is None and row(client, "orders")["paused"] is None
    assert client.post("/api/endpoints/orders/pause", json={"seconds": 0}).status_code == 422
    assert client.post("/api/endpoints/nope/pause", json={"seconds": 5}).status_code == 404


def test_deferred_messages_are_listed_and_released(bus: Bus, client: TestClient) -> None:
    message_id = bus.send(Ship(order_id="s1"))
    drain(bus)
    [item] = client.get("/api/deferred", params={"endpoint": "orders"}).json()
    assert item["message_id"] == message_id and item["message_type"].endswith("Ship")
    assert client.get("/api/deferred").json() == [item]
    shop.HOLD["on"] = False
    released = client.post(f"/api/deferred/orders/{message_id}/release",
                           json={"deferrals": item["deferrals"]}).json()
    assert released["released"] is True
    assert drain(bus).total() == {"processed": 1}
    assert shop.times(bus, "orders", "s1", "shipped") == 1
    assert client.get("/api/deferred").json() == []
    assert client.post(f"/api/deferred/orders/{message_id}/release").json()["released"] is False


def test_sessions_are_listed_and_closed(bus: Bus, client: TestClient) -> None:
    bus.send(Track(parcel="p1", event="picked"))
    bus.send(Track(parcel="p1", event="packed"))
    drain(bus)
    [session] = client.get("/api/sessions", params={"endpoint": "tracking"}).json()
    assert (session["session"], session["status"], session["handled"]) == ("p1", "open", 2)
    closed = client.post("/api/sessions/tracking/p1/close").json()
    assert closed == {"endpoint": "tracking", "session": "p1", "released": 0}
    assert client.get("/api/sessions").json()[0]["status"] == "closed"
    assert client.post("/api/sessions/tracking/nope/skip").status_code == 404


def test_a_session_held_by_a_poisoned_copy_names_its_entry(bus: Bus, client: TestClient) -> None:
    for event in ("picked", "lost", "delivered"):
        bus.send(Track(parcel="p2", event=event))
    drain(bus, fail_fast=False)
    [session] = client.get("/api/sessions", params={"endpoint": "tracking"}).json()
    assert (session["status"], session["waiting"], session["next"]) == ("waiting", 1,
                                                                        {"client:client": 2})
    [group] = client.get("/api/poisoned").json()["groups"]
    assert session["blocked_by"] == group["ids"]
    [entry_id] = group["ids"]
    entry = client.get(f"/api/poisoned/tracking/{entry_id}").json()
    assert '"lost"' in entry["payload_text"] and entry["reason"].startswith("rejected")
    client.post("/api/sessions/tracking/p2/skip")
    drain(bus, fail_fast=False)
    [session] = client.get("/api/sessions", params={"endpoint": "tracking"}).json()
    assert (session["status"], session["blocked_by"]) == ("open", [])


def post_routes(client: TestClient) -> list[str]:
    """Every POST route of the app (from its OpenAPI document, which FastAPI generates from
    the routes), path parameters filled in."""
    paths = client.get("/api/openapi.json").json()["paths"]
    return [re.sub(r"\{[^}]+\}", "x", path) for path, methods in paths.items()
            if "post" in methods]


def test_read_only_refuses_every_action(bus: Bus, readonly: TestClient) -> None:
    poison(bus, "o1")
    [group] = readonly.get("/api/poisoned").json()["groups"]
    paths = post_routes(readonly)
    assert len(paths) == 7, paths  # pause, resume, replay, purge, release, skip, close
    paths.append("/api/a-route-added-later")  # the guard stands in front of every route
    settings = readonly.get("/api/settings").json()
    assert settings["allow_actions"] is False and "--allow-actions" in settings["how_to_allow"]
    for path in paths:
        response = readonly.post(path, json={"ids": group["ids"], "count": 1, "seconds": 60})
        assert response.status_code == 403, path
        assert "--allow-actions" in response.json()["detail"]
    for method in ("put", "patch", "delete"):  # any other method that is not a read
        assert getattr(readonly, method)("/api/poisoned/payments/x").status_code == 403
    assert readonly.get("/api/poisoned").json()["groups"][0]["count"] == 1  # nothing done
    assert bus.paused("payments") is None


def test_actions_from_another_site_are_refused(client: TestClient) -> None:
    evil = client.post("/api/endpoints/orders/pause", json={"seconds": 60},
                       headers={"Origin": "https://elsewhere.example"})
    assert evil.status_code == 403
    own = client.post("/api/endpoints/orders/resume",
                      headers={"Origin": "http://testserver"})
    assert own.status_code == 200


def test_pages_and_the_openapi_document(client: TestClient) -> None:
    for path, marker in (("/", 'id="endpoints-table"'), ("/poisoned", 'id="confirm-dialog"'),
                         ("/waiting", 'id="sessions-table"'),
                         ("/conversation", 'id="conversation-picture"')):
        page = client.get(path)
        assert page.status_code == 200 and marker in page.text, path
        assert "/static/vendor/alpinejs/cdn.min.js" in page.text
        assert "https://" not in page.text  # nothing from a CDN: it works offline
    document = client.get("/api/openapi.json").json()
    assert {"/api/endpoints", "/api/poisoned", "/api/poisoned/{endpoint}/replay",
            "/api/conversation", "/api/scheduled"} <= set(document["paths"])
    assert "/" not in document["paths"]  # pages are not API
    assert client.get("/api/docs").status_code == 200
    assert client.get("/static/vendor/alpinejs/cdn.min.js").status_code == 200


def test_the_vendored_alpine_is_node_modules_copy() -> None:
    """An upgrade is `npm install alpinejs@X --save-exact` and copying dist/cdn.min.js."""
    vendored = ROOT / "bus/operations/dashboard/static/vendor/alpinejs/cdn.min.js"
    installed = ROOT / "node_modules/alpinejs/dist/cdn.min.js"
    if not installed.exists():
        pytest.fail("node_modules/alpinejs is missing: run `npm ci` (make setup)")
    assert vendored.read_bytes() == installed.read_bytes(), \
        "static/vendor/alpinejs/cdn.min.js differs from node_modules' copy: copy it again"
    import json

    pinned = json.loads((ROOT / "package.json").read_text())["dependencies"]["alpinejs"]
    version = json.loads((ROOT / "node_modules/alpinejs/package.json").read_text())["version"]
    assert pinned == version


def test_scheduled_messages(bus: Bus, client: TestClient) -> None:
    message_id = bus.send(Ship(order_id="later"), delay=3600)
    [item] = client.get("/api/scheduled", params={"endpoint": "orders"}).json()
    assert item["message_id"] == message_id
    assert item["due_at"] == pytest.approx(time.time() + 3600, abs=60)
    assert row(client, "orders")["scheduled"] == 1


def test_statistics_over_the_period(bus: Bus, client: TestClient) -> None:
    shop.FAILING["on"] = False
    bus.send(Charge(order_id="o1", amount=1))
    drain(bus)
    stats = row(client, "payments")["stats"]
    assert stats is not None and stats["processed"] >= 1


def test_conversation(bus: Bus, client: TestClient) -> None:
    message_id = bus.send(Ship(order_id="c1"))
    drain(bus)  # deferred
    body = client.get("/api/conversation", params={"id": message_id}).json()
    assert [(m["message_id"], m["state"]) for m in body["messages"]] == [(message_id,
                                                                          "deferred")]


def test_the_vendored_swagger_ui_is_node_modules_copy() -> None:
    """An upgrade is `npm install swagger-ui-dist@X --save-exact` and copying the files."""
    import json

    installed = ROOT / "node_modules/swagger-ui-dist"
    if not installed.exists():
        pytest.fail("node_modules/swagger-ui-dist is missing: run `npm ci` (make setup)")
    vendored = ROOT / "bus/operations/dashboard/static/vendor/swagger-ui"
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "LICENSE", "NOTICE"):
        assert (vendored / name).read_bytes() == (installed / name).read_bytes(), (
            f"static/vendor/swagger-ui/{name} differs from node_modules' copy: copy it again")
    pinned = json.loads((ROOT / "package.json").read_text())["dependencies"]["swagger-ui-dist"]
    assert json.loads((installed / "package.json").read_text())["version"] == pinned


def test_instances_and_an_unserved_endpoint(bus: Bus, client: TestClient) -> None:
    from bus.observability.heartbeat import Heartbeat

    bus.send(Ship(order_id="s1"))  # waits at orders: nobody serves it
    assert client.get("/api/instances").json()["instances"] == []
    assert (row(client, "orders")["live"], row(client, "orders")["unserved"]) == ([], True)
    assert row(client, "payments")["unserved"] is False  # nothing waits there
    beat = Heartbeat(bus.storage.tables, bus.names.instances_table, "worker", 10.0, time.time,
                     instance="w1")
    with beat.serving("orders"):  # beats on its thread until the block ends
        deadline = time.monotonic() + 30
        while not client.get("/api/instances").json()["instances"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert row(client, "orders")["live"] == ["w1"]
        [listed] = client.get("/api/instances").json()["instances"]
        assert (listed["id"], listed["kind"], listed["endpoints"], listed["live"]) == (
            "w1", "worker", ["orders"], True)
    # the last one out wrote the row stopped
    assert row(client, "orders")["unserved"] is True
    [listed] = client.get("/api/instances").json()["instances"]
    assert (listed["live"], listed["stopped"]) == (False, True)
