"""Group commit for dispatch-start checkpoints (see :mod:`daemon.services.batcher`).

Each effect handler must commit its fenced checkpoint before a byte leaves,
which alone would be one commit per effect. Concurrent handlers' checkpoints
go into one ``effect_checkpoint_many`` transaction instead; each request is
still checked against its own fence and its command's state and gets its own
attempt id or refusal. A checkpoint whose handler was cancelled after its
batch was taken may still commit: the same as a crash just after the
checkpoint (the next claim reconciles; it never resends blindly).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from daemon.core.work import Fence
from daemon.services.batcher import Batcher
from daemon.services.clock import Clock
from storage.effect_values import AttemptDraft
from storage.port import StorageError
from storage.work_store import WorkStore


@attrs.define(eq=False)
class CheckpointBatcher:
    store: WorkStore
    clock: Clock
    batcher: Batcher[tuple[Fence, AttemptDraft], str] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.batcher = Batcher(self._flush)

    async def _flush(self, requests: Sequence[tuple[Fence, AttemptDraft]]
                     ) -> list[str | StorageError]:
        return await self.store.effect_checkpoint_many(requests, self.clock.now_us)

    async def checkpoint(self, fence: Fence, draft: AttemptDraft) -> str:
        """The committed attempt id; raises what ``effect_checkpoint`` would raise."""
        return await self.batcher.submit((fence, draft))
