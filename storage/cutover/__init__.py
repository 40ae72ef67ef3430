"""Ownership cutover between claimants (seed 11): every SQL statement of it lives here.

``values`` holds the rows as values and the legacy probe contract, ``snapshot``
counts what a step's own transaction must prove, ``steps`` moves the owner
generation (begin, commit, rollback begin, the atomic rollback fence), and
``legacy`` takes the legacy owner's outcome receipts and projects them.
"""
