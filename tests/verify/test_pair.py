"""`verify ORIGINAL [PORTED]` and `verify determinism`: routing and the errors caught before any run (no child
processes here; the verdicts of real runs are in test_verdicts.py)."""

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import PAIR_COMMAND, default_port, route

GROUP = typer.main.get_command(app)


def invoke(args: list[str]):
    return CliRunner().invoke(app, route(args, GROUP))


@pytest.mark.parametrize(("argv", "routed"), [
    (["train.py"], ["pair", "train.py"]),
    (["train.py", "port.py", "-n", "3"], ["pair", "train.py", "port.py", "-n", "3"]),
    # `--` after ORIGINAL alone: PORTED is spelled out, or the parser would take `--epochs` for it
    (["train.py", "--steps", "3", "--no-dropout", "--", "--epochs", "1"],
     ["pair", "train.py", "--steps", "3", "--no-dropout", "train_npu.py", "--", "--epochs", "1"]),
    (["train.py", "--steps=3", "port.py", "--", "-b", "2"], ["pair", "train.py", "--steps=3", "port.py", "--", "-b", "2"]),
    (["pair", "a/train.py", "--", "x"], ["pair", "a/train.py", "a/train_npu.py", "--", "x"]),
    (["run", "train.py", "--", "--epochs", "1"], ["run", "train.py", "--", "--epochs", "1"]),
    (["determinism", "train.py"], ["determinism", "train.py"]),
    (["--help"], ["--help"]),
    ([], []),
])
def test_route_sends_a_script_to_the_pair_command(argv, routed):
    assert route(argv, GROUP) == routed


def test_help_documents_the_pair_and_lists_the_commands():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "verify ORIGINAL [PORTED]" in result.output
    for command in ("run", "compare", "report", "export", "determinism"):
        assert command in result.output
    assert PAIR_COMMAND in CliRunner().invoke(app, [PAIR_COMMAND, "--help"]).output


def test_default_port_is_what_migrate_writes():
    assert default_port(Path("src/train.py")) == Path("src/train_npu.py")


def test_missing_port_is_an_error_naming_its_path(tmp_path):
    original = tmp_path / "train.py"
    original.write_text("print('hi')\n")
    result = invoke([str(original), "--", "--epochs", "1"])
    assert result.exit_code == 2
    assert str(tmp_path / "train_npu.py") in result.output.replace("\n", "")
    assert not (tmp_path / "verify-out").exists()


def test_an_output_folder_in_the_way_is_an_error(tmp_path):
    for name in ("train.py", "train_npu.py"):
        (tmp_path / name).write_text("print('hi')\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = invoke([str(tmp_path / "train.py"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "already exists" in result.output
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_amp_effect_needs_the_reference_under_the_ports_autocast(tmp_path):
    for name in ("train.py", "train_npu.py"):
        (tmp_path / name).write_text("print('hi')\n")
    result = invoke([str(tmp_path / "train.py"), "--amp-effect", "--no-match-amp"])
    assert result.exit_code == 2 and "--no-match-amp" in result.output


def test_determinism_of_a_missing_script_is_an_error(tmp_path):
    result = invoke(["determinism", str(tmp_path / "nope.py"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no such script" in result.output


def test_quiet_and_verbose_together_are_refused_before_anything_runs(tmp_path):
    for name in ("train.py", "train_npu.py"):
        (tmp_path / name).write_text("print('hi')\n")
    for command in ([], ["determinism"]):
        result = invoke([*command, str(tmp_path / "train.py"), "-q", "-v", "-o", str(tmp_path / "out")])
        assert result.exit_code == 2 and "--quiet and --verbose" in result.output
    assert not (tmp_path / "out").exists()
