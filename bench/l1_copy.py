"""A benchmark's own copy of the shipped L1 definitions, with the provider quota it
chooses: a benchmark of the effect path measures integrationd, not a provider's request
limit (``bench.quota`` measures quota), so its copy drops every ``[quota.*]`` table of
the shipped files and declares only the ones the benchmark asks for."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_TABLE = re.compile(r"^\s*\[")
_QUOTA_TABLE = re.compile(r"^\s*\[quota\.")


def without_quota(text: str) -> str:
    """``text`` (one L1 file) without its ``[quota.*]`` tables."""
    kept: list[str] = []
    dropping = False
    for line in text.splitlines(keepends=True):
        if _TABLE.match(line):
            dropping = bool(_QUOTA_TABLE.match(line))
        if not dropping:
            kept.append(line)
    return "".join(kept)


# The sandbox's simulators (sandbox/h11_server.py) never close an idle connection: the
# copy declares a long keep-alive for them, so the replicas keep theirs 60 s (half).
SIMULATOR_KEEP_ALIVE_S = 120.0


def l1_copy(directory: Path, *, quota: dict[str, str] | None = None) -> Path:
    """Copy ``config/providers`` into ``directory`` without quota; ``quota`` maps a
    provider file's stem to the TOML tables to declare in it instead. Each copy declares
    the simulator's keep-alive (``SIMULATOR_KEEP_ALIVE_S``) unless the file has one."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in sorted((REPO / "config" / "providers").glob("*.toml")):
        text = without_quota(entry.read_text())
        if "keep_alive" not in tomllib.loads(text):
            text = re.sub(r"^(provider = .*\n)", rf"\1keep_alive = {SIMULATOR_KEEP_ALIVE_S}\n",
                          text, count=1, flags=re.M)
        extra = (quota or {}).get(entry.stem, "")
        if extra:
            text = text.rstrip("\n") + "\n\n" + extra
        declared = tomllib.loads(text).get("quota", {})
        if bool(declared) != bool(extra):  # the copy must say exactly what was asked
            raise SystemExit(f"{entry}: the benchmark's quota tables did not apply")
        (directory / entry.name).write_text(text)
    for entry in (REPO / "config" / "providers").iterdir():
        if entry.is_dir():
            shutil.copytree(entry, directory / entry.name, dirs_exist_ok=True)
    return directory
