-- The console's reads at 1,000,000 items (bench/admin_ui.py).
--
-- The flow sample (storage/flow.py): per sample interval, commands accepted, effect
-- attempts answered and receipts confirmed, each a range read on its own time column
-- (bounded by the interval, never a table scan).

CREATE INDEX external_commands_created ON external_commands (created_at_us);

CREATE INDEX effect_attempts_finished ON effect_attempts (finished_at_us, outcome);

CREATE INDEX result_receipts_confirmed ON result_receipts (confirmed_at_us);

-- The DLQ filtered by failure class (and family): without it a class that matches few
-- dead items scanned every dead item newest first (at 1,000,000 items the page timed
-- out with 503). With it, equality on (state, class, family) reads newest first and
-- stops at the page size; a class that matches nothing is an empty range.
CREATE INDEX work_items_dead_class ON work_items (state, failure_class, family, work_id);
