"""The torture run in little (issue 12): ``python -m bench.torture`` on MariaDB, Galera and
one shared SQLite file, each for a few seconds of chaos: replicas SIGKILLed and restarted,
one frozen past its lease, a Galera node killed and rejoining, the simulator injecting
latency, 5xx, 429 and resets, effects drawing on a provider quota and on grants whose
short-lived tokens are refreshed all the while, and signed Outreach webhook deliveries sent
to every replica's ingress listener in turn (their receipts applied to Leads through the
Runtime). The invariants come from the HubSpot, OAuth and Outreach simulators' journals,
the Runtimes' own stores and the database; ``make torture DURATION=600`` is the long
run.

The replicas' clocks are skewed as in ``make torture`` (0.9 of the lease margin).

The provider quota holds under starvation by checking each send slot twice after the
checkpoint (on waking, and at the first byte: daemon/providers/executor.py's send
gate) and by the replicas' clock spread kept apart from L1's jitter
(``work.clock_spread``). Still open
(issue 12): a refresh owner frozen or killed between the provider's rotation and its own
activation leaves the rotated refresh token unknown; the next owner's refresh then meets
``invalid_grant`` and the grant needs re-authorization (``double_refreshes``,
``grants_not_valid``). Under two CPU hogs one 45 s MariaDB run in three hit it."""

from __future__ import annotations

import json
import sys

import pytest
import trio

# The invariants whose breach makes the run exit 1 (bench/torture.py's own list).
from bench.torture import BROKEN

# Alone: its chaos (freezes past a 10 s lease, kills inside a refresh) is timed for a
# machine it has to itself; beside another pytest worker it left a grant in doubt that
# the run's operator did not settle (issue 12's open trade).
pytestmark = [pytest.mark.slow, pytest.mark.galera, pytest.mark.mysql, pytest.mark.alone]


async def test_a_short_torture_run_loses_and_duplicates_nothing() -> None:
    with trio.fail_after(900):
        done = await trio.run_process(
            [sys.executable, "-m", "bench.torture", "--duration", "45", "--replicas", "3",
             "--settle", "120"],
            capture_stdout=True, capture_stderr=True, check=False)
    assert done.stdout, done.stderr.decode()[-3000:]
    line = json.loads(done.stdout.decode().strip().splitlines()[-1])
    # The whole line goes to the captured stderr; the assertions compare small dicts, so
    # a failure names the broken invariant and its backend instead of a truncated repr.
    sys.stderr.write(json.dumps(line) + "\n")
    assert line["backends"] == ["mysql", "galera", "sqlite"]
    assert {b: {k: got[k] for k in BROKEN} for b, got in line["per_backend"].items()} == {
        b: dict.fromkeys(BROKEN, 0) for b in line["backends"]}
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    for backend, got in line["per_backend"].items():
        # The chaos happened and work flowed through it, on every backend.
        assert got["kills"] >= 1 and got["sigstops"] >= 1 and got["effects"] > 0, (backend, got)
        assert got["receipts"] == got["intents"]["COMMITTED"], (backend, got)
        # Everything finished within the settle bound; tokens were refreshed on the way.
        assert got["drained"] is True, (backend, got)
        assert got["refreshes"] >= 1, (backend, got)
        # Webhooks flowed on every backend and were answered 200, so "every delivery
        # answered 200 has exactly one receipt" had deliveries to look at; each receipt
        # became inbound work.
        assert got["webhooks_sent"] > 0 and got["webhooks_answered_200"] > 0, (backend, got)
        assert got["webhook_receipts"] >= got["webhooks_answered_200"], (backend, got)
        assert got["inbound_items"] == got["webhook_receipts"], (backend, got)
    assert line["per_backend"]["galera"]["db_node_kills"] == 1, line
