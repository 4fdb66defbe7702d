"""options.command_line (issue 37): the command line an adaptation report gives, as a person would type it again:
arguments, the options that differ from their defaults (flags, their --no- forms, options given several times),
then `--` and the script's arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.testing import CliRunner

from verify.cli import options
from verify.record.schema import DumpMode


def test_the_command_line_names_what_was_typed_and_nothing_left_at_its_default():
    app = typer.Typer()
    seen: list[list[str]] = []

    @app.command()
    def pair(
        context: typer.Context,
        original: Path,
        script_args: options.script_args() = None,
        steps: options.steps("Steps.") = 20,
        dump: options.dump("Dump.") = DumpMode.STATS,
        match_amp: Annotated[bool, typer.Option(help="Match.")] = True,
        mapping: Annotated[Optional[list[Path]], typer.Option("--op-mapping")] = None,
        quiet: options.quiet() = False,
    ) -> None:
        seen.append(options.command_line(context, command_typed=False))

    result = CliRunner().invoke(app, ["a.py", "--steps", "3", "--dump", "off", "--no-match-amp", "--op-mapping",
                                      "m1.toml", "--op-mapping", "m2.toml", "--", "--epochs", "1"])
    assert result.exit_code == 0, result.output
    assert seen == [["verify", "a.py", "--steps", "3", "--dump", "off", "--no-match-amp", "--op-mapping", "m1.toml",
                     "--op-mapping", "m2.toml", "--", "--epochs", "1"]]
