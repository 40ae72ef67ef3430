"""With a limit of 40 a second and 4 replicas, the provider sees at least 90 % of the limit
used for as long as work waits, and no window over it (issue 20 item 4).

The production replicas run on simulated time (:mod:`sim.quota_use`): computing costs no
time, so every slot the provider does not see used is one the design lost. The declared
jitter is 0.1 s (the schedule's ceiling: 1 / 1.1 = 0.909 of the limit): the bench's
provider is on loopback, where a request arrives within a millisecond of leaving, and a
send that would start later than its jitter is held back unsent, so the jitter bounds
only how late a send may start, never the windows."""

from __future__ import annotations

from sim.quota_use import Scenario, run

LIMIT = 40
JITTER_S = 0.1


def test_four_replicas_use_90_percent_of_a_limit_of_40_while_500_items_wait() -> None:
    got = run(Scenario(replicas=4, limit=LIMIT, jitter_s=JITTER_S, items=500))
    summary = {k: got[k] for k in ("limit_use", "window_counts", "executions",
                                   "longest_gap_s")}
    assert got["committed"] == got["intents"] == 500
    assert got["items_by_state"] == {"succeeded": 500}, summary
    assert got["duplicate_patches"] == 0
    assert got["oracle_violations"] == []
    assert got["windows_over"] == 0, summary
    assert got["limit_use"] >= 0.9, summary
    # And in every whole window of the provider's while the backlog lasted, not only on
    # average: at least 36 of 40.
    assert got["windows_under_90"] == 0, summary
