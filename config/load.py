"""Load settings: TOML file, then environment overrides, then secrets.

* File: ``--config PATH`` (or ``$INTEGRATIOND_CONFIG``); without one, defaults.
* Environment: ``INTEGRATIOND__SECTION__KEY=value`` overrides ``[section] key``
  (``INTEGRATIOND__FAMILIES__NOOP__BATCH_SIZE=32`` for a family table).
* Secrets never come from the TOML: the database password is read from
  ``$CREDENTIALS_DIRECTORY/storage-password`` (systemd ``LoadCredential=``),
  from the file named by ``storage.password_file``, or from
  ``$INTEGRATIOND_STORAGE_PASSWORD``.

Every problem raises :class:`ConfigError` naming the key, which the CLI prints
as one line and exits 2.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import urllib.parse
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import attrs
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from config.catalog import (
    CatalogError,
    load_definitions,
    load_documents,
    webhooks_from_documents,
)
from config.definitions import OperationDefinition, policy_of
from config.settings import (
    AUTH_KINDS,
    FAMILY_DEFAULTS,
    L2_QUOTA_SCOPES,
    LEGACY_ADAPTERS,
    ROLES,
    AdminSettings,
    ApiSettings,
    BindingSettings,
    CatalogSettings,
    FamilySettings,
    IngressSettings,
    KeysSettings,
    LegacyClaimantSettings,
    Operator,
    QuotaScope,
    ReplicaSettings,
    RetentionSettings,
    RuntimeClient,
    Secret,
    Settings,
    StorageSettings,
    WebhookRoute,
    WorkSettings,
)
from daemon.core.quota import QuotaPolicyError
from daemon.core.retention import RetentionConfigError, RetentionPolicy

ENV_PREFIX = "INTEGRATIOND__"
_SECTIONS: dict[str, type[Any]] = {
    "storage": StorageSettings,
    "replica": ReplicaSettings,
    "admin": AdminSettings,
    "work": WorkSettings,
    "api": ApiSettings,
    "catalog": CatalogSettings,
    "keys": KeysSettings,
    "ingress": IngressSettings,
    "retention": RetentionSettings,
}
_ARRAYS = ("families", "operators", "runtimes", "bindings", "webhook_routes",
           "legacy_claimants")


class ConfigError(Exception):
    """A configuration problem, naming the key: ``storage.url: ...``."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class _EnvText(str):
    """A value that came from the environment: text to parse as the key's type.

    A TOML value already has a type, and it must be the key's: ``2.5`` is not an
    integer and ``"0.25"`` is not a number. Only environment text is parsed.
    """


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def _coerce(key: str, value: Any, kind: type[Any]) -> Any:
    if isinstance(value, _EnvText):
        return _parse_text(key, value.strip(), kind)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"expected true or false, got {value!r}")
    if kind is int:
        if type(value) is int:
            return value
        raise ConfigError(key, f"expected an integer, got {value!r}")
    if kind is float:
        if type(value) in (int, float) and math.isfinite(value):
            return float(value)
        raise ConfigError(key, f"expected a number, got {value!r}")
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, "unsupported setting type")


def _parse_text(key: str, text: str, kind: type[Any]) -> Any:
    if kind is bool:
        if text.lower() in ("true", "false", "1", "0"):
            return text.lower() in ("true", "1")
        raise ConfigError(key, f"expected true or false, got {text!r}")
    if kind is int:
        if _INTEGER_TEXT.fullmatch(text):
            return int(text)
        raise ConfigError(key, f"expected an integer, got {text!r}")
    if kind is float:
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(key, f"expected a number, got {text!r}") from None
        if not math.isfinite(number):
            raise ConfigError(key, f"expected a number, got {text!r}")
        return number
    if kind is str:
        return str(text)
    raise ConfigError(key, "unsupported setting type")


