"""One observed change of one remote record: the contract between inbound sources and the
inbound Flow (pure).

Two sources observe remote records: the webhook materializer (one ``NormalizedEvent`` per
verified receipt) and cursor reconciliation (one page of a provider's list). Both hand the
inbound Flow the same value, as the payload of one WorkItem of the ``inbound_apply`` family:

    source -> InboundChange -> WorkItem(family=inbound_apply, source lane = the remote record)
           -> inbound Flow (field ownership, hydration, RemoteLink, Runtime mutation)

Theory of operation:

- ``attributes`` holds only what the source carried (a webhook's changed attributes, a
  listed record's attributes); the Flow never reads a missing key as "blank".
- ``remote_updated_at`` is the provider's own text at its full precision; the Flow compares
  it to what it already applied so that an older observation never regresses a field.
- The source lane is the remote record, so the changes of one record apply in order.
- The dedupe key is the origin's identity: one WorkItem per normalized event, and one per
  (stream, record, updated-at) for reconciliation, so a crash between producing and
  checkpointing never doubles a change.

Provider names are data here (the L1 definition's name); nothing branches on them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from daemon.core.canonical import canonical_bytes
from daemon.core.work import WorkSpec

INBOUND_APPLY_FAMILY: Final = "inbound_apply"
PAYLOAD_VERSION: Final = 1

KINDS: Final = frozenset({"created", "updated", "destroyed", "observed"})
ORIGINS: Final = frozenset({"webhook", "reconcile", "repair"})


class BadInboundChange(ValueError):
    """A payload that is not a version-1 InboundChange (names the field)."""


@attrs.frozen(kw_only=True)
class InboundChange:
    """What one source observed about one remote record."""

    provider: str            # the L1 definition's name
    binding: str             # the L2 binding the source belongs to
    resource_type: str       # the provider's resource type, e.g. a JSON:API ``type``
    resource_id: str         # the provider's stable id of the record, as text
    kind: str                # one of KINDS; "observed" = seen by reconciliation
    attributes: Mapping[str, Any] = attrs.field(factory=dict)
    remote_updated_at: str | None = None
    origin: str              # one of ORIGINS
    origin_id: str           # normalized event id, or "<stream>:<page checkpoint>"
    subscription_generation: int | None = None
    # The remote account the binding named when the change was observed (its durable
    # fact; None in changes queued before it was kept). The Flow applies it only while
    # the binding still names that account: a record id means nothing in another one.
    remote_account: str | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("provider", "binding", "resource_type", "resource_id", "origin_id"):
            if not getattr(self, name):
                raise BadInboundChange(f"{name}: required")
        if self.kind not in KINDS:
            raise BadInboundChange(f"kind: {self.kind!r} is not one of {sorted(KINDS)}")
        if self.origin not in ORIGINS:
            raise BadInboundChange(f"origin: {self.origin!r} is not one of {sorted(ORIGINS)}")

    @property
    def source_lane(self) -> str:
        """The remote record: every change of one record applies in order."""
        return inbound_lane(self.provider, self.binding, self.resource_type, self.resource_id)

    @property
    def dedupe_key(self) -> str:
        return f"inbound:{self.origin}:{self.origin_id}"

    def to_payload(self) -> str:
        """Canonical JSON text (the WorkItem payload)."""
        # ``remote_account`` only when known, so that a change without it keeps its bytes.
        account = {} if self.remote_account is None else {"remote_account": self.remote_account}
        return canonical_bytes({
            **account,
            "version": PAYLOAD_VERSION,
            "provider": self.provider,
            "binding": self.binding,
            "resource_type": self.resource_type,
            "resource_id": self.resource_id,
            "kind": self.kind,
            "attributes": dict(self.attributes),
            "remote_updated_at": self.remote_updated_at,
            "origin": self.origin,
            "origin_id": self.origin_id,
            "subscription_generation": self.subscription_generation,
        }).decode()

    @classmethod
    def from_payload(cls, text: str) -> InboundChange:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BadInboundChange(f"payload: not JSON ({exc.__class__.__name__})") from None
        if not isinstance(data, dict):
            raise BadInboundChange("payload: not an object")
        if data.get("version") != PAYLOAD_VERSION:
            raise BadInboundChange(f"version: {data.get('version')!r} is not {PAYLOAD_VERSION}")
        attributes = data.get("attributes")
        if not isinstance(attributes, dict):
            raise BadInboundChange("attributes: not an object")
        generation = data.get("subscription_generation")
        if generation is not None and (isinstance(generation, bool)
                                       or not isinstance(generation, int)):
            raise BadInboundChange("subscription_generation: not an integer")
        updated_at = data.get("remote_updated_at")
        if updated_at is not None and not isinstance(updated_at, str):
            raise BadInboundChange("remote_updated_at: not a string")
        account = data.get("remote_account")
        if account is not None and (not isinstance(account, str) or not account):
            raise BadInboundChange("remote_account: not a non-empty string")
        text_fields = {}
        for name in ("provider", "binding", "resource_type", "resource_id", "kind", "origin",
                     "origin_id"):
            value = data.get(name)
            if not isinstance(value, str):
                raise BadInboundChange(f"{name}: not a string")
            text_fields[name] = value
        return cls(attributes=attributes, remote_updated_at=updated_at,
                   subscription_generation=generation, remote_account=account, **text_fields)

    def work_spec(self, *, org_id: str, catalog_revision: int, catalog_digest: str,
                  max_attempts: int = 5) -> WorkSpec:
        """The WorkItem that applies this change (insert with ``storage.work_admin.insert_work``
        inside the transaction that records the source's own progress)."""
        return WorkSpec(
            family=INBOUND_APPLY_FAMILY, org_id=org_id,
            subject_kind=f"remote:{self.resource_type}", subject_id=self.resource_id,
            definition_ref=f"{self.provider}/{self.binding}",
            catalog_revision=catalog_revision, catalog_digest=catalog_digest,
            payload=self.to_payload(), source_lane=self.source_lane,
            max_attempts=max_attempts, dedupe_key=self.dedupe_key,
        )


def inbound_lane(provider: str, binding: str, resource_type: str, resource_id: str) -> str:
    return f"inbound:{provider}:{binding}:{resource_type}:{resource_id}"
