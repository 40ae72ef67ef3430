-- PrincipalBinding (seed 8.1): the durable fact behind every binding generation.
-- Transitions are compare-and-swap UPDATEs on generation and state, audited.

CREATE TABLE principal_bindings (
    binding_id {KEY}(128) NOT NULL PRIMARY KEY,
    kind {KEY}(16) NOT NULL,
    org_id {KEY}(128) NOT NULL,
    app_installation_id {KEY}(128) NOT NULL,
    provider {KEY}(64) NOT NULL,
    user_id {KEY}(128) NOT NULL,
    issuer {KEY}(255) NOT NULL,
    remote_account_id {KEY}(255) NOT NULL,
    remote_subject {KEY}(255) NOT NULL,
    installation_id {KEY}(255) NOT NULL,
    scopes_json {TEXT} NOT NULL,
    generation BIGINT NOT NULL,
    state {KEY}(16) NOT NULL,
    created_at_us BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

CREATE INDEX principal_bindings_org ON principal_bindings (org_id, provider);
