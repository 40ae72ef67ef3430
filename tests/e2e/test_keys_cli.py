"""``integrationd keys status|rotate`` as an operator runs them: real processes, real
databases; no token or key ever printed."""

from __future__ import annotations

import json
from pathlib import Path

from daemon.core.token_bundle import (
    BundleContext,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.processes import run_cli, write_config
from tests.support.work import T0

OLD = TokenKey("k1", bytes(range(32)))
NEW = TokenKey("k2", bytes(range(100, 132)))
ADMIN = '\n[[operators]]\nname = "root"\nrole = "admin"\n'


def _bundle(i: int) -> TokenBundle:
    return TokenBundle(access_token=SecretText(f"access-SECRET-{i}"),
                       refresh_token=SecretText(f"refresh-SECRET-{i}"), expires_at_us=T0)


def _config(tmp_path: Path, url: str, keys: str) -> Path:
    keydir = tmp_path / "keys"
    keydir.mkdir(exist_ok=True)
    (keydir / "k1.key").write_text(OLD.material.hex())
    (keydir / "k2.key").write_text(NEW.material.hex())
    return write_config(tmp_path / "c.toml", url, extra=ADMIN + f'\n[keys]\ndir = "keys"\n{keys}\n')


async def test_rotate_rewraps_every_bundle_without_changing_authority(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    for i in range(3):
        await store.grant_install(binding_id=f"b{i}", generation=1,
                                  sealed=seal(_bundle(i), OLD, BundleContext(f"b{i}", 1, 1)),
                                  expires_at_us=T0, now_us=T0)
    cfg = _config(tmp_path, database.url, 'active = "k2"\nprevious = "k1"')
    before = run_cli(cfg, "keys", "status", "--json")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["bundles_by_key"] == {"k1": 3}
    text = run_cli(cfg, "keys", "status")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == ["active key: k2", "loaded keys: k1, k2",
                                        "  key k1 seals 3 bundle(s)",
                                        "every stored bundle opens"]

    denied = run_cli(cfg, "keys", "rotate", "--actor", "alice", "--reason", "r")
    assert denied.returncode == 1 and "admins only" in denied.stderr

    rotated = run_cli(cfg, "keys", "rotate", "--actor", "root", "--reason", "yearly rotation",
                      "--json")
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout) == {"active": "k2", "rewrapped": 3,
                                           "already_current": 0, "refused": [],
                                           "refreshing": 0}
    again = run_cli(cfg, "keys", "rotate", "--actor", "root", "--reason", "again")
    assert again.stdout == ("rewrapped 0 bundle(s) under key k2; 3 already sealed with it;"
                            " 0 refused\n")

    for i in range(3):
        grant = await store.grant_get(f"b{i}", 1)
        assert grant is not None and (grant.sealed.key_id, grant.token_version) == ("k2", 2)
        assert open_bundle(grant.sealed, {"k2": NEW}, BundleContext(f"b{i}", 1, 2)) == _bundle(i)
    audit = [e for e in await store.audit_list() if e.action == "grant.rewrap"]
    assert len(audit) == 3 and {e.actor for e in audit} == {"root"}

    # The old key may go now: status is clean with only the new one loaded.
    only_new = _config(tmp_path, database.url, 'active = "k2"')
    after = run_cli(only_new, "keys", "status", "--json")
    assert after.returncode == 0 and json.loads(after.stdout)["problems"] == []
    printed = "".join(r.stdout + r.stderr for r in (before, denied, rotated, again, after))
    assert "SECRET" not in printed
    assert OLD.material.hex() not in printed and NEW.material.hex() not in printed


async def test_missing_or_wrong_keys_are_named(database: FreshDatabase, store: WorkStore,
                                               tmp_path: Path) -> None:
    await store.grant_install(binding_id="b0", generation=1,
                              sealed=seal(_bundle(0), OLD, BundleContext("b0", 1, 1)),
                              expires_at_us=T0, now_us=T0)
    # The key that seals the stored bundles is not loaded: status says which.
    cfg = _config(tmp_path, database.url, 'active = "k2"')
    missing = run_cli(cfg, "keys", "status")
    assert missing.returncode == 1
    assert "token key 'k1' seals stored bundles but is not loaded" in missing.stdout
    # A different key under the id k1: it does not open them.
    (tmp_path / "keys" / "k1.key").write_text(bytes(32).hex())
    wrong = write_config(tmp_path / "w.toml", database.url,
                         extra='\n[keys]\ndir = "keys"\nactive = "k1"\n')
    bad = run_cli(wrong, "keys", "status")
    assert bad.returncode == 1 and "token key 'k1' does not open" in bad.stdout
    # A configured key that does not exist: one line naming it, exit 2.
    absent = write_config(tmp_path / "a.toml", database.url,
                          extra='\n[keys]\ndir = "keys"\nactive = "k9"\n')
    result = run_cli(absent, "keys", "status")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: keys.k9: token key 'k9' not found")


GRANT_BINDING = """
[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "org-1"
app_installation_id = "install-1"
remote_account_id = "portal-1"
base_url = "http://127.0.0.1:9"
auth = "grant"
token_url = "http://127.0.0.1:9/oauth/v1/token"
client_id = "client-1"
client_secret_file = "client.secret"
"""


async def test_run_with_a_grant_binding_and_a_missing_key_is_one_line_exit_2(
        database: FreshDatabase, tmp_path: Path) -> None:
    """Effects open grants with the token keys, so ``run`` loads them at once: a
    configured key that is missing is named in one line, exit 2, before anything starts."""
    (tmp_path / "client.secret").write_text("client-SECRET-x\n")
    (tmp_path / "keys").mkdir()
    cfg = write_config(tmp_path / "g.toml", database.url,
                       extra=GRANT_BINDING + '\n[keys]\ndir = "keys"\nactive = "k9"\n')
    result = run_cli(cfg, "run")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: keys.k9: token key 'k9' not found")
    assert "client-SECRET-x" not in result.stderr + result.stdout


async def test_run_with_a_malformed_or_missing_previous_key_is_one_line_exit_2(
        database: FreshDatabase, tmp_path: Path) -> None:
    """A key file that is not 32 bytes (a truncated copy), or a ``previous`` key that is
    not there: named in one line, exit 2, before anything starts; the file's content is
    never printed."""
    (tmp_path / "client.secret").write_text("client-SECRET-x\n")
    (tmp_path / "keys").mkdir()
    truncated = NEW.material.hex()[:-2]
    (tmp_path / "keys" / "k2.key").write_text(truncated)
    cfg = write_config(tmp_path / "g.toml", database.url,
                       extra=GRANT_BINDING + '\n[keys]\ndir = "keys"\nactive = "k2"\n')
    bad = run_cli(cfg, "run")
    assert bad.returncode == 2, bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: keys.k2: token key 'k2' is not 32"
                           " bytes"), line
    assert truncated not in bad.stderr + bad.stdout
    (tmp_path / "keys" / "k2.key").write_text(NEW.material.hex())
    cfg = write_config(tmp_path / "p.toml", database.url,
                       extra=GRANT_BINDING + '\n[keys]\ndir = "keys"\nactive = "k2"\n'
                       'previous = "k1"\n')
    missing = run_cli(cfg, "run")
    assert missing.returncode == 2, missing.stderr
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: keys.k1: token key 'k1' not found")
    assert NEW.material.hex() not in missing.stderr + missing.stdout


