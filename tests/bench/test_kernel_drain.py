"""``bench.kernel`` end to end on a small drain: the release UPDATE's own time is reported
beside the drain's (``release_s``), items/s are over the drain, and ``--pool-size``
reaches each replica's configuration."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.kernel import REPO, write_config

pytestmark = [pytest.mark.slow, pytest.mark.mysql]


def test_a_replicas_pool_size_is_written_only_when_asked(tmp_path: Path) -> None:
    asked = tomllib.loads(write_config(tmp_path, "mysql://x/y", "NORMAL", "a", 3).read_text())
    default = tomllib.loads(write_config(tmp_path, "mysql://x/y", "NORMAL", "b").read_text())
    assert asked["storage"]["pool_size"] == 3
    assert "pool_size" not in default["storage"]
    assert asked["admin"] == default["admin"] and asked["retention"] == {"enabled": False}


def test_a_drain_reports_the_release_beside_it_and_its_pool_size() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.kernel", "--backend", "mysql", "--replicas", "2",
         "--items", "300", "--no-peer", "--pool-size", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["items"], result["lost"], result["duplicates"]) == (300, 0, 0)
    assert result["pool_size"] == 2
    assert result["release_s"] > 0 and result["seconds"] > 0
    # items/s over the drain alone, the release's own time excluded.
    assert result["items_per_s"] == pytest.approx(300 / result["seconds"], rel=0.01)


@pytest.mark.parametrize("size", ["0", "-3"])
def test_a_pool_size_under_one_is_refused_before_anything_starts(size: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.kernel", "--backend", "sqlite", "--no-peer",
         "--pool-size", size], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert f"--pool-size: connections per replica, 1 or more (got {size})" in \
        done.stderr.splitlines()[-1]
