"""Receipt delivery is a fenced step (issue 8, item 12): a stale claimant delivers nothing.

A receipt item whose lease expired and was reclaimed by another replica must not
be POSTed by its old claimant: the Runtime would see a delivery from a claimant
that no longer owns the work. Real storage on every backend, a real HTTP server
standing in for the Runtime's results endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
import pytest
import trio

from config.settings import RuntimeClient, Secret, Settings
from daemon.core.outcomes import Succeeded
from daemon.core.work import Fence, WorkItem
from daemon.providers.executor import BoundedHttp
from daemon.services.batcher import Batcher
from daemon.services.families import WorkContext
from daemon.services.receipt_sender import ReceiptSender
from sandbox.h11_server import H11Server, Request, Response
from storage.port import LostLease, StorageError
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, FixedClock, claim, enqueue


@attrs.define
class RecordingRuntime:
    received: list[str] = attrs.field(factory=list)

    async def handle(self, request: Request) -> Response:
        self.received.append(request.path)
        return Response(200, b'{"status":"COMMITTED"}', (("content-type", "application/json"),))


async def _claimed(store: WorkStore, owner: str, now: int) -> WorkItem:
    result = await claim(store, owner=owner, now=now, ttl=SEC, family="runtime_receipt")
    (item,) = result.claimed
    return item


@pytest.mark.parametrize("batched", [False, True])
async def test_a_stale_receipt_claimant_delivers_nothing(store: WorkStore, batched: bool) -> None:
    runtime = RecordingRuntime()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(H11Server(runtime.handle).run)
        settings = Settings(runtimes=(RuntimeClient(
            name="crm", org_id="org-1", app_installation_id="i-1", runtime_capability_id="cap",
            runtime_work_binding_digest="sha256:b", results_url=f"http://127.0.0.1:{port}/r",
            token=Secret("t"), results_token=Secret("rt")),))
        http = BoundedHttp.open(4)
        # A claims; its lease (1 s) expires; replica B reclaims the item.
        later = T0 + 5 * SEC
        fences: Batcher[Fence, None] | None = None
        if batched:  # the proof as the replica makes it: in a shared transaction
            async def prove(batch: Sequence[Fence]) -> list[StorageError | None]:
                return await store.work_fences_live(batch, lambda: later + 1)

            fences = Batcher(prove)
            nursery.start_soon(fences.run)
        sender = ReceiptSender(settings, http, fences=fences)
        await enqueue(store, family="runtime_receipt", subject_kind="receipt", subject_id="c1",
                      payload=json.dumps({"command_id": "c1", "runtime": "crm",
                                          "request": {"command_id": "c1"}}))
        stale = await _claimed(store, "A", T0)
        live = await _claimed(store, "B", later)
        assert live.ownership_epoch > stale.ownership_epoch
        try:
            assert stale.fence is not None and live.fence is not None
            old = WorkContext(item=stale, fence=stale.fence, store=store,
                              clock=FixedClock(later + 1), replica_id="A")
            with pytest.raises(LostLease):
                await sender.handle(old)
            assert runtime.received == []  # the stale claimant sent nothing
            assert old.side_writes == []
            # The live claimant delivers it.
            new = WorkContext(item=live, fence=live.fence, store=store,
                              clock=FixedClock(later + 1), replica_id="B")
            assert isinstance(await sender.handle(new), Succeeded)
            assert runtime.received == ["/r"]
        finally:
            await http.aclose()
            nursery.cancel_scope.cancel()
