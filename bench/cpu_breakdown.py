"""Where a profiled replica's CPU went, by layer: one JSON line from a cProfile dump.

    BENCH_PROFILE_DIR=/tmp/prof python -m bench.effects --replicas 2 --effects 1000 \\
        --noop-items 0 --no-peer
    python -m bench.cpu_breakdown /tmp/prof/replica-0.prof [--top 30]

``bench.profile_replica`` profiles replica 0 with a CPU-time clock. Each function's own
time (not cumulative: coroutines make cumulative figures overlap) is charged to the layer
its file belongs to: the MySQL driver, trio, the HTTP client (ours, h11, httpx), the
HTTP server (hypercorn, Quart, Werkzeug), our own code (daemon/, storage/, config/), the
standard library and the rest. It also counts the TCP connections the replica opened
(our HTTP client's connections, MySQL connects) and accepted (hypercorn), and the escaping
calls. ``--top N`` also prints the top N functions by own and by cumulative time.
"""

from __future__ import annotations

import argparse
import json
import pstats
import sys
from typing import Any

# (layer, path fragments): the first layer whose fragment a file's path holds.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mysql_driver", ("/trio_mysql/",)),
    ("http_client", ("/httpx/", "/httpcore/", "/h11/", "/daemon/providers/http_client.py")),
    ("http_server", ("/hypercorn/", "/quart/", "/quart_trio/", "/werkzeug/", "/wsproto/",
                     "/h2/")),
    ("trio", ("/trio/", "/outcome/", "/sniffio/")),
    ("ours", ("/daemon/", "/storage/", "/config/")),
    ("stdlib", ("/lib/python3",)),
)

# Sync functions (a coroutine's ncalls counts its resumptions, not its calls).
COUNTED = {
    "http_connections_opened": ("daemon/providers/http_client.py", "__init__", "_Connection"),
    "http_connections_accepted": ("hypercorn/trio/tcp_server.py", "__init__"),
    "http_requests_sent": ("daemon/providers/http_client.py", "_request_bytes"),
    "mysql_escape_calls": ("trio_mysql/connections.py", "escape"),
    "mysql_connects": ("trio_mysql/connections.py", "__init__", "Connection"),
}


def layer_of(filename: str) -> str:
    for layer, fragments in LAYERS:
        if any(f in filename for f in fragments):
            return layer
    return "builtins" if filename == "~" else "other"


def breakdown(path: str) -> dict[str, Any]:
    stats = pstats.Stats(path)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    by_layer: dict[str, float] = {}
    counts = dict.fromkeys(COUNTED, 0)
    for (filename, line, name), (_, ncalls, tottime, _, _) in raw.items():
        by_layer[layer_of(filename)] = by_layer.get(layer_of(filename), 0.0) + tottime
        for label, (fragment, function, *owner) in COUNTED.items():
            if filename.endswith(fragment) and name == function and (
                    not owner or _in_class(filename, line, owner[0])):
                counts[label] += ncalls
    return {
        "profile": path,
        "cpu_s": round(total, 3),
        "share_by_layer": {k: round(v / total, 3) for k, v in
                           sorted(by_layer.items(), key=lambda kv: -kv[1])} if total else {},
        **counts,
    }


def _in_class(filename: str, line: int, owner: str) -> bool:
    """Whether the function at ``line`` is a method of class ``owner`` (a module may
    define several ``__init__``)."""
    try:
        with open(filename) as source:
            text = source.read().splitlines()
    except OSError:
        return False
    for back in range(line - 1, max(0, line - 400), -1):
        if text[back].startswith("class "):
            return text[back].startswith(f"class {owner}(") or text[back].startswith(
                f"class {owner}:")
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", help="a cProfile dump (bench.profile_replica)")
    parser.add_argument("--top", type=int, default=0, help="also print the top N functions")
    args = parser.parse_args()
    print(json.dumps(breakdown(args.profile)), flush=True)
    if args.top:
        stats = pstats.Stats(args.profile, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
