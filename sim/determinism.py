"""Everything that draws or reads time, made a function of the seed, for one run.

Below production code, never inside it: for the duration of :func:`deterministic`

* ``os.urandom`` (ULIDs, lease tokens, uuid4, ``secrets``: they all end there) and the
  ``random`` module's own urandom hook return bytes from a ``random.Random`` seeded from
  the seed; the global ``random`` generator (backoff jitter, scheduler rotation) is seeded;
* trio's scheduler's private generator (it reverses each batch of runnable tasks at
  random) is seeded, and its deadline heap's tie-breaker (``id(cancel_scope)``, a memory
  address) is replaced by a counter, so two timers due at the same virtual instant fire
  in the same order on every run;
* trio's tasks hash by their creation number (counted from 0 for each seed), not by
  their memory address: trio keeps the tasks waiting on an ``Event`` (and on a channel,
  and a cancel status's) in a ``set`` and wakes them in its iteration order, which
  followed the addresses, so a seed's trace depended on the heap, hence on which seeds
  had run before it in the process (seed 28 after seed 27, and with the cyclic garbage
  collector on or off); a cancel status's child statuses are kept in insertion order;
* ``trio.to_thread.run_sync`` runs its function inline (the spool's file writes, the
  set-up's durable COMMITs): a worker thread finishes after a wall-clock delay, and while
  it runs the MockClock jumps and the scheduler makes a machine-dependent number of passes;
* ``time.time``/``time_ns``/``monotonic``/``monotonic_ns`` follow the virtual clock (the
  simulators, httpx and the logging timestamps read them); the
  replicas read their own skewed :class:`~daemon.services.clock.TrioClock`.

``PYTHONHASHSEED`` must be fixed for the process (set iteration order of strings):
:func:`sim.__main__.main` re-executes itself with it set.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
from collections.abc import Iterator
from heapq import heappush
from typing import Any

import trio
from trio._core import _run as trio_run

EPOCH_S = 1_800_000_000.0  # the virtual wall clock at trio time 0 (2027-01-15)
EPOCH_US = int(EPOCH_S * 1_000_000)


def virtual_seconds() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside the run (set-up, the report)
        return 0.0


class InsertionOrderedSet:
    """What trio's :class:`CancelStatus` needs of a ``set`` (add, remove, discard,
    membership, iteration, length), iterated in insertion order: trio's own ``set`` of
    tasks (and of child statuses) iterates in the order of their memory addresses."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[Any, None] = {}

    def add(self, item: Any) -> None:
        self._items[item] = None

    def remove(self, item: Any) -> None:
        del self._items[item]

    def discard(self, item: Any) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)


# attrs compiles each ``factory=`` default into its class's ``__init__``'s globals.
_CANCEL_STATUS_SETS = ("__attr_factory__children", "__attr_factory__tasks")
_TASK_COUNTER = "__attr_factory__counter"


def _task_hash(task: Any) -> int:
    return int(task._counter)


def reseed_scheduler(seed: int) -> None:
    """Trio draws once per scheduler pass, and a pass that waited on a worker thread (the
    set-up's durable SQLite COMMITs) happens a number of times that depends on the machine:
    the main run starts from a fresh draw."""
    trio_run._r.seed(f"trio:{seed}")


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[random.Random]:
    """Patch the sources of randomness and time; yield the run's own generator."""
    bytes_rng = random.Random(f"urandom:{seed}")
    world_rng = random.Random(f"world:{seed}")
    counter = itertools.count()

    def urandom(n: int) -> bytes:
        return bytes_rng.randbytes(n)

    def add(self: Any, deadline: float, cancel_scope: Any) -> None:
        heappush(self._heap, (deadline, next(counter), cancel_scope))
        self._active += 1

    async def run_inline(fn: Any, *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    saved: list[tuple[Any, str, Any]] = [
        (trio.to_thread, "run_sync", trio.to_thread.run_sync),
        (os, "urandom", os.urandom),
        (random, "_urandom", random._urandom),  # type: ignore[attr-defined]
        (trio_run.Deadlines, "add", trio_run.Deadlines.add),
        (time, "time", time.time), (time, "time_ns", time.time_ns),
        (time, "monotonic", time.monotonic), (time, "monotonic_ns", time.monotonic_ns),
    ]
    task_globals = trio_run.Task.__init__.__globals__
    assert _TASK_COUNTER in task_globals and "__hash__" not in vars(trio_run.Task), \
        "trio's Task changed: re-aim sim/determinism.py"
    task_counter = task_globals[_TASK_COUNTER]
    task_globals[_TASK_COUNTER] = itertools.count().__next__
    trio_run.Task.__hash__ = _task_hash  # type: ignore[assignment]
    status_globals = trio_run.CancelStatus.__init__.__globals__
    for name in _CANCEL_STATUS_SETS:
        assert status_globals[name] is set, f"trio's CancelStatus changed: {name}"
        status_globals[name] = InsertionOrderedSet
    random_state = random.getstate()
    trio_state = trio_run._r.getstate()
    os.urandom = urandom
    trio.to_thread.run_sync = run_inline  # type: ignore[assignment]
    random._urandom = urandom  # type: ignore[attr-defined]
    trio_run.Deadlines.add = add  # type: ignore[method-assign]
    time.time = lambda: EPOCH_S + virtual_seconds()
    time.time_ns = lambda: EPOCH_US * 1000 + int(virtual_seconds() * 1e9)
    time.monotonic = virtual_seconds
    time.monotonic_ns = lambda: int(virtual_seconds() * 1e9)
    random.seed(f"global:{seed}")
    trio_run._r.seed(f"trio:{seed}")
    try:
        yield world_rng
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        for name in _CANCEL_STATUS_SETS:
            status_globals[name] = set
        del trio_run.Task.__hash__
        task_globals[_TASK_COUNTER] = task_counter
        random.setstate(random_state)
        trio_run._r.setstate(trio_state)
