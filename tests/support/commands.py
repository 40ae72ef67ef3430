"""Helpers for command/effect conformance tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes, canonical_digest
from daemon.core.effect_step import DispatchPins
from daemon.core.handoff import EffectHandoffKey, TrustedRuntimeWorkScope
from daemon.core.identity import integration_link_key_v2
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.effect_values import AdmissionResult, AttemptDraft, CommandDraft
from storage.port import PublishParams

if TYPE_CHECKING:
    from storage.work_store import WorkStore

SCOPE = TrustedRuntimeWorkScope("org-1", "install-1", "cap.leads", "sha256:binding")
OTHER_ORG = TrustedRuntimeWorkScope("org-2", "install-1", "cap.leads", "sha256:binding")
# The binding :func:`draft` names, as its [[bindings]] entry would configure it.
HUBSPOT_MAIN = BindingSettings(binding_id="hubspot-main", provider="hubspot", org_id="org-1",
                               app_installation_id="install-1", remote_account_id="portal-1",
                               base_url="http://127.0.0.1:1")


def command_doc(intent_id: str, title: str = "CTO", lead: str = "lead-1") -> dict[str, Any]:
    return {
        "intent_id": intent_id,
        "intent_kind": "UPSERT",
        "operation": "hubspot.contact.update_jobtitle",
        "logical_target": {"object": "lead", "lead_id": lead},
        "catalog_revision": 7,
        "request": {"properties": {"jobtitle": title}},
    }


def draft(intent_id: str = "int-1", *, scope: TrustedRuntimeWorkScope = SCOPE,
          outbox: str = "outbox-1", title: str = "CTO", lead: str = "lead-1",
          digest: str | None = None) -> CommandDraft:
    doc = command_doc(intent_id, title, lead)
    return CommandDraft(
        scope=scope, runtime_name="crm", handoff_key=EffectHandoffKey(scope, intent_id).encode(),
        payload_digest=digest or canonical_digest(doc), runtime_outbox_id=outbox,
        intent_id=intent_id, intent_kind="UPSERT", operation=doc["operation"],
        local_object="lead", local_id=lead, binding_id="hubspot-main", binding_generation=1,
        catalog_revision=7, catalog_digest="sha256:catalog",
        frozen_request=canonical_bytes(doc["request"]).decode(), max_attempts=8,
        lane=f"{scope.org_id}:lead:{lead}",
    )


async def publish_test_revision(store: WorkStore) -> None:
    """Publish revision 7 under the digest :func:`draft` pins ("sha256:catalog"), so a
    repair can resolve it as the current revision (idempotent)."""
    await store.catalog_publish(PublishParams(revision=7, digest="sha256:catalog",
                                              content="{}", actor="test", role="admin",
                                              reason="test setup"), 0)


# The scope digest of the links :func:`pin_targets` adopts.
TARGETS_SCOPE_DIGEST = "a" * 64
# What :func:`draft` pins, as :func:`pin_targets` makes it real.
PINNED_REVISION = (7, "sha256:catalog")


def target_key(lead: str) -> str:
    return integration_link_key_v2(TARGETS_SCOPE_DIGEST, "lead", lead)


def target_remote(lead: str) -> str:
    return f"r-{lead}"


async def pin_targets(store: WorkStore, lead: str = "lead-1", now: int = 0) -> None:
    """Make real what a :func:`pinned` draft pins, as the daemon would have them when it
    admits a command: the binding hubspot-main (generation 1, connected), Catalog revision
    7 stored under "sha256:catalog", an active link from ``lead`` to its remote record
    (each idempotent)."""
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), now)
    await publish_test_revision(store)
    await store.link_adopt(TARGETS_SCOPE_DIGEST, "lead", lead, "contact", target_remote(lead),
                           actor="test", role="admin", reason="test setup", now_us=now)


def pinned(d: CommandDraft) -> CommandDraft:
    """``d`` targeting its lead's link (pinned at admission when the link exists)."""
    return attrs.evolve(d, link_key=target_key(d.local_id))


async def accept_pinned(store: WorkStore, d: CommandDraft, now: int) -> AdmissionResult:
    """Admit ``d`` with every pin it names real and current (see :func:`pin_targets`)."""
    await pin_targets(store, d.local_id, now)
    return await store.command_accept(pinned(d), now)


def dispatch_pins(lead: str = "lead-1") -> DispatchPins:
    """The pins of a command :func:`accept_pinned` admitted for ``lead``."""
    return DispatchPins(binding_generation=1, link_key=target_key(lead), link_generation=1,
                        remote_id=target_remote(lead), catalog_revision=PINNED_REVISION[0],
                        catalog_digest=PINNED_REVISION[1])


def attempt(command_id: str, lead: str = "lead-1") -> AttemptDraft:
    """A dispatch-start checkpoint's draft for a command :func:`accept_pinned` admitted."""
    return AttemptDraft(command_id=command_id, method="PATCH",
                        target_path="/crm/v3/objects/contacts/7", safe_headers="{}",
                        body_sha256="sha256:" + "0" * 64, idempotency_key=command_id,
                        pre_dispatch_evidence="{}", pins=dispatch_pins(lead))
