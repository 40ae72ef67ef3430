"""A reference legacy claimant: the shape of an old event executor that integrationd
migrates a work family from and rolls it back to (seed 11).

It has its own event table (``legacy_events``, created by :func:`store.install`,
not by integrationd's migrations) and its own claim loop (``python -m
sandbox.legacy.worker``). It is *rollback-bridge compatible*: its claim
statement reads the family's owner-generation row, it heartbeats into
``claimant_processes``, and it writes a ``LegacyOutcomeReceipt`` in the same
transaction as every terminal transition of an event whose WorkItem is fenced.
"""