_FIELD_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _build(
    section: str, cls: type[Any], table: Mapping[str, Any], skip: Collection[str] = (),
    base: Any = None,
) -> Any:
    """``cls`` from one table; with ``base``, the table changes only the keys it names."""
    if not isinstance(table, Mapping):
        raise ConfigError(section, "expected a table")
    fields = {f.name: f for f in attrs.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{section}.{name}"
        if name in skip:
            continue
        field = fields.get(name)
        kind = _FIELD_TYPES.get(str(field.type)) if field is not None else None
        if field is None or kind is None:
            raise ConfigError(key, "unknown setting")
        kwargs[name] = _coerce(key, value, kind)
    if base is not None:
        return attrs.evolve(base, **kwargs)
    return cls(**kwargs)


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(key, f"must be positive, got {value}")


def _merge_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if len(path) < 2:
            raise ConfigError(name, "expected INTEGRATIOND__SECTION__KEY")
        table = raw
        for part in path[:-1]:
            nested = table.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ConfigError(".".join(path), "cannot override a non-table")
            table = nested
        table[path[-1]] = _EnvText(value)


def _read_secret_file(key: str, path: str, owner: str = "") -> Secret:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        # Name the file (and whose secret it is): "bindings[0]" alone does not say which
        # binding, nor where the daemon looked.
        whose = f" of {owner}" if owner else ""
        raise ConfigError(key, f"cannot read secret file{whose} {path!r}"
                               f" ({Path(path).resolve()}): {exc.strerror}") from None
    return Secret(text.strip())


def load_secret(
    *,
    key: str,
    credential: str,
    file_path: Any,
    env_var: str,
    environ: Mapping[str, str],
    owner: str = "",
) -> Secret | None:
    """A secret from, in order: the systemd credential ``credential``
    (``$CREDENTIALS_DIRECTORY``), the file named by the ``key``_file setting,
    or the environment variable ``env_var``. ``owner`` names whose secret it is in
    an error (``binding "hubspot-main"``)."""
    cred_dir = environ.get("CREDENTIALS_DIRECTORY")
    if cred_dir and (Path(cred_dir) / credential).exists():
        return _read_secret_file(key, str(Path(cred_dir) / credential), owner)
    if file_path:
        return _read_secret_file(f"{key}_file", str(file_path), owner)
    if env_var in environ:
        return Secret(environ[env_var])
    return None


def _storage_password(
    storage_raw: Mapping[str, Any], environ: Mapping[str, str]
) -> Secret | None:
    return load_secret(
        key="storage.password",
        credential="storage-password",
        file_path=storage_raw.get("password_file"),
        env_var="INTEGRATIOND_STORAGE_PASSWORD",
        environ=environ,
    )


def _validate_storage_url(url: str) -> None:
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("mysql", "mariadb", "tidb"):
        if parts.password:
            raise ConfigError(
                "storage.url",
                "do not put a password in the URL; use a credential file"
                " (storage.password_file or LoadCredential=storage-password)",
            )
        if not parts.hostname or not parts.path.strip("/"):
            raise ConfigError("storage.url", "expected mysql://user@host:port/database")
        return
    raise ConfigError(
        "storage.url", "expected sqlite:///path/to/file.db or mysql://user@host:port/database"
    )


def parse_settings(
    raw: dict[str, Any],
    *,
    environ: Mapping[str, str],
    known_families: Collection[str],
    base_dir: str = ".",
) -> Settings:
    """Build :class:`Settings` from a parsed TOML document plus the environment."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    _merge_env(raw, environ)
    unknown = set(raw) - set(_SECTIONS) - set(_ARRAYS)
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown section")
    storage_raw = raw.get("storage", {})
    if isinstance(storage_raw, Mapping) and "password" in storage_raw:
        raise ConfigError(
            "storage.password",
            "secrets are not read from the config file; use storage.password_file,"
            " LoadCredential=storage-password or INTEGRATIOND_STORAGE_PASSWORD",
        )
    storage = _build("storage", StorageSettings, storage_raw, skip=("password_file",))
    _validate_storage_url(storage.url)
    if storage.sqlite_synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ConfigError("storage.sqlite_synchronous", "expected NORMAL, FULL or EXTRA")
    _positive("storage.pool_size", storage.pool_size)
    _positive("storage.connect_timeout", storage.connect_timeout)
    _positive("storage.statement_timeout", storage.statement_timeout)
    _positive("storage.migration_timeout", storage.migration_timeout)
    if storage.startup_timeout < 0:
        raise ConfigError("storage.startup_timeout", "must not be negative")
    storage = attrs.evolve(storage, password=_storage_password(storage_raw, environ))

    replica = _build("replica", ReplicaSettings, raw.get("replica", {}))
    _positive("replica.heartbeat_interval", replica.heartbeat_interval)
    if replica.drain_timeout < 0:
        raise ConfigError("replica.drain_timeout", "must not be negative")
    _positive("replica.refresh_answer_wait", replica.refresh_answer_wait)

    admin_raw = raw.get("admin", {})
    if isinstance(admin_raw, Mapping) and "session_secret" in admin_raw:
        raise ConfigError(
            "admin.session_secret",
            "secrets are not read from the config file; use admin.session_secret_file,"
            " LoadCredential=admin-session-secret or INTEGRATIOND_ADMIN_SESSION_SECRET",
        )
    admin = _build("admin", AdminSettings, admin_raw, skip=("session_secret_file",))
    _parse_listen("admin.listen", admin.listen)
    if admin.auth not in ("password", "proxy"):
        raise ConfigError("admin.auth", "expected password or proxy")
    _positive("admin.session_ttl", admin.session_ttl)
    _keep_alive("admin.keep_alive", admin.keep_alive)
    admin = attrs.evolve(
        admin,
        session_secret=load_secret(
            key="admin.session_secret",
            credential="admin-session-secret",
            file_path=admin_raw.get("session_secret_file") if isinstance(admin_raw, Mapping)
            else None,
            env_var="INTEGRATIOND_ADMIN_SESSION_SECRET",
            environ=environ,
        ),
    )

    work = _build("work", WorkSettings, raw.get("work", {}))
    for name in ("poll_interval", "reclaim_interval", "depth_sample_interval", "concurrency"):
        _positive(f"work.{name}", getattr(work, name))
    if work.lease_margin < 0:
        raise ConfigError("work.lease_margin", "must not be negative")
    if work.clock_spread < 0:
        raise ConfigError("work.clock_spread", "must not be negative")
    if not 0 <= work.finalize_linger <= MAX_FINALIZE_LINGER_S:
        # Longer would spend the leases' trust on waiting: a group commit is milliseconds.
        raise ConfigError("work.finalize_linger",
                          f"must be between 0 and {MAX_FINALIZE_LINGER_S:g} (seconds)")

    families: dict[str, FamilySettings] = {}
    fam_raw = raw.get("families", {})
    if not isinstance(fam_raw, Mapping):
        raise ConfigError("families", "expected a table of family tables")
    for name, table in fam_raw.items():
        if name not in known_families:
            known = ", ".join(sorted(known_families))
            raise ConfigError(f"families.{name}", f"unknown work family (known: {known})")
        # A partial table (or one environment override) changes only the keys it names:
        # the rest keep the family's built-in defaults, not the generic ones.
        fam = _build(f"families.{name}", FamilySettings, table,
                     base=FAMILY_DEFAULTS.get(name, FamilySettings()))
        for field in ("max_attempts", "lease_ttl", "batch_size", "concurrency",
                      "backoff_base", "backoff_cap"):
            _positive(f"families.{name}.{field}", getattr(fam, field))
        if fam.lease_ttl <= work.lease_margin:
            raise ConfigError(
                f"families.{name}.lease_ttl", "must be longer than work.lease_margin"
            )
        if fam.backoff_cap < fam.backoff_base:
            raise ConfigError(f"families.{name}.backoff_cap", "must be at least backoff_base")
        families[name] = fam
    default_family = FamilySettings()
    if default_family.lease_ttl <= work.lease_margin:
        raise ConfigError("work.lease_margin", "must be shorter than the default lease_ttl (30)")

    operators: list[Operator] = []
    ops_raw = raw.get("operators", [])
    if not isinstance(ops_raw, list):
        raise ConfigError("operators", "expected an array of tables ([[operators]])")
    for i, entry in enumerate(ops_raw):
        op = _build(f"operators[{i}]", Operator, entry, skip=("password_hash_file",))
        if isinstance(entry, Mapping) and entry.get("password_hash_file"):
            if op.password_hash:
                raise ConfigError(f"operators[{i}]", "set password_hash or"
                                  " password_hash_file, not both")
            op = attrs.evolve(op, password_hash=_read_secret_file(
                f"operators[{i}].password_hash_file", str(entry["password_hash_file"])
            ).reveal())
        if not op.name:
            raise ConfigError(f"operators[{i}].name", "must not be empty")
        if op.role not in ROLES:
            raise ConfigError(f"operators[{i}].role", f"expected one of {', '.join(ROLES)}")
        if op.password_hash and not op.password_hash.startswith("$argon2"):
            raise ConfigError(
                f"operators[{i}].password_hash",
                "expected an argon2 hash (run `integrationd hash-password`)",
            )
        if any(o.name == op.name for o in operators):
            raise ConfigError(f"operators[{i}].name", f"duplicate operator {op.name!r}")
        operators.append(op)
    api = _build("api", ApiSettings, raw.get("api", {}))
    _parse_listen("api.listen", api.listen)
    _positive("api.max_body_bytes", api.max_body_bytes)
    _positive("api.max_batch_commands", api.max_batch_commands)
    _keep_alive("api.keep_alive", api.keep_alive)
    catalog = _build("catalog", CatalogSettings, raw.get("catalog", {}))
    _positive("catalog.revision", catalog.revision)
    keys = _build("keys", KeysSettings, raw.get("keys", {}))
    retention = _retention(raw.get("retention", {}))
    bindings = _bindings(raw.get("bindings", []), environ)
    if bindings:  # checked against the L1 definitions their providers declare
        operations = _definitions(catalog.definitions_dir)
        _l2_only_lengthens_l1(bindings, operations)
        _quota_holds_the_clock_spread(bindings, operations, work.clock_spread_us)
    ingress = _ingress(raw.get("ingress", {}))
    routes = _webhook_routes(raw.get("webhook_routes", []), environ, bindings, ingress,
                             catalog.definitions_dir)
    return Settings(
        storage=storage,
        replica=replica,
        admin=admin,
        work=work,
        families=families,
        operators=tuple(operators),
        api=api,
        runtimes=_runtimes(raw.get("runtimes", []), environ),
        bindings=bindings,
        catalog=catalog,
        keys=keys,
        ingress=ingress,
        webhook_routes=routes,
        retention=retention,
        legacy_claimants=_legacy_claimants(raw.get("legacy_claimants", []), known_families),
        base_dir=base_dir,
    )


def _retention(raw: Any) -> RetentionSettings:
    retention: RetentionSettings = _build("retention", RetentionSettings, raw)
    for name in ("interval", "lease_ttl", "sweep_interval"):
        _positive(f"retention.{name}", getattr(retention, name))
    try:
        retention_policy(retention)
    except RetentionConfigError as exc:
        raise ConfigError(exc.key, str(exc).split(": ", 1)[1]) from None
    return retention


def retention_policy(retention: RetentionSettings) -> RetentionPolicy:
    """The pure policy of these settings, validated."""
    return RetentionPolicy(work_days=retention.work_days, facts_days=retention.facts_days,
                           commands_days=retention.commands_days,
                           quarantine_days=retention.quarantine_days,
                           batch_rows=retention.batch_rows,
                           batch_bytes=retention.batch_bytes).validate()


def _array(name: str, value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConfigError(name, f"expected an array of tables ([[{name}]])")
    return value


def _env_name(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).upper()


def _no_inline_secret(key: str, table: Mapping[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if name in table:
            raise ConfigError(
                f"{key}.{name}",
                f"secrets are not read from the config file; use {name}_file or a credential",
            )


def _runtimes(value: Any, environ: Mapping[str, str]) -> tuple[RuntimeClient, ...]:
    out: list[RuntimeClient] = []
    for i, table in enumerate(_array("runtimes", value)):
        key = f"runtimes[{i}]"
        _no_inline_secret(key, table, ("token", "results_token"))
        rc = _build(key, RuntimeClient, table, skip=("token_file", "results_token_file"))
        for field in ("name", "org_id", "app_installation_id", "runtime_capability_id",
                      "runtime_work_binding_digest"):
            if not getattr(rc, field):
                raise ConfigError(f"{key}.{field}", "must not be empty")
        if any(r.name == rc.name for r in out):
            raise ConfigError(f"{key}.name", f"duplicate runtime {rc.name!r}")
        if rc.keep_alive:
            _keep_alive(f"{key}.keep_alive", rc.keep_alive)
        if rc.results_batch_url and not rc.results_url:
            raise ConfigError(f"{key}.results_batch_url",
                              "needs results_url too (inbound mutations and lead matching"
                              " go there)")
        for field in ("results_url", "results_batch_url"):
            url = getattr(rc, field)
            if url and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise ConfigError(f"{key}.{field}", "must be an http:// or https:// URL")
        env = _env_name(rc.name)
        rc = attrs.evolve(
            rc,
            token=load_secret(key=f"{key}.token", credential=f"runtime-{rc.name}-token",
                              file_path=table.get("token_file"),
                              env_var=f"INTEGRATIOND_RUNTIME_{env}_TOKEN", environ=environ,
                              owner=f"runtime {rc.name!r}"),
            results_token=load_secret(
                key=f"{key}.results_token", credential=f"runtime-{rc.name}-results-token",
                file_path=table.get("results_token_file"),
                env_var=f"INTEGRATIOND_RUNTIME_{env}_RESULTS_TOKEN", environ=environ,
                owner=f"runtime {rc.name!r}"),
        )
        out.append(rc)
    return tuple(out)


def _bindings(value: Any, environ: Mapping[str, str]) -> tuple[BindingSettings, ...]:
    out: list[BindingSettings] = []
    for i, table in enumerate(_array("bindings", value)):
        key = f"bindings[{i}]"
        _no_inline_secret(key, table, ("token", "client_secret", "s2s_private_key"))
        b = _build(key, BindingSettings, table, skip=("token_file", "client_secret_file",
                                                      "s2s_private_key_file", "quota"))
        b = attrs.evolve(b, quota=_binding_quota(f"{key}.quota", table.get("quota", {})))
        for field in ("binding_id", "provider", "org_id", "app_installation_id",
                      "remote_account_id", "base_url"):
            if not getattr(b, field):
                raise ConfigError(f"{key}.{field}", "must not be empty")
        if not b.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{key}.base_url", "expected an http:// or https:// URL")
        _positive(f"{key}.generation", b.generation)
        _positive(f"{key}.timeout", b.timeout)
        if any(o.binding_id == b.binding_id for o in out):
            raise ConfigError(f"{key}.binding_id", f"duplicate binding {b.binding_id!r}")
        b = attrs.evolve(
            b,
            token=load_secret(key=f"{key}.token", credential=f"binding-{b.binding_id}-token",
                              file_path=table.get("token_file"),
                              env_var=f"INTEGRATIOND_BINDING_{_env_name(b.binding_id)}_TOKEN",
                              environ=environ, owner=f"binding {b.binding_id!r}"),
            client_secret=load_secret(
                key=f"{key}.client_secret", credential=f"binding-{b.binding_id}-client-secret",
                file_path=table.get("client_secret_file"),
                env_var=f"INTEGRATIOND_BINDING_{_env_name(b.binding_id)}_CLIENT_SECRET",
                environ=environ, owner=f"binding {b.binding_id!r}"),
            s2s_private_key=load_secret(
                key=f"{key}.s2s_private_key", credential=f"binding-{b.binding_id}-s2s-key",
                file_path=table.get("s2s_private_key_file"),
                env_var=f"INTEGRATIOND_BINDING_{_env_name(b.binding_id)}_S2S_KEY",
                environ=environ, owner=f"binding {b.binding_id!r}"),
        )
        _binding_auth(key, b, declared="auth" in table)
        out.append(b)
    return tuple(out)


def _binding_quota(key: str, value: Any) -> tuple[QuotaScope, ...]:
    """``[bindings.quota.<dimension>]``: the scope L1's dimension is counted against."""
    if not isinstance(value, Mapping):
        raise ConfigError(key, "expected a table of quota dimensions")
    out = []
    for name, table in value.items():
        k = f"{key}.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(k, "expected a table with scope (and key)")
        unknown = sorted(set(table) - {"scope", "key", "endpoint_classes"})
        if unknown:
            raise ConfigError(f"{k}.{unknown[0]}", "unknown setting")
        classes = table.get("endpoint_classes", [])
        if not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes) \
                or ("endpoint_classes" in table and not classes):
            raise ConfigError(f"{k}.endpoint_classes", "expected a list of endpoint classes")
        # Without a scope, L1's (an override that only names endpoint classes).
        scope = table.get("scope", "" if classes else None)
        if scope != "" and scope not in L2_QUOTA_SCOPES:
            raise ConfigError(f"{k}.scope", f"expected one of {', '.join(L2_QUOTA_SCOPES)},"
                              f" got {scope!r}")
        qkey = table.get("key", "")
        if not isinstance(qkey, str) or (scope == "provider_key") != bool(qkey):
            raise ConfigError(f"{k}.key", "a provider quota key (text) is named exactly"
                              " when scope = \"provider_key\"")
        if qkey and not _QUOTA_KEY_NAME.fullmatch(qkey):
            raise ConfigError(f"{k}.key", "expected letters, digits, '-', '_' or '.'")
        out.append(QuotaScope(dimension=str(name), scope=scope, key=qkey,
                              endpoint_classes=tuple(classes)))
    return tuple(out)


