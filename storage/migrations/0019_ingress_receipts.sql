-- Webhook ingress (seed 3.1, 4, 7): the IngressReceipt, durable before the 200, and the
-- NormalizedEvent the materializer derives from it, immutably.
--
-- ingress_receipts: one row per distinct delivery. dedup_key is unique (seed 7: the
-- provider's delivery id where L1 declares it stable, else a digest over subscription
-- generation, event name, resource type and id, delivered-at and the raw body's hash), so
-- a redelivery, a spooled copy forwarded twice, or two replicas receiving the same event
-- all collapse to one row for as long as receipts are kept (ingress.retention_days).
-- The raw body is kept byte-identical (base64: it need not be UTF-8). state: received
-- -> materialized | quarantined, each a conditional UPDATE on the current state.

CREATE TABLE ingress_receipts (
    receipt_id {KEY}(32) NOT NULL PRIMARY KEY,
    dedup_key {KEY}(120) NOT NULL,
    route {KEY}(64) NOT NULL,
    binding_id {KEY}(128) NOT NULL,
    webhook {KEY}(128) NOT NULL,
    subscription_generation BIGINT NOT NULL,
    received_at_us BIGINT NOT NULL,
    body_b64 {TEXT} NOT NULL,
    body_sha256 {KEY}(64) NOT NULL,
    body_bytes BIGINT NOT NULL,
    -- Safe headers only (content type, the provider's delivery id, its timestamp); never
    -- the signature.
    headers_json {TEXT} NOT NULL,
    -- "verified:<n>": the n-th active secret matched (0 = the newest).
    verification {KEY}(32) NOT NULL,
    -- direct | spool: whether the receipt went through the local spool first.
    via {KEY}(16) NOT NULL,
    replica_id {KEY}(255) NOT NULL,
    duplicates BIGINT NOT NULL,
    state {KEY}(16) NOT NULL,
    quarantine_reason {KEY}(32) NULL,
    quarantine_detail {TEXT} NULL,
    settled_at_us BIGINT NULL,
    row_version BIGINT NOT NULL
) {OPTS};

CREATE UNIQUE INDEX ingress_receipts_dedup ON ingress_receipts (dedup_key);
CREATE INDEX ingress_receipts_state ON ingress_receipts (state, received_at_us);
CREATE INDEX ingress_receipts_received ON ingress_receipts (received_at_us);

-- normalized_events: immutable, one per event a receipt carries; event_id is
-- "<receipt_id>:<index>", so a second materialization of one receipt collides. Written in
-- the transaction that settles its receipt and inserts its inbound_apply WorkItem.
CREATE TABLE normalized_events (
    event_id {KEY}(48) NOT NULL PRIMARY KEY,
    receipt_id {KEY}(32) NOT NULL,
    event_index INTEGER NOT NULL,
    provider {KEY}(64) NOT NULL,
    binding_id {KEY}(128) NOT NULL,
    event_name {KEY}(128) NOT NULL,
    kind {KEY}(16) NOT NULL,
    resource_type {KEY}(128) NOT NULL,
    resource_id {KEY}(255) NOT NULL,
    delivered_at {KEY}(64) NOT NULL,
    remote_updated_at {KEY}(64) NULL,
    subscription_generation BIGINT NOT NULL,
    attributes_json {TEXT} NOT NULL,
    work_id {KEY}(32) NOT NULL,
    created_at_us BIGINT NOT NULL
) {OPTS};

CREATE INDEX normalized_events_receipt ON normalized_events (receipt_id);
