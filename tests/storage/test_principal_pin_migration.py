"""The durable binding generation arrives by the seed 11.3 sequence (migrations 0015-0018).

Nullable, default, backfill, tighten, each its own migration, run step by step against a
database that already holds queued commands from before the sequence (pinned, as then,
to the ``[[bindings]]`` TOML generation). At no step can a queued command select a
generation nobody pinned: before the backfill an unpinned command is refused before any
call; after it, a command stays current exactly while the durable binding (bootstrapped
from the same TOML generation) has not moved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from config.settings import BindingSettings
from daemon.core.effect_step import LinkView, target_refusal
from daemon.core.principals import BindingEvent
from daemon.services.effect_runner import binding_view, command_view
from daemon.services.principal_bootstrap import bootstrap_facts, ensure_config_bindings
from storage.effect_values import BindingNow
from storage.effects import read_binding_now
from storage.migrate import EXPECTED_VERSION, check_schema, migrate
from storage.port import SqlTx
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.commands import HUBSPOT_MAIN, draft
from tests.support.work import T0

BEFORE = 14  # the last migration before the sequence
NULLABLE, DEFAULT, BACKFILL, TIGHTEN = BEFORE + 1, BEFORE + 2, BEFORE + 3, BEFORE + 4
LINK = "lk-1"

_OLD_COLUMNS = (
    "command_id, handoff_key, org_id, app_installation_id, runtime_capability_id,"
    " runtime_work_binding_digest, runtime_name, intent_id, intent_kind, operation,"
    " local_object, local_id, binding_id, binding_generation, catalog_revision,"
    " frozen_request, payload_digest, runtime_outbox_id, settlement, repair_of,"
    " created_at_us, updated_at_us, catalog_digest, link_key, link_generation, remote_id"
)


async def _old_command(store: WorkStore, command_id: str, toml_generation: int) -> None:
    """A command as the code before the sequence wrote it: no principal_generation."""
    values: tuple[Any, ...] = (
        command_id, None, "org-1", "install-1", "cap.leads", "sha256:binding", "crm",
        f"intent-{command_id}", "UPSERT", "hubspot.contact.update_jobtitle", "lead",
        f"lead-{command_id}", "hubspot-main", toml_generation, 7, "{}", "sha256:x",
        "outbox-1", "open", None, T0, T0, "sha256:catalog", LINK, 1, "101")

    async def body(tx: SqlTx) -> None:
        await tx.execute(f"INSERT INTO external_commands ({_OLD_COLUMNS}) VALUES"
                         f" ({', '.join('?' * len(values))})", values)

    await store.db.transact(body, name="test.old_command")


async def _pinned(store: WorkStore, command_id: str) -> Any:
    async def body(tx: SqlTx) -> Any:
        rows = await tx.fetchall("SELECT principal_generation FROM external_commands"
                                 " WHERE command_id = ?", (command_id,))
        return rows[0][0]

    return await store.db.transact(body, name="test.pinned", write=False)


async def _step(store: WorkStore, version: int) -> None:
    assert await migrate(store.db, store.dialect, T0, upto=version) == [version]


async def _refusal(store: WorkStore, command_id: str) -> str | None:
    """What dispatch decides about the command's pins now (None: dispatchable)."""
    command = await store.command_get(command_id)
    assert command is not None

    async def body(tx: SqlTx) -> BindingNow | None:
        return await read_binding_now(tx, command.binding_id)

    now = await store.db.transact(body, name="test.binding_now", write=False)
    found = target_refusal(
        command_view(command), binding_view(HUBSPOT_MAIN, now) if now is not None else None,
        LinkView(state="active", generation=1, remote_id="101"))
    return None if found is None else found[0]