_QUOTA_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _binding_auth(key: str, b: BindingSettings, *, declared: bool) -> None:
    """A static token is an explicitly declared auth kind; a grant names how it refreshes."""
    if b.auth not in AUTH_KINDS:
        raise ConfigError(f"{key}.auth", f"expected one of {', '.join(AUTH_KINDS)},"
                          f" got {b.auth!r}")
    if b.token is not None and not declared:
        raise ConfigError(f"{key}.auth", "this binding has a static token (token_file,"
                          " credential or environment): declare auth = \"static_token\""
                          " (sandbox only), or connect a grant and declare auth = \"grant\"")
    if b.auth == "static_token":
        if b.token is None:
            raise ConfigError(f"{key}.token_file", "auth = \"static_token\" needs a token")
        return
    if b.auth == "s2s":
        _s2s_auth(key, b)
        return
    if b.s2s_private_key is not None:
        raise ConfigError(f"{key}.s2s_private_key_file", f"auth = \"{b.auth}\" does not use"
                          " an S2S private key (declare auth = \"s2s\")")
    if b.token is not None:
        raise ConfigError(f"{key}.token_file", "auth = \"grant\" takes its token from the"
                          " binding's AuthorizationGrant, never from a file")
    if not (declared or b.token_url or b.client_id or b.client_secret):
        return  # a grant that cannot be refreshed: its token is used until it expires
    if not b.token_url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}.token_url", "auth = \"grant\" needs the OAuth token"
                          " endpoint (an http:// or https:// URL)")
    if not b.client_id:
        raise ConfigError(f"{key}.client_id", "auth = \"grant\" needs the OAuth client id")
    if b.client_secret is None:
        raise ConfigError(f"{key}.client_secret_file", "auth = \"grant\" needs the OAuth"
                          " client secret")


