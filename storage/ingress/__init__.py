"""The webhook ingress capability's storage room: receipts and normalized events."""
