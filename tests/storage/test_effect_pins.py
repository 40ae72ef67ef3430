"""Conformance: a command pins its RemoteLink at admission (seed 8.1, 13), and settling
refuses a no-effect result where seed 003 does not admit one; every backend."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.handoff import RESULT_FORMAT_NO_EFFECT, NoEffectReason, NoEffectResult
from daemon.core.identity import integration_link_key_v2
from storage.effect_values import Settlement
from storage.effects import settle
from storage.port import SqlTx, WorkConflict
from storage.work_store import WorkStore
from tests.support.commands import draft
from tests.support.work import T0

SCOPE_DIGEST = "a" * 64
WHO = {"actor": "ada", "role": "admin", "reason": "test"}


def _key(lead: str) -> str:
    return integration_link_key_v2(SCOPE_DIGEST, "lead", lead)


async def test_admission_pins_the_link_as_it_is_then(store: WorkStore) -> None:
    link = await store.link_adopt(SCOPE_DIGEST, "lead", "lead-1", "contact", "101", now_us=T0,
                                  **WHO)
    result = await store.command_accept(attrs.evolve(draft(), link_key=_key("lead-1")), T0)
    assert result.command_id is not None
    command = await store.command_get(result.command_id)
    assert command is not None
    assert (command.link_key, command.link_generation, command.remote_id) == (
        link.link_key, link.generation, "101")
    # A rebind after acceptance changes the link, never the command's pins.
    rebound = await store.link_rebind(link.link_key, "contact", "202",
                                      expected_generation=link.generation, now_us=T0 + 1, **WHO)
    assert rebound.generation == link.generation + 1
    again = await store.command_get(result.command_id)
    assert again is not None
    assert (again.link_generation, again.remote_id) == (link.generation, "101")


async def test_without_a_link_only_the_key_is_pinned(store: WorkStore) -> None:
    result = await store.command_accept(attrs.evolve(draft(), link_key=_key("lead-1")), T0)
    assert result.command_id is not None
    command = await store.command_get(result.command_id)
    assert command is not None
    assert (command.link_key, command.link_generation, command.remote_id) == (
        _key("lead-1"), None, None)
    # A link adopted later does not become the target of the queued command.
    await store.link_adopt(SCOPE_DIGEST, "lead", "lead-1", "contact", "101", now_us=T0 + 1,
                           **WHO)
    later = await store.command_get(result.command_id)
    assert later is not None and (later.link_generation, later.remote_id) == (None, None)


async def test_a_batch_pins_each_command_its_own_link(store: WorkStore) -> None:
    await store.link_adopt(SCOPE_DIGEST, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    await store.link_adopt(SCOPE_DIGEST, "lead", "lead-2", "contact", "202", now_us=T0, **WHO)
    drafts = [attrs.evolve(draft(f"int-{i}", lead=lead), link_key=_key(lead))
              for i, lead in enumerate(("lead-1", "lead-2", "lead-3"))]
    results = await store.command_accept_many(drafts, T0)
    pins = []
    for r in results:
        assert r.command_id is not None
        command = await store.command_get(r.command_id)
        assert command is not None
        pins.append((command.link_generation, command.remote_id))
    assert pins == [(1, "101"), (1, "202"), (None, None)]


async def test_a_command_admitted_before_pins_reads_as_unpinned(store: WorkStore) -> None:
    """What the upgrade leaves on existing rows: the new columns are NULL."""
    await store.link_adopt(SCOPE_DIGEST, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    result = await store.command_accept(draft(), T0)  # no link key: as before the migration
    assert result.command_id is not None
    command = await store.command_get(result.command_id)
    assert command is not None
    assert (command.link_key, command.link_generation, command.remote_id) == (None, None, None)


@pytest.mark.parametrize(("kind", "refused"), [("CREATE", True), ("UPDATE", True),
                                               ("UPSERT", False), ("DELETE", False)])
async def test_integrationd_refuses_format_2_for_other_intent_kinds(
    store: WorkStore, kind: str, refused: bool
) -> None:
    """Seed 003: only UPSERT and DELETE intents admit a no-effect result (it used to be
    only the reference Runtime that checked)."""
    result = await store.command_accept(attrs.evolve(draft(), intent_kind=kind), T0)
    assert result.command_id is not None
    no_effect = NoEffectResult(NoEffectReason.REJECTED_BEFORE_DISPATCH)

    async def body(tx: SqlTx) -> str:
        assert result.command_id is not None
        return await settle(tx, command_id=result.command_id, settlement=Settlement.NO_EFFECT,
                            result_format_version=RESULT_FORMAT_NO_EFFECT, remote_id="",
                            canonical_result=no_effect.canonical.decode(),
                            result_digest=no_effect.digest, receipt_max_attempts=5, now_us=T0)

    if refused:
        with pytest.raises(WorkConflict, match="only UPSERT and DELETE admit"):
            await store.db.transact(body, name="test.settle")
    else:
        await store.db.transact(body, name="test.settle")
    command = await store.command_get(result.command_id)
    assert command is not None
    assert command.settlement is (Settlement.OPEN if refused else Settlement.NO_EFFECT)
    assert (await store.receipt_get(result.command_id) is None) is refused
