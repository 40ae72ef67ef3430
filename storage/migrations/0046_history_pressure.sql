-- The console's history of the work queue's own pressure (issue 23 item 1; seed 5.2:
-- a read model, never a second queue authority): per family, how many items were
-- ready, waiting (a retry's backoff, or held: pending until a later run_after, such as
-- a quota deferral) and claimed, sampled from work_items once a minute by one replica
-- (storage/history_pressure.py). A sample is counted from the WorkItems themselves,
-- so nothing accumulates and nothing can drift; what happens between two samples is
-- not seen (a peak that comes and goes within the minute).
--   level_us, bucket_us  as in history_rollup (0039): minute rows are the samples;
--              hour and day rows hold the highest sample of their hour or day
--              (rebuilt from the minute rows by `integrationd history rebuild`)
--   family     the work family, or '*' for the sum over families; the '*' rows are
--              written for every sample, zeros too, and mark the minute as sampled
--              (the first writer of a minute's '*' rows samples it: one replica)
--   series     'ready' (pending or retry, due), 'retry_wait' (retry, not yet due),
--              'held' (pending, not yet due), 'claimed' (processing)
--   n          the count (at most the sampler's cap per family and series)
--   more       1 when a count stopped at the cap (at least n)
CREATE TABLE history_pressure (
    level_us BIGINT NOT NULL,
    bucket_us BIGINT NOT NULL,
    family {KEY}(64) NOT NULL,
    series {KEY}(16) NOT NULL,
    n BIGINT NOT NULL,
    more INTEGER NOT NULL,
    PRIMARY KEY (level_us, bucket_us, family, series)
) {OPTS};
