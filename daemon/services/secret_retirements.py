"""What the ingress verifier knows of retired previous webhook secrets (docs/subscriptions.md).

The subscription reconciler retires a route's previous secret durably (the
``webhook_secret_retirements`` row, audited). The verifier asks :meth:`SecretRetirements.
retired` only when a delivery matched a route's *previous* secret (rare once a rotation is
over: the hot path, a delivery signed with the newest secret, never waits on it). A
retirement is final for its (route, secret generation), so a known one is kept forever;
otherwise the answer is read from the database at most once per ``ttl_s`` (bounded by
``deadline_s``). The database unreachable and no retirement known yet: the previous secret
is still accepted (it was accepted a moment ago; an accepted delivery is never lost for
want of the database), said in the docs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import attrs
import trio

from daemon.services import logs
from storage.port import StorageError

Key = tuple[str, int]


@attrs.define(eq=False)
class SecretRetirements:
    load: Callable[[], Awaitable[set[Key]]]
    # The routes with a previous secret configured: (route, secret generation).
    watched: frozenset[Key] = frozenset()
    ttl_s: float = 1.0
    deadline_s: float = 0.5
    # Called with (route, accepted) after every load: the previous-secret gauge.
    on_state: Callable[[str, bool], None] = lambda route, accepted: None
    _retired: set[Key] = attrs.field(factory=set)
    _loaded_at: float | None = None

    async def refresh(self) -> None:
        with trio.move_on_after(self.deadline_s):
            try:
                found = await self.load()
            except StorageError as exc:
                logs.warn("secret_retirements_unavailable", error=str(exc)[:200])
                return
            self._retired |= found
            self._loaded_at = trio.current_time()
            for route, gen in self.watched:
                self.on_state(route, (route, gen) not in self._retired)

    async def retired(self, route: str, secret_generation: int) -> bool:
        key = (route, secret_generation)
        if key in self._retired:
            return True
        if self._loaded_at is None or trio.current_time() - self._loaded_at >= self.ttl_s:
            await self.refresh()
        return key in self._retired

    def known_retired(self) -> Iterable[Key]:
        return tuple(sorted(self._retired))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Keeps the gauge (and the cache) fresh: a load at start, then every ``ttl_s``."""
        task_status.started()
        if not self.watched:
            return
        while True:
            await self.refresh()
            await trio.sleep(self.ttl_s)
