"""The ``integrationd`` command line, as an operator uses it: real processes, real databases."""

from __future__ import annotations

import datetime
import json
import os
import pwd
import re
import time
from pathlib import Path

import attrs
import pytest

from daemon.core.outcomes import DeadLetter
from daemon.services.principal_bootstrap import bootstrap_facts
from sandbox.demo_keys import private_pem
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import HUBSPOT_MAIN, draft
from tests.support.processes import cli_env, run_cli, write_config
from tests.support.work import claim, enqueue, finalize


def test_bad_config_is_one_line_naming_the_key_and_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[work]\nconcurrency = "lots"\n')
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "integrationd: config error: work.concurrency: expected an integer, got 'lots'"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[storage]\nurl = 'postgres://x'\n", "storage.url"),
        ("[storage]\nurl = 'mysql://u:pw@h:3306/db'\n", "storage.url"),
        ("[storage]\npassword = 'x'\n", "storage.password"),
        ("[admin]\nlisten = 'nowhere'\n", "admin.listen"),
        ("[families.nosuch]\nbatch_size = 1\n", "families.nosuch"),
        ("[families.noop]\nlease_ttl = 1.0\n", "families.noop.lease_ttl"),
        ("[work]\nbogus = 1\n", "work.bogus"),
        # A command horizon shorter than the admission dedup window (facts_days).
        ("[retention]\ncommands_days = 399.0\n", "retention.commands_days"),
        ("[[operators]]\nname = 'a'\nrole = 'root'\n", "operators[0].role"),
        ("not toml at all [", "--config"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, toml: str, key: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert f"config error: {key}" in result.stderr
    assert "pw@" not in result.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    result = run_cli(tmp_path / "absent.toml", "check-config")
    assert result.returncode == 2
    assert "no such file" in result.stderr


def test_unreachable_database_at_start_is_a_clear_error(tmp_path: Path) -> None:
    # run and migrate wait storage.startup_timeout (with a log line per try), then fail.
    cfg = write_config(tmp_path / "a.toml", "mysql://root@127.0.0.1:9/nothing",
                       storage_extra="startup_timeout = 1.0")
    for command in (["run"], ["migrate"]):
        result = run_cli(cfg, *command)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if not line.startswith("{")]
        assert len(errors) == 1, result.stderr
        assert errors[0].startswith("integrationd: database unreachable"
                                    " (mysql://root@127.0.0.1:9/nothing): ")
        assert "storage.startup_timeout" in errors[0]
        assert '"event":"database_waiting"' in result.stderr
        assert "Traceback" not in result.stderr


def test_run_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    # An existing database without the schema (a missing file is refused earlier, exit 2:
    # test_a_missing_sqlite_file_is_named_and_never_created_by_a_read).
    (tmp_path / "empty.db").touch()
    cfg = write_config(tmp_path / "a.toml", f"sqlite:///{tmp_path / 'empty.db'}")
    result = run_cli(cfg, "run")
    assert result.returncode == 1
    assert "run `integrationd migrate`" in result.stderr


