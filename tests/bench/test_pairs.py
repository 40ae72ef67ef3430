"""bench.pairs: the figures of a benchmark's JSON lines, and the summary of pairs."""

from __future__ import annotations

import pytest

from bench.pairs import figures, main, summarize


def test_figures_flatten_every_numeric_value_by_dotted_name() -> None:
    stdout = "\n".join([
        "starting...",
        '{"system": "integrationd-effects", "effects_per_s": 250.5, "ok": true,'
        ' "cpu_ms": {"replicas": 3.5, "sandbox": 1}, "backend": "mysql"}',
        '{"system": "integrationd", "items_per_s": 4000}',
        '{"ratio": "effects / noop", "value": 0.06}',
        "{not json",
    ])
    assert figures(stdout) == {
        "integrationd-effects.mysql.effects_per_s": 250.5,
        "integrationd-effects.mysql.cpu_ms.replicas": 3.5,
        "integrationd-effects.mysql.cpu_ms.sandbox": 1.0,
        "integrationd.items_per_s": 4000.0,
        "line2.value": 0.06,
    }


def test_lines_per_backend_mode_and_rate_never_collide() -> None:
    stdout = "\n".join([
        '{"system": "integrationd", "backend": "sqlite", "rate": 250, "p99_ms": 7.5}',
        '{"system": "integrationd", "backend": "mysql", "rate": 250, "p99_ms": 9.0}',
        '{"system": "integrationd", "backend": "mysql", "mode": "spool", "rate": 250,'
        ' "p99_ms": 4.0}',
        '{"summary": true, "system": "integrationd", "backend": "mysql", "max_rate": 500}',
    ])
    got = figures(stdout)
    assert got["integrationd.sqlite.rate250.p99_ms"] == 7.5
    assert got["integrationd.mysql.rate250.p99_ms"] == 9.0
    assert got["integrationd.mysql.spool.rate250.p99_ms"] == 4.0
    assert got["integrationd.mysql.summary.max_rate"] == 500.0


def test_a_single_unnamed_line_keeps_plain_names() -> None:
    assert figures('{"limit_use": 0.97, "violations": 0}') == {
        "limit_use": 0.97, "violations": 0.0}


def test_summary_gives_mean_spread_and_the_per_pair_ratio() -> None:
    ours = [{"figures": {"rate": 110.0, "only_ours": 1.0}}, {"figures": {"rate": 90.0}}]
    theirs = [{"figures": {"rate": 100.0}}, {"figures": {"rate": 100.0}}]
    out = summarize(ours, theirs)
    assert out["ours"]["rate"] == {"mean": 100.0, "sd": 14.1421, "values": [110.0, 90.0]}
    assert out["theirs"]["rate"]["sd"] == 0.0
    assert out["ratio"]["rate"] == {"mean": 1.0, "sd": 0.1414, "values": [1.1, 0.9]}
    assert "only_ours" not in out["ours"], "a figure one run lacks is not compared"


def test_a_zero_figure_on_their_side_gives_no_ratio() -> None:
    out = summarize([{"figures": {"violations": 0.0}}], [{"figures": {"violations": 0.0}}])
    assert out["ratio"] == {} and out["ours"]["violations"]["mean"] == 0.0


@pytest.mark.parametrize("argv", [["--", "daemon.cli"], [], ["--pairs", "0", "--", "bench.quota"]])
def test_bad_invocations_are_refused_with_a_usage_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "usage: python -m bench.pairs" in capsys.readouterr().err
