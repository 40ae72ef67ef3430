"""The ``[[bindings]]`` TOML as the bootstrap of the durable PrincipalBinding rows.

A binding's generation is the durable fact in ``principal_bindings`` (seed 8.1): what
admission pins, and what dispatch, refresh and read-back compare with. The TOML entry
only *creates* that row when none exists (at its ``generation``, normally 1; an
upgrading deployment keeps the number its queued commands pinned), audited as
``binding.bootstrap``. From then on only an operator transition moves it
(``integrationd binding reconnect|change``); editing ``generation`` in the TOML and
restarting changes nothing, and says so once at start-up.

The same holds for the identity: the durable row's remote account (and installation id)
is the authority for new work (docs/identity.md). When the TOML's ``remote_account_id``
or ``s2s_installation_id`` disagrees with it (after a rebind or a reinstall, before
anyone edited the file), **the durable fact wins**: start-up logs one warning per field
naming both values (identifiers, never a secret) and ``integrationd binding status``
shows the drift. Refusing to start instead would turn an audited online transition into
an outage of every replica until each host's file is edited, for a value that no longer
decides anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from config.settings import BindingSettings
from daemon.core.principals import (
    BindingFacts,
    BindingIdentity,
    BindingState,
    PrincipalKind,
    config_drift,
)
from daemon.services import logs
from storage.work_store import WorkStore


def bootstrap_facts(b: BindingSettings) -> BindingFacts:
    """The durable row a TOML binding starts as: a shared principal on its remote
    account, issued by its provider endpoint."""
    return BindingFacts(
        binding_id=b.binding_id, kind=PrincipalKind.SHARED, org_id=b.org_id,
        app_installation_id=b.app_installation_id, provider=b.provider,
        identity=BindingIdentity(issuer=b.base_url, remote_account_id=b.remote_account_id,
                                 remote_subject=b.remote_account_id,
                                 # An S2S binding's app installation (empty otherwise).
                                 installation_id=b.s2s_installation_id),
        generation=b.generation, state=BindingState.CONNECTED)


async def ensure_config_bindings(store: WorkStore, bindings: Sequence[BindingSettings],
                                 now_us: int) -> dict[str, BindingFacts]:
    """Bootstrap every configured binding that has no durable row; return them all."""
    found: dict[str, BindingFacts] = {}
    for b in bindings:
        facts = await store.binding_bootstrap(bootstrap_facts(b), now_us)
        for drift in config_drift(bootstrap_facts(b), facts):
            event, message = _DRIFT[drift.field]
            logs.warn(event, binding_id=b.binding_id, configured=drift.configured,
                      durable=drift.durable, message=message)
        found[b.binding_id] = facts
    return found


# What a disagreeing TOML field is told at start-up (event, message).
_DRIFT = {
    "generation": ("binding_generation_not_from_config",
                   "bindings.generation only bootstraps a new binding; the durable"
                   " one decides (integrationd binding list / reconnect)"),
    "remote_account_id": ("binding_account_not_from_config",
                          "bindings.remote_account_id only bootstraps a new binding; new"
                          " work uses the durable account (integrationd binding status)"),
    "installation_id": ("binding_installation_not_from_config",
                        "bindings.s2s_installation_id only bootstraps a new binding;"
                        " a reinstall is `integrationd binding change --installation`"),
}
