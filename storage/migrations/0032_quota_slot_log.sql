-- The slot log of a quota key whose sliding window has a burst (daemon/core/quota.py,
-- "Bursts"): an entry per newest slot (its position on the TAT line, or its start if
-- later), oldest first, as the first entry and then each one's distance from the one
-- before, comma-separated. NULL: the key keeps no log (no burst, a fixed window, or a
-- limit above SLOT_LOG_MAX); a key that starts keeping one then guesses its history as
-- late as it could have been, so the NULL of an old row is safe.

ALTER TABLE quota_keys ADD COLUMN slot_log {TEXT} NULL;
