"""Retention decisions, table-driven: what may be pruned, what must be kept, and why."""

from __future__ import annotations

import pytest

from daemon.core import retention as r
from daemon.core.retention import (
    DAY_US,
    PRUNE,
    Cutoffs,
    Keep,
    RetentionConfigError,
    RetentionPolicy,
)

NOW = 1_900_000_000_000_000
CUT = Cutoffs(work_us=NOW - 30 * DAY_US, facts_us=NOW - 400 * DAY_US,
              ingress_us=NOW - 14 * DAY_US, commands_us=NOW - 400 * DAY_US,
              quarantine_us=NOW - 90 * DAY_US)
OLD = CUT.work_us - 1  # past the work horizon, within the facts horizon
ANCIENT = CUT.facts_us - 1  # past both
FRESH = CUT.work_us  # exactly at the cutoff: kept (strictly older is pruned)


def _item(**kw: object) -> r.TerminalItemFacts:
    base: dict[str, object] = {"updated_at_us": OLD, "has_dedupe_key": False,
                               "legacy_reconciled": False, "replay_original_exists": False,
                               "command_settlement": None}
    base.update(kw)
    return r.TerminalItemFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("facts", "verdict"), [
    (_item(), PRUNE),
    (_item(updated_at_us=FRESH), Keep("within_retention")),
    (_item(has_dedupe_key=True), Keep("dedup_fact")),
    (_item(has_dedupe_key=True, updated_at_us=ANCIENT), PRUNE),
    (_item(has_dedupe_key=True, updated_at_us=FRESH), Keep("within_retention")),
    (_item(legacy_reconciled=True), Keep("dedup_fact")),
    (_item(legacy_reconciled=True, updated_at_us=ANCIENT), PRUNE),
    (_item(replay_original_exists=True), Keep("replay_lineage")),
    (_item(replay_original_exists=True, updated_at_us=ANCIENT), Keep("replay_lineage")),
    (_item(command_settlement="open"), Keep("command_unsettled")),
    (_item(command_settlement="open", updated_at_us=ANCIENT), Keep("command_unsettled")),
    (_item(command_settlement="succeeded"), PRUNE),
    (_item(command_settlement="retired", open_repair=True), Keep("open_repair")),
    (_item(command_missing=True), Keep("command_unreadable")),
])
def test_work_item_verdicts(facts: r.TerminalItemFacts, verdict: r.Verdict) -> None:
    assert r.work_item_verdict(facts, CUT) == verdict


def _attempt(**kw: object) -> r.AttemptFacts:
    base: dict[str, object] = {"finished_at_us": OLD, "outcome": "ACCEPTED",
                               "disposition": None, "command_settlement": "succeeded",
                               "command_work_live": False, "open_repair": False}
    base.update(kw)
    return r.AttemptFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("facts", "verdict"), [
    (_attempt(), PRUNE),
    (_attempt(outcome="REJECTED", command_settlement="retired"), PRUNE),
    (_attempt(finished_at_us=FRESH), Keep("within_retention")),
    (_attempt(outcome=None, finished_at_us=None), Keep("no_outcome")),
    (_attempt(outcome=None), Keep("no_outcome")),
    (_attempt(outcome="OUTCOME_UNKNOWN"), Keep("outcome_unknown")),
    (_attempt(outcome="OUTCOME_UNKNOWN", finished_at_us=ANCIENT), Keep("outcome_unknown")),
    (_attempt(outcome="OUTCOME_UNKNOWN", disposition="operator_absent"), PRUNE),
    (_attempt(command_settlement="open"), Keep("command_unsettled")),
    (_attempt(command_settlement=None), Keep("command_unreadable")),
    (_attempt(command_work_live=True), Keep("work_live")),
    (_attempt(open_repair=True), Keep("open_repair")),
])
def test_attempt_verdicts(facts: r.AttemptFacts, verdict: r.Verdict) -> None:
    assert r.attempt_verdict(facts, CUT) == verdict


