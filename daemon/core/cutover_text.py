"""Cutover in the operator's words: phases, claimants, steps and counts (pure).

The status document (:func:`daemon.services.cutover.status`) is the CLI's ``--json``:
machine names (``cutover_draining``, ``legacy_processing``) and raw values (tuples,
microseconds). The console's Cutover page and ``integrationd cutover status`` show none
of them: every phase, claimant, step and count has
a sentence here, and :func:`count_rows` refuses a count it has no words for (a new
field on :class:`daemon.core.cutover.Snapshot` must be named here before it shows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from daemon.core.cutover import Claimant, Phase, Snapshot, Step

PHASE_TEXT: Mapping[str, str] = {
    Phase.LEGACY_ACTIVE: "legacy owner active",
    Phase.CUTOVER_DRAINING: "cutover draining",
    Phase.INTEGRATIOND_ACTIVE: "integrationd active",
    Phase.ROLLBACK_DRAINING: "rollback draining",
}
CLAIMANT_TEXT: Mapping[str, str] = {
    Claimant.INTEGRATIOND: "integrationd",
    Claimant.LEGACY: "the legacy owner",
    Claimant.NONE: "nobody (draining)",
}
STEP_TEXT: Mapping[str, str] = {
    Step.BEGIN: "begin the cutover: close the legacy owner's admission and let it drain",
    Step.COMMIT: "commit the cutover: integrationd claims from then on",
    Step.ROLLBACK_BEGIN: "roll back: close integrationd's admission, let it drain and"
                         " hand the family back to the legacy owner",
    Step.ROLLBACK_COMMIT: "finish the rollback: the legacy owner claims from then on",
}
# The step form's button, per operator verb.
VERB_BUTTON: Mapping[str, str] = {
    "begin": "Begin cutover",
    "commit": "Commit cutover",
    "rollback": "Roll back",
    "re-cutover": "Re-cutover",
}
RECEIPT_KIND_TEXT: Mapping[str, str] = {"cutover": "cutover", "rollback": "rollback"}

# Every Snapshot field: its label and how its value reads.
COUNT_LABELS: Mapping[str, str] = {
    "processing": "Items processing under a live lease",
    "expired_leases": "Items holding an expired lease",
    "started_attempts": "Effect attempts dispatched without an outcome",
    "dispatch_history": "Unstarted items with dispatch history",
    "replicas": "Live claim-capable replicas",
    "open_claims": "Open claim transactions",
    "open_claim_owners": "Replicas holding an open claim",
    "legacy_reported": "Legacy claimant declared and answering",
    "legacy_processing": "Legacy items still claimed by the legacy owner",
    "legacy_processes": "Live legacy claim-capable processes",
    "legacy_uncovered": "Eligible legacy items without a work item",
    "legacy_open_claims": "Open legacy claim transactions",
    "awaiting": "Fenced items awaiting their legacy outcome",
    "unknown": "Fenced items with an unknown legacy outcome",
    "unprojected_receipts": "Legacy outcome receipts not projected yet",
    "conflicting_receipts": "Legacy outcome receipts in conflict",
    "closed_for_us": "Admission closed for",
    "claim_tx_bound_us": "Claim transaction bound",
}


@attrs.frozen
class CountRow:
    label: str
    kind: str  # "count" | "names" | "yes_no" | "span" | "open"
    value: Any


def count_rows(counts: Mapping[str, Any]) -> list[CountRow]:
    """The snapshot's counts as labelled rows (``KeyError`` for a field with no label)."""
    rows = []
    for name in (f.name for f in attrs.fields(Snapshot)):
        value = counts.get(name)
        label = COUNT_LABELS[name]
        if name.endswith("_us"):
            rows.append(CountRow(label, "open" if value is None else "span", value))
        elif isinstance(value, bool):
            rows.append(CountRow(label, "yes_no", "yes" if value else "no"))
        elif isinstance(value, (tuple, list)):
            rows.append(CountRow(label, "names", ", ".join(str(v) for v in value)))
        else:
            rows.append(CountRow(label, "count", value))
    return rows


def phase_text(phase: str | None) -> str:
    return PHASE_TEXT[phase] if phase is not None else "not under the cutover protocol"
