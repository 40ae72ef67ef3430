-- The console's flow sample (admin_ui/readmodels.py): per sample interval, commands
-- accepted, effect attempts answered and receipts confirmed, each a range read on
-- its own time column (bounded by the interval, never a table scan).

CREATE INDEX external_commands_created ON external_commands (created_at_us);

CREATE INDEX effect_attempts_finished ON effect_attempts (finished_at_us, outcome);

CREATE INDEX result_receipts_confirmed ON result_receipts (confirmed_at_us);
