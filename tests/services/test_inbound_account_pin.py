"""A webhook's change pins the remote account its binding named when it was materialized
(the durable fact), so that a rebind to another account never applies an old account's
record id to the new account's records (SQLite, MariaDB)."""

from __future__ import annotations

from pathlib import Path

import attrs

from config.catalog import load_catalog
from daemon.core.inbound_change import InboundChange
from daemon.core.principals import BindingEvent
from daemon.services.clock import WallClock
from daemon.services.materializer import Materializer
from daemon.services.metrics import Metrics
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.ingress.receipts import IngressReceipt, Materialization
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.ingress import receipt
from tests.support.webhooks import ingress_settings, prospect_body
from tests.support.work import T0


def _outreach_receipt(n: int) -> IngressReceipt:
    return attrs.evolve(receipt(n, body=prospect_body(pid=40 + n)), route="outreach-main",
                        binding_id="outreach-main", webhook="outreach.prospect_events")


async def test_a_materialized_change_pins_the_account_the_binding_names_now(
        store: WorkStore, tmp_path: Path) -> None:
    cfg = ingress_settings(tmp_path)
    catalog = load_catalog(cfg)
    materializer = Materializer(max_attempts=8, store=store, catalog=catalog,
                                routes={r.route: r for r in cfg.webhook_routes},
                                clock=WallClock(), metrics=Metrics())
    first = _outreach_receipt(1)
    # No durable row yet: the configured account.
    assert await materializer.accounts([first]) == {"outreach-main": "acct-1"}
    (binding,) = [b for b in cfg.bindings if b.binding_id == "outreach-main"]
    facts = await store.binding_bootstrap(bootstrap_facts(binding), T0)
    await store.binding_transition(
        "outreach-main", BindingEvent.CHANGE, Actor("ada", "admin", "the org moved"),
        expected_generation=facts.generation, now_us=T0,
        identity=attrs.evolve(facts.identity, remote_account_id="acct-2"))
    second = _outreach_receipt(2)
    plan = materializer.plan(second, await materializer.accounts([second]))
    assert isinstance(plan, Materialization)
    (spec,) = plan.work
    change = InboundChange.from_payload(spec.payload)
    assert change.remote_account == "acct-2"  # the durable fact, not the TOML's acct-1
