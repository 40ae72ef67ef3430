"""Loopback ports for sandbox servers started by tests and benchmarks."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A port that is free now and that the kernel will not hand out meanwhile.

    ``bind(0)`` picks from the ephemeral range, the same range outgoing
    connections take their source ports from, so under load another socket
    could take the port before its server binds it (seen: EADDRINUSE). Below
    that range only explicit binds compete.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
