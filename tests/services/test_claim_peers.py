"""The live claimants of a family, from the heartbeats (daemon/services/claim_peers.py):
advice for where a claim starts, never for who may claim."""

from __future__ import annotations

import json

import pytest

from daemon.services.claim_peers import claimants_of
from storage.port import ReplicaInfo
from tests.admin.support import console_harness
from tests.support.backends import FreshDatabase


def _replica(replica_id: str, state: str = "running", families: str | None = None
             ) -> ReplicaInfo:
    return ReplicaInfo(replica_id=replica_id, hostname="h", pid=1, version="v", state=state,
                       families=json.dumps(["noop", "effect"]) if families is None
                       else families, started_at_us=0, heartbeat_at_us=0)


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        ([_replica("a"), _replica("b", "starting")], ["a", "b"]),
        # Draining and stopped replicas claim no more.
        ([_replica("a"), _replica("b", "draining"), _replica("c", "stopped")], ["a"]),
        # A replica that does not run the family is not one of its claimants.
        ([_replica("a"), _replica("b", families=json.dumps(["effect"]))], ["a"]),
        # Unreadable family lists are left out (advice: a wrong count only costs races).
        ([_replica("a", families="not json"), _replica("b", families=json.dumps("noop")),
          _replica("c", families="null")], []),
        ([], []),
    ],
)
def test_claimants_of(replicas: list[ReplicaInfo], expected: list[str]) -> None:
    assert claimants_of("noop", replicas) == expected


async def test_a_replica_ranks_itself_by_the_id_it_runs_under(database: FreshDatabase) -> None:
    """daemon/cli.py sets a configured replica id (the systemd unit's ``%H-%i``) after
    the Replica is built. The rank must be by that id: by the id the Replica was built
    with, every replica counted one claimant too many and could share a rank with
    another (before: ``(0, 3) == (1, 2)``)."""
    async with console_harness(database) as harness:
        harness.replica.replica_id = "host-2"
        peers = harness.replica.claim_peers
        peers._live = [_replica("host-1"), _replica("host-2")]
        assert peers.rank("noop") == (1, 2)
