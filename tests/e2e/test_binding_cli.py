"""``integrationd binding ...``: audited transitions from the command line (real processes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from config.settings import BindingSettings
from daemon.binding_cli import status_line
from daemon.core.grant_reasons import grant_reason
from daemon.core.principals import BindingFacts
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.grants import GrantState
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.processes import run_cli, write_config
from tests.support.work import T0

WHO = ("--actor", "alice", "--reason", "onboarding")


async def test_binding_lifecycle(database: FreshDatabase, store: WorkStore,
                                 tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", database.url)
    empty = run_cli(cfg, "binding", "list")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "no bindings\n", "")
    empty_json = run_cli(cfg, "binding", "list", "--json")
    assert empty_json.returncode == 0 and json.loads(empty_json.stdout) == []

    made = run_cli(cfg, "binding", "connect", "b1", *WHO, "--org", "org-1",
                   "--app-installation", "i1", "--provider", "p", "--issuer", "https://iss",
                   "--remote-account", "acct-1", "--remote-subject", "app-1",
                   "--scopes", "write,read", "--json")
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    assert (doc["generation"], doc["state"], doc["scopes"]) == (1, "connected",
                                                                ["read", "write"])

    stale = run_cli(cfg, "binding", "disconnect", "b1", *WHO, "--generation", "2")
    assert stale.returncode == 1 and "not 2" in stale.stderr
    illegal = run_cli(cfg, "binding", "reconnect", "b1", *WHO, "--generation", "1")
    assert illegal.returncode == 1 and "not_disconnected" in illegal.stderr
    viewer = run_cli(cfg, "binding", "disconnect", "b1", "--actor", "victor", "--reason", "x",
                     "--generation", "1")
    assert viewer.returncode == 1 and "may not change bindings" in viewer.stderr

    off = run_cli(cfg, "binding", "disconnect", "b1", *WHO, "--generation", "1")
    assert off.stdout == ("b1: generation 1 disconnected, shared p, org org-1,"
                          " account acct-1\n")
    back = run_cli(cfg, "binding", "reconnect", "b1", *WHO, "--generation", "1",
                   "--remote-account", "acct-2", "--json")
    assert back.returncode == 0, back.stderr
    doc = json.loads(back.stdout)
    assert (doc["generation"], doc["remote_account_id"], doc["issuer"]) == (2, "acct-2",
                                                                          "https://iss")
    shown = json.loads(run_cli(cfg, "binding", "show", "b1", "--json").stdout)
    assert shown == {**doc, "grant": None}  # no grant installed for b1
    text = run_cli(cfg, "binding", "show", "b1")
    assert text.stdout.splitlines() == [
        "b1: generation 2 connected, shared p, org org-1, account acct-2",
        "  app installation i1",
        "  issuer https://iss, subject app-1, scopes read write",
        "  grant: none for this generation"]
    listed = run_cli(cfg, "binding", "list")
    assert listed.stdout == "b1: generation 2 connected, shared p, org org-1, account acct-2\n"
    # Not found is exit 1, as everywhere.
    missing = run_cli(cfg, "binding", "show", "nosuch")
    assert missing.returncode == 1 and missing.stderr == "integrationd: no binding nosuch\n"

    actions = [e.action for e in await store.audit_list(target_id="b1")]
    assert sorted(actions) == ["binding.connect", "binding.disconnect", "binding.reconnect"]
    # Who really acted: the OS user beside --actor.
    assert all(e.origin is not None and '"os_user"' in e.origin
               for e in await store.audit_list(target_id="b1"))


_CONFIGURED = BindingSettings(binding_id="b1", provider="p", org_id="org-1",
                              app_installation_id="i1", remote_account_id="acct-1",
                              base_url="https://iss")


@pytest.mark.parametrize(("durable", "line"), [
    (None, "b1: no durable row yet (bootstrapped from the configuration at start or first"
           " admission)"),
    (bootstrap_facts(_CONFIGURED), "b1: generation 1 connected, account acct-1; the"
                                   " configuration agrees"),
    (attrs.evolve(bootstrap_facts(_CONFIGURED), generation=3,
                  identity=attrs.evolve(bootstrap_facts(_CONFIGURED).identity,
                                        remote_account_id="acct-2")),
     "b1: generation 3 connected, account acct-2; drift (the durable value wins):"
     " generation configured 1 durable 3, remote_account_id configured acct-1 durable"
     " acct-2"),
], ids=["no row", "in step", "rebound"])
def test_binding_status_is_one_line_per_configured_binding(
        durable: BindingFacts | None, line: str) -> None:
    assert status_line(_CONFIGURED, durable) == line
async def test_binding_show_says_why_the_grant_needs_reauthorization(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", database.url)
    made = run_cli(cfg, "binding", "connect", "b1", *WHO, "--org", "org-1",
                   "--app-installation", "i1", "--provider", "p", "--issuer", "https://iss",
                   "--remote-account", "acct-1", "--remote-subject", "app-1")
    assert made.returncode == 0, made.stderr
    key = TokenKey("k1", bytes(range(32)))
    bundle = TokenBundle(access_token=SecretText("at-SECRET-7"),
                         refresh_token=SecretText("rt-SECRET-7"))
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(bundle, key, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)
    valid = json.loads(run_cli(cfg, "binding", "show", "b1", "--json").stdout)
    assert (valid["grant"]["state"], valid["grant"]["reason"]) == ("valid", None)
    why = grant_reason("invalid_grant")
    assert await store.grant_mark("b1", 1, 1, GrantState.NEEDS_REAUTHORIZATION, T0 + 1, why)
    shown = run_cli(cfg, "binding", "show", "b1", "--json")
    assert shown.returncode == 0, shown.stderr
    grant = json.loads(shown.stdout)["grant"]
    assert (grant["state"], grant["reason"]) == (
        "needs_reauthorization", {"code": "invalid_grant", "text": why.text})
    assert "SECRET" not in shown.stdout + shown.stderr
    # As text: the state, the reason's code and sentence, and times people read (no
    # epoch microseconds).
    text = run_cli(cfg, "binding", "show", "b1")
    assert text.returncode == 0, text.stderr
    assert "  grant: needs_reauthorization, token version 1, sealed with key k1" in text.stdout
    assert f"  needs attention: invalid_grant: {why.text}" in text.stdout
    assert "  expires never" in text.stdout
    assert re.search(r"  last refresh 2027-01-15 08:00:00Z \((in .+|.+ ago)\)\n",
                     text.stdout), text.stdout
    assert str(T0) not in text.stdout and "SECRET" not in text.stdout
