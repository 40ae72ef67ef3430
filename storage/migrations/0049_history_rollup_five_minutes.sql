-- A five-minute level in the executions' history (issue 23 item 1): history_rollup
-- (0039, keyed by 0048) gains level_us = 300000000 between the minute and the hour
-- (storage/history.py EXECUTION_LEVELS_US), so a step of 5 or 10 minutes (the 6 h
-- preset, and ranges up to 20 h) reads a fifth of the rows a minute step does; a
-- narrowed 6 h range read ~7x the unkeyed rollup's minute rows before. Maintained by the
-- statement that maintains the other levels (storage/rollup_rows.add_at_levels: one
-- conditional UPDATE of the four rows; an INSERT when a key's five minutes are new),
-- and written by `integrationd history rebuild`.
-- Backfilled here from the minute rows (every minute row has its five minutes, so the
-- writers' invariant holds: a row implies its coarser levels). A portable
-- INSERT ... SELECT ... GROUP BY; no five-minute row exists before this migration.
-- During a rolling upgrade a previous build's increments skip the five-minute rows
-- (its UPDATE names three levels), and a minute it opens has no five-minute row, which
-- the new build's UPDATE then takes for a missing minute: run
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
