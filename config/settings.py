"""The settings model: every key integrationd reads, with its default.

Values are ``@attrs.frozen``; :mod:`config.load` builds them from TOML,
environment overrides and secret files, and names the offending key in every
error. Secrets are :class:`Secret` values whose ``repr`` hides them.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Secret:
    """A secret value. ``repr`` and ``str`` never show it."""

    value: str = attrs.field(repr=False)

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__

    def reveal(self) -> str:
        return self.value


@attrs.frozen(kw_only=True)
class StorageSettings:
    url: str = "sqlite:///var/integrationd.db"
    password: Secret | None = None
    pool_size: int = 8
    sqlite_synchronous: str = "FULL"
    # Seconds: a connect (greeting and authentication included); one statement,
    # COMMIT or ROLLBACK (SQLite: waiting for the write lock); and how long
    # `run` and `migrate` wait for a database that is still coming up.
    connect_timeout: float = 5.0
    statement_timeout: float = 15.0
    startup_timeout: float = 120.0
    # Seconds `migrate` gives one migration (each statement and the whole of it; its
    # DDL may rebuild a table of millions of rows), and waits for one that another
    # migrator is applying.
    migration_timeout: float = 3600.0


@attrs.frozen(kw_only=True)
class ReplicaSettings:
    id: str = ""
    heartbeat_interval: float = 5.0
    drain_timeout: float = 30.0
    # Seconds a token refresh whose call left reads the provider's answer, past its
    # refresh lease if need be: with rotating refresh tokens only that answer can heal
    # the grant (docs/quota-and-credentials.md). A drain cuts it at drain_timeout + 2 s.
    refresh_answer_wait: float = 90.0


@attrs.frozen(kw_only=True)
class AdminSettings:
    listen: str = "127.0.0.1:8780"
    # As api.keep_alive (the console's browsers and the CLI).
    keep_alive: float = 20.0
    # "password": operators sign in with name + password (argon2 hashes below);
    # "proxy": a trusted reverse proxy authenticates and sends the operator
    # name in ``proxy_user_header`` (roles still come from [[operators]]).
    auth: str = "password"
    proxy_user_header: str = "X-Remote-User"
    session_ttl: float = 8 * 3600.0
    # Signs session cookies. From the admin-session-secret credential,
    # admin.session_secret_file or $INTEGRATIOND_ADMIN_SESSION_SECRET; when
    # unset, a random one per process (sessions end at restart).
    session_secret: Secret | None = None


@attrs.frozen(kw_only=True)
class WorkSettings:
    poll_interval: float = 0.25
    reclaim_interval: float = 1.0
    depth_sample_interval: float = 5.0
    concurrency: int = 256
    lease_margin: float = 5.0
    # How far apart the replicas' wall clocks may be, for the provider quota schedule:
    # slots are spaced wider by this much, while a send still starts only within its L1
    # jitter (daemon/core/quota.py, "Replicas' clocks"). 0: clocks agree (NTP keeps them
    # within milliseconds; set it to what yours guarantees).
    clock_spread: float = 0.0
    # Idle pause after a database error, doubling up to the cap.
    db_backoff_cap: float = 5.0
    # The finalizations' group commit: the longest a handler's finalization waits for the
    # replica's other running handlers to finish too, so that one transaction commits them
    # all (0: each flush goes at once; daemon/services/completer.py).
    finalize_linger: float = 0.005

    @property
    def clock_spread_us(self) -> int:
        return int(self.clock_spread * 1_000_000)


@attrs.frozen(kw_only=True)
class FamilySettings:
    max_attempts: int = 5
    lease_ttl: float = 30.0
    batch_size: int = 64
    concurrency: int = 128
    backoff_base: float = 1.0
    backoff_cap: float = 300.0


# Defaults per built-in family where the generic ones do not fit: receipts are
# retried until the Runtime confirms them (effectively forever, backoff capped at
# a minute); effects get a handful of attempts before waiting for an operator.
FAMILY_DEFAULTS: dict[str, FamilySettings] = {
    # Trivial handlers: bigger batches amortize each claim and finalize round trip.
    "noop": FamilySettings(batch_size=128, concurrency=256),
    "external_effect": FamilySettings(max_attempts=8, backoff_base=2.0, backoff_cap=60.0,
                                      batch_size=32),
    "runtime_receipt": FamilySettings(max_attempts=1_000_000, backoff_base=1.0,
                                      backoff_cap=60.0, batch_size=32),
    # An inbound change: the webhook materializer's 8 (its built-in before the family's
    # setting reached it), now also for a cursor reconcile's changes (5 before).
    "inbound_apply": FamilySettings(max_attempts=8),
}


@attrs.frozen(kw_only=True)
class Operator:
    name: str
    role: str  # viewer | operator | admin
    # argon2id PHC string (``integrationd hash-password`` prints one); empty
    # means this operator cannot sign in with a password (proxy mode only).
    password_hash: str = attrs.field(default="", repr=False)


ROLES = ("viewer", "operator", "admin")


@attrs.frozen(kw_only=True)
class ApiSettings:
    """The service API (``/v1/``) the CRM Runtime calls."""

    listen: str = "127.0.0.1:8781"
    # Seconds an idle kept-alive connection stays open, and the most a client may take to
    # send a request's head (hypercorn uses one timer for both: the slow-loris bound).
    # Longer than our clients keep theirs (a Runtime's should expire before this).
    keep_alive: float = 20.0
    # A whole request, batches included: 64 commands of a typical size fit.
    max_body_bytes: int = 256 * 1024
    max_batch_commands: int = 100


@attrs.frozen(kw_only=True)
class RuntimeClient:
    """One trusted Runtime caller (``[[runtimes]]``) and its complete work scope.

    The scope comes from here, bound to the bearer token the Runtime presents;
    it is never read from a request body.
    """

    name: str
    org_id: str
    app_installation_id: str
    runtime_capability_id: str
    runtime_work_binding_digest: str
    # Where terminal result receipts are committed (CommitResultRequest).
    results_url: str = ""
    # Where many receipts are committed in one request ({"results": [...]}, one answer
    # each, in order; docs/runtime-handoff.md); empty: one POST to results_url per receipt.
    results_batch_url: str = ""
    # Seconds the Runtime's results server keeps an idle connection open (0: unknown).
    # Our pooled connections to it expire at half of it, or at 4 s when unknown, so a
    # receipt is never sent on a connection the Runtime is closing (and then resent).
    keep_alive: float = 0.0
    token: Secret | None = None
    results_token: Secret | None = None


# What an L2 binding may count an L1 quota dimension against (config/definitions.py's
# scopes, or an explicit provider quota key shared across bindings).
L2_QUOTA_SCOPES = ("app_installation", "binding", "org", "provider_key")


@attrs.frozen(kw_only=True)
class QuotaScope:
    """``[bindings.quota.<dimension>]``: ``scope`` ("": L1's), ``key`` for
    ``provider_key``, and ``endpoint_classes``: the classes whose calls count against a
    budget of their own for this binding (the provider counts them apart)."""

    dimension: str
    scope: str
    key: str = ""
    endpoint_classes: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class BindingSettings:
    """An L2 binding: one provider account used by one org/app installation."""

    binding_id: str
    provider: str
    org_id: str
    app_installation_id: str
    remote_account_id: str
    base_url: str
    # Only the bootstrap of the durable PrincipalBinding's generation (used when the
    # binding has no row yet); after that the durable row decides.
    generation: int = 1
    timeout: float = 10.0
    # L2 policy may only *lengthen* the in-flight window L1 declares for the
    # provider's operations (0: L1's); a shorter one is a configuration error.
    max_in_flight: float = 0.0
    # The largest clock difference assumed between us and the provider when a
    # read-back's last-modified time is compared with our dispatch time; again
    # at least what L1 declares (0: L1's).
    max_clock_skew: float = 0.0
    # How calls authenticate: "grant" (the binding generation's AuthorizationGrant: a
    # sealed token, refreshed by one winner through token_url) or "static_token" (the
    # token below, never refreshed: for the sandbox; declared explicitly).
    auth: str = "grant"
    token: Secret | None = None
    # auth = "grant": the OAuth token endpoint and the client that refreshes the grant.
    token_url: str = ""
    client_id: str = ""
    client_secret: Secret | None = None
    # auth = "s2s": a server-to-server app installation's one-hour token, minted by one
    # winner with an RS256 app JWT (``iss`` = s2s_app_id, signed by the app's RSA private
    # key, read from s2s_private_key_file or the credential binding-ID-s2s-key, never the
    # TOML) at token_url, where "{installation_id}" is the durable binding's installation
    # (bootstrapped from s2s_installation_id; `integrationd binding change --installation`
    # moves it, and the binding's generation with it).
    s2s_app_id: str = ""
    s2s_installation_id: str = ""
    s2s_private_key: Secret | None = None
    # L2 overrides of the scope L1's quota dimensions are counted against.
    quota: tuple[QuotaScope, ...] = ()

    def quota_scope(self, dimension: str) -> QuotaScope | None:
        return next((q for q in self.quota if q.dimension == dimension), None)


AUTH_KINDS = ("grant", "static_token", "s2s")


@attrs.frozen(kw_only=True)
class KeysSettings:
    """Token-bundle encryption keys (never in the TOML: only where to find them).

    Each key is 32 bytes, as 64 hex digits or base64, in the systemd credential
    ``token-key-ID`` or the file ``dir/ID.key``. ``active`` seals new bundles; every key
    id that still seals a stored bundle must be loadable too.
    """

    active: str = ""
    # Comma-separated ids of older keys still needed to open stored bundles.
    previous: str = ""
    dir: str = ""


@attrs.frozen(kw_only=True)
class CatalogSettings:
    # The Catalog revision this deployment serves; commands must name the same one.
    revision: int = 1
    # A directory of L1 definitions (*.toml) served instead of the shipped
    # config/providers/ (relative to the working directory; a sandbox whose simulators
    # declare their own, shorter, windows); empty: the shipped ones.
    definitions_dir: str = ""
    # A directory of L2 object bindings (*.toml: which local object mirrors which remote
    # resource, and which side owns each field) instead of the shipped config/bindings/.
    object_bindings_dir: str = ""


@attrs.frozen(kw_only=True)
class IngressSettings:
    """The webhook ingress listener (``POST /hooks/{route}``) and its local spool."""

    # "" = no ingress listener (no [[webhook_routes]] either).
    listen: str = "127.0.0.1:8782"
    max_body_bytes: int = 1024 * 1024
    # The request line and headers together (hypercorn refuses more with 431/400).
    max_header_bytes: int = 16 * 1024
    # Seconds for the body to arrive (408 after it), and again for the receipt to be made
    # durable: twice this must be inside every route's L1 response_window.
    request_deadline: float = 2.0
    # How long the database may take to make a receipt durable before it goes to the
    # spool instead (within request_deadline).
    db_deadline: float = 0.75
    # The local spool (relative to the working directory): append-only, fsynced files.
    spool_dir: str = "var/spool/ingress"
    spool_max_bytes: int = 256 * 1024 * 1024
    # Receipts (and so exact dedup) are kept this long.
    retention_days: float = 14.0
    forward_interval: float = 1.0
    materialize_interval: float = 0.5
    materialize_batch: int = 64


@attrs.frozen(kw_only=True)
class WebhookRoute:
    """An L2 webhook route (``[[webhook_routes]]``): ``POST /hooks/<route>`` receives the
    deliveries of one L1 webhook contract for one binding."""

    route: str
    binding_id: str
    webhook: str                 # the L1 ``[webhooks."<name>"]`` contract
    subscription_generation: int = 1
    # The URL the provider calls, when its signature covers the URI (behind a proxy
    # the request's own URL is not it); "" = the request's own.
    public_url: str = ""
    # Active secrets, newest first (during a rotation both the new and the previous one).
    secret: Secret | None = None
    previous_secret: Secret | None = None
    # Raised by the operator with each new ``secret``: the subscription reconciler then
    # subscribes again with the new secret, keeps the old subscription until a delivery
    # verified with the new secret is seen, then deletes it (docs/subscriptions.md).
    secret_generation: int = 1

    def secrets(self) -> tuple[bytes, ...]:
        return tuple(s.reveal().encode() for s in (self.secret, self.previous_secret)
                     if s is not None)


@attrs.frozen(kw_only=True)
class RetentionSettings:
    """The pruner (docs/retention.md): one replica at a time, by a lease in the database."""

    enabled: bool = True
    # Days after which terminal WorkItems, their executions, resolved effect attempts and
    # confirmed Runtime receipts are deleted.
    work_days: float = 30.0
    # Days kept for facts that must outlive the Runtime's outbox, redelivery and workflow
    # windows (seed 6.1): handoff admission facts, rejection tombstones and dedup facts
    # (terminal items with a dedupe_key). Must be longer than work_days.
    facts_days: float = 400.0
    # Days a settled external command is kept after it settled (and only once its
    # admission fact, work, attempts and receipt duty are gone). At least facts_days:
    # the admission fact is what deduplicates a repeated handoff key.
    commands_days: float = 400.0
    # Days the evidence of conflicting handoff repeats (handoff_quarantine) is kept.
    quarantine_days: float = 90.0
    # Seconds between passes; the lease a pass holds (renewed by every batch).
    interval: float = 300.0
    lease_ttl: float = 60.0
    # One batch (one transaction): at most this many rows and bytes of row text.
    batch_rows: int = 500
    batch_bytes: int = 8_000_000
    # Seconds between full sweeps (each scan restarts from its beginning).
    sweep_interval: float = 86400.0


# Adapter kinds a [[legacy_claimants]] entry may name.
LEGACY_ADAPTERS = ("sql",)


@attrs.frozen(kw_only=True)
class LegacyClaimantSettings:
    """The legacy owner of one work family, as the cutover proves it (seed 11.1;
    docs/operations.md, "Your legacy claimant"). ``adapter = "sql"``: statements
    over its tables in the same database, ``:family`` where the family goes."""

    family: str = ""
    adapter: str = "sql"
    # An UPDATE touching every live (pending or claimed) legacy row: the lock that
    # makes the counts one decision with the step.
    lock_sql: str = ""
    # One row, one count each: its active claims and leases; its eligible items
    # that no WorkItem covers.
    processing_sql: str = ""
    uncovered_sql: str = ""
    # Optional, one name per row: its live claim-capable processes (besides the
    # heartbeats in claimant_processes); its claim transactions still open.
    processes_sql: str = ""
    open_claims_sql: str = ""


@attrs.frozen(kw_only=True)
class Settings:
    storage: StorageSettings = StorageSettings()
    replica: ReplicaSettings = ReplicaSettings()
    admin: AdminSettings = AdminSettings()
    work: WorkSettings = WorkSettings()
    families: dict[str, FamilySettings] = attrs.field(factory=dict)
    operators: tuple[Operator, ...] = ()
    api: ApiSettings = ApiSettings()
    runtimes: tuple[RuntimeClient, ...] = ()
    bindings: tuple[BindingSettings, ...] = ()
    catalog: CatalogSettings = CatalogSettings()
    keys: KeysSettings = KeysSettings()
    ingress: IngressSettings = IngressSettings()
    webhook_routes: tuple[WebhookRoute, ...] = ()
    retention: RetentionSettings = RetentionSettings()
    legacy_claimants: tuple[LegacyClaimantSettings, ...] = ()
    # Directory that relative paths (the SQLite file) resolve against.
    base_dir: str = "."

    def family(self, name: str) -> FamilySettings:
        return self.families.get(name) or FAMILY_DEFAULTS.get(name, FamilySettings())

    def operator(self, name: str) -> Operator | None:
        for op in self.operators:
            if op.name == name:
                return op
        return None