@pytest.mark.parametrize(("facts", "verdict"), [
    (r.ExecutionFacts(finished_at_us=OLD, work_live=False), PRUNE),
    (r.ExecutionFacts(finished_at_us=FRESH, work_live=False), Keep("within_retention")),
    (r.ExecutionFacts(finished_at_us=ANCIENT, work_live=True), Keep("work_live")),
])
def test_execution_verdicts(facts: r.ExecutionFacts, verdict: r.Verdict) -> None:
    assert r.execution_verdict(facts, CUT) == verdict


@pytest.mark.parametrize(("facts", "verdict"), [
    (r.ReceiptFacts(state="confirmed", confirmed_at_us=OLD, receipt_work_live=False,
                    open_repair=False), PRUNE),
    (r.ReceiptFacts(state="pending", confirmed_at_us=None, receipt_work_live=True,
                    open_repair=False), Keep("unconfirmed")),
    (r.ReceiptFacts(state="pending", confirmed_at_us=ANCIENT, receipt_work_live=False,
                    open_repair=False), Keep("unconfirmed")),
    (r.ReceiptFacts(state="confirmed", confirmed_at_us=FRESH, receipt_work_live=False,
                    open_repair=False), Keep("within_retention")),
    (r.ReceiptFacts(state="confirmed", confirmed_at_us=OLD, receipt_work_live=True,
                    open_repair=False), Keep("work_live")),
    (r.ReceiptFacts(state="confirmed", confirmed_at_us=OLD, receipt_work_live=False,
                    open_repair=True), Keep("open_repair")),
    # Written by a repair's result for a retired command: the command's only proof.
    (r.ReceiptFacts(state="confirmed", confirmed_at_us=ANCIENT, receipt_work_live=False,
                    open_repair=False, command_retired=True), Keep("retired_command_proof")),
])
def test_receipt_verdicts(facts: r.ReceiptFacts, verdict: r.Verdict) -> None:
    assert r.receipt_verdict(facts, CUT) == verdict


@pytest.mark.parametrize(("facts", "verdict"), [
    # Admission facts and tombstones live to the facts horizon, not the work one.
    (r.AdmissionFacts(admission="HANDOFF_REJECTED", created_at_us=OLD,
                      command_settlement=None), Keep("within_retention")),
    (r.AdmissionFacts(admission="HANDOFF_REJECTED", created_at_us=ANCIENT,
                      command_settlement=None), PRUNE),
    (r.AdmissionFacts(admission="COMMAND_ACCEPTED", created_at_us=OLD,
                      command_settlement="succeeded"), Keep("within_retention")),
    (r.AdmissionFacts(admission="COMMAND_ACCEPTED", created_at_us=ANCIENT,
                      command_settlement="succeeded"), PRUNE),
    (r.AdmissionFacts(admission="COMMAND_ACCEPTED", created_at_us=ANCIENT,
                      command_settlement="open"), Keep("command_unsettled")),
    (r.AdmissionFacts(admission="COMMAND_ACCEPTED", created_at_us=ANCIENT,
                      command_settlement=None), Keep("command_unreadable")),
    (r.AdmissionFacts(admission="SOMETHING_NEW", created_at_us=ANCIENT,
                      command_settlement=None), Keep("unknown_admission")),
])
def test_admission_verdicts(facts: r.AdmissionFacts, verdict: r.Verdict) -> None:
    assert r.admission_verdict(facts, CUT) == verdict


INGRESS_OLD = NOW - 15 * DAY_US  # past the ingress horizon, within the work one


@pytest.mark.parametrize(("facts", "verdict"), [
    (r.IngressReceiptFacts(state="materialized", received_at_us=INGRESS_OLD,
                           work_live=False), PRUNE),
    (r.IngressReceiptFacts(state="quarantined", received_at_us=ANCIENT,
                           work_live=False), PRUNE),
    # Never a receipt the materializer has not settled, however old.
    (r.IngressReceiptFacts(state="received", received_at_us=ANCIENT, work_live=False),
     Keep("unsettled")),
    (r.IngressReceiptFacts(state="materialized", received_at_us=NOW - DAY_US,
                           work_live=False), Keep("within_retention")),
    (r.IngressReceiptFacts(state="materialized", received_at_us=INGRESS_OLD,
                           work_live=True), Keep("work_live")),
])
def test_ingress_receipt_verdicts(facts: r.IngressReceiptFacts, verdict: r.Verdict) -> None:
    assert r.ingress_receipt_verdict(facts, CUT) == verdict


