-- Retention (issue 12): one pruner at a time, cluster-wide, by a lease row; the
-- last pass's figures (rows pruned per table, lag) for the console; each rule's
-- scan position (JSON), so a pass resumes where the last one stopped.

CREATE TABLE retention_leases (
    name {KEY}(64) NOT NULL PRIMARY KEY,
    holder {KEY}(128) NULL,
    lease_token {KEY}(32) NULL,
    until_us BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    batches_total BIGINT NOT NULL,
    sweep_started_at_us BIGINT NOT NULL,
    cursors_json {TEXT} NOT NULL,
    last_pass_at_us BIGINT NOT NULL,
    last_pass_json {TEXT} NOT NULL
) {OPTS};

-- Keyset scans in age order (age, then the key, so equal ages page exactly).
CREATE INDEX work_executions_retention ON work_executions (finished_at_us, work_id, ownership_epoch);

CREATE INDEX effect_attempts_retention ON effect_attempts (finished_at_us, attempt_id);

CREATE INDEX result_receipts_retention ON result_receipts (confirmed_at_us, command_id);

CREATE INDEX handoff_admissions_retention ON handoff_admissions (created_at_us, handoff_key);
