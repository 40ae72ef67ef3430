"""The access token an effect presents, by the binding's declared auth kind.

* ``static_token``: the configured token, never refreshed (the sandbox's kind, declared
  explicitly in ``[[bindings]]``);
* ``grant``: the pinned binding generation's AuthorizationGrant through the single-winner
  :class:`~daemon.services.token_refresh.TokenOwner` (refreshed under the claim's fence
  when it expires, or when the provider answered 401 to the version just used);
* ``s2s``: the same grant and lease, minted instead of refreshed (a
  :class:`~daemon.services.token_refresh.MintEndpoint`): the app JWT is exchanged for a
  one-hour token of the *durable* binding's installation, and only while the durable
  binding is still the generation the work pinned (a reinstall moves the generation, so
  work queued before it never gets the new installation's token). The generation's
  first token is minted on first use: its grant starts as an expired placeholder bundle.

A failure is a :class:`~daemon.services.token_refresh.TokenUnavailable` with a stable
reason; :func:`definitive` says which ones settle the work (nothing a retry could cure)
and which only delay it. A bundle that fails authentication is refused, logged as an
error (an alert) and never used.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

import attrs
import httpx

from config.keys import load_token_keys
from config.settings import BindingSettings, Secret, Settings
from daemon.core.principals import BindingState
from daemon.core.token_bundle import (
    BundleContext,
    BundleRefused,
    SecretText,
    TokenBundle,
    TokenKey,
    seal,
)
from daemon.core.work import Fence
from daemon.providers.executor import NoCookies
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.token_refresh import (
    AccessToken,
    MintEndpoint,
    RefreshEndpoint,
    TokenOwner,
    TokenUnavailable,
)
from storage.port import WorkConflict
from storage.work_store import WorkStore

# Reasons no retry can cure: an operator re-authorizes, reconnects or fixes the keys.
_DEFINITIVE = frozenset({"needs_reauthorization", "revoked", "no_grant", "no_token",
                         "token_bundle_unauthentic", "token_key_missing",
                         "binding_generation", "binding_disconnected", "no_installation"})


def definitive(reason: str) -> bool:
    return reason in _DEFINITIVE


@attrs.define(eq=False)
class Credentials:
    # None: no token keys are configured, so no grant can be opened (such a binding
    # has no credentials: its work waits, as for a binding with no static token).
    owner: TokenOwner | None = None
    # The token owner's HTTP client, closed with the replica (None: not ours).
    http: httpx.AsyncClient | None = None

    async def token(self, fence: Fence, binding: BindingSettings, generation: int, *,
                    rejected_version: int | None = None) -> AccessToken:
        if binding.auth == "static_token":
            if binding.token is None:
                raise TokenUnavailable("no_token", f"binding {binding.binding_id} has no"
                                       " static token configured")
            return AccessToken(SecretText(binding.token.reveal()), 0)
        if self.owner is None:
            raise TokenUnavailable("no_token_keys", "no token keys are configured ([keys]"
                                   " active): a grant's bundle cannot be opened")
        endpoint: RefreshEndpoint | MintEndpoint
        if binding.auth == "s2s":
            endpoint = await self._mint_endpoint(self.owner, binding, generation)
        else:
            endpoint = RefreshEndpoint(binding.token_url, binding.client_id,
                                       binding.client_secret or Secret(""))
        try:
            return await self.owner.access_token(fence, binding.binding_id, generation,
                                                 endpoint, rejected_version=rejected_version)
        except BundleRefused as exc:
            # Never used; an operator must look (a rolled-back row, a wrong key).
            logs.error("token_bundle_refused", binding_id=binding.binding_id,
                       generation=generation, reason=exc.reason)
            reason = exc.reason if exc.reason in _DEFINITIVE else "token_bundle_unauthentic"
            raise TokenUnavailable(reason, f"binding {binding.binding_id} generation"
                                   f" {generation}: its token bundle was refused"
                                   f" ({exc.reason})") from None

    async def current_token(self, store: WorkStore, fence: Fence,
                            binding: BindingSettings) -> AccessToken:
        """The token of the binding's *current* durable generation, for work that pins
        none (the inbound Flow's hydration, reconciliation's list requests)."""
        if binding.auth == "static_token":
            return await self.token(fence, binding, 0)
        facts = await store.binding_get(binding.binding_id)
        if facts is None:
            raise TokenUnavailable("no_grant", f"binding {binding.binding_id} has no durable"
                                   " row yet")
        if facts.state is not BindingState.CONNECTED:
            raise TokenUnavailable("binding_disconnected", f"binding {binding.binding_id} is"
                                   f" {facts.state.value}")
        return await self.token(fence, binding, facts.generation)

    async def _mint_endpoint(self, owner: TokenOwner, binding: BindingSettings,
                             generation: int) -> MintEndpoint:
        """Where the pinned generation's token is minted: its durable installation, and
        only while that generation is the durable one; its grant exists from then on."""
        facts = await owner.store.binding_get(binding.binding_id)
        if facts is None or facts.generation != generation:
            raise TokenUnavailable("binding_generation", f"binding {binding.binding_id} is"
                                   f" no longer at generation {generation} (reinstalled or"
                                   " reconnected): its installation's token is not minted")
        if facts.state is not BindingState.CONNECTED:
            raise TokenUnavailable("binding_disconnected", f"binding {binding.binding_id} is"
                                   f" {facts.state.value}")
        # The durable binding's installation, never the TOML's bootstrap value.
        installation = facts.identity.installation_id
        if not installation:
            raise TokenUnavailable("no_installation", f"binding {binding.binding_id} names no"
                                   " app installation: `integrationd binding change"
                                   " --installation`")
        assert binding.s2s_private_key is not None  # checked when the config loaded
        if await owner.store.grant_get(binding.binding_id, generation) is None:
            await _install_unminted(owner, binding.binding_id, generation)
        url = binding.token_url.replace("{installation_id}",
                                        urllib.parse.quote(installation, safe=""))
        return MintEndpoint(url, binding.s2s_app_id, binding.s2s_private_key)

    def abandon_at(self, deadline: float) -> None:
        """A drain's or forced stop's hard deadline (trio time): no unfinished refresh
        outlives it (its dispatch marker stays: the grant ends in doubt, never refreshed
        twice)."""
        if self.owner is not None:
            self.owner.abandon_at(deadline)

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()


def connect_flow_key(settings: Settings, environ: Mapping[str, str]) -> TokenKey | None:
    """The active token key, which seals the grants the Runtime's connect flows hand over
    (None when no ``[keys] active`` is configured)."""
    if not settings.keys.active:
        return None
    return load_token_keys(settings.keys, environ, settings.base_dir)[settings.keys.active]


async def _install_unminted(owner: TokenOwner, binding_id: str, generation: int) -> None:
    """The generation's grant before its first mint: an expired placeholder (version 1),
    so the first user mints through the lease like every later one. Racing installers:
    one row wins, the others find it."""
    now = owner.clock.now_us()
    bundle = TokenBundle(access_token=SecretText("unminted"), refresh_token=None,
                         expires_at_us=0)
    try:
        await owner.store.grant_install(
            binding_id=binding_id, generation=generation,
            sealed=seal(bundle, owner.keys[owner.active_key],
                        BundleContext(binding_id, generation, 1)),
            expires_at_us=0, now_us=now)
    except WorkConflict:
        return  # another claimant installed it first


def build_credentials(settings: Settings, store: WorkStore, clock: Clock,
                      environ: Mapping[str, str]) -> Credentials:
    """The token source for these bindings: with a grant binding and ``[keys] active``,
    the token keys are loaded now (a missing or malformed key is a ConfigError naming its
    id: exit 2)."""
    if not settings.keys.active or not any(b.auth in ("grant", "s2s")
                                           for b in settings.bindings):
        return Credentials()  # no grant can be opened: such bindings have no credentials
    keys = load_token_keys(settings.keys, environ, settings.base_dir)
    http = httpx.AsyncClient(timeout=httpx.Timeout(10.0), cookies=NoCookies())
    owner = TokenOwner(store, keys, settings.keys.active, http, clock,
                       answer_wait_us=int(settings.replica.refresh_answer_wait * 1_000_000))
    return Credentials(owner, http)