def test_secrets_come_from_the_environment_and_are_never_printed(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "a.toml", "mysql://root@127.0.0.1:3306/test")
    env = cli_env()
    env["INTEGRATIOND_STORAGE_PASSWORD"] = "hunter2-secret"
    result = run_cli(cfg, "check-config", env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["storage"]["password"] == "set"
    assert "hunter2" not in result.stdout + result.stderr


async def test_operator_verbs(database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    assert run_cli(cfg, "migrate").returncode == 0

    out = run_cli(cfg, "work", "enqueue", "noop", "--count", "3", "--org", "acme")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["enqueued"] == 3

    unknown = run_cli(cfg, "work", "enqueue", "nosuch")
    assert unknown.returncode == 2
    assert "unknown work family 'nosuch' (known: noop)" in unknown.stderr

    bad = run_cli(cfg, "work", "enqueue", "noop", "--payload", "{oops")
    assert bad.returncode == 2 and "payload is not valid JSON" in bad.stderr

    listed = json.loads(run_cli(cfg, "work", "list", "--org", "acme", "--json").stdout)
    assert len(listed) == 3
    assert all("payload" not in i and "lease_token" not in i for i in listed)
    # A full page says it may not be all, and how to read on; a partial one says nothing.
    page = run_cli(cfg, "work", "list", "--org", "acme", "--limit", "2")
    assert page.returncode == 0 and len(page.stdout.splitlines()) == 2
    newest_two = [i["work_id"] for i in listed[:2]]
    assert page.stderr == (f"integrationd: stopped at --limit 2; more may match: next page"
                           f" with --after {newest_two[1]}\n")
    rest = run_cli(cfg, "work", "list", "--org", "acme", "--after", newest_two[1])
    assert rest.stderr == "" and rest.stdout.split()[0] == listed[2]["work_id"]

    bad_state = run_cli(cfg, "work", "list", "--state", "nosuch")
    assert bad_state.returncode == 2 and "unknown state 'nosuch'" in bad_state.stderr

    # Make one dead, then replay it: refused for a viewer, allowed for an operator.
    now = time.time_ns() // 1000
    (dead_id,) = await enqueue(store, now=now)
    (item,) = [i for i in (await claim(store, now=now, limit=10)).claimed
               if i.work_id == dead_id]
    await finalize(store, item, DeadLetter("bad", "provider said no"), now=now)

    refused = run_cli(cfg, "work", "replay", dead_id, "--actor", "victor", "--reason", "x")
    assert refused.returncode == 1 and "may not work.replay" in refused.stderr
    stranger = run_cli(cfg, "work", "replay", dead_id, "--actor", "mallory", "--reason", "x")
    assert stranger.returncode == 1 and "not a configured operator" in stranger.stderr

    replayed = run_cli(cfg, "work", "replay", dead_id, "--actor", "alice", "--reason",
                       "provider fixed", "--json")
    assert replayed.returncode == 0, replayed.stderr
    new = json.loads(replayed.stdout)
    assert new["replay_of"] == dead_id and new["state"] == "pending"

    again = run_cli(cfg, "work", "replay", dead_id, "--actor", "alice", "--reason", "x")
    assert again.returncode == 1 and "already replayed" in again.stderr

    shown = json.loads(run_cli(cfg, "work", "show", dead_id, "--json").stdout)
    assert shown["state"] == "dead"
    assert [e["outcome"] for e in shown["executions"]] == ["dead"]

    missing = run_cli(cfg, "work", "show", "01NOSUCHITEM00000000000000")
    assert missing.returncode == 1 and "no work item" in missing.stderr

    cancelled = json.loads(
        run_cli(cfg, "work", "cancel", new["work_id"], "--actor", "alice", "--reason",
                "superseded").stdout)
    assert cancelled == {"work_id": new["work_id"], "disposition": "cancelled",
                         "state": "cancelled"}
    # Cancelling a terminal item is refused: one line, exit 1, nothing audited.
    twice = run_cli(cfg, "work", "cancel", new["work_id"], "--actor", "alice", "--reason",
                    "again")
    assert twice.returncode == 1, twice.stdout
    assert twice.stdout == "" and twice.stderr.count("\n") == 1
    assert "cannot be cancelled: the item is cancelled" in twice.stderr

    # The test's own claim took the three acme items too; one dead item remains.
    depths = json.loads(run_cli(cfg, "work", "depths", "--json").stdout)
    assert sorted((d["state"], d["count"]) for d in depths) == [("dead", 1), ("processing", 3)]


def test_check_config_prints_every_section_with_secrets_as_set_or_unset(
        tmp_path: Path) -> None:
    """The finding: check-config left out [api], [[runtimes]], [[bindings]], [catalog],
    admin.auth and the secrets' state."""
    example = Path(__file__).resolve().parents[2] / "config" / "example.toml"
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    text = example.read_text().replace("var/secrets/", f"{secrets}/")
    for name in ("runtime-crm.token", "runtime-crm-results.token", "hubspot.token",
                 "hubspot-webhook.token", "outreach-webhook.token", "admin-session.secret"):
        (secrets / name).write_text(f"value-of-{name}\n")
    # The Outreach binding is an S2S app: its RSA private key (the token key is loaded
    # only when a replica is assembled, not by check-config).
    pem = private_pem()
    (secrets / "outreach-app.pem").write_bytes(pem)
    # A real argon2 hash, so the operator's hash file loads.
    for who in ("admin", "viewer"):
        (secrets / f"{who}.password-hash").write_text(
            "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$5h1bQ0Wm4zG8GZ0S1b3tWJZq5bq7d7O4X3Qe2s0hY0c\n")
    cfg = tmp_path / "example.toml"
    cfg.write_text(text)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    for section in ("storage", "replica", "admin", "work", "families", "operators", "api",
                    "runtimes", "bindings", "catalog"):
        assert section in doc, section
    assert doc["admin"]["auth"] == "password"
    assert doc["admin"]["session_secret"] == "set"  # make secrets generates it
    assert doc["api"]["listen"] == "127.0.0.1:8781"
    assert doc["catalog"]["revision"] == 7
    (runtime,) = doc["runtimes"]
    assert runtime["token"] == "set" and runtime["results_token"] == "set"
    assert runtime["results_url"].endswith("/runtime/v1/results")
    assert runtime["results_batch_url"].endswith("/runtime/v1/results/batch")
    hubspot, outreach = doc["bindings"]
    assert hubspot["token"] == "set" and hubspot["base_url"] == "http://127.0.0.1:8791"
    assert outreach["base_url"] == "http://127.0.0.1:8793"
    assert (outreach["auth"], outreach["token"], outreach["s2s_private_key"]) == (
        "s2s", "unset", "set")
    assert b"PRIVATE KEY" in pem and "PRIVATE KEY" not in result.stdout + result.stderr
    assert {o["name"]: o["password_hash"] for o in doc["operators"]} == {
        "admin": "set", "viewer": "set"}
    assert set(doc["families"]) >= {"noop", "external_effect", "runtime_receipt"}
    assert doc["families"]["runtime_receipt"]["max_attempts"] == 1_000_000
    printed = result.stdout + result.stderr
    assert "value-of-" not in printed and "$argon2id" not in printed


def test_check_config_connect_proves_the_database_is_reachable_and_migrated(
        tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    cfg = write_config(tmp_path / "a.toml", f"sqlite:///{db}")
    missing = run_cli(cfg, "check-config", "--connect")  # no file: exit 2, none made
    assert missing.returncode == 2 and not db.exists()
    assert "run `integrationd migrate`" in missing.stderr
    db.touch()  # a database without the schema
    unmigrated = run_cli(cfg, "check-config", "--connect")
    assert unmigrated.returncode == 1
    assert "run `integrationd migrate`" in unmigrated.stderr
    assert run_cli(cfg, "migrate").returncode == 0
    ok = run_cli(cfg, "check-config", "--connect")
    assert ok.returncode == 0, ok.stderr
    assert "reachable, schema current" in ok.stderr
    unreachable = run_cli(write_config(tmp_path / "b.toml", "mysql://root@127.0.0.1:9/nothing"),
                          "check-config", "--connect")
    assert unreachable.returncode == 1
    assert "database unreachable" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
# A Catalog revision and a binding matching tests/support/commands.draft(), so that the
# effect family's replay guard (same binding generation, same revision) lets a replay by.
EFFECT_CATALOG = """
[[operators]]
name = "root"
role = "admin"

[catalog]
revision = 7

[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "org-1"
app_installation_id = "install-1"
remote_account_id = "portal-1"
base_url = "http://127.0.0.1:9"
generation = 1
"""


async def _dead_effects(store: WorkStore, n: int, cfg: Path) -> list[str]:
    """``n`` dead effect items whose commands pin revision 7 as the config publishes it."""
    published = run_cli(cfg, "catalog", "publish", "--actor", "root", "--reason", "setup",
                        "--json")
    assert published.returncode == 0, published.stderr
    digest = json.loads(published.stdout)["digest"]
    now = time.time_ns() // 1000
    # The binding's durable row, as a replica bootstraps it from [[bindings]].
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), now)
    for i in range(n):
        accepted = await store.command_accept(attrs.evolve(
            draft(f"int-{i}", outbox=f"outbox-{i}", lead=f"lead-{i}"),
            catalog_digest=digest), now)
        assert accepted.work_id is not None
    items = (await claim(store, now=now, limit=n, family="external_effect")).claimed
    assert len(items) == n
    for item in items:
        await finalize(store, item, DeadLetter("provider_rejected", "the provider said no"),
                       now=now)
    return sorted(i.work_id for i in items)


async def test_work_replay_and_dlq_replay_resolve_every_family(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Finding (issue 13): both verbs built a registry of noop only and refused
    external_effect ("unknown work family ... known: noop")."""
    cfg = write_config(tmp_path / "a.toml", database.url, extra=EFFECT_CATALOG)
    first, second = await _dead_effects(store, 2, cfg)
    one = run_cli(cfg, "work", "replay", first, "--actor", "alice", "--reason", "fixed",
                  "--json")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["replay_of"] == first
    bulk = run_cli(cfg, "dlq", "replay", "--family", "external_effect", "--actor", "alice",
                   "--reason", "fixed", "--json")
    assert bulk.returncode == 0, bulk.stderr
    report = json.loads(bulk.stdout)
    assert [(i["work_id"], i["outcome"]) for i in report["items"]] == [(second, "replayed")]
    replays = await store.work_replay_map([first, second])
    assert set(replays) == {first, second}
    # The family's own replay guard ran: a second replay of either is refused.
    again = run_cli(cfg, "work", "replay", first, "--actor", "alice", "--reason", "x")
    assert again.returncode == 1 and "already replayed" in again.stderr


async def test_work_show_and_command_verbs_follow_the_operator_path_table(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Issue 20 item 3 through the CLI: ``work show`` and ``command show`` name the effect
    state and the one next action; a refused action prints the table's code and what to
    do instead (exit 1) and writes nothing; the advised action settles the receipt."""
    cfg = write_config(tmp_path / "a.toml", database.url, extra=EFFECT_CATALOG)
    (dead,) = await _dead_effects(store, 1, cfg)  # no attempt: proven no effect
    item = await store.work_get(dead)
    assert item is not None
    shown = json.loads(run_cli(cfg, "work", "show", dead, "--json").stdout)
    assert shown["operator_path"]["effect_state"] == "no_effect"
    assert shown["operator_path"]["next_action"] == "retire"
    # The item's command and its attempts, as the console's item page shows them.
    assert shown["command"]["command_id"] == item.subject_id
    assert shown["command"]["settlement"] == "open"
    assert shown["effect_attempts"] == [] and shown["receipt"] is None
    assert "frozen_request" not in json.dumps(shown)
    assert "operator_path: " in run_cli(cfg, "work", "show", dead).stdout
    command = json.loads(run_cli(cfg, "command", "show", item.subject_id, "--json").stdout)
    assert command["operator_path"]["next_action"] == "retire"
    assert "frozen_request" not in command["command"]
    as_text = run_cli(cfg, "command", "show", item.subject_id)
    assert as_text.returncode == 0, as_text.stderr
    assert as_text.stdout.startswith(f"command {item.subject_id}: settlement ")
    assert "  attempts: none\n" in as_text.stdout and "  receipt: none\n" in as_text.stdout
    assert "  effect state: no_effect; next action: retire\n" in as_text.stdout
    missing = run_cli(cfg, "command", "show", "nosuch")
    assert (missing.returncode, missing.stderr) == (1, "integrationd: no command nosuch\n")
    viewer = run_cli(cfg, "command", "retire", item.subject_id, "--actor", "nobody",
                     "--reason", "x")
    assert viewer.returncode == 1 and "not a configured operator" in viewer.stderr
    retired = run_cli(cfg, "command", "retire", item.subject_id, "--actor", "alice",
                      "--reason", "the provider never saw it")
    assert retired.returncode == 0, retired.stderr
    assert retired.stdout == f"retired {item.subject_id}: settlement no_effect\n"
    receipt = await store.receipt_get(item.subject_id)
    assert receipt is not None and receipt.result_format_version == 2
    audit = len(await store.audit_list(target_id=item.subject_id))
    for args in (("work", "replay", dead), ("command", "retire", item.subject_id),
                 ("command", "repair", item.subject_id)):
        refused = run_cli(cfg, *args, "--actor", "alice", "--reason", "again")
        assert refused.returncode == 1, refused.stderr
        assert "refused (settled)" in refused.stderr, refused.stderr
    assert len(await store.audit_list(target_id=item.subject_id)) == audit
    assert await store.work_replays_of(dead) == []


async def test_dlq_replay_refuses_an_unknown_family(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    result = run_cli(cfg, "dlq", "replay", "--family", "nosuch", "--actor", "alice",
                     "--reason", "x")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "integrationd: unknown work family 'nosuch'"
        " (known: cursor_reconcile, external_effect, inbound_apply, noop, runtime_receipt,"
        " subscription_reconcile)"]
    assert result.stdout == ""
    assert await store.audit_list() == []  # nothing written


async def test_dlq_replay_prints_an_audit_id_only_when_one_was_written(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    nothing = run_cli(cfg, "dlq", "replay", "--family", "noop", "--actor", "alice",
                      "--reason", "x")
    assert nothing.returncode == 0, nothing.stderr
    assert "audit" not in nothing.stdout.replace("no audit entry written", "")
    assert "nothing to replay" in nothing.stdout
    assert await store.audit_list() == []
    as_json = json.loads(run_cli(cfg, "dlq", "replay", "--family", "noop", "--actor", "alice",
                                 "--reason", "x", "--json").stdout)
    assert as_json["selected"] == 0 and as_json["audit_id"] is None

    now = time.time_ns() // 1000
    await enqueue(store, now=now)
    (item,) = (await claim(store, now=now)).claimed
    await finalize(store, item, DeadLetter("bad"), now=now)
    done = run_cli(cfg, "dlq", "replay", "--family", "noop", "--actor", "alice", "--reason",
                   "provider fixed")
    assert done.returncode == 0, done.stderr
    summary = [e for e in await store.audit_list() if e.action == "dlq.bulk_replay"]
    assert len(summary) == 1
    assert f"audit {summary[0].audit_id}" in done.stdout.splitlines()[-1]


@pytest.mark.parametrize("backend", ["sqlite"])  # output only
async def test_work_show_prints_iso_times_and_json_structures(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Finding (issue 13): times were epoch microseconds and the journal a Python repr."""
    cfg = write_config(tmp_path / "a.toml", database.url)
    now = time.time_ns() // 1000
    (wid,) = await enqueue(store, now=now)
    (item,) = (await claim(store, now=now)).claimed
    await finalize(store, item, DeadLetter("bad"), now=now)
    shown = run_cli(cfg, "work", "show", wid)
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(": ", 1) for line in shown.stdout.splitlines())
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
    for key in ("created_at", "updated_at", "run_after"):
        assert iso.match(fields[key]), (key, fields[key])
    assert "created_at_us" not in fields and fields["lease_until"] == "-"
    (execution,) = json.loads(fields["executions"])
    assert execution["outcome"] == "dead" and iso.match(execution["finished_at"])
    assert fields["hold"] == "-"
    expected = datetime.datetime.fromtimestamp(now // 1_000_000, tz=datetime.UTC)
    assert fields["created_at"].startswith(expected.strftime("%Y-%m-%dT%H:%M:%S"))
    # --json keeps the machine shape (epoch microseconds).
    doc = json.loads(run_cli(cfg, "work", "show", wid, "--json").stdout)
    assert doc["created_at_us"] == item.created_at_us and doc["hold"] is None


@pytest.mark.parametrize("backend", ["sqlite"])  # output only
async def test_work_show_says_why_newer_work_waits(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    (wid,) = await enqueue(store, engine_capability_version=7)
    fields = dict(line.split(": ", 1)
                  for line in run_cli(cfg, "work", "show", wid).stdout.splitlines())
    assert "engine capability v7" in fields["hold"]


@pytest.mark.parametrize("backend", ["sqlite"])  # output only
async def test_listing_verbs_take_json_and_say_when_empty(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    listings = [("work", "list"), ("work", "depths"), ("dlq", "list"), ("dlq", "classes"),
                ("audit", "list")]
    for verb in listings:
        text = run_cli(cfg, *verb)
        assert text.returncode == 0, (verb, text.stderr)
        assert text.stdout.startswith("no "), (verb, text.stdout)
        assert len(text.stdout.splitlines()) == 1
        as_json = run_cli(cfg, *verb, "--json")
        assert as_json.returncode == 0, (verb, as_json.stderr)
        doc = json.loads(as_json.stdout)
        assert doc in ([], {"items": []}, {"entries": []},
                       {"classes": [], "classes_sample": 5000}), (verb, doc)
    await enqueue(store, 2)
    depths = run_cli(cfg, "work", "depths")
    assert depths.stdout.split()[:3] == ["noop", "pending", "2"]


@pytest.mark.parametrize("backend", ["sqlite"])  # output only
async def test_the_audit_log_records_the_os_user_beside_the_actor(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Finding (issue 13): the CLI audited only the --actor it was told."""
    cfg = write_config(tmp_path / "a.toml", database.url)
    (wid,) = await enqueue(store)
    env = cli_env()
    env["SUDO_USER"] = "bob"
    result = run_cli(cfg, "work", "cancel", wid, "--actor", "alice", "--reason", "dup",
                     env=env)
    assert result.returncode == 0, result.stderr
    (entry,) = await store.audit_list()
    assert entry.actor == "alice" and entry.origin is not None
    assert json.loads(entry.origin) == {"via": "cli", "os_user": pwd.getpwuid(os.geteuid())
                                        .pw_name, "uid": os.geteuid(), "sudo_user": "bob"}
    listed = run_cli(cfg, "audit", "list")
    assert "via cli (os_user=" in listed.stdout and "sudo_user=bob" in listed.stdout
    doc = json.loads(run_cli(cfg, "audit", "list", "--json").stdout)
    assert doc["entries"][0]["origin"]["sudo_user"] == "bob"


def test_a_missing_sqlite_file_is_named_and_never_created_by_a_read(tmp_path: Path) -> None:
    """Only ``migrate`` creates the SQLite file. Any other command on a path that holds no
    database says where it looked (the relative URL resolved) and how to create it, exit 2,
    and leaves no empty database (or directory) behind a mistyped path."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[storage]\nurl = "sqlite:///data/typo.db"\n')
    expected = tmp_path / "data" / "typo.db"
    for argv in (("work", "list"), ("work", "depths"), ("audit", "list"), ("dlq", "list"),
                 ("binding", "list"), ("check-config", "--connect"), ("run",)):
        done = run_cli(cfg, *argv)
        assert done.returncode == 2, (argv, done.stderr)
        (line,) = done.stderr.splitlines()
        assert f"no SQLite database at {expected}: run `integrationd migrate`" in line, argv
        assert "relative to the directory integrationd starts in" in line
        assert not (tmp_path / "data").exists(), argv
    made = run_cli(cfg, "migrate")
    assert made.returncode == 0, made.stderr
    assert expected.exists()
    assert run_cli(cfg, "work", "list").returncode == 0
