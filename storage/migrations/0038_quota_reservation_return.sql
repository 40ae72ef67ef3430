-- A lost claim's unused quota slot comes back (issue 20 item 6; seed 9). The grant and
-- the reservation that binds its slot to the claim are now one fenced transaction, so a
-- claim lost afterwards leaves its reservation `reserved`; the replicas' quota sweep
-- gives such a slot back once its in-flight window has passed, and only when no request
-- can have left on it (daemon/core/lost_slots.py).
--   position_us  the slot's place on the key's TAT line (what a give-back names; a burst
--                or a fixed window grants several slots one send time). NULL: a row of
--                the previous build, which is never given back (counted as spent).
--   send_gate    what lets a request leave on the slot: 'checkpoint' (an effect: only a
--                dispatch checkpoint of this very claim), 'granted' (a read whose slot
--                reserve has not handed out yet), 'handed' (handed to a read, which sends
--                with no checkpoint). NULL: the previous build (counted as spent).
-- Nullable, no default: a replica of the previous build keeps working beside this one.

ALTER TABLE quota_reservations ADD COLUMN position_us BIGINT NULL;
ALTER TABLE quota_reservations ADD COLUMN send_gate {KEY}(16) NULL;

-- The sweep reads the `reserved` rows whose window has passed, oldest first.
CREATE INDEX quota_reservations_state_expiry ON quota_reservations (state, expires_at_us);
