"""Migration 0035 (the record's last-modified time moves from the link onto the settled
commands) is upgrade-safe: what 0033 kept on a link reads back the same afterwards, an
open command gets nothing, and a replica of the previous build, which still writes
``remote_links.modified_at_us``, keeps working beside this one."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from storage.links import read_link
from storage.migrate import EXPECTED_VERSION, migrate
from storage.port import SqlTx
from tests.support.backends import fresh_database
from tests.support.commands import draft
from tests.support.work import T0

MOVED = 35
KEY = "link-lead-1"
MODIFIED = 1_700_000_000_123_000


@pytest.mark.usefixtures("admission_before_history_flow")
async def test_the_links_time_carries_over_onto_its_succeeded_commands(
        backend: str, tmp_path: Path) -> None:
    assert EXPECTED_VERSION >= MOVED
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        await migrate(store.db, store.dialect, T0, upto=MOVED - 1)

        async def old_build(tx: SqlTx) -> None:  # the link as 0033's build left it
            await tx.execute(
                "INSERT INTO remote_links (link_key, scope_digest, local_object, local_id,"
                " remote_object, remote_id, locator_hash, state, generation, updated_at_us,"
                " modified_at_us, active_locator, created_at_us) VALUES"
                " (?, 's', 'lead', 'lead-1', 'contact', '101', 'loc', 'active', 1, ?, ?,"
                " 'loc', ?)", (KEY, T0, MODIFIED, T0))

        await store.db.transact(old_build, name="test.old_link")
        ids = []
        for intent in ("int-1", "int-2", "int-3"):
            result = await store.command_accept(
                attrs.evolve(draft(intent), link_key=KEY), T0)
            assert result.command_id is not None
            ids.append(result.command_id)

        async def old_settle(tx: SqlTx) -> None:
            for command_id in ids[:2]:
                await tx.execute("UPDATE external_commands SET settlement = 'succeeded'"
                                 " WHERE command_id = ?", (command_id,))

        await store.db.transact(old_settle, name="test.old_settle")

        assert await migrate(store.db, store.dialect, T0, upto=MOVED) == [MOVED]

        async def kept(tx: SqlTx) -> dict[str, object]:
            rows = await tx.fetchall("SELECT command_id, modified_at_us FROM external_commands")
            return {str(r[0]): r[1] for r in rows}

        assert await store.db.transact(kept, name="test.kept", write=False) == {
            ids[0]: MODIFIED, ids[1]: MODIFIED, ids[2]: None}

        async def link_time(tx: SqlTx) -> int | None:
            link = await read_link(tx, KEY)
            assert link is not None
            return link.modified_at_us

        assert await store.db.transact(link_time, name="test.link", write=False) == MODIFIED

        # The previous build's write still applies (the column stays until a later
        # drop); this build no longer reads it.
        async def old_note(tx: SqlTx) -> int:
            return await tx.execute("UPDATE remote_links SET modified_at_us = 5"
                                    " WHERE link_key = ?", (KEY,))

        assert await store.db.transact(old_note, name="test.old_note") == 1
        assert await store.db.transact(link_time, name="test.link", write=False) == MODIFIED
