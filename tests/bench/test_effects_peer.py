"""bench.effects_peer: the naive peer retries a job that met a network error, as a naive
team would, instead of leaving it failed (and the benchmark waiting for it)."""

from __future__ import annotations

import httpx
import pytest
import trio
from procrastinate.jobs import Job

from bench.effects_peer import Peer


async def test_a_job_that_meets_a_network_error_is_retried(nursery: trio.Nursery) -> None:
    """Finding (issue 24, item 4): a PATCH that met a network error failed its job for
    good, so the intent was never committed and the run waited for its 900 s timeout."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]

    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the request arrives; no answer ever leaves
        await stream.aclose()

    nursery.start_soon(trio.serve_listeners, hang_up, [listener])
    peer = Peer({"dsn": "postgresql://127.0.0.1:1/unused", "concurrency": 1,
                 "provider_url": f"http://127.0.0.1:{port}", "provider_token": "t",
                 "runtimes": [{"token": "r", "results_url": f"http://127.0.0.1:{port}/results",
                               "results_token": "r", "contact_base": 0}]})
    try:
        with pytest.raises(httpx.TransportError) as caught:
            await peer.effect(0, "command", "key", "intent", "digest", 1, "17", {"a": "b"})
    finally:
        await peer.http.aclose()
    strategy = peer.task.retry_strategy
    assert strategy is not None, "the job is not retried"
    job = Job(queue="default", lock=None, queueing_lock=None, task_name="effect", attempts=1)
    assert strategy.get_retry_decision(exception=caught.value, job=job) is not None
