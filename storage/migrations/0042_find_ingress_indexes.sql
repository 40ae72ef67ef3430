-- "Find anything" at size (issue 23, bench.seqload: 500,000 ingress receipts): the
-- ingress list filtered by state, newest first by receipt id. The state index of 0019
-- ends with received_at_us, so a state's page sorted all of that state's receipts
-- (20,528 quarantined: 667 ms under load). This one leads with the state and ends with
-- the id, as 0040's: a page is one range read backwards, stopping at the page size.
-- (No binding index: with one, MariaDB intersected it with this one for state plus
-- binding and read both ranges whole, 1.9 s; without it, that filter walks the state's
-- range newest first and meets a page of the binding's receipts early.)
CREATE INDEX ingress_receipts_find_state ON ingress_receipts (state, receipt_id);