def _s2s_auth(key: str, b: BindingSettings) -> None:
    """An S2S binding mints its tokens: the app's id, its installation, the mint URL and
    an RSA private key (checked now: a key that cannot sign is a start-up error)."""
    if b.token is not None:
        raise ConfigError(f"{key}.token_file", "auth = \"s2s\" mints its token; it never"
                          " reads one from a file")
    if not b.token_url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}.token_url", "auth = \"s2s\" needs the mint endpoint (an"
                          " http:// or https:// URL; {installation_id} is filled in)")
    for field in ("s2s_app_id", "s2s_installation_id"):
        if not getattr(b, field):
            raise ConfigError(f"{key}.{field}", "auth = \"s2s\" needs it")
    if b.s2s_private_key is None:
        raise ConfigError(f"{key}.s2s_private_key_file", "auth = \"s2s\" needs the app's RSA"
                          " private key (a PEM file or the credential"
                          f" binding-{b.binding_id}-s2s-key)")
    try:
        private = serialization.load_pem_private_key(
            b.s2s_private_key.reveal().encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # Never the key's text, nor the parser's detail about it.
        raise ConfigError(f"{key}.s2s_private_key_file", "is not an unencrypted PEM private"
                          " key") from None
    if not isinstance(private, rsa.RSAPrivateKey):
        raise ConfigError(f"{key}.s2s_private_key_file", "is not an RSA private key (the app"
                          " JWT is RS256)")


# A listener's keep-alive is also the time a client may take to send a request's head
# (hypercorn's one timer): long enough for our clients to let go first (they keep an idle
# connection half of it), short enough to bound a slow-loris.
KEEP_ALIVE_BOUNDS_S = (1.0, 120.0)
MAX_FINALIZE_LINGER_S = 0.1


def _keep_alive(key: str, value: float) -> None:
    low, high = KEEP_ALIVE_BOUNDS_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high:
        raise ConfigError(key, f"expected seconds from {low:g} to {high:g}")


_ROUTE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def _ingress(value: Any) -> IngressSettings:
    ingress: IngressSettings = _build("ingress", IngressSettings, value)
    if ingress.listen:
        _parse_listen("ingress.listen", ingress.listen)
    for name in ("max_body_bytes", "max_header_bytes", "request_deadline", "db_deadline",
                 "spool_max_bytes", "retention_days", "forward_interval",
                 "materialize_interval", "materialize_batch"):
        _positive(f"ingress.{name}", getattr(ingress, name))
    if ingress.db_deadline >= ingress.request_deadline:
        raise ConfigError("ingress.db_deadline", "must be shorter than ingress.request_deadline"
                          " (the spool needs the rest)")
    if not ingress.spool_dir:
        raise ConfigError("ingress.spool_dir", "must not be empty")
    return ingress


def _webhook_routes(value: Any, environ: Mapping[str, str],
                    bindings: tuple[BindingSettings, ...], ingress: IngressSettings,
                    definitions_dir: str) -> tuple[WebhookRoute, ...]:
    tables = _array("webhook_routes", value)
    if not tables:
        return ()
    try:
        webhooks = webhooks_from_documents(load_documents(definitions_dir))
    except CatalogError as exc:
        raise ConfigError(exc.key, str(exc).partition(": ")[2]) from None
    out: list[WebhookRoute] = []
    for i, table in enumerate(tables):
        key = f"webhook_routes[{i}]"
        _no_inline_secret(key, table, ("secret", "previous_secret"))
        r = _build(key, WebhookRoute, table, skip=("secret_file", "previous_secret_file"))
        if not _ROUTE_NAME.fullmatch(r.route):
            raise ConfigError(f"{key}.route", "expected 1-63 of a-z, 0-9, '-' and '_'")
        if any(o.route == r.route for o in out):
            raise ConfigError(f"{key}.route", f"duplicate route {r.route!r}")
        binding = next((b for b in bindings if b.binding_id == r.binding_id), None)
        if binding is None:
            raise ConfigError(f"{key}.binding_id", f"no [[bindings]] entry {r.binding_id!r}")
        webhook = webhooks.get(r.webhook)
        if webhook is None:
            raise ConfigError(f"{key}.webhook", f"no L1 webhook contract {r.webhook!r}"
                              f" (declared: {', '.join(sorted(webhooks)) or 'none'})")
        if webhook.provider != binding.provider:
            raise ConfigError(f"{key}.webhook", f"{r.webhook!r} belongs to"
                              f" {webhook.provider!r}, the binding to {binding.provider!r}")
        # The body may take request_deadline, and the receipt as long again.
        if 2 * ingress.request_deadline >= webhook.response_window_s:
            raise ConfigError("ingress.request_deadline",
                              f"twice {ingress.request_deadline:g} s (the body, then the"
                              " receipt) is not inside the"
                              f" {webhook.response_window_s:g} s response window of"
                              f" {r.webhook}")
        _positive(f"{key}.subscription_generation", r.subscription_generation)
        _positive(f"{key}.secret_generation", r.secret_generation)
        if r.public_url and not r.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"{key}.public_url", "expected an http:// or https:// URL")
        env = _env_name(r.route)
        r = attrs.evolve(
            r,
            secret=load_secret(key=f"{key}.secret", credential=f"webhook-{r.route}-secret",
                               file_path=table.get("secret_file"),
                               env_var=f"INTEGRATIOND_WEBHOOK_{env}_SECRET", environ=environ),
            previous_secret=load_secret(
                key=f"{key}.previous_secret", credential=f"webhook-{r.route}-previous-secret",
                file_path=table.get("previous_secret_file"),
                env_var=f"INTEGRATIOND_WEBHOOK_{env}_PREVIOUS_SECRET", environ=environ),
        )
        out.append(r)
    return tuple(out)


