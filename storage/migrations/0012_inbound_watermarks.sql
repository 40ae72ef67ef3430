-- The inbound Flow's per-record watermarks (daemon/core/inbound_flow.py): for one remote
-- record (its locator hash: scope, remote object, remote id), the provider time of the
-- newest change applied to each inbound-owned field (canonical JSON {field: ns}), the
-- newest time a webhook delivered (lost-webhook detection), and the time the record was
-- observed destroyed. Provider times are integer nanoseconds since the epoch (the full
-- precision a provider's ISO 8601 text can carry). Compare-and-swap by row_version.

CREATE TABLE inbound_watermarks (
    locator_hash {KEY}(64) NOT NULL PRIMARY KEY,
    scope_digest {KEY}(64) NOT NULL,
    remote_object {KEY}(64) NOT NULL,
    remote_id {KEY}(255) NOT NULL,
    field_stamps {TEXT} NOT NULL,
    webhook_seen_ns BIGINT NOT NULL,
    deleted_ns BIGINT NULL,
    row_version BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};
