-- Every operator action on a command (retire, repair, replay of its work) first bumps
-- this counter on the command's row, in the transaction that decides the action: two
-- actions on one command, or an action and the effect runner's settlement (which writes
-- the same row), are then serialized by the row (a row lock on one node, a
-- certification conflict at COMMIT across Galera nodes), and each decides on what the
-- other committed. A counter, so the statement always changes the row.
ALTER TABLE external_commands ADD COLUMN operator_version BIGINT NOT NULL DEFAULT 0;