def test_cutoffs_count_days_back_from_now() -> None:
    policy = RetentionPolicy(work_days=30, facts_days=400, batch_rows=10, batch_bytes=1000,
                             ingress_days=14, commands_days=400, quarantine_days=90)
    assert r.cutoffs(policy, NOW) == CUT
    assert CUT.of(r.Horizon.WORK) == CUT.work_us and CUT.of(r.Horizon.FACTS) == CUT.facts_us
    assert CUT.of(r.Horizon.INGRESS) == CUT.ingress_us
    assert CUT.of(r.Horizon.COMMANDS) == CUT.commands_us
    assert CUT.of(r.Horizon.QUARANTINE) == CUT.quarantine_us
    # Without an ingress (commands, quarantine) horizon, no row is old enough.
    assert Cutoffs(work_us=1, facts_us=0).of(r.Horizon.INGRESS) == 0
    assert Cutoffs(work_us=1, facts_us=0).of(r.Horizon.COMMANDS) == 0
    assert Cutoffs(work_us=1, facts_us=0).of(r.Horizon.QUARANTINE) == 0


@pytest.mark.parametrize(("kw", "key"), [
    ({"work_days": 0}, "retention.work_days"),
    ({"work_days": -1}, "retention.work_days"),
    ({"facts_days": 30}, "retention.facts_days"),
    ({"facts_days": 10}, "retention.facts_days"),
    ({"batch_rows": 0}, "retention.batch_rows"),
    ({"batch_bytes": 0}, "retention.batch_bytes"),
    ({"batch_bytes": r.MAX_BATCH_BYTES + 1}, "retention.batch_bytes"),
    ({"ingress_days": 0}, "ingress.retention_days"),
    ({"ingress_days": -2}, "ingress.retention_days"),
    # Shorter than the admission dedup window (facts_days): a config error naming it.
    ({"commands_days": 399}, "retention.commands_days"),
    ({"commands_days": 30}, "retention.commands_days"),
    ({"facts_days": 401}, "retention.commands_days"),
    ({"quarantine_days": 0}, "retention.quarantine_days"),
    ({"quarantine_days": -1}, "retention.quarantine_days"),
])
def test_policy_refuses_settings_that_cannot_work(kw: dict[str, float], key: str) -> None:
    base: dict[str, float] = {"work_days": 30, "facts_days": 400, "batch_rows": 500,
                              "batch_bytes": 1_000_000}
    base.update(kw)
    with pytest.raises(RetentionConfigError) as info:
        RetentionPolicy(**base).validate()  # type: ignore[arg-type]
    assert info.value.key == key


def test_a_command_horizon_equal_to_the_facts_horizon_is_allowed() -> None:
    policy = RetentionPolicy(work_days=30, facts_days=400, commands_days=400,
                             batch_rows=1, batch_bytes=1)
    assert policy.validate() is policy


CMD_OLD = CUT.commands_us - 1  # past the commands horizon
CMD_FRESH = CUT.commands_us


def _command(**kw: object) -> r.CommandFacts:
    base: dict[str, object] = {
        "settlement": "succeeded", "settled_at_us": CMD_OLD, "handed_off": True,
        "admission_exists": False, "receipt_state": None, "work_exists": False,
        "attempts_exist": False, "open_repair": False, "repair_original_exists": False,
        "older_on_record": False}
    base.update(kw)
    return r.CommandFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("facts", "verdict"), [
    (_command(), PRUNE),  # succeeded: its receipt was written, confirmed and pruned
    (_command(settlement="no_effect"), PRUNE),
    (_command(receipt_state="confirmed"), PRUNE),
    (_command(settlement="retired", receipt_state="confirmed"), PRUNE),
    (_command(handed_off=False, settlement="retired"), PRUNE),  # no receipt duty
    (_command(settlement="open"), Keep("command_unsettled")),
    (_command(settlement="open", settled_at_us=0), Keep("command_unsettled")),
    (_command(settled_at_us=CMD_FRESH), Keep("within_retention")),
    (_command(settled_at_us=OLD), Keep("within_retention")),  # past work, not commands
    (_command(admission_exists=True), Keep("admission_fact")),
    (_command(work_exists=True), Keep("work_exists")),
    (_command(attempts_exist=True), Keep("attempts_exist")),
    (_command(open_repair=True, settlement="retired"), Keep("open_repair")),
    (_command(handed_off=False, repair_original_exists=True), Keep("repair_lineage")),
    (_command(receipt_state="pending"), Keep("receipt_unconfirmed")),
    (_command(receipt_state="failed"), Keep("receipt_unconfirmed")),
    (_command(settlement="retired"), Keep("receipt_owed")),
    (_command(older_on_record=True), Keep("older_intent_on_record")),
])
def test_command_verdicts(facts: r.CommandFacts, verdict: r.Verdict) -> None:
    assert r.command_verdict(facts, CUT) == verdict


