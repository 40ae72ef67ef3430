-- The executions' history per org, binding and provider operation (issue 23 item 1):
-- history_rollup (0039) gains the effect item's org, binding and operation in its key,
-- so the History page's executions and DLQ inflow charts narrow by them as the effect
-- path's do. Written by the same journaling transaction as before (storage/history.py:
-- an item of the effect family is counted under its command's org, binding and
-- operation, read by primary key in that transaction); every other family's items,
-- and every row written before this migration, carry '' (none). Still a read model
-- (seed 5.2), rebuilt from work_executions joined to their items and commands by
-- `integrationd history rebuild`.
-- A primary key cannot be changed in place on SQLite: the table is rebuilt, its rows
-- copied with '' for the new columns (their default, so a previous build's INSERT still
-- works). During a rolling upgrade a previous build's increment of an effect item
-- (UPDATE ... WHERE level, bucket, family, outcome, shard) adds to every key of that
-- minute's effect rows: run `integrationd history rebuild --from <the upgrade's day>`
-- once the last replica of the previous build has stopped.
CREATE TABLE history_rollup_keyed (
    level_us BIGINT NOT NULL,
    bucket_us BIGINT NOT NULL,
    family {KEY}(64) NOT NULL,
    outcome {KEY}(32) NOT NULL,
    org_id {KEY}(128) NOT NULL DEFAULT '',
    binding_id {KEY}(128) NOT NULL DEFAULT '',
    operation {KEY}(128) NOT NULL DEFAULT '',
    shard INTEGER NOT NULL,
    executions BIGINT NOT NULL,
    PRIMARY KEY (level_us, bucket_us, family, outcome, org_id, binding_id, operation, shard)
) {OPTS};

INSERT INTO history_rollup_keyed (level_us, bucket_us, family, outcome, org_id, binding_id,
    operation, shard, executions)
SELECT level_us, bucket_us, family, outcome, '', '', '', shard, executions
FROM history_rollup;

DROP TABLE history_rollup;

ALTER TABLE history_rollup_keyed RENAME TO history_rollup;

-- The per-family view of a range, as before; and one per filter, each an index range
-- of (level, value, bucket) so a narrowed range reads only its own key's rows.
CREATE INDEX history_rollup_family ON history_rollup (level_us, family, bucket_us);
CREATE INDEX history_rollup_org ON history_rollup (level_us, org_id, bucket_us);
CREATE INDEX history_rollup_binding ON history_rollup (level_us, binding_id, bucket_us);
CREATE INDEX history_rollup_operation ON history_rollup (level_us, operation, bucket_us);
