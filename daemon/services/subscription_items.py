"""The ``subscription_reconcile`` family's WorkItems: their payload, lane and keys.

A **run** (``kind`` "run") lists and decides; a **step** ("create" / "delete") is one
provider call. A step pins the durable binding generation the run that queued it read
(``binding_generation``): it is sent only while the binding is still connected at that
generation (checked in its checkpoint's statement), so a reconnect fences every step
queued before it.
"""

from __future__ import annotations

import json
from typing import Final

import attrs

from config.catalog import Catalog
from config.settings import BindingSettings
from daemon.core.subscriptions import Create, Delete
from daemon.core.work import WorkSpec
from storage.effect_values import Kin
from storage.idgen import new_ulid

SUBSCRIPTION_FAMILY: Final = "subscription_reconcile"
PAYLOAD_VERSION: Final = 1


class BadStep(ValueError):
    pass


@attrs.frozen(kw_only=True)
class SubscriptionPayload:
    """A run (``kind`` "run") or one step ("create" / "delete")."""

    kind: str
    binding: str
    chain: bool = True           # a run: queue the next run when done
    name: str | None = None      # a step: the row (None: an orphan's delete)
    generation: int | None = None  # create: the generation to create; delete: the fence
    provider_id: str = ""        # delete: the subscription to delete
    reason: str = ""
    # A step: the durable binding generation it was decided under (None: queued by a
    # build that did not pin it; such a step is never sent, the next run decides again).
    binding_generation: int | None = None

    def to_payload(self) -> str:
        return json.dumps({"version": PAYLOAD_VERSION, **attrs.asdict(self)}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_payload(cls, text: str) -> SubscriptionPayload:
        try:
            doc = json.loads(text)
        except ValueError:
            raise BadStep("payload: not JSON") from None
        if not isinstance(doc, dict) or doc.pop("version", None) != PAYLOAD_VERSION:
            raise BadStep(f"payload: not a version-{PAYLOAD_VERSION} subscription item")
        if doc.get("kind") not in ("run", "create", "delete"):
            raise BadStep(f"kind: {doc.get('kind')!r} is not run, create or delete")
        try:
            return cls(**doc)
        except TypeError as exc:
            raise BadStep(f"payload: {exc}") from None


def lane(binding_id: str) -> str:
    return f"subscriptions:{binding_id}"


def item_spec(binding: BindingSettings, catalog: Catalog, payload: SubscriptionPayload, *,
              key: str, max_attempts: int, run_after_us: int | None = None) -> WorkSpec:
    """``max_attempts``: the family's configured one (``[families.subscription_reconcile]``);
    every builder of this family's items passes it, so none falls back to the built-in."""
    return WorkSpec(
        family=SUBSCRIPTION_FAMILY, org_id=binding.org_id,
        app_installation_id=binding.app_installation_id,
        subject_kind="subscription" if payload.kind != "run" else "binding",
        subject_id=payload.name or payload.provider_id or binding.binding_id,
        definition_ref=f"{binding.provider}/{binding.binding_id}",
        catalog_revision=catalog.revision, catalog_digest=catalog.digest,
        payload=payload.to_payload(),
        # Steps of one binding run one at a time, in order. Runs take no lane: a run only
        # reads and queues (a queued future run must not hold an operator's run, or the
        # steps it queues, behind it); concurrent runs decide the same keys.
        source_lane=lane(binding.binding_id) if payload.kind != "run" else None,
        run_after_us=run_after_us, max_attempts=max_attempts, dedupe_key=key)


def run_spec(binding: BindingSettings, catalog: Catalog, *, now_us: int,
             interval_s: float, max_attempts: int, chain: bool = True) -> WorkSpec:
    """A run now: a chain link keyed by its time slot (two chains merge), or a one-off
    (an operator's "reconcile now", its own key; it queues no next run)."""
    slot = now_us // max(1, int(interval_s * 1_000_000))
    key = (f"subs:run:{binding.binding_id}:{slot}" if chain
           else f"subs:run:{binding.binding_id}:now:{new_ulid(now_us)}")
    return item_spec(binding, catalog,
                     SubscriptionPayload(kind="run", binding=binding.binding_id, chain=chain),
                     key=key, max_attempts=max_attempts, run_after_us=now_us)


def create_kin(binding_id: str, name: str) -> Kin:
    """Every create step of one subscription: one effect's history across the items
    (issue 22: a dead step's unresolved attempt holds the next one's checkpoint)."""
    return Kin(family=SUBSCRIPTION_FAMILY, subject_kind="subscription", subject_id=name,
               lane=lane(binding_id), key_prefix=f"subs:create:{binding_id}:")


def step_key(binding: str, step: Create | Delete, run_id: str) -> str:
    """A step's dedupe key: one per run (a run skips the names with a step still pending,
    and a step re-checks the row before it acts, so a repeated decision does nothing)."""
    if isinstance(step, Create):
        return f"subs:create:{binding}:{step.name}:{step.generation}:{run_id}"
    return f"subs:delete:{binding}:{step.provider_id}:{step.expected_generation}:{run_id}"


def retire_check_spec(binding: BindingSettings, catalog: Catalog, route: str,
                      generation: int, at_us: int, *, max_attempts: int) -> WorkSpec:
    """A one-off run at the time a watch may retire its secret (one per time)."""
    return item_spec(binding, catalog, SubscriptionPayload(
        kind="run", binding=binding.binding_id, chain=False),
        key=f"subs:run:{binding.binding_id}:retire:{route}:{generation}:{at_us}",
        max_attempts=max_attempts, run_after_us=at_us)