_SQL_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _legacy_sql(key: str, sql: str, first_word: str) -> None:
    """One statement, ``:family`` its only parameter, beginning with ``first_word``."""
    words = sql.split()
    if not words or words[0].upper() != first_word:
        raise ConfigError(key, f"expected one {first_word} statement")
    if ";" in sql.rstrip().rstrip(";"):
        raise ConfigError(key, "expected one statement (no ';' inside)")
    if "?" in sql:
        raise ConfigError(key, "write :family where the family goes (no '?' placeholders)")
    others = sorted({p for p in _SQL_PARAM.findall(sql) if p != "family"})
    if others:
        raise ConfigError(key, f"unknown parameter :{others[0]} (only :family is bound)")


def _legacy_claimants(value: Any, known_families: Collection[str]
                      ) -> tuple[LegacyClaimantSettings, ...]:
    out: list[LegacyClaimantSettings] = []
    for i, table in enumerate(_array("legacy_claimants", value)):
        key = f"legacy_claimants[{i}]"
        c: LegacyClaimantSettings = _build(key, LegacyClaimantSettings, table)
        if c.family not in known_families:
            raise ConfigError(f"{key}.family", f"unknown work family {c.family!r} (known:"
                              f" {', '.join(sorted(known_families))})")
        if any(o.family == c.family for o in out):
            raise ConfigError(f"{key}.family", f"duplicate: {c.family!r} already has a legacy"
                              " claimant")
        if c.adapter not in LEGACY_ADAPTERS:
            raise ConfigError(f"{key}.adapter", f"unknown adapter {c.adapter!r} (known:"
                              f" {', '.join(LEGACY_ADAPTERS)})")
        for name, first in (("lock_sql", "UPDATE"), ("processing_sql", "SELECT"),
                            ("uncovered_sql", "SELECT"), ("processes_sql", "SELECT"),
                            ("open_claims_sql", "SELECT")):
            sql = getattr(c, name)
            if not sql.strip():
                if name in ("processes_sql", "open_claims_sql"):
                    continue
                raise ConfigError(f"{key}.{name}", "is required (see docs/operations.md,"
                                  " \"Your legacy claimant\")")
            _legacy_sql(f"{key}.{name}", sql, first)
        if ":family" not in c.lock_sql:
            raise ConfigError(f"{key}.lock_sql", "must name the family (:family): it locks"
                              " that family's live legacy rows")
        out.append(attrs.evolve(c, **{n: getattr(c, n).strip().rstrip(";").strip() for n in (
            "lock_sql", "processing_sql", "uncovered_sql", "processes_sql",
            "open_claims_sql")}))
    return tuple(out)


