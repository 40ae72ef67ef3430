"""``integrationd cutover status|begin|commit|rollback|re-cutover|project``, in-process."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import attrs
import pytest

from config.settings import Settings, StorageSettings
from daemon.admin_cli import add_admin_commands, run_admin_command
from sandbox.legacy import store as legacy
from storage.work_store import WorkStore
from tests.admin.support import operators
from tests.support.backends import FreshDatabase
from tests.support.cutover import states
from tests.support.processes import run_cli
from tests.support.work import claim


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="integrationd")
    sub = parser.add_subparsers(dest="command", required=True)
    add_admin_commands(sub)
    return parser.parse_args(argv)


def _step(verb: str, *extra: str, actor: str = "ada") -> argparse.Namespace:
    return _parse("cutover", verb, "noop", "--actor", actor, "--reason", "move noop",
                  "--claim-tx-bound", "0", "--json", *extra)


async def test_cutover_rollback_and_re_cutover_from_the_cli(
    database: FreshDatabase, store: WorkStore, capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(storage=StorageSettings(url=database.url, sqlite_synchronous="NORMAL"),
                        operators=operators(),
                        legacy_claimants=(legacy.claimant_settings("noop"),))
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}", "{}"], 1)
    await store.claimant_heartbeat("legacy-1", "legacy", "noop", 0, "running", 1)

    assert await run_admin_command(settings, _parse("cutover", "status", "noop")) == 0
    assert "not under cutover" in capsys.readouterr().out
    # Only an admin may move ownership; a viewer is refused before anything changes.
    assert await run_admin_command(settings, _step("begin", actor="viv")) == 1
    assert "may not cutover.step" in capsys.readouterr().err
    assert await store.owner_generation_get("noop") is None

    assert await run_admin_command(settings, _step("begin")) == 0
    assert json.loads(capsys.readouterr().out)["generation"]["phase"] == "cutover_draining"
    # The legacy worker still reports itself, and nothing is materialized: blocked.
    assert await run_admin_command(settings, _parse(
        "cutover", "commit", "noop", "--actor", "ada", "--reason", "r",
        "--claim-tx-bound", "0")) == 1
    err = capsys.readouterr().err
    assert "legacy-1" in err and "[legacy_processes]" in err and "[coverage_gap]" in err
    assert await run_admin_command(settings, _parse("cutover", "status", "noop",
                                                    "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["next_step"] == "commit"
    # (status counts with the default 60 s claim-transaction bound)
    assert [b["code"] for b in doc["blockers"]] == ["admission_recently_closed",
                                                    "legacy_processes", "coverage_gap"]

    assert await legacy.materialize(store, "noop", "org-1", 1) == 2
    assert await run_admin_command(settings, _step("commit", "--gone", "legacy-1")) == 0
    receipt = json.loads(capsys.readouterr().out)["receipt"]
    assert receipt["owner"] == "integrationd" and receipt["generation"] == 1
    assert receipt["proof"]["legacy_processes"] == []

    assert await run_admin_command(settings, _step("rollback")) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["moved"] == 2 and done["receipt"]["kind"] == "rollback"
    assert await states(store) == {"awaiting_legacy_outcome": 2}
    assert (await claim(store)).claimed == []

    # The legacy owner runs the fenced items; the projector confirms the fence.
    while (ev := await legacy.claim_one(store, "noop", "legacy-2", 10**9, 2)) is not None:
        assert await legacy.finish(store, ev, "legacy-2", "succeeded", 2)
    assert await run_admin_command(settings, _step("re-cutover")) == 1
    blocked = json.loads(capsys.readouterr().out)
    assert [b["code"] for b in blocked["blockers"]] == ["awaiting_legacy_outcome",
                                                        "receipts_unprojected"]
    assert await run_admin_command(settings, _parse("cutover", "project", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["reconciled"] == 2
    assert await run_admin_command(settings, _step("re-cutover")) == 0
    assert json.loads(capsys.readouterr().out)["generation"]["generation"] == 3

    assert await run_admin_command(settings, _parse("cutover", "status", "noop")) == 0
    text = capsys.readouterr().out
    assert "generation 3, integrationd active (claims: integrationd)" in text
    assert "next step: roll back" in text and "(integrationd cutover rollback)" in text
    assert "(confirmed)" in text
    actions = [e.action for e in await store.audit_list(target_id="noop")]
    # (one verb's steps share a millisecond, so their ids' order is not theirs)
    assert sorted(actions) == sorted(["cutover.commit", "cutover.begin",
                                      "cutover.rollback_commit", "cutover.rollback_begin",
                                      "cutover.commit", "cutover.begin"])
    gone = await store.audit_list(target_id="legacy-1")
    assert [e.action for e in gone] == ["cutover.process_gone"]


async def test_bad_cutover_input_is_one_line_and_exit_2(
    database: FreshDatabase, store: WorkStore, capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(storage=StorageSettings(url=database.url, sqlite_synchronous="NORMAL"),
                        operators=operators())
    assert await run_admin_command(settings, _step("rollback")) == 2
    assert "has no owner generation" in capsys.readouterr().err
    assert await run_admin_command(settings, _step("begin")) == 0
    capsys.readouterr()
    assert await run_admin_command(settings, _step("commit", "--gone", "nobody")) == 2
    assert "no replica or legacy process 'nobody'" in capsys.readouterr().err
    assert await run_admin_command(settings, _parse(
        "cutover", "begin", "noop", "--actor", "ada", "--reason", "   ")) == 2
    assert "reason is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse("cutover", "begin", "noop", "--actor", "ada", "--reason", "r",
               "--claim-tx-bound", "soon")
    assert "expected seconds" in capsys.readouterr().err


async def test_a_legacy_claimant_statement_the_database_refuses_is_named_exit_2(
    database: FreshDatabase, store: WorkStore, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Valid as configuration, wrong for this database: the column is misspelt.
    wrong = attrs.evolve(legacy.claimant_settings("noop"), uncovered_sql=(
        "SELECT COUNT(*) FROM legacy_events WHERE family = :family AND stat = 'pending'"))
    settings = Settings(storage=StorageSettings(url=database.url, sqlite_synchronous="NORMAL"),
                        operators=operators(), legacy_claimants=(wrong,))
    await legacy.install(store)
    assert await run_admin_command(settings, _step("begin")) == 0
    capsys.readouterr()
    assert await run_admin_command(settings, _step("commit")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("integrationd: legacy_claimants[0].uncovered_sql: ")
    assert "stat" in line
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.generation == 0  # nothing moved
    # status shows it as the blocker it is, rather than failing
    assert await run_admin_command(settings, _parse("cutover", "status", "noop", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["blockers"][0]["code"] == "legacy_claimant_misconfigured"
    assert "legacy_claimants[0].uncovered_sql" in doc["blockers"][0]["sentence"]
    # check-config --connect finds it before any step: one line, exit 2.
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[storage]\nurl = "{database.url}"\n\n[[legacy_claimants]]\n'
                   'family = "noop"\n' + "".join(
                       f"{k} = {json.dumps(getattr(wrong, k))}\n"
                       for k in ("lock_sql", "processing_sql", "uncovered_sql")))
    result = run_cli(cfg, "check-config", "--connect")
    assert result.returncode == 2, result.stderr
    errors = [x for x in result.stderr.splitlines() if not x.startswith("{")]
    assert len(errors) == 1 and errors[0].startswith(
        "integrationd: config error: legacy_claimants[0].uncovered_sql: "), errors


@pytest.mark.parametrize("verb", ["status", "begin", "rollback"])
async def test_an_unknown_family_is_refused_not_reported_as_never_cut_over(
    database: FreshDatabase, store: WorkStore, capsys: pytest.CaptureFixture[str], verb: str,
) -> None:
    """A typo (``cutover status bogus``) said "not under cutover", exit 0; it is refused
    as every other verb refuses an unknown family (exit 2), and nothing is written."""
    settings = Settings(storage=StorageSettings(url=database.url, sqlite_synchronous="NORMAL"),
                        operators=operators())
    argv = ("cutover", verb, "bogus") + (
        () if verb == "status" else ("--actor", "ada", "--reason", "typo"))
    assert await run_admin_command(settings, _parse(*argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("integrationd: unknown work family 'bogus' (known: ")
    assert "noop" in err
    assert await store.owner_generation_get("bogus") is None