@pytest.mark.usefixtures("admission_before_history_flow")
async def test_the_sequence_keeps_queued_work_pinned(backend: str, tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        mysql = store.dialect.name == "mysql"
        await migrate(store.db, store.dialect, T0, upto=BEFORE)
        # Queued before the sequence: one at the TOML generation the binding still has,
        # one pinned to an older TOML generation (the TOML was bumped since).
        await _old_command(store, "cmd-current", 1)
        await _old_command(store, "cmd-older", 2)

        # 1. nullable: old rows pin nothing yet, and are refused before any call.
        await _step(store, NULLABLE)
        assert await _pinned(store, "cmd-current") is None
        got = await store.command_get("cmd-current")
        assert got is not None and got.binding_generation is None
        await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), T0)
        assert await _refusal(store, "cmd-current") == "unpinned_binding"
        # This build's admission pins the durable generation.
        accepted = await store.command_accept(draft("int-new"), T0)
        assert accepted.command_id is not None
        assert await _pinned(store, accepted.command_id) == 1

        # 2. default: a writer that does not name the column pins 0, never a generation
        #    (MariaDB; SQLite cannot change a default in place, it stays NULL).
        await _step(store, DEFAULT)
        await _old_command(store, "cmd-old-writer", 1)
        assert await _pinned(store, "cmd-old-writer") == (0 if mysql else None)

        # 3. backfill: the TOML pin is copied; the durable row started at that TOML value.
        await _step(store, BACKFILL)
        assert await _pinned(store, "cmd-current") == 1
        assert await _pinned(store, "cmd-older") == 2
        assert await _pinned(store, accepted.command_id) == 1
        assert await _refusal(store, "cmd-current") is None
        assert await _refusal(store, "cmd-older") == "binding_generation"
        if mysql:  # pinned to 0 by the default: refused, never dispatched
            assert await _refusal(store, "cmd-old-writer") == "binding_generation"

        # 4. tighten: NOT NULL from here on (MariaDB; SQLite keeps it in the code).
        await _step(store, TIGHTEN)
        assert EXPECTED_VERSION >= TIGHTEN
        await migrate(store.db, store.dialect, T0)
        await check_schema(store.db, store.dialect)

        async def null_pin(tx: SqlTx) -> None:
            await tx.execute("UPDATE external_commands SET principal_generation = NULL"
                             " WHERE command_id = ?", ("cmd-current",))

        if mysql:
            with pytest.raises(Exception, match="principal_generation"):
                await store.db.transact(null_pin, name="test.null_pin")
            assert await _pinned(store, "cmd-current") == 1

        # A reconnect after the sequence fails the queued work closed, whatever the TOML.
        await ensure_config_bindings(store, (HUBSPOT_MAIN,), T0)
        who = Actor(name="ada", role="admin", reason="reinstalled")
        await store.binding_transition("hubspot-main", BindingEvent.DISCONNECT, who,
                                       expected_generation=1, now_us=T0)
        assert await _refusal(store, "cmd-current") == "binding_disconnected"
        await store.binding_transition("hubspot-main", BindingEvent.RECONNECT, who,
                                       expected_generation=1, now_us=T0)
        assert await _refusal(store, "cmd-current") == "binding_generation"


async def test_the_toml_generation_only_bootstraps(store: WorkStore) -> None:
    """A [[bindings]] generation creates the durable row once; editing it later (the
    old way of "reconnecting") moves nothing, and the durable value is what pins."""
    first = await ensure_config_bindings(store, (HUBSPOT_MAIN,), T0)
    assert first["hubspot-main"].generation == 1
    bumped = BindingSettings(**{**_fields(HUBSPOT_MAIN), "generation": 5})
    again = await ensure_config_bindings(store, (bumped,), T0 + 1)
    assert again["hubspot-main"].generation == 1
    facts = await store.binding_get("hubspot-main")
    assert facts is not None and facts.generation == 1
    # An upgrading deployment whose TOML said 3 bootstraps at 3 (its queued work pinned 3).
    other = BindingSettings(**{**_fields(HUBSPOT_MAIN), "binding_id": "b-3", "generation": 3})
    assert (await ensure_config_bindings(store, (other,), T0))["b-3"].generation == 3
    audit = [e for e in await store.audit_list() if e.target_id in ("hubspot-main", "b-3")]
    assert sorted((e.action, e.target_id) for e in audit) == [
        ("binding.bootstrap", "b-3"), ("binding.bootstrap", "hubspot-main")]


def _fields(b: BindingSettings) -> dict[str, Any]:
    return attrs.asdict(b, recurse=False)
