-- The refresh call's dispatch marker, on the refresh lease row (seed 8.2): a rotating
-- refresh token must never be presented twice, so a successor has to know whether an
-- expired lease's call ever left.
--   call_token       the lease token the owner took the lease under, written by the
--                    acquisition itself: a lease whose call_token differs from its
--                    lease_token was taken by a build that writes no marker (its call's
--                    fate is unknown, so it counts as dispatched).
--   call_sent_at_us  committed right before the provider call, by a compare-and-swap on
--                    the live lease token; NULL: the call never left.
-- A lease with a marker is never taken over for the same token version: the successor
-- marks the grant in doubt (refresh_in_doubt) and the owner's late answer heals it.
-- Nullable, no default: a replica of the previous build, which names neither column,
-- keeps working beside this one.

ALTER TABLE refresh_leases ADD COLUMN call_token {KEY}(32) NULL;
ALTER TABLE refresh_leases ADD COLUMN call_sent_at_us BIGINT NULL;
