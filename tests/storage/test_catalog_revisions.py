"""Conformance: Catalog revisions as durable, immutable facts, and commands pinned to them."""

from __future__ import annotations

import json

import attrs
import pytest

from config.catalog import load_catalog
from config.settings import BindingSettings, CatalogSettings, Settings
from daemon.core.outcomes import Succeeded
from daemon.services.catalog_view import CatalogView, publish_current
from storage import catalog_revisions
from storage.command_repair import RepairActor
from storage.port import (
    PublishParams,
    RevisionConflict,
    RevisionNotPublished,
    RevisionPins,
    SqlTx,
    WorkConflict,
)
from storage.work_store import WorkStore
from tests.support.commands import draft
from tests.support.work import SEC, T0, claim, finalize

WHO = {"actor": "alice", "role": "admin", "reason": "test"}


async def _publish(store: WorkStore, revision: int = 7, base_url: str = "http://127.0.0.1:1"
                   ) -> str:
    catalog = load_catalog(Settings(catalog=CatalogSettings(revision=revision), bindings=(
        BindingSettings(binding_id="hubspot-main", provider="hubspot", org_id="org-1",
                        app_installation_id="install-1", remote_account_id="portal-1",
                        base_url=base_url),)))
    rev, created = await publish_current(store, catalog, now_us=T0, **WHO)
    assert created
    return rev.digest


async def test_publish_is_idempotent_for_the_same_content_and_refused_for_other(
        store: WorkStore) -> None:
    digest = await _publish(store, 7)
    again, created = await store.catalog_publish(PublishParams(
        revision=7, digest=digest, content="ignored: the stored row answers", **WHO), T0 + 1)
    assert (again.digest, created, again.published_at_us) == (digest, False, T0)
    with pytest.raises(RevisionConflict, match="already published with digest"):
        await store.catalog_publish(PublishParams(
            revision=7, digest="sha256:" + "1" * 64, content="{}", **WHO), T0 + 2)
    stored = await store.catalog_get(7)
    assert stored is not None and stored.digest == digest and '"hubspot"' in stored.content
    audit = [e for e in await store.audit_list(limit=10) if e.target_kind == "catalog_revision"]
    assert [(e.action, e.target_id, e.actor) for e in audit] == [("catalog.publish", "7",
                                                                  "alice")]


async def test_list_shows_every_revision_newest_first_without_content(store: WorkStore) -> None:
    first = await _publish(store, 7)
    second = await _publish(store, 8, base_url="http://127.0.0.1:2")
    listed = await store.catalog_list()
    assert [(r.revision, r.digest, r.content) for r in listed] == [(8, second, ""),
                                                                    (7, first, "")]
    assert await store.catalog_digest(9) is None and await store.catalog_get(9) is None


async def test_commands_pin_the_revision_and_digest_they_were_admitted_under(
        store: WorkStore) -> None:
    result = await store.command_accept(attrs.evolve(draft(), catalog_digest="sha256:pinned"),
                                        T0)
    assert result.command_id is not None and result.work_id is not None
    command = await store.command_get(result.command_id)
    assert command is not None
    assert (command.catalog_revision, command.catalog_digest) == (7, "sha256:pinned")
    item = await store.work_get(result.work_id)
    assert item is not None and (item.catalog_revision, item.catalog_digest) == (
        7, "sha256:pinned")


async def test_a_revision_with_unsettled_pinned_work_cannot_be_deleted(
        store: WorkStore) -> None:
    digest = await _publish(store, 7)
    accepted = await store.command_accept(attrs.evolve(draft(), catalog_digest=digest), T0)
    assert accepted.command_id is not None and accepted.work_id is not None
    with pytest.raises(RevisionConflict, match=r"\(1 open commands, 1 live work items\)"):
        await store.catalog_delete(7, now_us=T0, **WHO)
    assert await store.catalog_digest(7) == digest  # nothing was deleted
    # Settle it: cancel the work, retire the command (nothing was ever dispatched: a
    # no-effect result, whose receipt the Runtime is owed and which is pinned too)...
    await store.work_cancel(accepted.work_id, T0)
    await store.command_retire(accepted.command_id, RepairActor(**WHO),
                               receipt_max_attempts=3, now_us=T0)
    pins = await store.catalog_pins(7)
    assert (pins.open_commands, pins.live_work) == (0, 1)
    with pytest.raises(RevisionConflict, match=r"\(0 open commands, 1 live work items\)"):
        await store.catalog_delete(7, now_us=T0, **WHO)
    # ... delivered; then the revision may go.
    (receipt,) = (await claim(store, family="runtime_receipt", now=T0)).claimed
    await finalize(store, receipt, Succeeded("confirmed"), now=T0)
    pins = await store.catalog_pins(7)
    assert (pins.open_commands, pins.live_work) == (0, 0)
    gone = await store.catalog_delete(7, now_us=T0 + 5 * SEC, **WHO)
    assert gone.digest == digest and await store.catalog_get(7) is None
    actions = [e.action for e in await store.audit_list(limit=10)
               if e.target_kind == "catalog_revision"]
    assert actions == ["catalog.delete", "catalog.publish"]
    with pytest.raises(RevisionNotPublished, match="catalog revision 7 is not published"):
        await store.catalog_delete(7, now_us=T0 + 6 * SEC, **WHO)


