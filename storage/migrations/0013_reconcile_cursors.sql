-- Cursor reconciliation (daemon/core/cursor.py): one row per stream (binding and
-- resource). The cursor is the greatest (provider updatedAt, record id) a run produced,
-- the time as the provider's text and as integer nanoseconds (full precision); it moves
-- in the same transaction as the inbound_apply WorkItems of the page that moved it.
-- `runs` numbers the incremental runs (the next run's dedupe key). Compare-and-swap by
-- row_version.

CREATE TABLE reconcile_cursors (
    stream_key {KEY}(200) NOT NULL PRIMARY KEY,
    binding_id {KEY}(128) NOT NULL,
    resource {KEY}(64) NOT NULL,
    cursor_ns BIGINT NULL,
    cursor_text {KEY}(64) NULL,
    cursor_id {KEY}(255) NULL,
    runs BIGINT NOT NULL,
    last_run_at_us BIGINT NULL,
    row_version BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};
