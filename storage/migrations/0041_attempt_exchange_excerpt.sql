-- A failed provider call's exchange on its attempt (issue 23 item 2): the request body
-- sent and the response's allow-listed headers and body, each a redacted excerpt of at
-- most 2,048 characters (daemon/core/exchange_excerpt.py), as one JSON text. Written by
-- the UPDATE that records the attempt's outcome (no extra statement), only for a call
-- that failed; NULL for successes and for attempts recorded before this migration.
ALTER TABLE effect_attempts ADD COLUMN exchange_excerpt {TEXT} NULL;