# L2 binding setting -> the L1 contract value it may only lengthen.
_L1_FLOORS = (("max_in_flight", "max_in_flight_s"), ("max_clock_skew", "max_clock_skew_s"))


def _definitions(definitions_dir: str) -> Mapping[str, OperationDefinition]:
    try:
        operations, _ = load_definitions(definitions_dir)
    except CatalogError as exc:
        raise ConfigError(exc.key, str(exc).partition(": ")[2]) from None
    return operations


def _l2_only_lengthens_l1(bindings: tuple[BindingSettings, ...],
                          operations: Mapping[str, OperationDefinition]) -> None:
    """A binding's in-flight window and clock skew may lengthen what L1 declares for
    its provider's operations, never shorten it: a shorter window would prove an
    unresolved dispatch absent while it may still be applied (a second PATCH)."""
    for i, b in enumerate(bindings):
        _quota_dimensions_exist(i, b, operations)
        for setting, contract_field in _L1_FLOORS:
            value = getattr(b, setting)
            if value < 0:
                raise ConfigError(f"bindings[{i}].{setting}", f"must not be negative, got {value}")
            if value == 0:
                continue  # L1's own value
            for op in sorted(operations.values(), key=lambda o: o.name):
                floor = getattr(op.contract, contract_field)
                if op.provider == b.provider and value < floor:
                    raise ConfigError(
                        f"bindings[{i}].{setting}",
                        f"{value:g} s is shorter than the {floor:g} s L1 declares for"
                        f" {op.name}; L2 may only lengthen it")


