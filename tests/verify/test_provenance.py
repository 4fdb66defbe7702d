"""Evidence that belongs (issue 43, items 2 to 4), on real runs: one faithful pair of verdict_mlp.py (its port, its
reference and the reference's calibration run, 3 steps each) and a calibration run of another script, then used as a
careless or hostile user would. A calibration of another reference and a --ref-run that is not a run of ORIGINAL with
the pair's arguments, seed and steps are refused (exit 2, naming what differs); `verify report` judges again from the
runs its summary names, and without them there is no verdict; `verify compare -o` and `verify export` write only into
an empty folder or their own earlier output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.compare.again import judged_again
from verify.cli.pair import route
from verify.errors import EXIT_ERROR
from verify.launch.runner import RunOptions, run_script
from verify.record import run_folders
from verify.report.writers import write_reports

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
ORIGINAL, PORT = SCRIPTS / "verdict_mlp.py", SCRIPTS / "verdict_mlp_npu.py"
STEPS = "3"


def verify(*args: object):
    argv = [str(arg) for arg in args]
    return CliRunner().invoke(app, route(argv, typer.main.get_command(app)))


def error_line(result) -> str:
    """The one line of verify's own error (exit 2), without its "error: " prefix."""
    assert result.exit_code == EXIT_ERROR, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0].removeprefix("error: ")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The faithful pair's folder (ref/, actual/, calibration/, its reports): it PASSes."""
    out = tmp_path_factory.mktemp("pair") / "out"
    result = verify(ORIGINAL, PORT, "-n", STEPS, "-q", "-o", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def other_calibration(tmp_path_factory) -> Path:
    """A real calibration run, of another script (tiny_train.py), as a pair of that script leaves it."""
    perturbation = {"seed": 1235, "half": "", "of": run_folders.REF, "blocks": 4, "rounding": True}
    return run_script(SCRIPTS / "tiny_train.py", [], RunOptions(steps=3, device="cpu", perturbation=perturbation),
                      tmp_path_factory.mktemp("other") / run_folders.calibration_run(1))


@pytest.fixture
def pair(recorded, tmp_path) -> Path:
    """A copy of the faithful pair's folder, elsewhere: its summary still finds its runs."""
    return shutil.copytree(recorded, tmp_path / "pair")


def sides(folder: Path) -> tuple[Path, Path]:
    return folder / run_folders.REF, folder / run_folders.ACTUAL


# --- item 2: a calibration is its reference's, a --ref-run a run of ORIGINAL ----------------------------------------


def test_a_calibration_of_another_script_beside_the_reference_is_refused(pair, other_calibration):
    """A calibration/ copied from another script's pair widened the envelope the port is judged against (a FAIL
    became a PASS): compare, and the pair's report, refuse it, naming the script."""
    shutil.rmtree(pair / run_folders.CALIBRATION)
    shutil.copytree(other_calibration, pair / run_folders.CALIBRATION)
    line = error_line(verify("compare", *sides(pair)))
    assert line.startswith(f"{pair / 'calibration'} is not a calibration run of the reference {pair / 'ref'}: its "
                           "script ") and "tiny_train.py" in line and "verdict_mlp.py" in line, line
    assert "its arguments" not in line and "its steps" not in line  # the same as the reference's: not named
    assert "is not the calibration run" in error_line(verify("report", pair))  # not the run the pair judged


def test_a_calibration_of_another_reference_or_none_at_all_is_refused(pair, tmp_path):
    """The pair's own calibration beside a reference under another name calibrates `ref`, not it; the reference's
    run copied in as its calibration is no calibration run."""
    golden = shutil.copytree(pair / run_folders.REF, tmp_path / "golden" / "golden")
    shutil.copytree(pair / run_folders.CALIBRATION, golden.parent / run_folders.CALIBRATION)
    assert "it calibrates 'ref', not 'golden'" in error_line(verify("compare", golden, pair / run_folders.ACTUAL))
    shutil.rmtree(pair / run_folders.CALIBRATION)
    shutil.copytree(pair / run_folders.REF, pair / run_folders.CALIBRATION)
    assert "it is no calibration run" in error_line(verify("compare", *sides(pair)))


@pytest.mark.slow
def test_a_calibration_of_another_pair_of_the_same_script_is_refused(pair, tmp_path):
    """The same script, arguments and seed, run by another pair command: its calibration measured another reference's
    noise (manifest.pair tells the pairs apart)."""
    other = tmp_path / "other"
    assert verify(ORIGINAL, PORT, "-n", STEPS, "-q", "-o", other).exit_code == 0
    shutil.rmtree(pair / run_folders.CALIBRATION)
    shutil.copytree(other / run_folders.CALIBRATION, pair / run_folders.CALIBRATION)
    assert "another pair command made it" in error_line(verify("compare", *sides(pair)))


def test_compare_of_two_scripts_runs_asks_nothing_of_them_alike(pair):
    """The original's run against its port's: two scripts (and on two machines, two devices); compare judges them."""
    result = verify("compare", *sides(pair))
    assert result.exit_code == 0 and "PASS" in result.output, result.output


@pytest.mark.parametrize("given, options, named", [
    (run_folders.ACTUAL, [], "it is a run of PORTED"),
    (run_folders.CALIBRATION, [], "it is a calibration run, not a reference"),
    (run_folders.REF, ["-n", "4"], "its steps 3 is not 4"),
    (run_folders.REF, ["--seed", "7"], "its seed 1234 is not 7"),
    (run_folders.REF, ["--", "--lr", "0.01"], "its arguments [] are not ['--lr', '0.01']"),
], ids=["the-ports-run", "a-calibration", "steps", "seed", "arguments"])
def test_a_ref_run_that_is_not_a_run_of_original_as_asked_is_refused_before_anything_runs(
        pair, tmp_path, given, options, named):
    """--ref-run pointing at the port's own run (actual/ beside ref/) made a broken port PASS against itself."""
    out = tmp_path / "out"
    steps = [] if "-n" in options else ["-n", STEPS]
    line = error_line(verify(ORIGINAL, PORT, *steps, "-q", "--ref-run", pair / given, "-o", out, *options))
    assert line.startswith(f"--ref-run {pair / given} is not a run of ORIGINAL {ORIGINAL} with this pair's "
                           "arguments, seed and steps: ") and named in line, line
    assert not out.exists()


def test_a_ref_run_of_original_as_it_was_is_refused_once_its_text_changed(pair, tmp_path):
    original = shutil.copy(ORIGINAL, tmp_path / ORIGINAL.name)
    Path(original).write_text(Path(original).read_text().replace("lr=args.lr", "lr=args.lr * 2"))
    line = error_line(verify(original, PORT, "-n", STEPS, "-q", "--ref-run", pair / run_folders.REF, "-o",
                             tmp_path / "out"))
    assert "its script " in line and "(sha256 " in line, line


def test_a_broken_port_against_a_ref_run_fails_and_never_passes_on_a_calibration_from_elsewhere(
        pair, other_calibration, tmp_path):
    """The reference's own calibration beside --ref-run is taken; the broken port FAILs. Another script's calibration
    in its place is refused: exit 2, not the PASS it made."""
    broken = tmp_path / "broken_npu.py"
    broken.write_text(PORT.read_text().replace("self.act = nn.ReLU()", "self.act = nn.GELU()"))
    out = tmp_path / "out"
    failed = verify(ORIGINAL, broken, "-n", STEPS, "-q", "--ref-run", pair / run_folders.REF, "-o", out)
    assert failed.exit_code == 1, failed.output
    summary = json.loads((out / "summary.json").read_text())
    assert [entry["path"] for entry in summary["runs"]["calibrations"]] == ["../pair/calibration"]
    shutil.rmtree(pair / run_folders.CALIBRATION)
    shutil.copytree(other_calibration, pair / run_folders.CALIBRATION)
    assert "is not a calibration run" in error_line(verify("compare", pair / run_folders.REF, out / "actual"))


# --- item 3: `verify report` judges again from the runs its summary names -------------------------------------------


def test_report_judges_the_pair_again_from_its_runs(pair):
    """The pair's folder, moved: its summary names its runs relative to it."""
    result = verify("report", pair)
    assert result.exit_code == 0, result.output
    assert "PASS: loss within 1.00% at all 3 steps" in result.output and "ops: exact 62" in result.output
    assert f"ref:    {ORIGINAL} on EMULATED CUDA" in result.output  # the comparison made again, as the pair printed it


def test_report_on_a_pair_with_a_damaged_run_is_exit_2_naming_it(pair):
    (pair / run_folders.ACTUAL / "losses.csv").write_bytes(b"\x00garbage\xff" * 40)
    line = error_line(verify("report", pair))
    assert line.startswith(f"damaged run directory {pair / 'actual'}: losses.csv"), line


def test_report_on_a_pair_whose_loss_was_edited_judges_the_edited_loss(pair):
    """A loss edited in place (the manifest untouched) is what the runs now hold: judged, it FAILs."""
    losses = pair / run_folders.ACTUAL / "losses.csv"
    lines = losses.read_text().splitlines()
    step, micro, loss, *rest = lines[-1].split(",")
    losses.write_text("\n".join([*lines[:-1], ",".join([step, micro, str(float(loss) * 2), *rest])]) + "\n")
    result = verify("report", pair)
    assert result.exit_code == 1 and "FAIL" in result.output, result.output


def test_report_on_a_summary_without_its_runs_is_exit_2(pair):
    """The runs gone from where the summary was written beside them (and from where they were judged)."""
    reports = pair / "reports"
    assert verify("compare", *sides(pair), "-o", reports).exit_code == 0
    for name in (run_folders.REF, run_folders.ACTUAL, run_folders.CALIBRATION):
        shutil.rmtree(pair / name)
    line = error_line(verify("report", reports))
    assert line.startswith(f"{reports / 'summary.json'} was judged from the reference run {pair / 'ref'}, "
                           "which is not there"), line


def test_report_of_a_copy_without_its_runs_names_the_folder_whose_runs_it_judged(recorded, tmp_path):
    """Regression (issue 52 item 6): a copy of a pair's folder whose runs are gone is judged from the original's,
    which its summary names by their absolute paths, and no report said so: the verdict read as the copy's own."""
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(recorded / "summary.json", copy)
    said = (f"judged from runs read in {recorded.resolve()}: the summary names them there, and they are gone from "
            "beside it")
    result = verify("report", copy)
    assert result.exit_code == 0, result.output
    assert f"note: {said}" in result.output
    # `verify report` writes no report files; those of its judgment, written, say it too
    write_reports(judged_again(copy / "summary.json", json.loads((copy / "summary.json").read_text())), copy / "again")
    summary = json.loads((copy / "again" / "summary.json").read_text())
    assert said in summary["notes"]
    assert said in (copy / "again" / "report.html").read_text()


def test_report_on_a_pair_whose_run_was_replaced_is_exit_2(pair):
    shutil.rmtree(pair / run_folders.ACTUAL)
    shutil.copytree(pair / run_folders.REF, pair / run_folders.ACTUAL)
    line = error_line(verify("report", pair))
    assert line == f"{pair / 'actual'} is not the port's run {pair / 'summary.json'} was judged from: its " \
                   "manifest.json changed since", line


@pytest.mark.parametrize("content", ['{"exit_code": 0}', "{}", '{"verdict": "PASS", "passed": true, "runs": {}}'])
def test_report_on_a_hand_written_summary_is_exit_2(tmp_path, content):
    (tmp_path / "summary.json").write_text(content)
    line = error_line(verify("report", tmp_path))
    assert line.startswith(f"{tmp_path / 'summary.json'} ") and "no verdict without runs" in line, line


# --- item 4: every -o refuses a folder it did not write ---------------------------------------------------------------


def test_compare_into_a_run_folder_is_refused_and_leaves_it_as_it_was(pair):
    ref, actual = sides(pair)
    before = {path: path.read_bytes() for path in ref.rglob("*") if path.is_file()}
    line = error_line(verify("compare", ref, actual, "-o", ref))
    assert line.startswith(f"{ref} already exists and is not an empty folder nor verify compare's earlier output"), line
    assert {path: path.read_bytes() for path in ref.rglob("*") if path.is_file()} == before


def test_compare_into_a_users_folder_is_refused(pair, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text("my notes")
    assert "not an empty folder" in error_line(verify("compare", *sides(pair), "-o", mine))
    assert [path.name for path in mine.iterdir()] == ["summary.json"]
    assert (mine / "summary.json").read_text() == "my notes"


def test_compare_writes_its_own_output_again_but_not_once_a_person_edited_it(pair, tmp_path):
    out = tmp_path / "reports"
    for _ in range(2):
        result = verify("compare", *sides(pair), "-o", out)
        assert result.exit_code == 0, result.output
    again = verify("report", out)
    assert again.exit_code == 0 and "PASS" in again.output, again.output
    (out / "advice.txt").write_text("edited")
    line = error_line(verify("compare", *sides(pair), "-o", out))
    assert "(advice.txt changed)" in line, line
    assert (out / "advice.txt").read_text() == "edited"


def test_export_writes_only_into_an_empty_folder_or_its_own_dump(pair, tmp_path):
    dump = tmp_path / "dump"
    for _ in range(2):
        result = verify("export", "--msprobe", pair / run_folders.REF, dump)
        assert result.exit_code == 0, result.output
    (dump / "notes.txt").write_text("mine")
    line = error_line(verify("export", "--msprobe", pair / run_folders.REF, dump))
    assert "(notes.txt is not a file it wrote)" in line, line


def test_a_ref_run_is_refused_once_a_file_original_imported_changed(tmp_path):
    """ORIGINAL's text alone is not the program: the ref run recorded the project files it imported (their sha256)."""
    (tmp_path / "helper.py").write_text("SCALE = 1.0\n")
    code = (SCRIPTS / "tiny_train.py").read_text().replace("import argparse\n", "import argparse\n\nimport helper\n", 1)
    original = tmp_path / "train.py"
    original.write_text(code)
    (tmp_path / "train_npu.py").write_text("# the port\n" + code)
    reference = run_script(original, [], RunOptions(steps=1, device="cpu"), tmp_path / "reference")
    assert verify("report", reference).exit_code == 0
    (tmp_path / "helper.py").write_text("SCALE = 2.0\n")
    line = error_line(verify(original, tmp_path / "train_npu.py", "-n", "1", "-q", "--ref-run", reference, "-o",
                             tmp_path / "out"))
    assert line.endswith("the file it imported differs: helper.py"), line
