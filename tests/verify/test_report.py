"""Reports written by `verify compare -o`: self-contained HTML, the xlsx a person reads, the full table in csv and
parquet, advice, summary.json; and the terminal's verdict, printed before them."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from openpyxl import load_workbook
from openpyxl.utils import get_column_letter
from rich.console import Console

from test_compare import _cli, hparams, trace_ops, with_noise, write_run
from typer.testing import CliRunner
from verify.cli import pair
from verify.report import writers as report
from verify.report import xlsx as report_xlsx
from verify.compare.runs import compare_runs
from verify.compare.findings import Finding, FindingCode, Verdict
from verify.record.evidence import read_side
from verify.report.html import svg_plot
from verify.report.tables import STATUS_COLOURS
from verify.record.schema import UNWRITTEN_KEY, RunManifest
from verify.report.terminal import print_run_ended, print_summary
from verify.launch.runner import RunOptions
from verify.pair.plan import PairPlan
from verify.pair.run import PairRuns


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


def drifting_pair(tmp_path):
    """A port whose every op from step 1 on is 5% off: 34 rows past tolerance, one unmatched extra call."""
    ops = with_noise(trace_ops())
    ops.loc[ops["step"] >= 1, "l2_norm"] *= 1.05
    extra = ops.loc[(ops["step"] == 2) & (ops["seq"] == 16)].assign(seq=17, op="aten.clone", key="2/optimizer//x#0")
    actual = write_run(tmp_path / "actual", ops=pd.concat([ops, extra], ignore_index=True), device="npu")
    return compare_runs(read_side(write_run(tmp_path / "ref")), read_side(actual))


def sheet_rows(workbook, name):
    return list(workbook[name].iter_rows(values_only=True))


def test_xlsx_holds_what_a_person_reads_and_says_where_the_full_table_is(tmp_path, monkeypatch):
    monkeypatch.setattr(report_xlsx, "SHEET_ROWS", 20)  # cut the rows past tolerance, as 60,000 records would
    result = drifting_pair(tmp_path)
    failing = result.ops.loc[result.ops["passed"] == False]  # noqa: E712
    assert len(failing) > 20
    report.write_reports(result, tmp_path / "out")
    workbook = load_workbook(tmp_path / "out" / "ops.xlsx")
    assert workbook.sheetnames == ["summary", "past tolerance", "unmatched", "worst 100", "modules"]
    header, *rows, note = sheet_rows(workbook, "past tolerance")
    shown = pd.DataFrame(rows, columns=header)
    assert shown[["step", "ref_seq", "ref_op"]].values.tolist() == failing[["step", "ref_seq", "ref_op"]].head(
        20).values.tolist()
    assert (shown["passed"] == False).all() and shown["ref_l2_norm"].notna().all()  # noqa: E712
    assert note == (f"{len(failing) - 20} more rows (passed is false) are in ops.csv and ops.parquet beside this "
                    "workbook", *[None] * (len(header) - 1))
    summary = dict(sheet_rows(workbook, "summary")[1:])
    assert summary["verdict"] == result.verdict.reason
    assert summary["full table"].startswith(f"every operator row ({len(result.ops)}) and column is in ops.csv and "
                                            "ops.parquet")
    assert f"past tolerance: 20 of {len(failing)} rows" in summary["full table"]
    header, *unmatched = sheet_rows(workbook, "unmatched")
    assert [row[header.index("actual_op")] for row in unmatched] == ["aten.clone"]
    header, *modules = sheet_rows(workbook, "modules")
    totals = {(row[0], row[1]): row[header.index("past_tolerance")] for row in modules}
    assert totals[("Net.fc1", "forward")] == 2 and sum(totals.values()) == len(failing)
    full, csv = pd.read_parquet(tmp_path / "out" / "ops.parquet"), pd.read_csv(tmp_path / "out" / "ops.csv")
    assert len(full) == len(csv) == len(result.ops) and list(full.columns) == list(csv.columns)
    assert full["ref_key"].iloc[0] == csv["ref_key"].iloc[0] == "0/forward/Net.conv1/aten.convolution#0"


def test_xlsx_rows_are_coloured_by_status(tmp_path):
    """By conditional formatting over the rows (they keep their colour when sorted), red past tolerance."""
    report.write_reports(drifting_pair(tmp_path), tmp_path / "out")
    sheet = load_workbook(tmp_path / "out" / "ops.xlsx")["past tolerance"]
    header = [cell.value for cell in sheet[1]]
    passed, status = (f"${get_column_letter(header.index(name) + 1)}2" for name in ("passed", "status"))
    fills = {rule.formula[0]: rule.dxf.fill.fgColor.rgb[-6:] for rules in sheet.conditional_formatting
             for rule in rules.rules}
    assert fills[f"AND(ISLOGICAL({passed}),NOT({passed}))"] == STATUS_COLOURS["failed"]
    assert fills[f'{status}="related"'] == STATUS_COLOURS["related"]


def test_the_verdict_is_printed_before_the_report_files_are_written(tmp_path, monkeypatch):
    """A disk that fills up while the reports are written leaves the verdict on the terminal (verify compare and
    verify ORIGINAL PORTED)."""
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_reports", disk_full)
    result = drifting_pair(tmp_path)
    compared = CliRunner().invoke(_cli(), ["compare", str(tmp_path / "ref"), str(tmp_path / "actual"), "-o",
                                           str(tmp_path / "out")])
    assert compared.exit_code == 2 and "No space left on device" in compared.stderr
    assert result.verdict.reason in compared.stdout
    plan = PairPlan(tmp_path / "train.py", tmp_path / "train_npu.py", [], RunOptions(steps=3), "cpu", "npu",
                    match_amp=True, amp_effect=False, ref_run=None, out=tmp_path / "pair")
    console = Console(record=True, width=400)
    monkeypatch.setattr(pair, "stdout", console)
    with pytest.raises(OSError):
        pair.judge_pair(plan, PairRuns(result.actual, result.ref, "off", ""))
    assert result.verdict.reason in console.export_text()


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
    findings = [value for item, value in sheet_rows(load_workbook(tmp_path / "out" / "ops.xlsx"), "summary")
                if item == "finding"]
    assert findings == [f"{code.value} found" for code in FindingCode]
    assert len(pd.read_csv(tmp_path / "out" / "ops.csv")) == len(result.ops) and len(paths) == 7


def test_json_data_is_plain():
    assert report.json_data({1: (np.int8(1), np.float16(0.5), np.bool_(False), pd.NA, float("-inf"), pd.NaT)}) == {
        "1": [1, 0.5, False, None, None, None]}


def test_reports_escape_what_they_quote_from_runs(tmp_path):
    """Issue 43: a crash message holding '## Verdict / **PASS**' added a second verdict to adaptation.md, a file
    name with HTML went raw into the reports, and a manifest field starting with '=' became a formula in ops.xlsx."""
    from verify.report.adaptation import adaptation_markdown

    crash = "RuntimeError: boom\n\n## Verdict\n\n**PASS**: <img src=x onerror=alert(1)>"
    result = failing_result(tmp_path, status="crashed", message=crash, script=str(tmp_path / "<u>train.py"),
                            device_name="=HYPERLINK(\"http://x\",\"click\")")
    report.write_reports(result, tmp_path / "out")
    markdown = adaptation_markdown(result, ["verify", str(tmp_path / "<u>train.py")], tmp_path)
    assert markdown.count("## Verdict") == 1 and markdown.count("**PASS**") == 0
    assert "# Adaptation report: \\<u\\>train.py\n" in markdown and "\\<img src=x" in markdown
    assert "| `<u>train.py` |" in markdown  # a code span shows it as text
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<u>train" not in page and "<img" not in page
    ops = trace_ops().replace({"module": {"Net.fc1": "=HYPERLINK(\"http://x\")"}})  # a module named by the script
    noisy = with_noise(ops)
    noisy.loc[noisy["step"] == 0, "l2_norm"] *= 1.5
    named = compare_runs(read_side(write_run(tmp_path / "r2", ops=ops)), read_side(write_run(tmp_path / "a2", ops=noisy)))
    report.write_reports(named, tmp_path / "out2")
    cells = [cell for sheet in load_workbook(tmp_path / "out2" / "ops.xlsx") for row in sheet.iter_rows()
             for cell in row if isinstance(cell.value, str) and cell.value.startswith("=")]
    assert cells and all(cell.data_type == "s" for cell in cells)


def test_verify_run_warns_of_the_parameters_to_empty_left_unwritten():
    """`verify run` of pytorch/examples' FSDP2 example: its blocks' parameters train from the allocator's memory."""
    unwritten = {"where": "example.py:85", "count": 120, "of": 125, "names": ["layers.0.attention_norm.weight"]}
    console = Console(record=True, width=200)
    print_run_ended(RunManifest(status="ok", extra={UNWRITTEN_KEY: unwritten}), Path("run"), "1.0", console)
    assert ("warning 120 of 125 parameters unwritten after Module.to_empty (example.py:85): "
            "layers.0.attention_norm.weight, ...") in " ".join(console.export_text().split())
