-- The provider's last-modified time of a linked remote record as our own latest accepted
-- change left it (the answer named it: L1's response.updated_at), in epoch microseconds.
-- A dispatch copies it into its pre-dispatch evidence; a read-back that shows exactly
-- this time proves that dispatch was not applied (daemon/core/effects.py: reconcile).
-- NULL: unknown (no such change yet, or a provider whose answers do not say): the proof
-- then rests on the time rule alone, as before.

ALTER TABLE remote_links ADD COLUMN modified_at_us BIGINT NULL;
