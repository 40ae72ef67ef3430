"""L1 definitions for a sandbox: the shipped ones with shorter windows.

An L2 binding may only lengthen what L1 declares, so tests whose simulators
answer at once (and run on the wall clock) serve their own L1: the shipped
files, copied with the declared ``max_in_flight`` and ``max_clock_skew``
replaced, so nothing else can drift from what ships.
"""

from __future__ import annotations

import functools
import re
import tempfile
from importlib import resources
from pathlib import Path

SANDBOX_IN_FLIGHT_S = 1.0
SANDBOX_CLOCK_SKEW_S = 0.1


def _replace_setting(text: str, name: str, value: float | bool, source: str) -> str:
    pattern = re.compile(rf"^{name} = [0-9.a-z]+$", re.MULTILINE)
    found = len(pattern.findall(text))
    if not found:
        raise AssertionError(f"{source} declares no {name}")
    rendered = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return pattern.sub(f"{name} = {rendered}", text)


# The replay proof a sandbox L1 declares for HubSpot's PATCH when a test asks for a
# replay-safe operation (the simulator must then honour the key:
# HubSpotSimulator.honour_idempotency_keys).
REPLAY_PROOF = ('idempotency_header = "Idempotency-Key"\n'
                "key_retention = 86400.0\n")
_OPERATION = re.compile(r'^\[operations\."([^"]+)"\]$', re.MULTILINE)


def write_sandbox_definitions(directory: Path, *, max_in_flight: float = SANDBOX_IN_FLIGHT_S,
                              max_clock_skew: float = SANDBOX_CLOCK_SKEW_S,
                              replay_safe: bool | None = None) -> Path:
    """Copies of the shipped L1 files with these windows (and, with ``replay_safe``,
    HubSpot's operations declared replay-safe by the Idempotency-Key its requests carry:
    the claim and its proof, which only a simulator honouring the key makes true)."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in resources.files("config").joinpath("providers").iterdir():
        if not entry.name.endswith(".toml"):
            continue
        text = _replace_setting(entry.read_text(), "max_in_flight", max_in_flight, entry.name)
        text = _replace_setting(text, "max_clock_skew", max_clock_skew, entry.name)
        if replay_safe and entry.name == "hubspot.toml":
            text = _replace_setting(text, "replay_safe", True, entry.name)
            text += "".join(f'\n[operations."{op}".replay_proof]\n{REPLAY_PROOF}'
                            for op in _OPERATION.findall(text))
        (directory / entry.name).write_text(text)
    return directory


@functools.cache
def sandbox_definitions_dir() -> str:
    """One sandbox L1 directory per test process (the default windows)."""
    return str(write_sandbox_definitions(Path(tempfile.mkdtemp(prefix="l1-sandbox-"))))
