-- Command admission (the Runtime handoff fence), external commands, the effect
-- journal, remote links and Runtime result receipts.

CREATE TABLE handoff_admissions (
    handoff_key {KEY}(512) NOT NULL PRIMARY KEY,
    org_id {KEY}(128) NOT NULL,
    app_installation_id {KEY}(128) NOT NULL,
    runtime_capability_id {KEY}(128) NOT NULL,
    runtime_work_binding_digest {KEY}(128) NOT NULL,
    payload_digest {KEY}(80) NOT NULL,
    runtime_outbox_id {KEY}(255) NOT NULL,
    admission {KEY}(32) NOT NULL,
    command_id {KEY}(32) NULL,
    receipt_json {TEXT} NULL,
    created_at_us BIGINT NOT NULL
) {OPTS};

CREATE TABLE handoff_quarantine (
    quarantine_id {KEY}(32) NOT NULL PRIMARY KEY,
    handoff_key {KEY}(512) NOT NULL,
    runtime_name {KEY}(128) NOT NULL,
    reason {KEY}(64) NOT NULL,
    presented_payload_digest {KEY}(80) NOT NULL,
    presented_outbox_id {KEY}(255) NOT NULL,
    at_us BIGINT NOT NULL
) {OPTS};

CREATE INDEX handoff_quarantine_key ON handoff_quarantine (handoff_key);

CREATE TABLE external_commands (
    command_id {KEY}(32) NOT NULL PRIMARY KEY,
    handoff_key {KEY}(512) NULL,
    org_id {KEY}(128) NOT NULL,
    app_installation_id {KEY}(128) NOT NULL,
    runtime_capability_id {KEY}(128) NOT NULL,
    runtime_work_binding_digest {KEY}(128) NOT NULL,
    runtime_name {KEY}(128) NOT NULL,
    intent_id {KEY}(255) NOT NULL,
    intent_kind {KEY}(32) NOT NULL,
    operation {KEY}(128) NOT NULL,
    local_object {KEY}(64) NOT NULL,
    local_id {KEY}(255) NOT NULL,
    binding_id {KEY}(128) NOT NULL,
    binding_generation BIGINT NOT NULL,
    catalog_revision BIGINT NOT NULL,
    frozen_request {TEXT} NOT NULL,
    payload_digest {KEY}(80) NOT NULL,
    runtime_outbox_id {KEY}(255) NOT NULL,
    settlement {KEY}(32) NOT NULL,
    repair_of {KEY}(32) NULL,
    created_at_us BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

CREATE UNIQUE INDEX external_commands_handoff ON external_commands (handoff_key);

CREATE INDEX external_commands_local ON external_commands (local_object, local_id);

CREATE TABLE effect_attempts (
    attempt_id {KEY}(32) NOT NULL PRIMARY KEY,
    command_id {KEY}(32) NOT NULL,
    work_id {KEY}(32) NOT NULL,
    ownership_epoch BIGINT NOT NULL,
    lease_token {KEY}(32) NOT NULL,
    method {KEY}(16) NOT NULL,
    target_path {KEY}(512) NOT NULL,
    safe_headers {TEXT} NOT NULL,
    body_sha256 {KEY}(80) NOT NULL,
    idempotency_key {KEY}(128) NOT NULL,
    pre_dispatch_evidence {TEXT} NOT NULL,
    dispatch_started_at_us BIGINT NOT NULL,
    response_status INTEGER NULL,
    provider_evidence {TEXT} NULL,
    outcome {KEY}(32) NULL,
    failure_class {KEY}(64) NULL,
    finished_at_us BIGINT NULL,
    disposition {KEY}(32) NULL,
    disposition_note {TEXT} NULL,
    disposition_by {KEY}(128) NULL,
    disposition_at_us BIGINT NULL,
    row_version BIGINT NOT NULL
) {OPTS};

CREATE UNIQUE INDEX effect_attempts_claim ON effect_attempts (work_id, ownership_epoch);

CREATE INDEX effect_attempts_command ON effect_attempts (command_id);

CREATE INDEX effect_attempts_outcome ON effect_attempts (outcome, disposition);

CREATE TABLE remote_links (
    link_key {KEY}(80) NOT NULL PRIMARY KEY,
    scope_digest {KEY}(64) NOT NULL,
    local_object {KEY}(64) NOT NULL,
    local_id {KEY}(255) NOT NULL,
    remote_object {KEY}(64) NULL,
    remote_id {KEY}(255) NULL,
    locator_hash {KEY}(64) NULL,
    active_locator {KEY}(64) NULL,
    state {KEY}(32) NOT NULL,
    generation BIGINT NOT NULL,
    created_at_us BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

CREATE UNIQUE INDEX remote_links_active_locator ON remote_links (active_locator);

CREATE TABLE result_receipts (
    command_id {KEY}(32) NOT NULL PRIMARY KEY,
    intent_id {KEY}(255) NOT NULL,
    result_format_version INTEGER NOT NULL,
    remote_id {KEY}(255) NOT NULL,
    canonical_result {TEXT} NOT NULL,
    result_digest {KEY}(80) NOT NULL,
    state {KEY}(32) NOT NULL,
    last_error {KEY}(128) NULL,
    created_at_us BIGINT NOT NULL,
    confirmed_at_us BIGINT NULL
) {OPTS};

CREATE INDEX result_receipts_state ON result_receipts (state, created_at_us);
