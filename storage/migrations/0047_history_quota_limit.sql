-- The quota history's limit in force at the time (issue 23 item 1): a 'granted' row of
-- history_quota (0044) records the policy its latest grant was made under (limit_count
-- slots per window_us), set by the same UPDATE or INSERT that counts the grant
-- (storage/history_quota.py), so the page draws each step against the limit then, not
-- the key's latest. NULL: rows written before this migration, and 'released' rows; the
-- page falls back to the key's latest policy there. A rebuild keeps the recorded limits
-- (the reservations do not record them).
ALTER TABLE history_quota ADD COLUMN limit_count BIGINT NULL;
ALTER TABLE history_quota ADD COLUMN window_us BIGINT NULL;
