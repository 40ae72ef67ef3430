-- Operator repair lineage: at most one repair command per original command
-- (seed 10: a repair cannot multiply effects). NULL repair_of (every handed-off
-- command) is not constrained: unique indexes admit many NULLs on every backend.

CREATE UNIQUE INDEX external_commands_repair_of ON external_commands (repair_of);
