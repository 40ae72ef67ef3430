-- The console's history read model (issue 23 item 1; seed 5.2: a read model, never a
-- second queue authority). One row counts the executions journaled in one minute, hour
-- or day (three levels, so a long range reads few rows) for one family and outcome; it is written in the same transaction as the work_executions
-- rows it counts (storage/history.py) and can be rebuilt from them
-- (`integrationd history rebuild`). Rows outlive the journal's retention, so long
-- ranges stay cheap and old history stays.
--   level_us   the bucket's length: 60 s, 1 h or 1 d (microseconds)
--   bucket_us  the bucket's first microsecond (UTC epoch microseconds, a multiple of level_us)
--   shard      0..3, chosen per journaling transaction, so that replicas finishing the
--              same family and outcome at the same time update different rows (no
--              lock queue on one hot row); readers sum the shards
--   executions how many executions finished there

CREATE TABLE history_rollup (
    level_us BIGINT NOT NULL,
    bucket_us BIGINT NOT NULL,
    family {KEY}(64) NOT NULL,
    outcome {KEY}(32) NOT NULL,
    shard INTEGER NOT NULL,
    executions BIGINT NOT NULL,
    PRIMARY KEY (level_us, bucket_us, family, outcome, shard)
) {OPTS};

-- The per-family view of a range reads this one.
CREATE INDEX history_rollup_family ON history_rollup (level_us, family, bucket_us);