@pytest.mark.parametrize(("at_us", "verdict"), [
    (CUT.quarantine_us - 1, PRUNE),
    (CUT.quarantine_us, Keep("within_retention")),
    (OLD, Keep("within_retention")),
])
def test_quarantine_verdicts(at_us: int, verdict: r.Verdict) -> None:
    assert r.quarantine_verdict(r.QuarantineFacts(at_us=at_us), CUT) == verdict


def test_the_batch_byte_budget_stays_within_tidb_transaction_limit() -> None:
    assert r.MAX_BATCH_BYTES * 4 == r.TIDB_TXN_LIMIT_BYTES == 100 * 1024 * 1024


KEEP = Keep("within_retention")


@pytest.mark.parametrize(("judged", "budget", "plan"), [
    ([], 10_000, r.BatchPlan(0, ())),
    ([(PRUNE, 0), (KEEP, 0), (PRUNE, 0)], 10_000, r.BatchPlan(3, (0, 2))),
    ([(KEEP, 0), (KEEP, 0)], 10, r.BatchPlan(2, ())),
    # 512 bytes overhead each: two rows of 488 fill 2000 exactly; the walk stops before
    # the third, so the cursor stays there and the next batch takes it.
    ([(PRUNE, 488), (KEEP, 9), (PRUNE, 488), (PRUNE, 488), (KEEP, 0)], 2000,
     r.BatchPlan(3, (0, 2))),
    # One oversized row is still deleted alone, never an empty batch that cannot move.
    ([(PRUNE, 50_000_000), (PRUNE, 1)], 1000, r.BatchPlan(1, (0,))),
    ([(PRUNE, 1), (PRUNE, 50_000_000)], 10_000, r.BatchPlan(1, (0,))),
    # Kept rows cost nothing: the walk goes on past them.
    ([(KEEP, 50_000_000), (PRUNE, 1)], 1000, r.BatchPlan(2, (1,))),
])
def test_plan_batch(judged: list[tuple[r.Verdict, int]], budget: int,
                    plan: r.BatchPlan) -> None:
    assert r.plan_batch(judged, max_bytes=budget) == plan


@pytest.mark.parametrize(("oldest", "cutoff", "lag"), [
    (None, 100, 0), (100, 100, 0), (150, 100, 0), (40, 100, 60)])
def test_overdue(oldest: int | None, cutoff: int, lag: int) -> None:
    assert r.overdue_us(oldest, cutoff) == lag


@pytest.mark.parametrize(("last", "now", "interval", "due"), [
    (0, 100, 50, True), (60, 100, 50, False), (50, 100, 50, True), (-1, 5, 50, True)])
def test_sweep_due(last: int, now: int, interval: int, due: bool) -> None:
    assert r.sweep_due(last, now, interval) is due


@pytest.mark.parametrize(("row", "decision"), [
    (None, r.CreateLease()),
    (r.LeaseView(holder=None, token=None, until_us=0, epoch=3), r.TakeLease(3)),
    (r.LeaseView(holder="a", token="t", until_us=NOW - 1, epoch=4), r.TakeLease(4)),
    (r.LeaseView(holder="a", token="t", until_us=NOW, epoch=4), r.LeaseHeld("a", NOW)),
    (r.LeaseView(holder="a", token="t", until_us=NOW + 9, epoch=4), r.LeaseHeld("a", NOW + 9)),
])
def test_lease_decision(row: r.LeaseView | None, decision: r.LeaseDecision) -> None:
    assert r.lease_decision(row, NOW) == decision
