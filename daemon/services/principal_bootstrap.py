"""The ``[[bindings]]`` TOML as the bootstrap of the durable PrincipalBinding rows.

A binding's generation is the durable fact in ``principal_bindings`` (seed 8.1): what
admission pins, and what dispatch, refresh and read-back compare with. The TOML entry
only *creates* that row when none exists (at its ``generation``, normally 1; an
upgrading deployment keeps the number its queued commands pinned), audited as
``binding.bootstrap``. From then on only an operator transition moves it
(``integrationd binding reconnect|change``); editing ``generation`` in the TOML and
restarting changes nothing, and says so once at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence

from config.settings import BindingSettings
from daemon.core.principals import BindingFacts, BindingIdentity, BindingState, PrincipalKind
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
        if facts.generation != b.generation:
            logs.warn("binding_generation_not_from_config", binding_id=b.binding_id,
                      configured=b.generation, durable=facts.generation,
                      message="bindings.generation only bootstraps a new binding; the durable"
                              " one decides (integrationd binding list / reconnect)")
        if b.s2s_installation_id and facts.identity.installation_id != b.s2s_installation_id:
            logs.warn("binding_installation_not_from_config", binding_id=b.binding_id,
                      configured=b.s2s_installation_id,
                      durable=facts.identity.installation_id,
                      message="bindings.s2s_installation_id only bootstraps a new binding;"
                              " a reinstall is `integrationd binding change --installation`")
        found[b.binding_id] = facts
    return found
