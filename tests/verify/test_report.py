"""Reports written by `verify compare -o`: self-contained HTML, coloured xlsx, csv, advice, summary.json."""

import json

import numpy as np
from openpyxl import load_workbook
from rich.console import Console

from test_compare import hparams, trace_ops, with_noise, write_run
from verify import report
from verify.compare import compare_runs
from verify.compare_cli import read_side


def failing_result(tmp_path, **actual):
    ops = with_noise(trace_ops())
    ops.loc[(ops["step"] == 0) & (ops["module"] == "Net.fc1"), "l2_norm"] *= 1.5
    ref = write_run(tmp_path / "ref")
    actual_dir = write_run(tmp_path / "actual", ops=ops, hparam=hparams(lr=0.01), emulated=True, emulated_on="cpu",
                           device="emulated-npu", **actual)
    return compare_runs(read_side(ref), read_side(actual_dir))


def test_all_reports_are_written_and_self_contained(tmp_path):
    result = failing_result(tmp_path)
    checklist = [{"id": "C9", "title": "Hyperparameters equal", "status": "Failed", "evidence": ["train.py:12: lr"],
                  "action": "use the same lr"}]
    (tmp_path / "checklist.json").write_text(json.dumps(checklist))
    out = tmp_path / "out"
    found = report.find_checklist(tmp_path / "ref", tmp_path / "actual", out)
    paths = report.write_reports(result, out, checklist=found)
    assert {p.name for p in paths} == {"summary.json", "ops.csv", "ops.xlsx", "advice.txt", "report.html",
                                       "losses.csv"}
    page = (out / "report.html").read_text()
    assert "EMULATED NPU" in page and 'class="banner"' in page
    assert page.count("<svg") == 2 and "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "lr 0.1 vs 0.01 in group 0" in page and "use the same lr" in page
    assert "aten.addmm" in page  # the first divergent op's table
    advice = (out / "advice.txt").read_text()
    assert advice.startswith("FAIL: hyperparameter differs") and "[checklist C9]" in advice
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergent"]["module"] == "Net.fc1" and summary["actual"]["emulated"] is True


def test_xlsx_rows_are_coloured_by_status(tmp_path):
    result = failing_result(tmp_path)
    report.write_xlsx(report.op_report_frame(result), tmp_path / "ops.xlsx")
    sheet = load_workbook(tmp_path / "ops.xlsx").active
    header = [cell.value for cell in sheet[1]]
    status_at, passed_at = header.index("status"), header.index("passed")
    colours = {(row[status_at].value, row[passed_at].value): row[0].fill.start_color.rgb[-6:]
               for row in sheet.iter_rows(min_row=2)}
    assert colours[("exact", True)] == report.STATUS_COLOURS["exact"]
    assert colours[("exact", False)] == report.STATUS_COLOURS["failed"]
    csv_keys = report.op_report_frame(result)["ref_key"].dropna()
    assert csv_keys.iloc[0] == "0/forward/Net.conv1/aten.convolution#0"


def test_terminal_summary(tmp_path):
    result = failing_result(tmp_path)
    console = Console(record=True, width=200)
    report.print_summary(result, console)
    text = console.export_text()
    assert "ACTUAL RAN ON AN EMULATED NPU" in text
    assert "FAIL: hyperparameter differs: lr 0.1 vs 0.01 in group 0" in text
    assert "first divergent operator: aten.addmm (Net.fc1, forward, step 0, out0)" in text


def test_svg_plot_survives_nan_and_constant_series():
    svg = report.svg_plot({"a": ([0, 1, 2], [1.0, np.nan, 1.0])}, "t", "y", limit=0.5)
    assert svg.startswith("<svg") and "polyline" in svg
    assert "no data" in report.svg_plot({"a": ([], [])}, "t", "y")
