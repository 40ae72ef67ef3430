-- The console's quota history (issue 23 item 1; seed 5.2: a read model, never a second
-- queue authority): slots of each quota key per minute, hour and day of the slot's
-- time, written in the transactions that write the reservations (storage/history_quota.py)
-- and rebuilt from them (`integrationd history rebuild`). Use over an interval is
-- granted minus released, drawn against the key's limit (quota_keys: its latest policy).
--   level_us, bucket_us, shard  as in history_rollup (0039)
--   metric     'granted' (a slot reserved for a claim) or 'released' (one given back
--              unused: provably never sent)
--   n          how many
CREATE TABLE history_quota (
    level_us BIGINT NOT NULL,
    bucket_us BIGINT NOT NULL,
    quota_key {KEY}(255) NOT NULL,
    metric {KEY}(16) NOT NULL,
    shard INTEGER NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (level_us, bucket_us, quota_key, metric, shard)
) {OPTS};

-- The slots behind a point of one key (the History page's links).
CREATE INDEX quota_reservations_key_slot ON quota_reservations (quota_key, slot_at_us);
