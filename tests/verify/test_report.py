"""Reports written by `verify compare -o`: self-contained HTML, coloured xlsx, csv, advice, summary.json."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
from openpyxl import load_workbook
from rich.console import Console

from test_compare import hparams, trace_ops, with_noise, write_run
from verify import report
from verify.compare import compare_runs
from verify.findings import Finding, FindingCode, Verdict
from verify.compare_cli import read_side
from verify.report_html import svg_plot
from verify.report_tables import STATUS_COLOURS, op_report_frame
from verify.report_terminal import print_saved_summary, print_summary
from verify.report_xlsx import write_xlsx


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
    assert {p.name for p in paths} == {"summary.json", "ops.csv", "ops.parquet", "ops.xlsx", "advice.txt",
                                       "report.html", "losses.csv"}
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
    write_xlsx(op_report_frame(result), tmp_path / "ops.xlsx")
    sheet = load_workbook(tmp_path / "ops.xlsx").active
    header = [cell.value for cell in sheet[1]]
    status_at, passed_at = header.index("status"), header.index("passed")
    colours = {(row[status_at].value, row[passed_at].value): row[0].fill.start_color.rgb[-6:]
               for row in sheet.iter_rows(min_row=2)}
    assert colours[("exact", True)] == STATUS_COLOURS["exact"]
    assert colours[("exact", False)] == STATUS_COLOURS["failed"]
    csv_keys = op_report_frame(result)["ref_key"].dropna()
    assert csv_keys.iloc[0] == "0/forward/Net.conv1/aten.convolution#0"


def test_terminal_summary(tmp_path):
    result = failing_result(tmp_path)
    console = Console(record=True, width=200)
    print_summary(result, console)
    text = console.export_text()
    assert "ACTUAL RAN ON AN EMULATED NPU" in text
    assert "FAIL: hyperparameter differs: lr 0.1 vs 0.01 in group 0" in text
    assert "first divergent operator: aten.addmm (Net.fc1, forward, step 0, out0)" in text


def test_svg_plot_survives_nan_and_constant_series():
    svg = svg_plot({"a": ([0, 1, 2], [1.0, np.nan, 1.0])}, "t", "y", limit=0.5)
    assert svg.startswith("<svg") and "polyline" in svg
    assert "no data" in svg_plot({"a": ([], [])}, "t", "y")


# What compare puts in a finding's detail comes from pandas rows and numpy reductions: none of it is plain JSON.
NUMPY_DETAIL = {
    "step": np.int64(2), "seq": np.int32(4), "side": "actual", "status": "crashed", "op": np.str_("aten.addmm"),
    "actual_op": "aten.mm", "module": "Net.fc1", "phase": "forward", "io": "out0", "dtype": "float16",
    "actual_dtype": pd.NA, "scale": np.float64(65536.0), "drops": np.int64(3), "scales": np.array([65536.0, 1.0]),
    "skipped": (1, 2), "collapsed": np.bool_(True), "update_by_hand": np.bool_(True), "follows_hparams": "",
    "share": np.float32(0.25), "rel_diff": np.float64(np.inf), "cosine": np.float64(np.nan), "name": "lr",
    "param": "fc1.weight", "explains": "TF32 matmuls", "ref_amp": "", "actual_amp": "float16",
    "ref_steps": np.int64(8), "actual_steps": 6, "steps_requested": 10, "where": Path("runs/npu"),
    "ref": {"nan_count": np.int64(0), "mean": np.float64(np.nan)},
}


def test_every_finding_with_numpy_details_goes_through_every_report_writer(tmp_path):
    """Regression: a script updating its parameters by hand gave a numpy bool in detail["update_by_hand"], and
    summary.json died on it after compare had found the FAIL. Every writer gets plain data from report.write_json."""
    result = failing_result(tmp_path)
    result.findings = [Finding(code, f"{code.value} found", dict(NUMPY_DETAIL)) for code in FindingCode]
    result.verdict = Verdict(False, f"FAIL: {result.findings[0].message}")
    paths = report.write_reports(result, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / report.SUMMARY_JSON).read_text())
    assert [finding["code"] for finding in summary["findings"]] == [code.value for code in FindingCode]
    detail = summary["findings"][0]["detail"]
    assert detail["update_by_hand"] is True and detail["collapsed"] is True
    assert (detail["step"], detail["drops"], detail["share"], detail["scales"]) == (2, 3, 0.25, [65536.0, 1.0])
    assert detail["actual_dtype"] is None and detail["rel_diff"] is None and detail["cosine"] is None
    assert detail["where"] == "runs/npu" and detail["ref"] == {"nan_count": 0, "mean": None}
    page = (tmp_path / "out" / "report.html").read_text()
    assert all(f"{code.value} found" in page for code in FindingCode)
    assert "steps_differ found" in (tmp_path / "out" / "advice.txt").read_text()
    assert load_workbook(tmp_path / "out" / "ops.xlsx").active.max_row == len(result.ops) + 1
    full, csv = pd.read_parquet(tmp_path / "out" / "ops.parquet"), pd.read_csv(tmp_path / "out" / "ops.csv")
    assert len(full) == len(csv) == len(result.ops) and list(full.columns) == list(csv.columns) and len(paths) == 7
    assert full["ref_key"].iloc[0] == csv["ref_key"].iloc[0] == "0/forward/Net.conv1/aten.convolution#0"
    console = Console(record=True, width=200)
    print_saved_summary(summary, console)
    assert "FAIL: run_failed found" in console.export_text()


def test_json_data_is_plain():
    assert report.json_data({1: (np.int8(1), np.float16(0.5), np.bool_(False), pd.NA, float("-inf"), pd.NaT)}) == {
        "1": [1, 0.5, False, None, None, None]}
