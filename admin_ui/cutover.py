"""Ownership cutover pages: owner generation, receipts, fences, blockers, projector.

``/admin/cutover`` lists every family under the cutover protocol (and opens one
by name); ``/admin/cutover/<family>`` shows its owner generation, what exactly
blocks the next step, its receipts and its rollback fences with the legacy
outcome projector's progress. Admins get the step forms (begin, commit,
rollback, re-cutover), each with a required reason; they post back with the
session's CSRF token, run :func:`daemon.services.cutover.step` (authorized and
audited there as for the CLI) and redirect with a fixed notice, or re-render
with the blockers (409) or the refusal.
"""

from __future__ import annotations

import re

from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.auth import current_principal, require
from admin_ui.context import console
from admin_ui.errors import DatabaseDown, NotFound, classify
from admin_ui.filters import reason_from
from admin_ui.render import page
from daemon.core.cutover import IllegalStep
from daemon.core.cutover_text import (
    CLAIMANT_TEXT,
    RECEIPT_KIND_TEXT,
    STEP_TEXT,
    VERB_BUTTON,
    count_rows,
    phase_text,
)
from daemon.services import cutover as service
from daemon.services.families import known_family_names
from storage.cutover.steps import NotUnderCutover
from storage.cutover.values import CutoverBlocked, LegacyClaimantError, StepParams

bp = Blueprint("cutover_pages", __name__)
FAMILY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
STEPS = ("begin", "commit", "rollback", "re-cutover")


def _family(family: str) -> str:
    if not FAMILY.fullmatch(family):
        raise NotFound("no such work family")
    return family


async def _choices() -> list[str]:
    """The families an operator may open: the ones this replica serves, the ones a
    legacy claimant is declared for and the ones already under the protocol."""
    view = console().view
    under = [g.family for g in await view.store.cutover_families()]
    declared = [c.family for c in view.settings.legacy_claimants]
    return sorted(set(view.registry.names()) | set(declared) | set(under))


async def _known(family: str) -> str:
    family = _family(family)
    if family not in set(await _choices()) | set(known_family_names()):
        raise NotFound("no such work family")
    return family


@bp.get("/admin/cutover")
@require("cutover.read")
async def cutover_list() -> Response | WerkzeugResponse:
    wanted = request.args.get("family", "").strip()
    if wanted:
        return redirect(f"/admin/cutover/{await _known(wanted)}")
    families = await console().view.store.cutover_families()
    return await page("cutover_list.html", families=[service.generation_json(g)
                                                     for g in families],
                      choices=await _choices(), phase_text=phase_text,
                      claimant_text=CLAIMANT_TEXT)


async def _status(family: str, status: int = 200, error: str | None = None,
                  blockers: list[dict[str, str]] | None = None) -> Response:
    view = console().view
    doc = await service.status(view.store, view.settings, family, view.clock.now_us())
    gen = doc["generation"]
    return await page("cutover.html", status=status, error=error, doc=doc,
                      offered=doc["next_verb"], button=VERB_BUTTON[doc["next_verb"]],
                      next_text=STEP_TEXT[doc["next_step"]],
                      phase=phase_text(gen["phase"] if gen else None),
                      claimant=CLAIMANT_TEXT[gen["claimant"]] if gen else None,
                      kind_text=RECEIPT_KIND_TEXT, claimant_text=CLAIMANT_TEXT,
                      counts=count_rows(doc["counts"]),
                      refused=blockers or [])


@bp.get("/admin/cutover/<family>")
@require("cutover.read")
async def cutover_family(family: str) -> Response:
    return await _status(await _known(family))


@bp.post("/admin/cutover/<family>/<verb>")
@require("cutover.step")
async def cutover_step(family: str, verb: str) -> Response | WerkzeugResponse:
    family = await _known(family)
    if verb not in STEPS:
        raise NotFound("no such cutover step")
    principal = current_principal()
    assert principal is not None
    form = await request.form
    view = console().view
    try:
        params = StepParams(family=family, actor=principal.name,
                            reason=reason_from(form.get("reason")))
        await service.step(view.store, view.settings, verb, params, view.clock.now_us())
    except CutoverBlocked as exc:
        return await _status(family, 409, f"cutover {verb} blocked",
                             [{"code": b.code, "sentence": b.sentence} for b in exc.blockers])
    except (IllegalStep, NotUnderCutover, LegacyClaimantError) as exc:
        return await _status(family, 409, str(exc))
    except Exception as exc:
        err = classify(exc)
        if err is None or isinstance(err, DatabaseDown):
            raise
        return await _status(family, err.status, err.message)
    return redirect(f"/admin/cutover/{family}?notice=cutover_{verb}")
