"""verify's own failures at the command boundary (verify/errors.py): exit code 2 and one line, never a traceback
and never exit code 1, which is a verdict."""

import pytest
import typer

from verify.cli.exits import TRACEBACK_FILE, exit_with
from verify.errors import VerifyFailure


def exit_code(body, out=None) -> int:
    with pytest.raises(typer.Exit) as stopped:
        exit_with(body, "compare runs/a with runs/b", out)
    return stopped.value.exit_code


def test_a_command_exits_with_the_code_its_body_returns():
    assert exit_code(lambda: 1) == 1


def test_an_expected_failure_is_its_own_message_on_one_line(capsys):
    def body():
        raise VerifyFailure("runs/b is not a run directory:\n manifest.json is missing")

    assert exit_code(body) == 2
    assert capsys.readouterr().err == "error: runs/b is not a run directory: manifest.json is missing\n"


def test_a_bug_in_verify_is_one_line_naming_what_it_was_doing_and_keeps_its_traceback(tmp_path, capsys):
    def body():
        return int({"count": None}["count"])

    assert exit_code(body, tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: verify could not compare runs/a with runs/b: TypeError: int() argument")
    assert str(tmp_path / TRACEBACK_FILE) in err
    assert "in body" in (tmp_path / TRACEBACK_FILE).read_text()
