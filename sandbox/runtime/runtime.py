"""The reference Runtime object: configuration, the in-memory store, the outbox wakeup."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import attrs
import trio

from config.settings import Secret
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.ids import encode_ulid
from daemon.core.retry import BackoffPolicy
from sandbox.runtime.store import RuntimeStore

DEFAULT_OPERATION = "hubspot.contact.update_jobtitle"
DEFAULT_BACKOFF = BackoffPolicy(base_s=0.5, cap_s=30.0, floor_s=0.05)


def _secret(value: str | Secret) -> Secret:
    return value if isinstance(value, Secret) else Secret(value)


def wall_clock_us() -> int:
    return time.time_ns() // 1000


def new_ulid_id(prefix: str) -> str:
    """``<prefix>-<ULID>``: sortable by creation time, random enough to never collide."""
    return f"{prefix}-{encode_ulid(time.time_ns() // 1_000_000, os.urandom(10))}"


class Wakeup:
    """Wake the outbox dispatcher early (a new entry, a freed sending slot).

    ``set`` before or during ``wait`` makes that ``wait`` return; ``wait`` re-arms before it
    returns, with no checkpoint in between, so no ``set`` is lost.
    """

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        with trio.move_on_after(max(timeout_s, 0.0)):
            await self._event.wait()
        self._event = trio.Event()


@attrs.define(eq=False, kw_only=True)
class ReferenceRuntime:
    """A reference CRM Runtime bound to one integrationd by ``scope``.

    State is in memory (:class:`~sandbox.runtime.store.RuntimeStore`). Serve it with
    :func:`sandbox.runtime.server.serve`, which also runs the outbox dispatcher.
    """

    scope: TrustedRuntimeWorkScope
    integration_url: str
    integration_token: Secret = attrs.field(converter=_secret, repr=False)
    results_token: Secret = attrs.field(converter=_secret, repr=False)
    catalog_revision: int
    operation: str = DEFAULT_OPERATION
    # Operations a title change also hands off, each its own intent (e.g. the Lead's
    # Outreach Prospect beside its HubSpot contact).
    also_operations: tuple[str, ...] = ()
    accept_no_effect_format: bool = True
    dispatch_backoff: BackoffPolicy = DEFAULT_BACKOFF
    poll_interval_s: float = 1.0
    dispatch_concurrency: int = 8
    # Entries per POST /v1/commands/batch (1: single POST /v1/commands requests).
    dispatch_batch: int = 32
    request_timeout_s: float = 10.0
    now_us: Callable[[], int] = wall_clock_us
    new_id: Callable[[str], str] = new_ulid_id
    store: RuntimeStore = attrs.field(init=False)
    wakeup: Wakeup = attrs.field(init=False, factory=Wakeup)

    def __attrs_post_init__(self) -> None:
        if self.dispatch_concurrency < 1 or self.dispatch_batch < 1:
            raise ValueError("dispatch_concurrency and dispatch_batch must be at least 1")
        if self.poll_interval_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("poll_interval_s and request_timeout_s must be positive")
        self.store = RuntimeStore(
            scope=self.scope,
            catalog_revision=self.catalog_revision,
            operation=self.operation,
            also_operations=tuple(self.also_operations),
            accept_no_effect_format=self.accept_no_effect_format,
            now_us=self.now_us,
            new_id=self.new_id,
        )
