"""One claim's decision (daemon/core/effect_step.py), row by row, negative rows included."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.effect_step import (
    AttemptView,
    BindingView,
    Blocked,
    ClaimView,
    CommandView,
    Dispatch,
    LinkView,
    Nothing,
    OperationView,
    Readback,
    Reconcile,
    RecordAbsent,
    Requeue,
    SettleNoEffect,
    SettleSuccess,
    Step,
    Wait,
    after_attempt,
    clock_skew_s,
    credential_refusal,
    decide,
    in_flight_window_s,
)
from daemon.core.effects import (
    Classification,
    DispatchObservation,
    OperationContract,
    Phase,
    RemoteSnapshot,
    classify,
)
from daemon.core.handoff import NoEffectReason
from tests.support.contracts import PROOF, contract

S = 1_000_000
NOW = 1_000 * S
REQUEST = "PATCH /contacts/101"
BEFORE = NoEffectReason.REJECTED_BEFORE_DISPATCH
DEFINITIVE = NoEffectReason.DEFINITIVE_NO_EFFECT

COMMAND = CommandView(command_id="c1", settlement="open", intent_kind="UPSERT",
                      binding_generation=1, link_key="lk", link_generation=3, remote_id="101")
OP = OperationView(name="op", intent_kinds=frozenset({"UPSERT"}), max_in_flight_s=30.0,
                   max_clock_skew_s=2.0)
BINDING = BindingView(generation=1, connected=True, has_token=True, client_deadline_s=10.0)
LINK = LinkView(state="active", generation=3, remote_id="101")
VIEW: ClaimView[str] = ClaimView(command=COMMAND, operation=OP, binding=BINDING, link=LINK,
                                 request=REQUEST, desired={"jobtitle": "CTO"}, now_us=NOW)


def att(outcome: str | None, evidence: str | None = None, disposition: str | None = None,
        at_s: float = 900, gave_up_s: float | None = None, attempt_id: str = "a1"
        ) -> AttemptView:
    return AttemptView(attempt_id=attempt_id, outcome=outcome, evidence=evidence,
                       disposition=disposition, dispatched_at_us=int(at_s * S),
                       gave_up_at_us=None if gave_up_s is None else int(gave_up_s * S))


def cmd(**changes: object) -> CommandView:
    return attrs.evolve(COMMAND, **changes)  # type: ignore[arg-type]


UNKNOWN = att("OUTCOME_UNKNOWN", "maybe_applied", gave_up_s=910)
CRASHED = att(None, gave_up_s=910)
APPLIED_SNAPSHOT = RemoteSnapshot(True, {"jobtitle": "CTO"}, updated_at_us=905 * S)
OLD_SNAPSHOT = RemoteSnapshot(True, {"jobtitle": "Engineer"}, updated_at_us=100 * S)
PARTIAL = RemoteSnapshot(True, {"jobtitle": "CT"}, updated_at_us=905 * S)

# The pinned operation declares a replay proof whose key the provider honours a day.
SAFE_VIEW = attrs.evolve(VIEW, operation=attrs.evolve(OP, replay_retention_s=86_400.0))
MAYBE = att("REPLAY_SAFE_RETRY", "maybe_applied")  # dispatched at 900 s

ROWS: list[tuple[str, ClaimView[str], Step[str]]] = [
    # --- a replay-safe retry is replayed only while its proof holds
    ("a maybe-applied replay-safe retry within the key's retention: replayed",
     attrs.evolve(SAFE_VIEW, attempts=(MAYBE,)), Dispatch(REQUEST)),
    ("...after the key's retention: reconciled, never replayed",
     attrs.evolve(SAFE_VIEW, attempts=(MAYBE,), now_us=(900 + 86_400) * S),
     Reconcile(("a1",), ("jobtitle",))),
    ("...when the pinned operation declares no proof: reconciled",
     attrs.evolve(VIEW, attempts=(MAYBE,)), Reconcile(("a1",), ("jobtitle",))),
    ("...a legacy row without evidence reads as maybe applied: reconciled",
     attrs.evolve(SAFE_VIEW, attempts=(att("REPLAY_SAFE_RETRY"),), now_us=(900 + 86_400) * S),
     Reconcile(("a1",), ("jobtitle",))),
    ("...a 429 (proven not applied) needs no proof: dispatched again",
     attrs.evolve(VIEW, attempts=(att("REPLAY_SAFE_RETRY", "not_applied"),),
                  now_us=(900 + 86_400) * S), Dispatch(REQUEST)),
    ("...once an operator disposed of it: dispatched again",
     attrs.evolve(VIEW, attempts=(att("REPLAY_SAFE_RETRY", "maybe_applied", "proven_absent"),)),
     Dispatch(REQUEST)),
    # --- settled / missing
    ("missing command", attrs.evolve(VIEW, command=None),
     Blocked("missing_command", "the command is missing")),
    ("settled succeeded", attrs.evolve(VIEW, command=cmd(settlement="succeeded")),
     Nothing("command already succeeded")),
    ("settled no_effect", attrs.evolve(VIEW, command=cmd(settlement="no_effect")),
     Nothing("command already no_effect")),
    ("retired", attrs.evolve(VIEW, command=cmd(settlement="retired")),
     Nothing("command already retired")),
    # --- the happy path
    ("fresh command dispatches", VIEW, Dispatch(REQUEST)),
    ("after a 429 dispatches again",
     attrs.evolve(VIEW, attempts=(att("REPLAY_SAFE_RETRY", "not_applied"),)), Dispatch(REQUEST)),
    ("after proven absence dispatches again",
     attrs.evolve(VIEW, attempts=(att("OUTCOME_UNKNOWN", "maybe_applied", "proven_absent"),)),
     Dispatch(REQUEST)),
    # --- applied
    ("accepted attempt settles success",
     attrs.evolve(VIEW, attempts=(att("ACCEPTED", "applied"),)), SettleSuccess("101")),
    ("operator applied settles success",
     attrs.evolve(VIEW, attempts=(att("OUTCOME_UNKNOWN", None, "operator_applied"),)),
     SettleSuccess("101")),
    ("applied settles with the pinned id even after a rebind",
     attrs.evolve(VIEW, attempts=(att("ACCEPTED", "applied"),),
                  link=attrs.evolve(LINK, generation=4, remote_id="202")),
     SettleSuccess("101")),
    # --- pins: refused before dispatch, with proof -> NO_EFFECT
    ("unpinned legacy command", attrs.evolve(VIEW, command=cmd(link_key=None)),
     SettleNoEffect("unpinned_command", "the command was accepted before targets were pinned;"
                    " issue a repair command to pin the current ones", BEFORE)),
    ("binding generation bumped", attrs.evolve(VIEW, binding=attrs.evolve(BINDING, generation=2)),
     SettleNoEffect("binding_generation", "the pinned binding generation 1 is no longer"
                    " current (2)", BEFORE)),
    ("binding gone", attrs.evolve(VIEW, binding=None),
     SettleNoEffect("binding_missing", "the command's binding is no longer configured", BEFORE)),
    ("no durable generation pinned (admitted before the pin, never backfilled)",
     attrs.evolve(VIEW, command=cmd(binding_generation=None)),
     SettleNoEffect("unpinned_binding", "the command pins no durable binding generation;"
                    " issue a repair command to pin the current one", BEFORE)),
    ("binding disconnected (generation kept)",
     attrs.evolve(VIEW, binding=attrs.evolve(BINDING, connected=False)),
     SettleNoEffect("binding_disconnected", "the pinned binding is disconnected", BEFORE)),
    ("binding disconnected and the generation moved",
     attrs.evolve(VIEW, binding=attrs.evolve(BINDING, connected=False, generation=2)),
     SettleNoEffect("binding_disconnected", "the pinned binding is disconnected", BEFORE)),
    ("no link at admission", attrs.evolve(VIEW, command=cmd(link_generation=None,
                                                            remote_id=None)),
     SettleNoEffect("no_remote_link", "no remote link existed for the record when the command"
                    " was accepted", BEFORE)),
    ("link gone", attrs.evolve(VIEW, link=None),
     SettleNoEffect("link_inactive", "the pinned remote link is no longer active", BEFORE)),
    ("link retired", attrs.evolve(VIEW, link=attrs.evolve(LINK, state="retired")),
     SettleNoEffect("link_inactive", "the pinned remote link is no longer active", BEFORE)),
    ("link rebound (generation)", attrs.evolve(VIEW, link=attrs.evolve(LINK, generation=4)),
     SettleNoEffect("link_generation", "the pinned remote link generation 3 is no longer"
                    " current (4)", BEFORE)),
    ("link names another record", attrs.evolve(VIEW, link=attrs.evolve(LINK, remote_id="202")),
     SettleNoEffect("remote_id_changed", "the pinned remote record is no longer the linked one",
                    BEFORE)),
    ("rebind after a rejection: definitive",
     attrs.evolve(VIEW, link=attrs.evolve(LINK, generation=4),
                  attempts=(att("REJECTED", "not_applied"),)),
     SettleNoEffect("link_generation", "the pinned remote link generation 3 is no longer"
                    " current (4)", DEFINITIVE)),
    # --- pins: refused without proof -> blocked
    ("rebind after a replay-safe timeout: blocked",
     attrs.evolve(SAFE_VIEW, link=attrs.evolve(LINK, generation=4),
                  attempts=(att("REPLAY_SAFE_RETRY", "maybe_applied"),)),
     Blocked("link_generation", "the pinned remote link generation 3 is no longer current (4);"
             " no no-effect result: an attempt may have been applied (timeout, reset or server"
             " error after sending); a replay-safe contract is no proof of no effect;"
             " operator repair needed")),
    ("a CREATE intent never settles no-effect",
     attrs.evolve(VIEW, command=cmd(intent_kind="CREATE"), binding=None),
     Blocked("binding_missing", "the command's binding is no longer configured; no no-effect"
             " result: only UPSERT and DELETE intents admit a no-effect result; operator"
             " repair needed")),
    # --- other refusals before dispatch
    ("operation gone", attrs.evolve(VIEW, operation=None),
     SettleNoEffect("unknown_operation", "the pinned operation is not in the catalog", BEFORE)),
    ("intent kind not accepted", attrs.evolve(VIEW, command=cmd(intent_kind="DELETE")),
     SettleNoEffect("intent_kind", "op does not accept intent kind DELETE", BEFORE)),
    ("bad request", attrs.evolve(VIEW, request=None, request_error="properties not allowed"),
     SettleNoEffect("bad_request", "properties not allowed", BEFORE)),
    ("no request prepared", attrs.evolve(VIEW, request=None),
     Blocked("request_not_prepared", "no request was prepared for the pinned target")),
    # The pinned Catalog revision's content is gone: refused before any other check.
    ("pinned revision not stored",
     attrs.evolve(VIEW, catalog_refusal=("catalog_revision_unavailable", "not stored")),
     SettleNoEffect("catalog_revision_unavailable", "not stored", BEFORE)),
    ("pinned revision not stored, after a rejected attempt",
     attrs.evolve(VIEW, catalog_refusal=("catalog_revision_unavailable", "not stored"),
                  attempts=(att("REJECTED", "not_applied"),)),
     SettleNoEffect("catalog_revision_unavailable", "not stored",
                    NoEffectReason.DEFINITIVE_NO_EFFECT)),
    ("no credentials", attrs.evolve(VIEW, binding=attrs.evolve(BINDING, has_token=False)),
     Wait("no_credentials", "the binding has no token configured", 60.0)),
    # --- unresolved: reconcile, never dispatch
    ("unknown outcome reconciles", attrs.evolve(VIEW, attempts=(UNKNOWN,)),
     Reconcile(("a1",), ("jobtitle",))),
    ("crash after checkpoint reconciles", attrs.evolve(VIEW, attempts=(CRASHED,)),
     Reconcile(("a1",), ("jobtitle",))),
    ("an earlier unresolved attempt is not hidden by a later rejection",
     attrs.evolve(VIEW, attempts=(UNKNOWN, att("REJECTED", "not_applied", attempt_id="a2"))),
     Reconcile(("a1",), ("jobtitle",))),
    ("unresolved and rebound: no read-back with the new identity",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), link=attrs.evolve(LINK, generation=4)),
     Blocked("link_generation", "the pinned remote link generation 3 is no longer current (4);"
             " an unresolved attempt cannot be read back with another identity: operator"
             " disposition needed")),
    ("unresolved and binding bumped: no read-back",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), binding=attrs.evolve(BINDING, generation=2)),
     Blocked("binding_generation", "the pinned binding generation 1 is no longer current (2);"
             " an unresolved attempt cannot be read back with another identity: operator"
             " disposition needed")),
    ("unresolved and binding disconnected: no read-back",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), binding=attrs.evolve(BINDING, connected=False)),
     Blocked("binding_disconnected", "the pinned binding is disconnected; an unresolved"
             " attempt cannot be read back with another identity: operator disposition"
             " needed")),
    ("unresolved, operation gone", attrs.evolve(VIEW, attempts=(UNKNOWN,), operation=None),
     Wait("reconcile_unavailable", "the pinned operation is not served; cannot read back",
          60.0)),
    ("unresolved, no credentials",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), binding=attrs.evolve(BINDING, has_token=False)),
     Blocked("outcome_unknown", "cannot read back (no credentials): operator disposition"
             " needed")),
    # --- with the read-back
    ("read-back shows the values: success",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), readback=Readback(APPLIED_SNAPSHOT)),
     SettleSuccess("101", ("a1",))),
    ("read-back failed: wait",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), readback=Readback(None, "ConnectError")),
     Wait("reconcile_read_failed", "ConnectError")),
    ("unmodified since before dispatch, window passed: absent",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), readback=Readback(OLD_SNAPSHOT)),
     RecordAbsent(("a1",))),
    ("a partial mutation is never absence",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), readback=Readback(PARTIAL)),
     Wait("outcome_unknown", "read-back proves neither effect nor absence: operator"
          " disposition needed")),
    # Absence counts from when the client gave up, not from the dispatch: dispatched at
    # 900 s, gave up at 975 s, window 30 s -> not before 1005 s (now is 1000 s).
    ("the window counts from the give-up",
     attrs.evolve(VIEW, attempts=(att("OUTCOME_UNKNOWN", "maybe_applied", gave_up_s=975),),
                  readback=Readback(OLD_SNAPSHOT)),
     Wait("outcome_unknown", "waiting out the provider's in-flight window", 5.5)),
    # A row without a give-up time: the client's deadline (10 s) bounds it.
    ("a legacy row counts from dispatch plus the client timeout",
     attrs.evolve(VIEW, attempts=(att(None, at_s=965),), readback=Readback(OLD_SNAPSHOT)),
     Wait("outcome_unknown", "waiting out the provider's in-flight window", 5.5)),
    # L2 may lengthen the window: gave up at 910 s, 100 s -> not before 1010 s.
    ("a longer L2 window is honoured",
     attrs.evolve(VIEW, attempts=(UNKNOWN,), readback=Readback(OLD_SNAPSHOT),
                  binding=attrs.evolve(BINDING, max_in_flight_s=100.0)),
     Wait("outcome_unknown", "waiting out the provider's in-flight window", 10.5)),
    # ... and never shorten it: 1 s after 990 s has passed; L1's 30 s (1020 s) has not.
    ("a shorter L2 window is not",
     attrs.evolve(VIEW, attempts=(att("OUTCOME_UNKNOWN", "maybe_applied", gave_up_s=990),),
                  readback=Readback(OLD_SNAPSHOT),
                  binding=attrs.evolve(BINDING, max_in_flight_s=1.0)),
     Wait("outcome_unknown", "waiting out the provider's in-flight window", 20.5)),
]


@pytest.mark.parametrize(("name", "view", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(name: str, view: ClaimView[str], expected: Step[str]) -> None:
    assert decide(view) == expected


GRANT_VIEW = attrs.evolve(VIEW, binding=attrs.evolve(BINDING, refreshable=True))
REJECTED_401 = AttemptView(attempt_id="a-401", outcome="REJECTED", evidence="not_applied",
                           disposition=None, dispatched_at_us=0, gave_up_at_us=1,
                           failure_class="http_401")

CONTRACT = contract(default_retry_after_s=5.0)
REPLAY_SAFE = attrs.evolve(CONTRACT, replay=PROOF)

AFTER: list[tuple[str, OperationContract, DispatchObservation, ClaimView[str], Step[str]]] = [
    ("2xx settles success", CONTRACT, DispatchObservation(Phase.RESPONDED, 200), VIEW,
     SettleSuccess("101")),
    ("404 settles definitive no-effect", CONTRACT, DispatchObservation(Phase.RESPONDED, 404),
     VIEW, SettleNoEffect("http_404", "the provider rejected the request (404)", DEFINITIVE)),
    ("404 after a replay-safe 5xx is blocked", REPLAY_SAFE,
     DispatchObservation(Phase.RESPONDED, 404),
     attrs.evolve(VIEW, attempts=(att("REPLAY_SAFE_RETRY", "maybe_applied"),)),
     Blocked("http_404", "the provider rejected the request (404); no no-effect result: an"
             " attempt may have been applied (timeout, reset or server error after sending);"
             " a replay-safe contract is no proof of no effect; operator repair needed")),
    ("429 waits for Retry-After", CONTRACT, DispatchObservation(Phase.RESPONDED, 429, 7.0),
     VIEW, Wait("http_429", "not applied (429)", 7.0)),
    ("not connected retries", CONTRACT, DispatchObservation(Phase.NOT_CONNECTED), VIEW,
     Wait("connect", "not applied (connect)", None)),
    # --- our own quota or send gate held the request back: requeued, never charged
    ("a slot that expired waiting is requeued, charging nothing", CONTRACT,
     DispatchObservation(Phase.HELD, detail="quota_slot_expired"), VIEW,
     Requeue("quota_slot_expired", "held back before sending (quota_slot_expired): nothing"
             " was sent; no attempt is charged")),
    ("no free connection of ours is requeued, charging nothing", REPLAY_SAFE,
     DispatchObservation(Phase.HELD, detail="connection_wait"),
     attrs.evolve(VIEW, attempts=(att("RETRYABLE_PRE_DISPATCH", "not_sent"),)),
     Requeue("quota_connection_wait", "held back before sending (connection_wait): nothing"
             " was sent; no attempt is charged")),
    ("a refused connect is no hold: it is a failed attempt", CONTRACT,
     DispatchObservation(Phase.NOT_CONNECTED, detail="ConnectError"), VIEW,
     Wait("connect", "not applied (ConnectError)", None)),
    ("replay-safe timeout retries, as maybe applied", REPLAY_SAFE,
     DispatchObservation(Phase.SENT, idempotency_header="Idempotency-Key"), VIEW,
     Wait("transport", "maybe applied (transport); the contract proves a replay safe", None)),
    ("a proof the request did not carry proves nothing: reconciled", REPLAY_SAFE,
     DispatchObservation(Phase.SENT), VIEW,
     Wait("outcome_unknown", "dispatch outcome unknown (transport); reconciling", 30.0)),
    ("timeout waits out the window to reconcile", CONTRACT, DispatchObservation(Phase.SENT),
     VIEW, Wait("outcome_unknown", "dispatch outcome unknown (transport); reconciling", 30.0)),
    ("5xx waits out the window to reconcile", CONTRACT,
     DispatchObservation(Phase.RESPONDED, 503), VIEW,
     Wait("outcome_unknown", "dispatch outcome unknown (503); reconciling", 30.0)),
    # --- a 401 rejects the token, not the effect: one refresh, then a retry
    ("401 with a refreshable grant: refresh once and retry", CONTRACT,
     DispatchObservation(Phase.RESPONDED, 401), GRANT_VIEW,
     Wait("token_rejected", "the provider refused the access token (http_401): refreshed"
          " once, the effect is retried", 0.0)),
    ("401 again after the refresh: a definitive rejection", CONTRACT,
     DispatchObservation(Phase.RESPONDED, 401),
     attrs.evolve(GRANT_VIEW, attempts=(REJECTED_401,)),
     SettleNoEffect("http_401", "the provider rejected the request (401)", DEFINITIVE)),
    ("401 with a static token: a rejection (nothing to refresh)", CONTRACT,
     DispatchObservation(Phase.RESPONDED, 401), VIEW,
     SettleNoEffect("http_401", "the provider rejected the request (401)", DEFINITIVE)),
    ("403 with a grant is no token problem", CONTRACT,
     DispatchObservation(Phase.RESPONDED, 403), GRANT_VIEW,
     SettleNoEffect("http_403", "the provider rejected the request (403)", DEFINITIVE)),
]


@pytest.mark.parametrize(("name", "contract", "seen", "view", "expected"), AFTER,
                         ids=[r[0] for r in AFTER])
def test_after_attempt(name: str, contract: OperationContract, seen: DispatchObservation,
                       view: ClaimView[str], expected: Step[str]) -> None:
    what = seen.detail or (str(seen.status) if seen.status else
                           classify(contract, seen).failure_class)
    assert after_attempt(view, classify(contract, seen), what) == expected


@pytest.mark.parametrize(("l1", "l2", "window"), [
    (30.0, 0.0, 30.0), (30.0, 45.0, 45.0), (30.0, 1.0, 30.0), (2.0, 0.0, 2.0),
])
def test_l2_only_lengthens_l1(l1: float, l2: float, window: float) -> None:
    op = attrs.evolve(OP, max_in_flight_s=l1, max_clock_skew_s=l1)
    binding = attrs.evolve(BINDING, max_in_flight_s=l2, max_clock_skew_s=l2)
    assert in_flight_window_s(op, binding) == window
    assert clock_skew_s(op, binding) == window


@pytest.mark.parametrize(("name", "view", "verdict", "expected"), [
    ("needs re-authorization before any call: proven not sent", VIEW, None,
     SettleNoEffect("needs_reauthorization", "re-authorize", BEFORE)),
    ("needs re-authorization after the 401 just made: proven not applied", VIEW,
     classify(CONTRACT, DispatchObservation(Phase.RESPONDED, 401)),
     SettleNoEffect("needs_reauthorization", "re-authorize", DEFINITIVE)),
    ("after a replay-safe maybe-applied attempt: no proof, blocked",
     attrs.evolve(VIEW, attempts=(att("REPLAY_SAFE_RETRY", "maybe_applied"),)), None,
     Blocked("needs_reauthorization", "re-authorize; no no-effect result: an attempt may"
             " have been applied (timeout, reset or server error after sending); a"
             " replay-safe contract is no proof of no effect; operator repair needed")),
])
def test_credential_refusal(name: str, view: ClaimView[str], verdict: Classification | None,
                            expected: Step[str]) -> None:
    assert credential_refusal(view, "needs_reauthorization", "re-authorize",
                              verdict) == expected
