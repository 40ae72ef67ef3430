"""The access token an effect presents, by the binding's declared auth kind.

* ``static_token``: the configured token, never refreshed (the sandbox's kind, declared
  explicitly in ``[[bindings]]``);
* ``grant``: the pinned binding generation's AuthorizationGrant through the single-winner
  :class:`~daemon.services.token_refresh.TokenOwner` (refreshed under the claim's fence
  when it expires, or when the provider answered 401 to the version just used).

A failure is a :class:`~daemon.services.token_refresh.TokenUnavailable` with a stable
reason; :func:`definitive` says which ones settle the work (nothing a retry could cure)
and which only delay it. A bundle that fails authentication is refused, logged as an
error (an alert) and never used.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import httpx

from config.keys import load_token_keys
from config.settings import BindingSettings, Secret, Settings
from daemon.core.token_bundle import BundleRefused, SecretText, TokenKey
from daemon.core.work import Fence
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.token_refresh import (
    AccessToken,
    RefreshEndpoint,
    TokenOwner,
    TokenUnavailable,
)
from storage.work_store import WorkStore

# Reasons no retry can cure: an operator re-authorizes, reconnects or fixes the keys.
_DEFINITIVE = frozenset({"needs_reauthorization", "revoked", "no_grant", "no_token",
                         "token_bundle_unauthentic", "token_key_missing"})


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

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()


def connect_flow_key(settings: Settings, environ: Mapping[str, str]) -> TokenKey | None:
    """The active token key, which seals the grants the Runtime's connect flows hand over
    (None when no ``[keys] active`` is configured)."""
    if not settings.keys.active:
        return None
    return load_token_keys(settings.keys, environ, settings.base_dir)[settings.keys.active]


def build_credentials(settings: Settings, store: WorkStore, clock: Clock,
                      environ: Mapping[str, str]) -> Credentials:
    """The token source for these bindings: with a grant binding and ``[keys] active``,
    the token keys are loaded now (a missing or malformed key is a ConfigError naming its
    id: exit 2)."""
    if not settings.keys.active or not any(b.auth == "grant" for b in settings.bindings):
        return Credentials()  # no grant can be opened: such bindings have no credentials
    keys = load_token_keys(settings.keys, environ, settings.base_dir)
    http = httpx.AsyncClient(timeout=httpx.Timeout(10.0))
    return Credentials(TokenOwner(store, keys, settings.keys.active, http, clock), http)
