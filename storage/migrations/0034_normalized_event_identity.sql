-- Per-event dedup (issue 10 item 3, seed 7). A route whose L1 payload contract declares
-- event_identity gives each NormalizedEvent a key over the route, the subscription
-- generation and the event's identity (daemon/core/ingress.py: event_key); the unique
-- index keeps one event per key, so a re-batched delivery that repeats events already
-- received creates only the new ones. NULL: the route declares no identity (events of
-- such routes, and every event written before this migration, are unique by receipt only).
-- The key lives as long as its event, which retention deletes with its receipt: event
-- dedup lasts exactly as long as the receipt dedup of the delivery that first brought it.
--
-- ingress_receipts.duplicate_events: how many events of a receipt were already there
-- (counted when it is materialized; visible on the console next to its events).

ALTER TABLE normalized_events ADD COLUMN identity_key {KEY}(120) NULL;
CREATE UNIQUE INDEX normalized_events_identity ON normalized_events (identity_key);
ALTER TABLE ingress_receipts ADD COLUMN duplicate_events BIGINT NOT NULL DEFAULT 0;
