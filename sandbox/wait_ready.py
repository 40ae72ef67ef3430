"""``python -m sandbox.wait_ready URL [SECONDS]``: wait until URL answers 200 (exit 0),
or give up after SECONDS (default 120; exit 1). ``make run`` prints its banner once the
replica's ``/readyz`` answers, so the addresses are the last thing on the screen."""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request


def wait_ready(url: str, within_s: float) -> bool:
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"wait_ready: expected an http(s) URL, got {url!r}")
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:  # noqa: S310 (checked)
                if answer.status == 200:
                    return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    return False


if __name__ == "__main__":
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
    sys.exit(0 if wait_ready(sys.argv[1], seconds) else 1)
