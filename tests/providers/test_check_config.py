"""A bad L1 definition stops ``integrationd check-config``: one line naming the key, exit 2."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from tests.support.processes import run_cli

OP = "outreach.prospect.update_title"
KEY = f"providers.outreach.operations.{OP}"


def providers_dir(tmp_path: Path, replace: tuple[str, str] | None = None,
                  file: str = "outreach.toml") -> Path:
    """A copy of the shipped definitions, with one text replacement in ``file``."""
    folder = tmp_path / "providers"
    folder.mkdir()
    shipped = resources.files("config").joinpath("providers")
    for name in ("hubspot.toml", "outreach.toml"):
        text = shipped.joinpath(name).read_text()
        if replace is not None and name == file:
            assert replace[0] in text
            text = text.replace(replace[0], replace[1], 1)
        (folder / name).write_text(text)
    return folder


def config(tmp_path: Path, folder: Path | str) -> Path:
    cfg = tmp_path / "integrationd.toml"
    cfg.write_text(f'[catalog]\nrevision = 3\ndefinitions_dir = "{folder}"\n')
    return cfg


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        ('attributes = "$fields"', 'attributes = "$attributes"', f"{KEY}.request.body.data"
         ".attributes", "unknown placeholder '$attributes'"),
        ('fields = "/data/attributes"', 'fields = "data/attributes"', f"{KEY}.read.fields",
         "malformed JSON pointer"),
        ('identity = "/data/id"', 'identity = "/data/~3id"', f"{KEY}.response.identity",
         "malformed JSON pointer"),
        ('content_type = "application/vnd.api+json"\n', "", f"{KEY}.request.content_type",
         "missing"),
        ('command_fields = "/attributes"\n', "", f"{KEY}.command_fields", "missing"),
        ('auth = "s2s"', 'auth = "oauth"', f"{KEY}.request.auth", "no auth scheme 'oauth'"),
        ('path = "/api/v2/prospects/{remote_id}"\ncontent',
         'path = "/api/v2/prospects/{prospect_id}"\ncontent', f"{KEY}.request.path",
         "unknown path field {prospect_id}"),
        ('rejected_statuses = ["4xx"]', 'rejected_statuses = ["4xx", 429]',
         f"{KEY}.rejected_statuses", "status 429 is also in not_applied_statuses"),
        ('accepted_statuses = ["2xx"]', 'accepted_statuses = ["2xx", 600]',
         f"{KEY}.accepted_statuses", "600 is not an HTTP status code (100-599)"),
        ('rejected_statuses = ["4xx"]', 'rejected_statuses = [99]',
         f"{KEY}.rejected_statuses", "99 is not an HTTP status code"),
    ],
)
def test_a_bad_definition_is_one_line_naming_the_key_and_exit_2(
        tmp_path: Path, old: str, new: str, key: str, says: str) -> None:
    result = run_cli(config(tmp_path, providers_dir(tmp_path, (old, new))), "check-config")
    assert result.returncode == 2, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {key}: "), line
    assert says in line
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        # A bare claim: nothing L0 can check proves that a replay cannot repeat the effect.
        ("replay_safe = false", "replay_safe = true", f"{KEY}.replay_safe",
         "without a mechanism L0 can check"),
        # The meaning of a 429 (and of every status) is the operation's declaration; L0
        # assumes none.
        ("not_applied_statuses = [429]\n", "", f"{KEY}.not_applied_statuses",
         "missing: an operation declares what each status means"),
        ('accepted_statuses = ["2xx"]\n', "", f"{KEY}.accepted_statuses",
         "missing: an operation declares what each status means"),
        ('rejected_statuses = ["4xx"]\n', "", f"{KEY}.rejected_statuses",
         "missing: an operation declares what each status means"),
    ],
)
def test_a_replay_safe_claim_or_a_status_meaning_l1_does_not_declare_is_exit_2(
        tmp_path: Path, old: str, new: str, key: str, says: str) -> None:
    """Issue 20 item 7 (seed 6): replay safety is a declared proof L0 can check, and each
    status's meaning is the operation contract's declaration, not an L0 default."""
    result = run_cli(config(tmp_path, providers_dir(tmp_path, (old, new))), "check-config")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {key}: "), line
    assert says in line, line
    assert "Traceback" not in result.stderr


HOOK = "providers.hubspot.webhooks.hubspot.contact_events.payload"
IDENTITY = 'event_identity = ["/portalId", "/subscriptionId", "/eventId", "/objectId",'


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        (IDENTITY, IDENTITY.replace('"/eventId"', '"eventId"'), "event_identity",
         "malformed JSON pointer 'eventId'"),
        (IDENTITY, IDENTITY.replace('"/eventId"', '"/attemptNumber"'), "event_identity",
         "/attemptNumber changes per attempt"),
        (IDENTITY, IDENTITY.replace("event_identity", "event_identiy"), "event_identiy",
         "unknown key"),
        ('attempt_fields = ["/attemptNumber"]', 'attempt_fields = ["attemptNumber"]',
         "attempt_fields", "malformed JSON pointer"),
    ],
)
def test_a_bad_event_identity_is_one_line_naming_the_key_and_exit_2(
        tmp_path: Path, old: str, new: str, key: str, says: str) -> None:
    folder = providers_dir(tmp_path, (old, new), file="hubspot.toml")
    result = run_cli(config(tmp_path, folder), "check-config")
    assert result.returncode == 2, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {HOOK}.{key}: "), line
    assert says in line, line
    assert "Traceback" not in result.stderr


SUB = "providers.outreach.webhooks.outreach.prospect_events.subscription"


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        ("after it has passed.\nmax_in_flight = 30.0", "after it has passed.\nmax_in_flight = -1",
         f"{SUB}.max_in_flight", "expected a non-negative number"),
        ("max_clock_skew = 2.0\n\n[webhooks", 'max_clock_skew = "2s"\n\n[webhooks',
         f"{SUB}.max_clock_skew", "expected a non-negative number"),
        ('cleanup_token = "/data/meta/cleanupToken"', 'cleanup_token = "data/meta"',
         f"{SUB}.create.cleanup_token", "malformed JSON pointer"),
        ('path = "/api/v2/webhooks/{remote_id}"', 'path = "/api/v2/webhooks"',
         f"{SUB}.delete.path", "must name the subscription"),
        ('actions = ["created", "updated", "destroyed"]', "actions = []", f"{SUB}.actions",
         "expected at least one entry"),
    ],
)
def test_a_bad_subscription_definition_is_one_line_naming_the_key_and_exit_2(
        tmp_path: Path, old: str, new: str, key: str, says: str) -> None:
    result = run_cli(config(tmp_path, providers_dir(tmp_path, (old, new))), "check-config")
    assert result.returncode == 2, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {key}: "), line
    assert says in line, line
    assert "Traceback" not in result.stderr


def test_toml_that_does_not_parse_names_the_file(tmp_path: Path) -> None:
    folder = providers_dir(tmp_path)
    (folder / "broken.toml").write_text("provider = [\n")
    result = run_cli(config(tmp_path, folder), "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: providers/broken.toml: not valid TOML")


def test_a_missing_providers_dir_names_the_key(tmp_path: Path) -> None:
    result = run_cli(config(tmp_path, tmp_path / "absent"), "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: catalog.definitions_dir: no such directory")


def test_a_good_providers_dir_is_served(tmp_path: Path) -> None:
    folder = providers_dir(tmp_path)
    shutil.copy(folder / "outreach.toml", folder / "outreach.toml.bak")  # not *.toml: ignored
    result = run_cli(config(tmp_path, folder), "check-config")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)


def test_a_relative_providers_dir_resolves_against_the_working_directory(
        tmp_path: Path) -> None:
    providers_dir(tmp_path, ('"$fields"', '"$nope"'))
    result = run_cli(config(tmp_path, "providers"), "check-config", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown placeholder '$nope'" in result.stderr