async def test_pinned_work_is_counted_up_to_a_bound_and_the_delete_asks_only_if_any(
        store: WorkStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing counts a revision's unsettled work up to PIN_COUNT_LIMIT (an index
    range that stops there) and says there is more; the delete refuses on the first
    pinned row it meets. (3 here, for a small test; 1000 in production.)"""
    monkeypatch.setattr(catalog_revisions, "PIN_COUNT_LIMIT", 3)
    digest = await _publish(store, 7)
    for i in range(5):
        accepted = await store.command_accept(
            attrs.evolve(draft(f"int-{i}", lead=f"lead-{i}"), catalog_digest=digest), T0)
        assert accepted.work_id is not None
    pins = await store.catalog_pins(7)
    assert pins == RevisionPins(open_commands=3, live_work=3, open_commands_more=True,
                                live_work_more=True)
    with pytest.raises(RevisionConflict, match=r"\(3\+ open commands, 3\+ live work items\)"):
        await store.catalog_delete(7, now_us=T0, **WHO)
    # Exactly at the bound is an exact count, not "more".
    monkeypatch.setattr(catalog_revisions, "PIN_COUNT_LIMIT", 5)
    assert await store.catalog_pins(7) == RevisionPins(open_commands=5, live_work=5)
    # Terminal work and settled commands of the revision are not counted at all.
    await store.db.transact(lambda tx: tx.execute(
        "UPDATE external_commands SET settlement = 'retired'"), name="test.settle")
    await store.db.transact(lambda tx: tx.execute(
        "UPDATE work_items SET state = 'cancelled'"), name="test.cancel")
    assert await store.catalog_pins(7) == RevisionPins(open_commands=0, live_work=0)
    assert (await store.catalog_delete(7, now_us=T0, **WHO)).digest == digest


async def test_a_repair_pins_the_resolved_current_revision_and_audits_both(
        store: WorkStore) -> None:
    old_digest = await _publish(store, 7)
    accepted = await store.command_accept(attrs.evolve(draft(), catalog_digest=old_digest), T0)
    assert accepted.command_id is not None and accepted.work_id is not None
    await store.work_cancel(accepted.work_id, T0)
    who = RepairActor(**WHO)
    with pytest.raises(WorkConflict, match="current Catalog revision 8 is not published"):
        await store.command_repair(accepted.command_id, who, binding_generation=1,
                                   catalog_revision=8, catalog_digest="sha256:x",
                                   max_attempts=3, now_us=T0)
    new_digest = await _publish(store, 8, base_url="http://127.0.0.1:2")
    new_id = await store.command_repair(accepted.command_id, who, binding_generation=1,
                                        catalog_revision=8, catalog_digest=new_digest,
                                        max_attempts=3, now_us=T0 + 1)
    new = await store.command_get(new_id)
    assert new is not None and new.repair_of == accepted.command_id
    assert (new.catalog_revision, new.catalog_digest) == (8, new_digest)
    (entry,) = [e for e in await store.audit_list(limit=10) if e.action == "command.repair"]
    before, after = json.loads(entry.before), json.loads(entry.after)
    assert (before["catalog_revision"], before["catalog_digest"]) == (7, old_digest)
    assert (after["catalog_revision"], after["catalog_digest"]) == (8, new_digest)


async def test_the_view_serves_exactly_the_pinned_content_and_caches_it(
        store: WorkStore) -> None:
    digest = await _publish(store, 7)
    current = load_catalog(Settings(catalog=CatalogSettings(revision=8)))
    view = CatalogView(store, current)
    pinned = await view.pinned(7, digest)
    assert pinned is not None and pinned.revision == 7 and pinned.digest == digest
    assert await view.pinned(7, "sha256:" + "0" * 64) is None  # another digest: not it
    assert await view.pinned(8, current.digest) is None  # the served one is not published
    assert await view.published(8) is None

    async def tamper(tx: SqlTx) -> None:
        await tx.execute("UPDATE catalog_revisions SET content = '{}' WHERE revision = 7")

    await store.db.transact(tamper, name="test.tamper")
    assert await view.pinned(7, digest) is pinned  # an immutable fact, parsed once
    assert await CatalogView(store, current).pinned(7, digest) is None  # tampered: refused


async def test_a_command_admitted_before_digests_runs_under_the_revision_of_its_number(
        store: WorkStore) -> None:
    digest = await _publish(store, 7)
    view = CatalogView(store, load_catalog(Settings(catalog=CatalogSettings(revision=7))))
    legacy = await view.pinned(7, "")  # migration 0007 left old commands without a digest
    assert legacy is not None and legacy.digest == digest
    assert await view.pinned(8, "") is None
