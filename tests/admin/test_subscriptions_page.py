"""The console's Subscriptions page and its JSON: desired and observed subscriptions with
health, a cleanup token shown only as sealed; "reconcile now" needs an operator, the CSRF
token and a reason, queues one run and is audited."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

from admin_ui.app import create_app
from admin_ui.extensions import combine
from admin_ui.subscriptions import subscriptions_extensions
from config.catalog import Catalog, build_catalog, load_definitions, load_object_binding_documents
from config.settings import BindingSettings, Secret, WebhookRoute
from daemon.core.outcomes import DeadLetter
from daemon.services.subscriptions import SUBSCRIPTION_FAMILY, run_spec
from storage.port import SqlTx, WorkQuery
from storage.secret_retirements import RetirementRow, read_retirements, write_retirement
from storage.subscriptions import (
    Sealed,
    SubscriptionRow,
    read_subscriptions,
    write_subscription,
)
from tests.admin.support import ConsoleHarness, console_harness, console_settings
from tests.admin.test_openapi import _routes
from tests.support.backends import FreshDatabase
from tests.support.work import T0, claim, finalize

BINDING = BindingSettings(binding_id="outreach-main", provider="outreach", org_id="org-1",
                          app_installation_id="app-1", remote_account_id="org-77",
                          base_url="http://127.0.0.1:9")
ROUTE = WebhookRoute(route="outreach", binding_id="outreach-main",
                     webhook="outreach.prospect_events",
                     public_url="https://hooks.example.test/hooks/outreach",
                     secret=Secret("never-shown-secret"))


def console_catalog() -> Catalog:
    _, documents = load_definitions()
    return build_catalog(1, documents, (BINDING,), load_object_binding_documents())


@pytest.fixture
async def subs_console(sqlite_db: FreshDatabase) -> AsyncIterator[ConsoleHarness]:
    settings = attrs.evolve(console_settings(), bindings=(BINDING,), webhook_routes=(ROUTE,))
    _, documents = load_definitions()
    catalog = build_catalog(1, documents, (BINDING,), load_object_binding_documents())
    async with console_harness(sqlite_db, settings=settings) as harness:
        harness.app = create_app(harness.replica, combine(subscriptions_extensions(catalog)))
        yield harness


async def test_the_page_shows_desired_and_observed_and_never_a_secret(
        subs_console: ConsoleHarness) -> None:
    console = subs_console

    async def seed(tx: SqlTx) -> None:
        await write_subscription(tx, None, SubscriptionRow(
            name="outreach:updated", binding_id="outreach-main", route="outreach",
            resource="prospect", action="updated", url=ROUTE.public_url, payload_version=2,
            provider_id="17", generation=2, secret_generation=1, health="missing",
            cleanup=Sealed("k1", b"\x00" * 40), last_outcome="created",
            last_reason="deleted_behind_our_back"), 1)

    await console.store.db.transact(seed, name="test.seed")
    viewer, _ = await console.sign_in("viv")
    got = await viewer.get("/admin/api/subscriptions")
    doc = await got.get_json()
    assert got.status_code == 200 and "desired" in doc, doc
    assert [d["name"] for d in doc["desired"]] == [
        "outreach:created", "outreach:destroyed", "outreach:updated"]
    (row,) = doc["observed"]
    assert (row["provider_id"], row["generation"], row["health"], row["cleanup_token"]) == (
        "17", 2, "missing", "sealed:k1")
    # The observed row is missing at the provider, and the two desired ones with no row
    # are missing too.
    assert doc["health"] == {"active": 0, "disabled": 0, "missing": 3}
    assert doc["previous_secret_removable"] == []  # no previous secret configured
    html = await (await viewer.get("/admin/subscriptions")).get_data(as_text=True)
    assert "outreach:updated" in html and 'href="/admin/subscriptions"' in html
    assert "never-shown-secret" not in html and "never-shown-secret" not in str(doc)
    documented = (await (await viewer.get("/admin/api/openapi.json")).get_json())["paths"]
    assert "/admin/api/subscriptions" in documented
    assert ("/admin/api/subscriptions", "get") in _routes(console)
    assert (await console.client().get("/admin/api/subscriptions")).status_code == 401


async def test_reconcile_now_needs_an_operator_csrf_and_a_reason_and_is_audited(
        subs_console: ConsoleHarness) -> None:
    console = subs_console
    form = {"binding_id": "outreach-main", "reason": "provider outage over"}
    viewer, viewer_csrf = await console.sign_in("viv")
    refused = await viewer.post("/admin/subscriptions/reconcile",
                                form={**form, "csrf_token": viewer_csrf})
    assert refused.status_code == 403
    operator, csrf = await console.sign_in("otto")
    assert (await operator.post("/admin/subscriptions/reconcile", form=form)).status_code \
        == 403  # no CSRF token
    no_reason = await operator.post("/admin/subscriptions/reconcile",
                                    form={"binding_id": "outreach-main", "csrf_token": csrf})
    assert no_reason.status_code == 400
    unknown = await operator.post("/admin/subscriptions/reconcile",
                                  form={**form, "binding_id": "nope", "csrf_token": csrf})
    assert unknown.status_code == 400
    assert await console.store.work_list(WorkQuery(family=SUBSCRIPTION_FAMILY)) == []
    done = await operator.post("/admin/subscriptions/reconcile",
                               form={**form, "csrf_token": csrf})
    assert done.status_code == 302
    (item,) = await console.store.work_list(WorkQuery(family=SUBSCRIPTION_FAMILY))
    assert '"kind":"run"' in item.payload and '"chain":false' in item.payload
    (entry,) = [e for e in await console.store.audit_list()
                if e.action == "subscriptions.reconcile"]
    assert (entry.actor, entry.role, entry.target_id, entry.reason) == (
        "otto", "operator", "outreach-main", "provider outage over")
    assert item.work_id in entry.after


async def test_the_page_says_when_a_rotated_routes_previous_secret_may_go(
        sqlite_db: FreshDatabase) -> None:
    route = attrs.evolve(ROUTE, previous_secret=Secret("old"), secret_generation=2)
    settings = attrs.evolve(console_settings(), bindings=(BINDING,), webhook_routes=(route,))
    _, documents = load_definitions()
    catalog = build_catalog(1, documents, (BINDING,), load_object_binding_documents())
    async with console_harness(sqlite_db, settings=settings) as console:
        console.app = create_app(console.replica, combine(subscriptions_extensions(catalog)))
        row = SubscriptionRow(
            name="outreach:updated", binding_id="outreach-main", route="outreach",
            resource="prospect", action="updated", url=ROUTE.public_url, payload_version=2,
            provider_id="18", generation=2, secret_generation=2, rotating=True)

        async def seed(tx: SqlTx) -> None:
            await write_subscription(tx, None, row, 1)

        await console.store.db.transact(seed, name="test.seed")
        viewer, _ = await console.sign_in("viv")
        doc = await (await viewer.get("/admin/api/subscriptions")).get_json()
        assert doc["previous_secret_removable"] == []  # still rotating

        async def done(tx: SqlTx) -> None:
            (before,) = await read_subscriptions(tx)
            await write_subscription(tx, before, attrs.evolve(before, rotating=False), 2)

        (state,) = doc["previous_secrets"]
        assert (state["state"], state["rotation_complete"]) == ("accepted", False)
        assert state["redelivery_window_s"] == 23.0  # Outreach: 4 x 5 s + 3 x 1 s

        await console.store.db.transact(done, name="test.done")
        doc = await (await viewer.get("/admin/api/subscriptions")).get_json()
        # Outreach declares its redelivery schedule: the previous secret retires itself,
        # nothing for the operator to remove.
        assert doc["previous_secret_removable"] == []
        (state,) = doc["previous_secrets"]
        assert (state["state"], state["rotation_complete"]) == ("accepted", True)
        html = await (await viewer.get("/admin/subscriptions")).get_data(as_text=True)
        assert "the next reconciliation run starts the previous secret" in html

        async def watch(tx: SqlTx) -> None:
            await write_retirement(tx, None, RetirementRow(
                route="outreach", secret_generation=2, state="watching",
                watch_since_us=T0, check_at_us=T0 + 23_000_000), T0)

        await console.store.db.transact(watch, name="test.watch")
        (state,) = (await (await viewer.get("/admin/api/subscriptions")).get_json()
                    )["previous_secrets"]
        assert state["state"] == "watching"
        html = await (await viewer.get("/admin/subscriptions")).get_data(as_text=True)
        assert 'class="notice previous-secret-watching"' in html

        async def retire(tx: SqlTx) -> None:
            (before,) = await read_retirements(tx)
            await write_retirement(tx, before, attrs.evolve(
                before, state="retired", retired_at_us=T0 + 24_000_000), T0)

        await console.store.db.transact(retire, name="test.retire")
        (state,) = (await (await viewer.get("/admin/api/subscriptions")).get_json()
                    )["previous_secrets"]
        assert state["state"] == "retired" and state["retired_age_s"] is not None
        html = await (await viewer.get("/admin/subscriptions")).get_data(as_text=True)
        assert 'id="previous-secret-state-outreach"' in html and "retired itself" in html
        assert "old" not in html.split('id="previous-secret-state-outreach"')[1][:400]


async def test_missing_counts_every_desired_subscription_the_provider_does_not_have_and_the_last_run_is_shown(  # noqa: E501
        subs_console: ConsoleHarness) -> None:
    """Seen on main after `make run`: 3 desired, 0 observed, and the page said "Missing 0";
    the run that died ("the subscription list did not answer 200 (401)") was nowhere on
    it."""
    console = subs_console
    store = console.store
    now = console.replica.clock.now_us()
    (run,) = await store.work_enqueue([run_spec(BINDING, console_catalog(), now_us=now,
                                                interval_s=300, chain=False, max_attempts=5)], now)
    (item,) = (await claim(store, now=now, family=SUBSCRIPTION_FAMILY)).claimed
    assert await finalize(store, item, DeadLetter(
        "list_unavailable", "the subscription list did not answer 200 (401)"), now)
    viewer, _ = await console.sign_in("viv")
    doc = await (await viewer.get("/admin/api/subscriptions")).get_json()
    assert doc["health"] == {"active": 0, "disabled": 0, "missing": 3}
    assert [(d["name"], d["state"], d["observed"]) for d in doc["desired"]] == [
        (f"outreach:{a}", "missing", None) for a in ("created", "destroyed", "updated")]
    (last,) = doc["runs"]
    assert (last["binding_id"], last["work_id"], last["state"], last["failure_class"],
            last["summary"]) == ("outreach-main", run.work_id, "dead", "list_unavailable",
                                 "the subscription list did not answer 200 (401)")
    html = await (await viewer.get("/admin/subscriptions")).get_data(as_text=True)
    assert 'id="health-missing">3<' in html
    assert "did not answer 200 (401)" in html and run.work_id in html
