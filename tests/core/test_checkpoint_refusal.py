"""The dispatch checkpoint's pin check (daemon/core/effect_step.py ``checkpoint_refusal``) and
the step a refusal leads to (issue 20 item 2), row by row, negative rows included."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.effect_step import (
    AttemptView,
    BindingView,
    Blocked,
    ClaimView,
    CommandView,
    DispatchPins,
    LinkView,
    OperationView,
    SettleNoEffect,
    checkpoint_refusal,
    refused_before_dispatch,
)
from daemon.core.handoff import NoEffectReason

COMMAND = CommandView(command_id="c1", settlement="open", intent_kind="UPSERT",
                      binding_generation=1, link_key="lk", link_generation=3,
                      remote_id="101", catalog_revision=7, catalog_digest="sha256:seven")
SENT = DispatchPins(binding_generation=1, link_key="lk", link_generation=3, remote_id="101",
                    catalog_revision=7, catalog_digest="sha256:seven")
BINDING = BindingView(generation=1, connected=True, has_token=True, client_deadline_s=10.0)
LINK = LinkView(state="active", generation=3, remote_id="101")
STORED = "sha256:seven"

Row = tuple[str, CommandView, DispatchPins, BindingView | None, LinkView | None, str | None,
            str | None]
ROWS: list[Row] = [
    ("every pin current", COMMAND, SENT, BINDING, LINK, STORED, None),
    ("a command admitted before digests: the stored revision stands",
     attrs.evolve(COMMAND, catalog_digest=""), SENT, BINDING, LINK, STORED, None),
    ("revision not stored", COMMAND, SENT, BINDING, LINK, None,
     "catalog_revision_unavailable"),
    ("revision stored with another digest", COMMAND, SENT, BINDING, LINK, "sha256:other",
     "catalog_revision_unavailable"),
    ("request built from another revision", COMMAND,
     attrs.evolve(SENT, catalog_revision=8, catalog_digest="sha256:eight"), BINDING, LINK,
     STORED, "catalog_revision"),
    ("request built from other content of the revision", COMMAND,
     attrs.evolve(SENT, catalog_digest="sha256:other"), BINDING, LINK, STORED,
     "catalog_revision"),
    ("binding gone", COMMAND, SENT, None, LINK, STORED, "binding_missing"),
    ("binding disconnected", COMMAND, SENT, attrs.evolve(BINDING, connected=False), LINK,
     STORED, "binding_disconnected"),
    ("binding generation moved", COMMAND, SENT, attrs.evolve(BINDING, generation=2), LINK,
     STORED, "binding_generation"),
    ("link gone", COMMAND, SENT, BINDING, None, STORED, "link_inactive"),
    ("link retired", COMMAND, SENT, BINDING, attrs.evolve(LINK, state="retired"), STORED,
     "link_inactive"),
    ("link generation moved", COMMAND, SENT, BINDING, attrs.evolve(LINK, generation=4), STORED,
     "link_generation"),
    ("link remote id changed", COMMAND, SENT, BINDING, attrs.evolve(LINK, remote_id="202"),
     STORED, "remote_id_changed"),
    ("unpinned command", attrs.evolve(COMMAND, link_key=None), SENT, BINDING, LINK, STORED,
     "unpinned_command"),
    ("request for another record", COMMAND, attrs.evolve(SENT, remote_id="202"), BINDING,
     LINK, STORED, "dispatch_pins_differ"),
    ("request for another link generation", COMMAND, attrs.evolve(SENT, link_generation=2),
     BINDING, LINK, STORED, "dispatch_pins_differ"),
    ("request for another binding generation", COMMAND,
     attrs.evolve(SENT, binding_generation=2), BINDING, LINK, STORED, "dispatch_pins_differ"),
]


@pytest.mark.parametrize(("name", "command", "sent", "binding", "link", "stored", "code"),
                         ROWS, ids=[r[0] for r in ROWS])
def test_checkpoint_refusal(name: str, command: CommandView, sent: DispatchPins,
                            binding: BindingView | None, link: LinkView | None,
                            stored: str | None, code: str | None) -> None:
    got = checkpoint_refusal(command, sent, binding, link, stored)
    assert (None if got is None else got[0]) == code
    if got is not None:
        assert got[1]  # always a sentence


def test_the_sentences_name_what_moved() -> None:
    assert checkpoint_refusal(COMMAND, SENT, attrs.evolve(BINDING, generation=2), LINK,
                              STORED) == (
        "binding_generation", "the pinned binding generation 1 is no longer current (2)")
    assert checkpoint_refusal(COMMAND, attrs.evolve(SENT, catalog_revision=8,
                                                    catalog_digest="sha256:eight"),
                              BINDING, LINK, STORED) == (
        "catalog_revision", "the request was built from Catalog revision 8 (sha256:eight),"
        " not the pinned revision 7 (sha256:seven)")


OP = OperationView(name="op", intent_kinds=frozenset({"UPSERT"}), max_in_flight_s=30.0)


def _view(*attempts: AttemptView, kind: str = "UPSERT") -> ClaimView[str]:
    return ClaimView(command=attrs.evolve(COMMAND, intent_kind=kind), operation=OP,
                     binding=BINDING, link=LINK, attempts=attempts)


def _att(outcome: str, evidence: str) -> AttemptView:
    return AttemptView(attempt_id="a0", outcome=outcome, evidence=evidence, disposition=None,
                       dispatched_at_us=1, gave_up_at_us=2)


def test_a_refused_checkpoint_settles_as_a_refusal_before_dispatch() -> None:
    sentence = "the pinned remote link generation 3 is no longer current (4)"
    assert refused_before_dispatch(_view(), "link_generation", sentence) == SettleNoEffect(
        "link_generation", sentence, NoEffectReason.REJECTED_BEFORE_DISPATCH)
    # An earlier attempt proven not applied: every attempt effect-free, definitively.
    assert refused_before_dispatch(_view(_att("REJECTED", "not_applied")), "link_generation",
                                   sentence) == SettleNoEffect(
        "link_generation", sentence, NoEffectReason.DEFINITIVE_NO_EFFECT)


def test_a_refused_checkpoint_never_hides_an_earlier_effect() -> None:
    # An earlier accepted attempt is never turned into "no effect"; nor is an intent kind
    # that admits no no-effect result.
    applied = refused_before_dispatch(_view(_att("ACCEPTED", "applied")), "link_generation",
                                      "moved")
    assert isinstance(applied, Blocked) and applied.code == "link_generation"
    other_kind = refused_before_dispatch(_view(kind="CREATE"), "binding_generation", "moved")
    assert isinstance(other_kind, Blocked)