def _quota_holds_the_clock_spread(bindings: tuple[BindingSettings, ...],
                                  operations: Mapping[str, OperationDefinition],
                                  clock_spread_us: int) -> None:
    """Every quota dimension a binding's provider declares can be scheduled with the
    replicas' clock spread (a fixed window must outlast its jitter plus the spread)."""
    providers = {b.provider for b in bindings}
    for op in sorted(operations.values(), key=lambda o: o.name):
        for dim in op.quotas if op.provider in providers else ():
            try:
                policy_of(dim, clock_spread_us)
            except QuotaPolicyError as exc:
                raise ConfigError("work.clock_spread",
                                  f"{op.provider} quota {dim.name}: {exc}") from None


def _quota_dimensions_exist(i: int, b: BindingSettings,
                            operations: Mapping[str, OperationDefinition]) -> None:
    """An L2 scope override names a dimension its provider's L1 declares, and only
    endpoint classes that dimension counts."""
    dims = {q.name: (q, op.provider_classes) for op in operations.values()
            if op.provider == b.provider for q in op.quotas}
    for q in b.quota:
        if q.dimension not in dims:
            raise ConfigError(f"bindings[{i}].quota.{q.dimension}",
                              f"{b.provider}'s L1 declares no such quota dimension"
                              f" (declared: {', '.join(sorted(dims)) or 'none'})")
        dim, classes = dims[q.dimension]
        counted = dim.endpoint_classes or classes
        for cls in q.endpoint_classes:
            if cls not in counted:
                raise ConfigError(
                    f"bindings[{i}].quota.{q.dimension}.endpoint_classes",
                    f"unknown endpoint class {cls!r} ({b.provider}'s {q.dimension} counts:"
                    f" {', '.join(sorted(counted)) or 'no endpoint class'})")


def _parse_listen(key: str, value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"expected host:port, got {value!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(key, f"expected host:port, got {value!r}") from None
    if not 0 <= port < 65536:
        raise ConfigError(key, f"port out of range: {port}")
    return host.strip("[]"), port


def parse_listen(value: str) -> tuple[str, int]:
    return _parse_listen("listen", value)


def load_settings(
    path: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    known_families: Collection[str],
) -> Settings:
    """Read ``path`` (or defaults when ``None``) and apply environment and secrets."""
    env = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    base_dir = os.getcwd()
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError("--config", f"no such file: {path}") from None
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from None
    return parse_settings(raw, environ=env, known_families=known_families, base_dir=base_dir)
