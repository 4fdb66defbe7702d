"""migrate never calls a script ported, or a checklist item passed, when it is not (issue 13); and its terminal
output fits a pipe. Each case on a real file through the command line."""

import inspect
import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from migrate import checklist, cli
from migrate.cli import app
from migrate.facts import file_facts
from migrate.types import FileResult, FileStatus
from rules import Settings
from rules import all_rules, rule_by_code

runner = CliRunner()

# A script that already knows the NPU exists (a branch, a backend table, a --device-modules option) but has not been
# ported: without `import torch_npu` nothing registers the npu device, and its default device is "cuda".
MULTI_DEVICE = '''"""Fit a line on the accelerator given by --device."""
import argparse
import importlib

import torch

BACKENDS = {"cuda": "nccl", "npu": "hccl"}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "npu":
        torch.npu.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", help="cuda, npu or cpu")
    parser.add_argument("--device-modules", nargs="*", default=[], help="modules that register a device")
    args = parser.parse_args()
    for name in args.device_modules:
        importlib.import_module(name)
    device = torch.device(args.device)
    weight = torch.zeros(1, device=device, requires_grad=True)
    loss = (weight - 1).pow(2).sum()
    loss.backward()
    synchronize(device)


if __name__ == "__main__":
    main()
'''


def migrate(*args: object):
    return runner.invoke(app, [str(arg) for arg in args])


def test_a_script_that_only_names_the_npu_is_ported_and_runs_there_by_default(tmp_path: Path):
    script = tmp_path / "fit.py"
    script.write_text(MULTI_DEVICE)
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    assert "1 ported" in result.stderr
    ported = (tmp_path / "fit_npu.py").read_text()
    assert "import torch\nimport torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n" in ported
    assert 'parser.add_argument("--device", default="npu", help="cuda, npu or cpu")' in ported
    report = (tmp_path / "fit_npu_report" / "report.md").read_text()
    assert 'DEV020: --device default -> "npu"' in report
    assert migrate(tmp_path / "fit_npu.py", "--check").exit_code == 0, "the port is taken as ported"


def test_a_device_option_the_script_cannot_take_npu_for_is_kept_and_named(tmp_path: Path):
    script = tmp_path / "fit.py"
    script.write_text(MULTI_DEVICE.replace('help="cuda, npu or cpu"', 'choices=["cuda", "cpu"]'))
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    assert 'default="cuda", choices=["cuda", "cpu"]' in (tmp_path / "fit_npu.py").read_text()
    report = (tmp_path / "fit_npu_report" / "report.md").read_text()
    assert 'DEV020: --device picks the device; its default "cuda" runs on the NPU through transfer_to_npu' in report
    assert 'its choices lack "npu"' in report


# ----- a checklist item passes only when something was checked ---------------------------------------------------

BROKEN = "import torch\n\ndef train(:\n    pass\n"
ITEMS = [f"C{i}" for i in range(1, 10)]


def _checklist(report: Path) -> dict[str, dict]:
    return {item["id"]: item for item in json.loads((report / "checklist.json").read_text())}


def _build(*results: FileResult, rules=None) -> dict[str, checklist.Item]:
    command = "verify train.py train_npu.py -- ARGS"
    items = checklist.build(results, Settings(), all_rules() if rules is None else rules, command, "train.py")
    return {item.id: item for item in items}


