"""``mailtap bench parse``: the parse processes' job timed in-process against the stdlib's parse
(figures, never asserted on their size)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from mailtap.cli import main


def test_bench_parse_prints_its_figure_the_baseline_and_the_ratio() -> None:
    result = CliRunner().invoke(
        main, ["bench", "parse", "--mails", "200", "--rounds", "2", "--profile", "3", "--json"]
    )

    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "parse" and figures["rounds"] == 2
    assert len(figures["build_us_per_mail"]) == len(figures["stdlib_parse_us_per_mail"]) == 2
    assert figures["build_us_per_mail_median"] > 0 and figures["ratio_to_stdlib_parse"] > 0
    assert "µs CPU per mail" in result.stderr and "ncalls" in result.stderr
