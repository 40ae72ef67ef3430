"""The 3-node Galera cluster lives in :mod:`sandbox.galera` (the benchmarks and the torture
run start one too); the test fixtures import it from here."""

from sandbox.galera import GaleraCluster, GaleraNode, GaleraUnavailable

__all__ = ["GaleraCluster", "GaleraNode", "GaleraUnavailable"]
