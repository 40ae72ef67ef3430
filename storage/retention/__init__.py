"""Retention: declared per-table rules and the fenced, batched pruner's storage."""
