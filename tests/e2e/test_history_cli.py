"""``integrationd history rebuild``: the console's history read model recomputed from the
execution journal by a real process (issue 23 item 1)."""

from __future__ import annotations

import json
from pathlib import Path

from admin_ui.history import history_for
from daemon.core.outcomes import DeadLetter, Succeeded
from storage.port import SqlTx
from tests.support.backends import fresh_database
from tests.support.find import seed_receipts
from tests.support.history import finish_effects, use_quota
from tests.support.processes import run_cli, write_config
from tests.support.work import T0, claim, enqueue, finalize


async def test_history_rebuild_restores_the_rollup_from_the_journal(tmp_path: Path) -> None:
    async with fresh_database("sqlite", tmp_path) as database:
        store = await database.open_store()
        await enqueue(store, 3)
        items = (await claim(store, "A", limit=3)).claimed
        for item in items[:2]:
            assert (await finalize(store, item, Succeeded())).applied
        assert (await finalize(store, items[2], DeadLetter("boom"))).applied

        async def counts(tx: SqlTx) -> list[tuple[object, ...]]:
            return [tuple(r) for r in await tx.fetchall(
                "SELECT outcome, SUM(executions) FROM history_rollup WHERE level_us = 60000000"
                " GROUP BY outcome"
                " ORDER BY outcome")]

        async def wipe(tx: SqlTx) -> None:
            await tx.execute("DELETE FROM history_rollup")

        maintained = await store.db.transact(counts, name="test.counts", write=False)
        assert maintained == [("dead", 1), ("succeeded", 2)]
        await store.db.transact(wipe, name="test.wipe", write=True)
        cfg = write_config(tmp_path / "a.toml", database.url)
        # The executions' day is not over: by default, its counts are left as they are.
        untouched = run_cli(cfg, "history", "rebuild", "--json")
        assert untouched.returncode == 0, untouched.stderr
        assert json.loads(untouched.stdout) == {"rebuilt_rows": 0, "rebuilt_flow_rows": 0,
                                                  "rebuilt_quota_rows": 0,
                                                  "rebuilt_pressure_rows": 0}
        rebuilt = run_cli(cfg, "history", "rebuild", "--from", "2027-01-15T00:00Z", "--json")
        assert rebuilt.returncode == 0, rebuilt.stderr
        # 2 outcomes x 5 levels (storage/history.py EXECUTION_LEVELS_US); no command accepted
        assert json.loads(rebuilt.stdout) == {"rebuilt_rows": 10, "rebuilt_flow_rows": 0,
                                              "rebuilt_quota_rows": 0,
                                              "rebuilt_pressure_rows": 0}
        assert await store.db.transact(counts, name="test.counts", write=False) == maintained
        plain = run_cli(cfg, "history", "rebuild", "--from", "1800000000")
        assert plain.returncode == 0
        assert plain.stdout == ("history rebuilt: 10 rollup rows from the stored executions,"
                                " 0 from the stored commands and receipts,"
                                " 0 from the stored quota reservations,"
                                " 0 queue peaks from the queue's samples\n")
        bad = run_cli(cfg, "history", "rebuild", "--from", "yesterday")
        assert bad.returncode == 2
        assert "--from must be an ISO 8601 UTC time" in bad.stderr
        assert await store.db.transact(counts, name="test.counts", write=False) == maintained


async def test_history_show_answers_what_the_page_answers(tmp_path: Path) -> None:
    """``integrationd history show --json`` prints the document ``/admin/api/history``
    answers (the same read model), and its plain text the same figures."""
    async with fresh_database("sqlite", tmp_path) as database:
        store = await database.open_store()
        await seed_receipts(store, T0)
        await use_quota(store, store, T0)
        # The queue, sampled in the range's third minute: these 2 items and 2 the quota
        # seed left ready, 10 claimed by the seeds and still leased.
        await enqueue(store, 2, now=T0)
        assert await store.history_pressure_sample(T0 + 60_000_000) is not None
        cfg = write_config(tmp_path / "a.toml", database.url)
        start, end = str(T0 // 1_000_000 - 60), str(T0 // 1_000_000 + 240)
        shown = run_cli(cfg, "history", "show", "--from", start, "--to", end,
                        "--binding", "hubspot-main", "--json")
        assert shown.returncode == 0, shown.stderr
        page = await history_for(store, [("from", start), ("to", end),
                                         ("binding", "hubspot-main")], 0)
        assert json.loads(shown.stdout) == json.loads(json.dumps(page))
        assert [s["total"] for s in page["pressure"]] == [6, 2]
        assert [k["used_total"] for k in page["quota"]["keys"]] == [1, 1]
        plain = run_cli(cfg, "history", "show", "--from", start, "--to", end)
        assert plain.returncode == 0, plain.stderr
        lines = plain.stdout.splitlines()
        assert "filters: all" in lines[0]
        assert "commands accepted 6, receipts confirmed 2" in lines[1]
        # a header of five lines, one row per minute, one line per quota key
        assert len(lines) == 5 + 5 + 2
        assert lines[3] == ("queue peaks (highest per-minute sample; ready/retry wait/held/"
                            "claimed): 4/0/0/10 (1 of 5 steps sampled)")
        assert [line.split()[-1] for line in lines[5:10]] == [
            "-/-/-/-", "-/-/-/-", "4/0/0/10", "-/-/-/-", "-/-/-/-"]
        assert lines[-2] == ("quota k: limit 600 per 60 s, 600.0 per step; granted 3,"
                             " given back 2, used 1, peak 0.2 % of the limit")
        refused = run_cli(cfg, "history", "show", "--from", start)
        assert refused.returncode == 2
        assert "a custom range needs both from and to" in refused.stderr


async def test_history_show_narrows_the_executions_per_binding_as_the_page_does(
        tmp_path: Path) -> None:
    """``history show --binding B --json`` is the document ``/admin/api/history?binding=B``
    answers: the executions and DLQ inflow of that binding's effect items (migration
    0048), the queue's chart marked as not narrowed, with why; the plain text says so."""
    async with fresh_database("sqlite", tmp_path) as database:
        store = await database.open_store()
        await finish_effects(store, T0)
        cfg = write_config(tmp_path / "a.toml", database.url)
        start, end = str(T0 // 1_000_000 - 60), str(T0 // 1_000_000 + 240)
        shown = run_cli(cfg, "history", "show", "--from", start, "--to", end,
                        "--binding", "hubspot-eu", "--operation", "hubspot.deal.create",
                        "--json")
        assert shown.returncode == 0, shown.stderr
        page = await history_for(store, [("from", start), ("to", end),
                                         ("binding", "hubspot-eu"),
                                         ("operation", "hubspot.deal.create")], 0)
        assert json.loads(shown.stdout) == json.loads(json.dumps(page))
        assert {s["outcome"]: s["total"] for s in page["throughput"]} == {
            "dead": 1, "succeeded": 1}
        assert page["dlq_inflow"]["total"] == 1
        assert page["queue_pressure"]["not_narrowed_by"] == ["binding", "operation"]
        plain = run_cli(cfg, "history", "show", "--from", start, "--to", end,
                        "--org", "org-1")
        assert plain.returncode == 0, plain.stderr
        lines = plain.stdout.splitlines()
        assert "filters: org org-1" in lines[0]
        assert lines[1].startswith("totals: dead 1, succeeded 2;"), lines[1]
        assert "not narrowed by org: the queue is sampled once a minute per family" in lines[3]
