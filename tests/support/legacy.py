"""The sandbox's legacy claimant as the cutover sees it: the configured SQL adapter."""

from __future__ import annotations

from config.settings import Settings
from daemon.services.cutover import legacy_claimant_for
from sandbox.legacy.store import claimant_settings
from storage.cutover.legacy_sql import SqlLegacyClaimant


def sandbox_settings(family: str = "noop") -> Settings:
    return Settings(legacy_claimants=(claimant_settings(family),))


def sandbox_claimant(family: str = "noop") -> SqlLegacyClaimant:
    claimant = legacy_claimant_for(sandbox_settings(family), family)
    assert claimant is not None
    return claimant
