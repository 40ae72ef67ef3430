"""NO_EFFECT only from proof, end to end (seed 003; issue 8, item 1).

Under an operation L1 declares replay-safe, a 503 after sending is retried
(the contract allows it) but proves nothing about the effect: it may have been
applied. When the next attempt is rejected (400), today's rule counted the
replay-safe retry as proof and told the Runtime NO_EFFECT. The command must
instead stay blocking, dead for an operator, with no receipt.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from daemon.core.states import WorkState
from sandbox.hubspot_sim import Fault
from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.l1 import write_sandbox_definitions
from tests.support.slice import running_slice
from tests.ui.support import _OPERATORS, PASSWORDS

pytestmark = pytest.mark.slow


async def test_a_replay_safe_5xx_then_a_rejection_is_never_no_effect(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    l1 = write_sandbox_definitions(tmp_path / "l1", replay_safe=True)
    async with running_slice(store, database.url, definitions_dir=str(l1),
                             honour_idempotency_keys=True) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.inject(Fault(mode="status", method="PATCH", status=503))
        sl.sim.inject(Fault(mode="status", method="PATCH", status=400))
        intent_id = await sl.set_title("lead-1", "CTO")

        async def finished() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            return bool(items) and items[0].state in (WorkState.DEAD, WorkState.SUCCEEDED)

        await wait_for(finished, within_s=30)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        attempts = sent_attempts(await store.effect_attempts(item.subject_id))
        assert [(a.outcome, a.evidence) for a in attempts] == [
            ("REPLAY_SAFE_RETRY", "maybe_applied"), ("REJECTED", "not_applied")]
        assert (item.state, item.failure_class) == (WorkState.DEAD, "http_400")
        assert "may have been applied" in (item.operator_summary or "")
        command = await store.command_get(item.subject_id)
        assert command is not None and command.settlement is Settlement.OPEN
        assert await store.receipt_get(item.subject_id) is None
        # The Runtime's intent keeps blocking owner changes.
        assert (await sl.intent("lead-1", intent_id))["status"] == "ACCEPTED"
        doc = await sl.lead_doc("lead-1")
        assert doc["receipts"] == []


async def test_the_operator_retire_uses_the_same_proof(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Retiring that command cannot claim NO_EFFECT either: retired, no receipt."""
    l1 = write_sandbox_definitions(tmp_path / "l1", replay_safe=True)
    async with running_slice(store, database.url, definitions_dir=str(l1),
                             operators=_OPERATORS, honour_idempotency_keys=True) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.inject(Fault(mode="status", method="PATCH", status=503))
        sl.sim.inject(Fault(mode="status", method="PATCH", status=400))
        intent_id = await sl.set_title("lead-1", "CTO")

        async def dead() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            return bool(items) and items[0].state is WorkState.DEAD

        await wait_for(dead, within_s=30)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        otto = httpx.AsyncClient(base_url=sl.base_url, timeout=10)
        try:
            form = await otto.get("/admin/sign-in")
            found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
            assert found is not None
            r = await otto.post("/admin/sign-in", data={
                "name": "otto", "password": PASSWORDS["otto"], "csrf_token": found.group(1),
                "next": "/admin/"})
            assert r.status_code == 302, r.text
            csrf = (await otto.get("/admin/api/session")).json()["csrf_token"]
            r = await otto.post(f"/admin/api/effects/commands/{item.subject_id}/retire",
                                json={"reason": "give up"}, headers={"X-CSRF-Token": csrf})
        finally:
            await otto.aclose()
        assert r.status_code == 200, r.text
        command = await store.command_get(item.subject_id)
        assert command is not None and command.settlement is Settlement.RETIRED
        assert await store.receipt_get(item.subject_id) is None
        assert (await sl.intent("lead-1", intent_id))["status"] == "ACCEPTED"
