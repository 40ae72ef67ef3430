-- Retention prunes ingress receipts (issue 12 item 4): its keyset scan walks
-- (received_at_us, receipt_id), which this index serves as a range on every engine
-- (SQLite's index on received_at_us alone ends in the rowid, not the receipt id).
CREATE INDEX ingress_receipts_retention ON ingress_receipts (received_at_us, receipt_id);
