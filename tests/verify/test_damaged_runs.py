"""Never PASS on damaged evidence (issue 36): real run folders, made by a tiny real `verify run`, then damaged as a
careless or hostile user would. A folder that lacks or cannot read what its manifest promises is damaged: `verify
compare` and `verify report` exit 2 with one line naming the file, never a verdict. A run killed mid-write is not
damaged for the end it lost."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from verify.cli import app
from verify.record.evidence import read_side
from verify.errors import EXIT_ERROR, Stopped
from verify.launch.runner import RunOptions, run_script
from verify.record.schema import DumpMode, Status
from verify.record.store import read_manifest

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """One real run of 3 steps with --dump stats (ops, grads, hparams, losses)."""
    return run_script(SCRIPTS / "tiny_train.py", [], RunOptions(steps=3, device="cpu", dump=DumpMode.STATS),
                      tmp_path_factory.mktemp("recorded") / "run")


@pytest.fixture
def pair(recorded, tmp_path) -> tuple[Path, Path]:
    """The run as reference and as port: undamaged, they PASS."""
    return shutil.copytree(recorded, tmp_path / "ref"), shutil.copytree(recorded, tmp_path / "actual")


def verify(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def one_error_line(result) -> str:
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: damaged run directory "), result.output
    return lines[0]


def random_bytes(path: Path, seed: int = 36) -> None:
    """The file's bytes replaced by as many random ones."""
    path.write_bytes(random.Random(seed).randbytes(path.stat().st_size))


def test_the_undamaged_pair_passes(pair):
    result = verify("compare", *pair)
    assert result.exit_code == 0 and "PASS" in result.output, result.output


@pytest.mark.parametrize("name", ["losses.csv", "hparams.csv", "ops/steps.arrows", "grads/steps.arrows"])
def test_random_bytes_in_a_file_are_exit_2_naming_it(pair, name):
    random_bytes(pair[1] / name)
    line = one_error_line(verify("compare", *pair))
    assert f"damaged run directory {pair[1]}: {name}" in line, line


def test_random_data_files_under_a_valid_manifest_are_damage_for_compare_and_report(pair):
    for name in ("losses.csv", "hparams.csv", "ops/steps.arrows", "grads/steps.arrows", "samples/steps.arrows"):
        random_bytes(pair[1] / name)
    assert "losses.csv" in one_error_line(verify("compare", *pair))
    assert "losses.csv" in one_error_line(verify("report", pair[1]))


def test_a_side_recorded_with_dump_stats_without_its_ops_folder_is_damaged(pair):
    shutil.rmtree(pair[1] / "ops")
    line = one_error_line(verify("compare", *pair))
    assert ("ops/steps.arrows has no operator records of step(s) 0, 1, 2 of the 3 step(s) the manifest records as "
            "written (it was recorded with --dump stats)") in line


def test_an_end_of_stream_mark_among_a_tables_records_is_damage(pair):
    """Regression (the fuzz test, its cases drawn anew): zeros over a gradient table's second step read as the end of
    its stream, and the steps after it were silently lost, the rest judged."""
    table = pair[1] / "grads" / "steps.arrows"
    with pa.OSFile(str(table)) as source:
        reader = pa.ipc.open_stream(source)
        reader.read_next_batch()
        second = source.tell()
    data = bytearray(table.read_bytes())
    data[second:second + 8] = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow's end-of-stream mark
    table.write_bytes(bytes(data))
    line = one_error_line(verify("compare", *pair))
    assert "grads/steps.arrows" in line and "an end-of-stream mark among its records" in line, line


def test_losses_of_a_step_removed_from_a_run_that_ended_whole_are_damage(pair):
    losses = pair[1] / "losses.csv"
    losses.write_bytes(b"".join(losses.read_bytes().splitlines(keepends=True)[:-1]))  # step 2's row gone
    assert "losses.csv has no loss of step(s) 2 of the 3 step(s)" in one_error_line(verify("compare", *pair))


def test_a_loss_that_is_not_a_number_is_damage_not_a_nan(pair):
    losses = pair[1] / "losses.csv"
    rows = losses.read_bytes().splitlines(keepends=True)
    step, micro, _, *rest = rows[2].split(b",")
    rows[2] = b",".join([step, micro, b"0.1x7", *rest])
    losses.write_bytes(b"".join(rows))
    assert "losses.csv: 1 row(s) hold cells that are not numbers" in one_error_line(verify("compare", *pair))


def test_a_run_stopped_mid_training_is_judged_on_what_it_wrote(tmp_path):
    """Ctrl-C after 2 of 5 steps: the manifest says interrupted; what the run wrote is whole, and it reads as no
    damage."""
    def press_ctrl_c_after_two_steps(steps: int) -> None:
        if steps == 2:
            raise KeyboardInterrupt

    with pytest.raises(Stopped):  # the runner turns Ctrl-C into Stopped, as test_run.py shows
        run_script(SCRIPTS / "hang.py", [], RunOptions(steps=5, device="cpu", dump=DumpMode.STATS),
                   tmp_path / "run", on_progress=press_ctrl_c_after_two_steps)
    assert read_manifest(tmp_path / "run").status == Status.INTERRUPTED.value
    run = read_side(tmp_path / "run")
    assert not run.damage and set(run.losses["step"]) >= {0} and set(run.ops["step"]) >= {0}


def test_a_run_killed_before_it_made_its_files_is_its_ending_not_damage(pair):
    """Regression (issue 52): a side killed at its timeout while torch still imported, on a loaded machine, wrote
    neither losses.csv nor hparams.csv; the pair said "damaged run directory: losses.csv is missing", exit 2,
    where the run had only timed out. A run that wrote no step promises no file."""
    ref, actual = pair
    manifest = actual / "manifest.json"
    record = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(record | {"status": Status.TIMEOUT.value, "steps_completed": 0,
                                             "message": "timed out after 5 s (0 steps completed)"}))
    for table in ("ops", "grads", "samples"):
        shutil.rmtree(actual / table, ignore_errors=True)
    for written in ("losses.csv", "hparams.csv"):
        (actual / written).unlink()
    assert not read_side(actual).damage
    result = verify("compare", ref, actual)
    assert result.exit_code == 1 and "actual run timeout: timed out after 5 s (0 steps completed)" in result.output


def test_a_param_group_that_gains_a_setting_is_no_damage_and_one_that_loses_one_is(pair):
    """DeepSpeed's FusedAdam adds `step` to its group after the first update, a scheduler made later adds initial_lr
    (issue 55: such a run was called damaged): a group may gain a setting, never lose one."""
    rows = (pair[1] / "hparams.csv").read_text().splitlines()
    lr_rows = [row for row in rows if row.startswith(("1,0,lr,", "2,0,lr,"))]
    for side in pair:
        (side / "hparams.csv").write_text(
            "\n".join([*rows, *(row.replace(",lr,", ",initial_lr,") for row in lr_rows)]) + "\n")
    result = verify("compare", *pair)
    assert result.exit_code == 0 and "PASS" in result.output, result.output
    (pair[1] / "hparams.csv").write_text("\n".join(row for row in rows if not row.startswith("2,0,lr,")) + "\n")
    line = one_error_line(verify("compare", *pair))
    assert "hparams.csv: optimizer 0's group 0 loses settings from step to step" in line, line