async def test_run_with_a_different_key_under_the_right_id_is_one_line_exit_2(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    """The key file holds another key under the id the stored bundles name (a swapped or
    mistyped file): every grant would be refused at use, so ``run`` stops at start in one
    line naming the key, exit 2; the key is never printed."""
    await store.grant_install(binding_id="hubspot-main", generation=1,
                              sealed=seal(_bundle(0), OLD, BundleContext("hubspot-main", 1, 1)),
                              expires_at_us=T0, now_us=T0)
    (tmp_path / "client.secret").write_text("client-SECRET-x\n")
    (tmp_path / "keys").mkdir()
    other = bytes(range(7, 39)).hex()
    (tmp_path / "keys" / "k1.key").write_text(other)
    cfg = write_config(tmp_path / "g.toml", database.url,
                       extra=ADMIN + GRANT_BINDING + '\n[keys]\ndir = "keys"\nactive = "k1"\n')
    published = run_cli(cfg, "catalog", "publish", "--actor", "root", "--reason", "r")
    assert published.returncode == 0, published.stderr
    run = run_cli(cfg, "run")
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "integrationd: config error: keys.k1: token key 'k1' opens none of the 1 stored"
        " bundle(s) sealed under its id that were tried (a different key under that id?)")
    printed = run.stdout + run.stderr
    assert other not in printed and OLD.material.hex() not in printed and "SECRET" not in printed
