-- Two more levels in the executions' history (issue 23 item 1): history_rollup (0039,
-- keyed by 0048) gains five minutes (level_us = 300000000, between the minute and the
-- hour) and six hours (21600000000, between the hour and the day; storage/history.py
-- EXECUTION_LEVELS_US). A step of 5 or 10 minutes (the 6 h preset, ranges up to 20 h)
-- reads a fifth of the rows a minute step does, a step of 6 or 12 hours (custom ranges
-- of 15 to 60 days) a sixth of the hour rows: the keys of 0048 had multiplied the rows
-- a narrowed range reads, and MariaDB read a binding's 30 days of hour rows through
-- history_rollup_binding, a primary-key lookup per row (EXPLAIN: ref, 73,740 rows).
-- Maintained by the statement that maintains the other levels
-- (storage/rollup_rows.add_at_levels: one conditional UPDATE of the five rows; an INSERT
-- when a key's five minutes or six hours are new), and written by
-- `integrationd history rebuild`.
-- Backfilled here, five minutes from the minute rows and six hours from the hour rows
-- (every row gets its new coarser levels, so the writers' invariant holds: a row
-- implies its coarser levels). Portable INSERT ... SELECT ... GROUP BY; no row of
-- either level exists before this migration.
-- During a rolling upgrade a previous build's increments skip the new levels (its
-- UPDATE names three), and a five minutes or six hours it opens has no row there, which
-- the new build's UPDATE then takes for a missing finer row (it counts that row
-- twice): run
-- `integrationd history rebuild --from <the upgrade's day>` once the last replica of
-- the previous build has stopped.
INSERT INTO history_rollup (level_us, bucket_us, family, outcome, org_id, binding_id,
    operation, shard, executions)
SELECT 300000000, bucket_us - (bucket_us % 300000000), family, outcome, org_id,
    binding_id, operation, shard, SUM(executions)
FROM history_rollup
WHERE level_us = 60000000
GROUP BY bucket_us - (bucket_us % 300000000), family, outcome, org_id, binding_id,
    operation, shard;

INSERT INTO history_rollup (level_us, bucket_us, family, outcome, org_id, binding_id,
    operation, shard, executions)
SELECT 21600000000, bucket_us - (bucket_us % 21600000000), family, outcome, org_id,
    binding_id, operation, shard, SUM(executions)
FROM history_rollup
WHERE level_us = 3600000000
GROUP BY bucket_us - (bucket_us % 21600000000), family, outcome, org_id, binding_id,
    operation, shard;
