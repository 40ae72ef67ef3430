"""``integrationd link ...`` (issue 20 item 8; seed 7, 10): an operator binds a local record to
an existing remote record from the command line; real processes, real databases.

Admins only, audited with the OS user beside the actor; a refusal prints its stable code
and a sentence, exits 1 and writes nothing. A rebind moves the link generation, so the
command queued under the old one is refused before dispatch: the provider simulator sees
nothing and its true NO_EFFECT receipt is queued for the Runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.services.clock import WallClock
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import HUBSPOT_MAIN
from tests.support.harness import wait_for
from tests.support.processes import run_cli, write_config
from tests.support.slice import SCOPE, running_slice

pytestmark = pytest.mark.slow

WHY = ("--reason", "the CRM says lead-1 is that contact")


def _config(tmp_path: Path, url: str, *, org: str = "org-1", install: str = "install-1"
            ) -> Path:
    return write_config(tmp_path / "link.toml", url, extra=f"""
[[operators]]
name = "ada"
role = "admin"

[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "{org}"
app_installation_id = "{install}"
remote_account_id = "portal-1"
base_url = "http://127.0.0.1:9"
""")


def _bind(cfg: Path, actor: str, local_id: str, remote_id: str, *extra: str
          ) -> tuple[int, dict[str, object] | None, str]:
    done = run_cli(cfg, "link", "bind", "--binding", "hubspot-main", "--local-id", local_id,
                   "--remote-id", remote_id, "--actor", actor, "--json", *WHY, *extra)
    doc = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, doc, done.stderr


async def test_link_bind_adopts_rebinds_and_refuses_with_codes(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, database.url)
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), WallClock().now_us())
    # Viewers and operators may not choose an identity.
    for actor, role in (("victor", "viewer"), ("alice", "operator")):
        code, _, err = _bind(cfg, actor, "lead-1", "101")
        assert code == 1 and f"'{actor}' ({role}) may not link.bind" in err
    code, doc, err = _bind(cfg, "ada", "lead-1", "101")
    assert code == 0, err
    assert doc is not None and doc["outcome"] == "adopted" and doc["before"] is None
    assert doc["link"] == {**doc["link"], "state": "active",  # type: ignore[dict-item]
                           "generation": 1, "remote_id": "101"}
    again = _bind(cfg, "ada", "lead-1", "101")
    assert again[0] == 0 and again[1] is not None and again[1]["outcome"] == "unchanged"
    for args, refusal in (
        (("lead-2", "101"), "remote_linked_elsewhere: the remote record is already linked"
                            " to another local record"),
        (("lead-1", "202"), "generation_required: the local record is linked to another"
                            " remote record at generation 1"),
        (("lead-1", "202", "--generation", "3"), "generation_moved: the link is not at"
                                                 " generation 3 any more (generation 1)"),
    ):
        code, _, err = _bind(cfg, "ada", *args)
        assert code == 1 and refusal in err, err
        assert "Traceback" not in err
    code, doc, err = _bind(cfg, "ada", "lead-1", "202", "--generation", "1")
    assert code == 0, err
    assert doc is not None and doc["outcome"] == "rebound"
    shown = run_cli(cfg, "link", "show", "--binding", "hubspot-main", "--local-id", "lead-1",
                    "--actor", "victor", "--json")
    assert shown.returncode == 0, shown.stderr
    # Text by default; a record with no link is not found (exit 1).
    text = run_cli(cfg, "link", "show", "--binding", "hubspot-main", "--local-id", "lead-1",
                   "--actor", "victor")
    assert text.returncode == 0 and text.stdout.endswith(
        ": lead lead-1 -> contact 202, active, generation 2\n"), text.stdout
    none = run_cli(cfg, "link", "show", "--binding", "hubspot-main", "--local-id", "lead-9",
                   "--actor", "victor")
    assert none.returncode == 1 and none.stdout == ""
    assert "no link for lead lead-9 under binding hubspot-main" in none.stderr
    assert {k: json.loads(shown.stdout)[k] for k in ("state", "generation", "remote_id")} == {
        "state": "active", "generation": 2, "remote_id": "202"}
    unknown = run_cli(cfg, "link", "bind", "--binding", "nosuch", "--local-id", "lead-1",
                      "--remote-id", "1", "--actor", "ada", *WHY)
    assert unknown.returncode == 2 and "unknown_binding" in unknown.stderr
    audit = await store.audit_list(target_id=str(json.loads(shown.stdout)["link_key"]))
    assert sorted(e.action for e in audit) == ["link.bind", "link.bind"]
    assert all(e.actor == "ada" and e.origin is not None and '"os_user"' in e.origin
               for e in audit)


async def test_a_rebind_from_the_cli_fails_the_queued_command_closed(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    async with running_slice(store, database.url, with_replica=False) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        port = sl.hubspot_port
    # The operator binds lead-1 to the contact it really is, naming the generation seen.
    cfg = _config(tmp_path, database.url, org=SCOPE.org_id,
                  install=SCOPE.app_installation_id)
    code, doc, err = _bind(cfg, "ada", "lead-1", "202", "--generation", "1")
    assert code == 0, err
    assert doc is not None and doc["outcome"] == "rebound"
    async with running_slice(store, database.url, hubspot_port=port) as sl2:
        sl2.sim.add_contact("101", jobtitle="Engineer")
        sl2.sim.add_contact("202", jobtitle="Engineer")
        (item,) = await store.work_list(WorkQuery(family="external_effect"))

        async def settled() -> bool:
            command = await store.command_get(item.subject_id)
            return command is not None and command.settlement is not Settlement.OPEN

        await wait_for(settled, within_s=60)
        assert sl2.sim.requests == []  # neither the old record nor the new one
    command = await store.command_get(item.subject_id)
    assert command is not None and command.settlement is Settlement.NO_EFFECT
    # The exact receipt queued for the Runtime (this slice's Runtime is a new process
    # that never saw the intent: tests/services/test_dispatch_pins.py follows one receipt
    # to the Runtime that accepted it).
    receipt = await store.receipt_get(item.subject_id)
    assert receipt is not None and receipt.result_format_version == 2
    assert json.loads(receipt.canonical_result) == {
        "outcome": "NO_EFFECT", "reason": "REJECTED_BEFORE_DISPATCH", "version": 1}
    got = await store.work_get(item.work_id)
    assert got is not None and (got.terminal_outcome, got.failure_class) == (
        "no_effect", "link_generation")
