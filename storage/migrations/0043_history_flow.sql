-- The console's effect-path history (issue 23 item 1; seed 5.2: a read model, never a
-- second queue authority): commands accepted, and Runtime receipts confirmed with their
-- latencies, per minute, hour and day, per org, binding and provider operation. Written
-- in the transactions that write those facts (storage/history_flow.py: the admission's
-- INSERT of external_commands, the receipt's confirmation) and rebuilt from them
-- (`integrationd history rebuild`).
--   level_us, bucket_us, shard  as in history_rollup (0039)
--   metric      'accepted' (a command accepted in the bucket) or 'receipted' (a receipt
--               the Runtime confirmed in the bucket)
--   answer_le   receipted: the log bucket (daemon/core/latency.py) of accept -> provider
--               answer (external_commands.created_at_us -> result_receipts.created_at_us)
--   receipt_le  receipted: the log bucket of accept -> Runtime receipt
--               (-> result_receipts.confirmed_at_us); both 0 for 'accepted'
--   n           how many
-- One row holds both latencies' buckets, so a confirmation writes one row per level,
-- and either histogram is the sum over the other bucket.

CREATE TABLE history_flow (
    level_us BIGINT NOT NULL,
    bucket_us BIGINT NOT NULL,
    metric {KEY}(16) NOT NULL,
    org_id {KEY}(128) NOT NULL,
    binding_id {KEY}(128) NOT NULL,
    operation {KEY}(128) NOT NULL,
    answer_le INTEGER NOT NULL,
    receipt_le INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (level_us, bucket_us, metric, org_id, binding_id, operation, answer_le,
                 receipt_le, shard)
) {OPTS};
