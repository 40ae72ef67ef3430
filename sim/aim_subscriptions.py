"""An aimed fault: a subscription create step that ends dead with its attempt in doubt.

Issue 22's window: a create step that ended (dead, its attempts spent) while one of its
attempts is unresolved (the provider may have applied it, the answer was lost) still
counts as in flight (``daemon.core.subscriptions.in_flight``, ``create_kin``): the next
run's create step, a new WorkItem, must wait out that attempt's in-flight window and
read the list back rather than send again. The chaos's own faults reach that window only
by luck: a step has ``max_attempts`` claims, and only a lost answer on its last one leaves
it dead and in doubt (an unknown outcome on an earlier claim is read back by the step
itself, once its window has passed). No seed of 1-29 reached it, so the mutant
``subscription_dead_create_forgotten`` (the guard switched off) survived them.

So, in some of the seeds with subscriptions (drawn from a generator of this module's
own: the other seeds keep their schedules), the provider's own fault queue
(``OutreachSimulator.inject``, the sandbox's injected faults, as its control API offers
them) is aimed at one create step: at the instant its create leaves a replica (the
virtual network's exchange hook), a create on a claim before the step's last is answered
429 (rate limited, not applied: the step retries a second later, the claim charged), and
the create on its last claim is applied and its answer lost (``reset_after``: the
connection is cut after the provider stored the subscription). A fault the request
did not take (it never reached the provider: a chaos fault dropped it) is cleared
before the next one, and when the step has ended. The step ends dead
(``attempts exhausted``) with that attempt ``OUTCOME_UNKNOWN``, inside its in-flight
window; the operator's next "reconcile now" (every 2-6 s, ``sim/subscriptions.py``)
decides the create again, and the oracles ``subscription_create_in_flight`` and
``subscription_created_twice`` judge what its step sends.

Production code is unchanged: the faults are the provider's answers.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import attrs
import trio

from daemon.core.states import TERMINAL, WorkState
from sandbox.hubspot_sim.model import Fault
from sandbox.outreach_sim.simulator import WEBHOOKS_PATH
from sim import oracles

if TYPE_CHECKING:
    from sim.net import VirtualSocket
    from sim.subscriptions import Subscriptions

# Of the seeds with subscriptions, those that aim at a dead create in doubt.
SHARE = 0.5


def rng_for(seed: int) -> random.Random:
    return random.Random(f"aim_subscriptions:{seed}")


@attrs.define(eq=False)
class DeadCreateInDoubt:
    subs: Subscriptions
    target: str | None = None  # the create step aimed at (its work id)
    done: bool = False  # its last claim's create was applied and its answer lost

    def on_exchange(self, sock: VirtualSocket, data: bytes) -> None:
        """At the instant a create leaves a replica (after the subscriptions' own hook,
        which may have frozen the replica as it left: then its body arrives after the
        thaw, and this create is not aimed at)."""
        from sim.subscriptions import CREATE

        world = self.subs.world
        if self.done or not sock.node.startswith("replica-") \
                or oracles.dst_node(sock) != "outreach" or not data.startswith(CREATE.encode()):
            return
        sender = oracles.CURRENT.get()
        if sender is None or sock.froze_at_send or sock.node in world.frozen:
            return
        work_id = sender.fence.work_id
        row = world.observer.execute(
            "SELECT attempt, max_attempts FROM work_items WHERE work_id = ?",
            (work_id,)).fetchone()
        if row is None:
            return
        attempt, most = int(row[0]), int(row[1])
        if self.target != work_id:
            if self.target is not None and not self._ended(self.target):
                return  # the aimed step is still going: one at a time
            self.target = work_id
            world.trace("aim_dead_create", work_id=work_id)
        osim = world.hooks.osim
        # A fault the previous create did not take (it never reached the provider: a
        # chaos fault) is for no other request.
        osim.clear_faults()
        if attempt < most:
            osim.inject(Fault(mode="rate_limit", method="POST", path_prefix=WEBHOOKS_PATH,
                              retry_after_s=1))
            world.count_fault("subscription.create_429_aimed")
            world.trace("aim_dead_create_429", work_id=work_id, attempt=attempt)
            return
        osim.inject(Fault(mode="reset_after", method="POST", path_prefix=WEBHOOKS_PATH))
        world.count_fault("subscription.create_answer_lost_aimed")
        world.trace("aim_dead_create_lost", work_id=work_id, attempt=attempt)
        self.done = True
        assert self.subs.nursery is not None
        self.subs.nursery.start_soon(self._reconcile_after, work_id)

    def _ended(self, work_id: str) -> bool:
        row = self.subs.world.observer.execute(
            "SELECT state FROM work_items WHERE work_id = ?", (work_id,)).fetchone()
        return row is None or WorkState(str(row[0])) in TERMINAL

    async def _reconcile_after(self, work_id: str) -> None:
        """Once the aimed step has ended, an operator's "reconcile now" at once (the
        settle may be on: its run would otherwise be the chain's, minutes later; polled
        finely, so the settle does not see every item finished in between)."""
        world = self.subs.world
        for _ in range(6000):  # 120 s at most (polled)
            if self._ended(work_id):
                break
            await trio.sleep(0.02)
        else:
            return
        world.hooks.osim.clear_faults()  # one not taken is for no later create
        row = world.observer.execute(
            "SELECT state, failure_class FROM work_items WHERE work_id = ?",
            (work_id,)).fetchone()
        world.trace("aim_dead_create_ended", work_id=work_id,
                    state=None if row is None else row[0],
                    failure_class=None if row is None else row[1])
        await self.subs.reconcile_now("aimed reconcile after a create ended in doubt")


def plan(subs: Subscriptions) -> DeadCreateInDoubt | None:
    """This seed's aim (None: none), for a seed with subscriptions."""
    rng = rng_for(subs.world.options.seed)
    return DeadCreateInDoubt(subs) if rng.random() < SHARE else None
