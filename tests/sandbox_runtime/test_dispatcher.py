"""The outbox dispatcher and withdraw, against a real fake integrationd over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from daemon.core.retry import BackoffPolicy
from sandbox.ports import free_port
from sandbox.runtime.dispatcher import OutboxDispatcher
from sandbox.runtime.model import (
    AdmissionAnswer,
    CommandAccepted,
    RejectAnswer,
    RetryLater,
)
from tests.sandbox_runtime import (
    FakeIntegration,
    RunningRuntime,
    running_fake,
    running_runtime,
    runtime_config,
    wait_until,
)

REJECTED = (409, {"admission": "HANDOFF_REJECTED", "receipt": {"version": 1, "reason": "x"}})
QUARANTINED = (422, {"error": "quarantined", "message": "payload digest differs"})


@pytest.fixture
async def rt(fake: tuple[FakeIntegration, str]) -> AsyncIterator[RunningRuntime]:
    async with running_runtime(fake[1]) as running:
        await running.create_lead()
        yield running


async def test_rejected_handoff_is_terminal_and_releases(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].command_script.append(REJECTED)
    intent_id = await rt.patch_title()
    intent = await rt.wait_status(intent_id, "REJECTED")
    assert intent["rejection_receipt"] == {"version": 1, "reason": "x"}
    assert intent["in_outbox"] is False and intent["command_id"] is None
    assert len(fake[0].commands()) == 1
    assert (await rt.http.delete("/leads/lead-1")).status_code == 204


async def test_quarantined_handoff_stops_sending_and_releases_nothing(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].command_script.append(QUARANTINED)
    intent_id = await rt.patch_title()
    intent = await rt.wait_status(intent_id, "QUARANTINED")
    assert intent["quarantine"] == {"http_status": 422, "error": "quarantined"}
    assert intent["in_outbox"] is False
    response = await rt.http.delete("/leads/lead-1")
    assert (response.status_code, response.json()["intent_ids"]) == (409, [intent_id])
    # only a HANDOFF_REJECTED receipt releases it
    response = await rt.http.post(f"/leads/lead-1/intents/{intent_id}/withdraw")
    assert (response.status_code, response.json()["status"]) == (200, "REJECTED")
    assert (await rt.http.delete("/leads/lead-1")).status_code == 204
    assert len(fake[0].commands()) == 1


async def test_retries_send_the_same_bytes_until_a_definitive_answer(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].command_script.extend([(503, {}), (500, {"error": "boom"}), (502, {}), (429, {})])
    intent_id = await rt.patch_title()
    intent = await rt.wait_status(intent_id, "ACCEPTED")
    sent = fake[0].commands()
    assert len(sent) == 5
    assert len({r.body for r in sent}) == 1
    assert len({r.authorization for r in sent}) == 1
    assert intent["effect_handoff_key"] in sent[0].body.decode()
    stats = (await rt.http.get("/_runtime/stats")).json()
    assert (stats["dispatch_retries"], stats["dispatch_sent"]) == (4, 5)


async def test_integrationd_not_up_yet() -> None:
    port = free_port()
    async with running_runtime(f"http://127.0.0.1:{port}") as rt:
        await rt.create_lead()
        intent_id = await rt.patch_title()
        await wait_until(lambda: rt.runtime.store.counters["dispatch_retries"] >= 2)
        assert rt.status(intent_id) == "PENDING"
        async with running_fake(f"127.0.0.1:{port}") as (fake, _):
            await rt.wait_status(intent_id, "ACCEPTED")
            assert len(fake.commands()) == 1


async def test_withdraw_before_acceptance_rejects(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].hold_before_decision = trio.Event()
    intent_id = await rt.patch_title()
    await wait_until(lambda: len(fake[0].commands()) == 1)  # the handoff is in flight
    response = await rt.http.post(f"/leads/lead-1/intents/{intent_id}/withdraw")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "REJECTED"
    assert response.json()["in_outbox"] is False
    [reject] = fake[0].rejects()
    assert reject.body == rt.runtime.store.intents[intent_id].intent.reject_body()

    # the late acceptance loses to the rejection tombstone
    fake[0].hold_before_decision.set()
    await wait_until(lambda: rt.runtime.store.counters["dispatch_answered"] == 1)
    assert not rt.runtime.store.outbox
    assert rt.status(intent_id) == "REJECTED"
    assert rt.runtime.store.counters["contract_violations"] == 0
    # withdrawing again is idempotent and needs no call
    response = await rt.http.post(f"/leads/lead-1/intents/{intent_id}/withdraw")
    assert (response.status_code, response.json()["status"]) == (200, "REJECTED")
    assert len(fake[0].rejects()) == 1
    assert (await rt.http.delete("/leads/lead-1")).status_code == 204


async def test_withdraw_loses_the_race_to_acceptance(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].hold_after_decision = trio.Event()
    intent_id = await rt.patch_title()
    await wait_until(lambda: fake[0].decided == 1)  # accepted, answer not yet delivered
    assert rt.status(intent_id) == "PENDING"
    response = await rt.http.post(f"/leads/lead-1/intents/{intent_id}/withdraw")
    assert response.status_code == 409
    assert response.json() | {"message": ""} == {
        "error": "already_accepted", "message": "", "status": "ACCEPTED", "command_id": "cmd-1",
    }
    assert rt.status(intent_id) == "ACCEPTED"
    assert rt.intent(intent_id)["in_outbox"] is False
    fake[0].hold_after_decision.set()  # the dispatcher's own answer agrees
    await wait_until(lambda: rt.runtime.store.counters["dispatch_answered"] == 1)
    response = await rt.http.delete("/leads/lead-1")
    assert (response.status_code, response.json()["intent_ids"]) == (409, [intent_id])
    assert rt.runtime.store.counters["contract_violations"] == 0
    # withdrawing an accepted intent answers without asking integrationd again
    response = await rt.http.post(f"/leads/lead-1/intents/{intent_id}/withdraw")
    assert response.status_code == 409 and len(fake[0].rejects()) == 1


async def test_withdraw_without_a_definitive_answer_changes_nothing(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].hold_before_decision = trio.Event()
    fake[0].reject_script.extend([(503, {}), (404, {"error": "not_found"})])
    intent_id = await rt.patch_title()
    url = f"/leads/lead-1/intents/{intent_id}/withdraw"
    response = await rt.http.post(url)
    assert (response.status_code, response.json()["error"]) == (503, "integration_unavailable")
    assert rt.status(intent_id) == "PENDING"
    # absence of a command is never a rejection
    response = await rt.http.post(url)
    assert response.status_code == 502
    assert response.json()["error"] == "withdraw_refused"
    assert (response.json()["upstream_status"], response.json()["upstream_error"]) == (
        404, "not_found"
    )
    assert rt.status(intent_id) == "PENDING"
    # a lost answer is repaired by withdrawing again: the same request, now answered
    response = await rt.http.post(url)
    assert (response.status_code, response.json()["status"]) == (200, "REJECTED")
    assert len({r.body for r in fake[0].rejects()}) == 1 and len(fake[0].rejects()) == 3
    response = await rt.http.post(url)
    assert (response.status_code, response.json()["status"]) == (200, "REJECTED")
    assert len(fake[0].rejects()) == 3
    fake[0].hold_before_decision.set()


async def test_one_leads_handoffs_go_out_in_order(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].hold_before_decision = trio.Event()
    first = await rt.patch_title(title="A")
    second = await rt.patch_title(title="B")
    await wait_until(lambda: len(fake[0].commands()) == 1)
    fake[0].hold_before_decision.set()
    await rt.wait_status(second, "ACCEPTED")
    assert rt.status(first) == "ACCEPTED"
    order = [c.body for c in fake[0].commands()]
    assert order == [rt.runtime.store.intents[i].intent.handoff_body() for i in (first, second)]


async def test_new_entries_wake_the_dispatcher(fake: tuple[FakeIntegration, str]) -> None:
    async with running_runtime(fake[1], poll_interval_s=3600.0) as rt:
        await rt.create_lead()
        intent_id = await rt.patch_title()
        await rt.wait_status(intent_id, "ACCEPTED")


@attrs.define
class ScriptedClient:
    """An in-process integrationd port: no sockets, so MockClock can jump over backoff."""

    answers: list[AdmissionAnswer]
    bodies: list[bytes] = attrs.field(factory=list)

    async def send_command(self, body: bytes) -> AdmissionAnswer:
        self.bodies.append(body)
        await trio.lowlevel.checkpoint()
        return self.answers.pop(0) if self.answers else CommandAccepted("cmd-7")

    async def send_commands(self, bodies: list[bytes]) -> list[AdmissionAnswer] | RetryLater:
        return [await self.send_command(body) for body in bodies]

    async def reject_if_unaccepted(self, body: bytes) -> RejectAnswer:
        raise AssertionError("not used")


async def test_backoff_under_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    runtime = runtime_config(
        "http://unused.invalid",
        dispatch_backoff=BackoffPolicy(base_s=1.0, cap_s=300.0, floor_s=0.05),
        poll_interval_s=60.0,
    )
    client = ScriptedClient([RetryLater("http 503")] * 12)
    store = runtime.store
    store.create_lead({"lead_id": "lead-1", "title": "t"})
    intent_id = store.update_lead("lead-1", {"title": "CTO"}).intent.intent_id
    async with trio.open_nursery() as nursery:
        await nursery.start(OutboxDispatcher(runtime, client).run)
        await wait_until(lambda: store.intents[intent_id].status.value == "ACCEPTED",
                         limit_s=24 * 3600, interval_s=5.0)
        nursery.cancel_scope.cancel()
    assert len(client.bodies) == 13 and len(set(client.bodies)) == 1
    assert store.counters["dispatch_retries"] == 12 and not store.outbox


async def test_an_integrationd_without_the_batch_route_gets_single_commands(
    fake: tuple[FakeIntegration, str]
) -> None:
    async with running_runtime(fake[1], poll_interval_s=3600.0) as rt:
        store = rt.runtime.store
        intents = []
        for i in range(5):  # due together, so the dispatcher batches them
            store.create_lead({"lead_id": f"lead-{i}", "title": "t"})
            intents.append(store.update_lead(f"lead-{i}", {"title": "CTO"}).intent.intent_id)
        rt.runtime.wakeup.set()
        for intent_id in intents:
            await rt.wait_status(intent_id, "ACCEPTED")
        assert fake[0].paths.count("/v1/commands/batch") == 1  # tried once: 404
        assert len(fake[0].commands()) == 5
        assert store.counters["dispatch_answered"] == 5
