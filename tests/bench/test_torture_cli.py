"""``python -m bench.torture``'s bad flags: one clear line naming the flag, exit 2, before
anything starts (no database made, no replica run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.kernel import REPO


@pytest.mark.parametrize(("flags", "message"), [
    (["--webhook-rate", "-1"], "--webhook-rate: deliveries per second, 0 or more (got -1.0)"),
    (["--webhook-rate", "fast"], "argument --webhook-rate: invalid float value: 'fast'"),
    (["--skew", "1.5"], "--skew: a fraction of work.lease_margin, 0 to 1 (got 1.5)"),
    (["--backends", "oracle"], "--backends: one or more of mysql, galera, sqlite"),
])
def test_a_bad_flag_is_one_clear_line_and_exit_2(flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.torture", *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert message in done.stderr.splitlines()[-1]
