"""The operators that each draw their own seeds (issue 22 item 2), wired into the world
through four small hooks of :mod:`sim.world`: ``configure`` once the configurations are
written, ``start`` with the run's parts, ``chaos`` beside the traffic, ``settle`` through
the settle, ``final`` before the end oracles. Each draws from its own generator, so a
seed that draws none keeps the schedule it had without them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from sim import operators_cutover, operators_keys, operators_reconnect, operators_retire

if TYPE_CHECKING:
    from sim.world import World
    from storage.work_store import WorkStore


class Operator(Protocol):
    def configure(self) -> None: ...

    def start(self, store: WorkStore, **parts: Any) -> None: ...

    async def chaos(self) -> None: ...

    async def settle(self) -> None: ...

    async def final(self, result: dict[str, Any]) -> None: ...


def draw(world: World) -> list[Operator]:
    drawn: list[Operator | None] = [operators_keys.draw(world),
                                    operators_reconnect.draw(world),
                                    operators_cutover.draw(world),
                                    operators_retire.draw(world)]
    return [op for op in drawn if op is not None]