def test_every_item_of_a_file_that_does_not_parse_is_not_checked_for_that_reason(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(BROKEN)
    result = migrate(script)
    assert result.exit_code == 2
    error = f"{script}:3:11: syntax error: invalid syntax"
    assert result.stderr.startswith(f"error: {error}\n")
    assert "passed" not in result.stderr and "Accuracy checklist" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"], "no report folder for a file never read"

    failed = FileResult(str(script), None, FileStatus.ERROR, error=error)
    items = _build(failed)
    assert list(items) == ITEMS
    for item in items.values():
        assert item.status is checklist.Status.NOT_CHECKED, item
        assert item.evidence[0] == f"not read: {error}", item


def test_every_item_of_an_empty_file_is_not_checked(tmp_path: Path):
    script = tmp_path / "empty.py"
    script.write_text("")
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    items = _checklist(tmp_path / "empty_npu_report")
    assert list(items) == ITEMS
    for item in items.values():
        assert item["status"] == "Not checked", item
        assert item["evidence"] or item["action"], item  # each says why, or what checks it
    assert "no file that was read imports torch" in items["C3"]["evidence"][0]
    assert items["C9"]["evidence"] == ["no hyperparameter found in the source that was read"]
    assert "nothing for DATA" in items["C6"]["evidence"][0]


def test_a_file_that_does_not_parse_turns_the_passes_of_the_others_into_not_checked(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(MULTI_DEVICE)
    (project / "broken.py").write_text(BROKEN)
    result = migrate(project)
    assert result.exit_code == 2
    error = f"{project / 'broken.py'}:3:11: syntax error: invalid syntax"
    assert result.stderr.startswith(f"error: {error}\n"), "the error comes before the checklist that depends on it"
    items = _checklist(tmp_path / "project_npu_report")
    assert {item["status"] for item in items.values()} <= {"Not checked", "Failed"}
    assert items["C3"]["status"] == "Not checked" and items["C3"]["evidence"][0] == f"not read: {error}"
    assert any(e.endswith(": npu_import") for e in items["C3"]["evidence"]), "what was checked stays listed"
    assert items["C1"]["evidence"][0] == f"not read: {error}" and "verify determinism" in items["C1"]["action"]


def test_an_item_whose_rules_were_left_out_is_not_checked(tmp_path: Path):
    script = tmp_path / "fit.py"
    script.write_text(MULTI_DEVICE)
    assert _checklist_of(script, tmp_path)["C8"]["status"] == "Passed"
    items = _checklist_of(script, tmp_path, "--ignore", "TRN002")
    assert items["C8"]["status"] == "Not checked"
    assert items["C8"]["evidence"][0] == "not run: TRN002 (left out by --select/--ignore)"
    assert "without --select/--ignore" in items["C8"]["action"]
    selected = _checklist_of(script, tmp_path, "--select", "IMP001")
    assert selected["C8"]["status"] == "Not checked" and "TRN001, TRN002" in selected["C8"]["evidence"][0]
    assert "Passed" not in {item["status"] for key, item in selected.items() if key != "C3"}


def _checklist_of(script: Path, tmp_path: Path, *options: str) -> dict[str, dict]:
    report = tmp_path / "report"
    result = migrate(script, "--report-dir", report, *options)
    assert result.exit_code == 0, result.stderr
    return _checklist(report)


def test_facts_python_cannot_read_are_unknown_not_absent():
    """libcst reads some syntax that the running Python's `ast` does not: such a file's facts are not 'none found'."""
    facts = file_facts(BROKEN, BROKEN)
    assert not facts.readable
    items = _build(FileResult("train.py", "train_npu.py", FileStatus.UNCHANGED, facts=facts))
    assert all(item.status is not checklist.Status.PASSED for item in items.values())
    reason = "train.py: Python's parser cannot read it, so its facts are unknown"
    assert items["C9"].evidence[0] == reason and items["C8"].evidence[0] == reason


# ----- output that fits a pipe ------------------------------------------------------------------------------------


def test_list_rules_in_a_pipe_prints_one_whole_line_per_rule():
    result = migrate("--list-rules")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == len(all_rules())
    for line, rule in zip(lines, all_rules()):
        assert line.split()[:2] == [rule.CODE, rule.name()] and line.endswith(rule.summary()), line
    assert not any(mark in result.stdout for mark in "…│┃━")


def test_explain_in_a_pipe_prints_the_whole_manual_as_written():
    """Every line of the manual comes out whole; `[...]` in it is text, not rich markup."""
    result = migrate("--explain", "DATA001")
    assert result.exit_code == 0
    rule = rule_by_code("DATA001")
    manual = inspect.cleandoc(rule.__doc__)
    assert result.stdout == f"# {rule.name()} (DATA001) - {rule.SAFETY.value}\n{manual}\n"
    assert "[rank::world_size]" in result.stdout  # rich would take it for a markup tag


def test_the_checklist_and_summary_in_a_pipe_are_whole_lines(tmp_path: Path):
    script = tmp_path / "fit.py"
    script.write_text(MULTI_DEVICE)
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    items = lines[lines.index("Accuracy checklist") + 1 :][:9]
    c8 = checklist.TITLES["C8"]
    assert items[7] == f"C8 passed      {c8}: nothing found by TRN001, TRN002", "longer than 80 columns, not cut"
    assert [line.split()[0] for line in items] == ITEMS
    assert any(line.startswith("npu-port: 1 file: 1 ported, 0 unchanged | findings: ") for line in lines)
    assert "…" not in result.stderr


def test_a_terminal_keeps_the_rich_table(monkeypatch):
    terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
    monkeypatch.setattr(cli, "stdout", terminal)
    assert migrate("--list-rules").exit_code == 0
    table = terminal.file.getvalue()
    assert "┏" in table and "code" in table and "…" in table  # a boxed table, cut to the terminal's width
