-- Distributed provider quota (seed 9): one budget row per quota key, shared by every
-- replica, and one reservation row per slot handed to an effect attempt.

CREATE TABLE quota_keys (
    quota_key {KEY}(255) NOT NULL PRIMARY KEY,
    -- Theoretical arrival time: the earliest start of the next slot (epoch us).
    tat_us BIGINT NOT NULL,
    -- A provider 429 blocks the key for everyone until then.
    blocked_until_us BIGINT NOT NULL,
    last_throttled_at_us BIGINT NOT NULL,
    throttles_total BIGINT NOT NULL,
    granted_total BIGINT NOT NULL,
    returned_total BIGINT NOT NULL,
    -- The policy of the latest grant, for operators (the caller's L1/L2 policy decides).
    limit_count INTEGER NOT NULL,
    window_us BIGINT NOT NULL,
    interval_us BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

CREATE TABLE quota_reservations (
    reservation_id {KEY}(32) NOT NULL PRIMARY KEY,
    quota_key {KEY}(255) NOT NULL,
    slot_at_us BIGINT NOT NULL,
    expires_at_us BIGINT NOT NULL,
    work_id {KEY}(32) NOT NULL,
    ownership_epoch BIGINT NOT NULL,
    attempt_id {KEY}(32) NULL,
    state {KEY}(16) NOT NULL,
    created_at_us BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

CREATE INDEX quota_reservations_key_state ON quota_reservations (quota_key, state);
CREATE INDEX quota_reservations_work ON quota_reservations (work_id, ownership_epoch);
