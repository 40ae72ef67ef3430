"""Lane rules and fair batch selection (pure).

Two lane facts ride on every WorkItem and are enforced by the database at
claim time, not here:

* a *source lane* orders work: an item may run only when every earlier item
  of its lane (by ``source_seq``) is terminal;
* a *target lane* serializes mutations of one remote target: at most one item
  per target lane is ``processing`` at a time (a unique ``target_lane_hold``
  column makes a second holder impossible).

This module only shapes a claim batch from candidates the database already
judged eligible: one item per lane inside a batch, and round-robin across
organizations so one org's backlog cannot fill every batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class Candidate:
    work_id: str
    org_id: str
    source_lane: str | None
    target_lane: str | None


def pick_batch(candidates: Sequence[Candidate], limit: int, rotation: int = 0) -> list[Candidate]:
    """Choose up to ``limit`` candidates: distinct lanes, orgs served in turn.

    ``candidates`` arrive oldest first. ``rotation`` shifts which org is served
    first so that successive batches start with different orgs.
    """
    if limit <= 0:
        return []
    seen_source: set[str] = set()
    seen_target: set[str] = set()
    per_org: dict[str, list[Candidate]] = {}
    for cand in candidates:
        if cand.source_lane is not None:
            if cand.source_lane in seen_source:
                continue
            seen_source.add(cand.source_lane)
        if cand.target_lane is not None:
            if cand.target_lane in seen_target:
                continue
            seen_target.add(cand.target_lane)
        per_org.setdefault(cand.org_id, []).append(cand)
    orgs = list(per_org)
    if orgs:
        shift = rotation % len(orgs)
        orgs = orgs[shift:] + orgs[:shift]
    picked: list[Candidate] = []
    depth = 0
    while len(picked) < limit:
        progressed = False
        for org in orgs:
            queue = per_org[org]
            if depth < len(queue):
                picked.append(queue[depth])
                progressed = True
                if len(picked) == limit:
                    break
        if not progressed:
            break
        depth += 1
    return picked
