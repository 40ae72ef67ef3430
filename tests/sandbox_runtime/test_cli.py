"""``python -m sandbox.runtime``: configuration, secrets, a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sandbox.runtime.__main__ import build_parser, main, runtime_from_args

REPO = Path(__file__).resolve().parents[2]


def test_tokens_from_files_and_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "integration-token"
    token_file.write_text("from-file\n")
    args = build_parser().parse_args(
        ["--integration-url", "http://127.0.0.1:8781", "--integration-token-file",
         str(token_file), "--old-runtime", "--catalog-revision", "9"]
    )
    runtime = runtime_from_args(args, {"SANDBOX_RUNTIME_RESULTS_TOKEN": "from-env"})
    assert runtime.integration_token.reveal() == "from-file"
    assert runtime.results_token.reveal() == "from-env"
    assert runtime.accept_no_effect_format is False and runtime.catalog_revision == 9
    assert "from-file" not in repr(runtime) and "from-env" not in repr(runtime)


def test_tokens_from_systemd_credentials(tmp_path: Path) -> None:
    (tmp_path / "runtime-integration-token").write_text("a")
    (tmp_path / "runtime-results-token").write_text("b")
    args = build_parser().parse_args(["--integration-url", "http://x:1"])
    runtime = runtime_from_args(args, {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert (runtime.integration_token.reveal(), runtime.results_token.reveal()) == ("a", "b")


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--integration-url", "http://x:1"], {}, "integration_token: missing"),
        (["--integration-url", "http://x:1"], {"SANDBOX_RUNTIME_INTEGRATION_TOKEN": "a"},
         "results_token: missing"),
        (["--integration-url", "x:1"], {"SANDBOX_RUNTIME_INTEGRATION_TOKEN": "a",
                                        "SANDBOX_RUNTIME_RESULTS_TOKEN": "b"},
         "integration-url: expected"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, environ) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_process_listens_serves_and_stops_on_sigterm() -> None:
    env = {
        **os.environ,
        "SANDBOX_RUNTIME_INTEGRATION_TOKEN": "integration-secret",
        "SANDBOX_RUNTIME_RESULTS_TOKEN": "results-secret",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox.runtime", "--port", "0",
         "--integration-url", "http://127.0.0.1:9"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[dict[str, object]] = []
        while not any(line.get("event") == "runtime_listening" for line in lines):
            text = proc.stderr.readline()
            assert text, "the process exited before listening"
            lines.append(json.loads(text))
        port = next(line["port"] for line in lines if line["event"] == "runtime_listening")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            assert client.get("/healthz").json() == {"status": "ok"}
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "integration-secret" not in rest and "results-secret" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
