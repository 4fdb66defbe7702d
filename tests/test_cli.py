"""The `migrate` command line, run in-process with typer's CliRunner on real files: exit codes, stdout, stderr."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate import __version__
from migrate.cli import app

GPU_SCRIPT = '''"""Train."""
import torch
import torch.nn as nn


def main():
    model = nn.Linear(2, 2)


if __name__ == "__main__":
    main()
'''

runner = CliRunner()


def migrate(*args: object):
    return runner.invoke(app, [str(arg) for arg in args])


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(GPU_SCRIPT)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text(GPU_SCRIPT)
    (root / "pkg" / "model.py").write_text("import torch\n\nclass Net(torch.nn.Module):\n    pass\n")
    (root / "pkg" / "plain.py").write_text("x = 1\n")
    (root / "config.yaml").write_text("lr: 0.1\n")
    return root


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_version():
    result = migrate("--version")
    assert result.exit_code == 0
    assert __version__ in result.stdout


def test_list_rules_names_every_rule():
    from rules import all_rules

    result = migrate("--list-rules")
    assert result.exit_code == 0
    assert all(rule.CODE in result.stdout for rule in all_rules())


def test_explain_prints_the_manual():
    result = migrate("--explain", "IMP001")
    assert result.exit_code == 0
    assert "IMP001" in result.stdout and "## Safety" in result.stdout


def test_explain_unknown_code_is_a_usage_error():
    result = migrate("--explain", "XYZ999")
    assert result.exit_code == 2
    assert "XYZ999" in result.stderr and result.stdout == ""


def test_no_path_is_a_usage_error():
    result = migrate()
    assert result.exit_code == 2
    assert "give at least one file" in result.stderr


def test_default_run_writes_beside_and_keeps_the_original(script: Path):
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    assert script.read_text() == GPU_SCRIPT
    ported = script.with_name("train_npu.py").read_text()
    assert "import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n" in ported
    report = script.with_name("train_npu_report")
    expected = {"report.md", "findings.csv", "findings.json", "diff.patch", "change_list.csv", "unsupported_api.csv",
                "written.json"}
    assert expected <= {p.name for p in report.iterdir()}
    assert "1 ported" in result.stderr and "Report:" in result.stderr
    assert result.stdout == ""


def test_diff_prints_a_git_style_patch_and_writes_nothing(script: Path):
    before = files_under(script.parent)
    result = migrate(script, "--diff")
    assert result.exit_code == 1
    assert result.stdout.startswith(f"--- a/{str(script).lstrip('/')}\n+++ b/{str(script.with_name('train_npu.py')).lstrip('/')}\n")
    assert "+import torch_npu\n" in result.stdout
    assert files_under(script.parent) == before


def test_diff_exits_0_when_nothing_would_change(tmp_path: Path):
    plain = tmp_path / "plain.py"
    plain.write_text("print('no torch here')\n")
    result = migrate(plain, "--diff")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.py"]


def test_check_writes_nothing_and_exits_1(script: Path):
    before = files_under(script.parent)
    result = migrate(script, "--check")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "1 would be ported" in result.stderr
    assert files_under(script.parent) == before


def test_select_and_ignore(script: Path):
    selected = migrate(script, "--diff", "--select", "IMP001")
    assert selected.exit_code == 1 and "+import torch_npu" in selected.stdout
    ignored = migrate(script, "--diff", "--ignore", "IMP")
    assert "+import torch_npu" not in ignored.stdout
    unknown = migrate(script, "--check", "--select", "NOPE1")
    assert unknown.exit_code == 2 and "NOPE1" in unknown.stderr


def test_out_file(script: Path, tmp_path: Path):
    target = tmp_path / "elsewhere" / "ported.py"
    result = migrate(script, "-o", target, "--select", "IMP001")
    assert result.exit_code == 0, result.stderr
    assert "import torch_npu" in target.read_text()
    assert not script.with_name("train_npu.py").exists()


def test_out_folder_mirrors_the_project_and_copies_other_files(project: Path, tmp_path: Path):
    out = tmp_path / "ported"
    result = migrate(project, "-o", out, "--select", "IMP001")
    assert result.exit_code == 0, result.stderr
    assert set(files_under(out)) == {"train.py", "pkg/model.py", "pkg/plain.py", "config.yaml"}
    assert (out / "config.yaml").read_bytes() == (project / "config.yaml").read_bytes()
    assert "import torch_npu" in (out / "train.py").read_text()
    assert (out / "pkg" / "plain.py").read_text() == "x = 1\n"


def test_folder_default_output_is_a_sibling(project: Path):
    result = migrate(project, "--select", "IMP001")
    assert result.exit_code == 0, result.stderr
    assert (project.parent / "proj_npu" / "train.py").exists()
    assert (project.parent / "proj_npu_report" / "report.md").exists()


def test_in_place_overwrites_only_when_asked(script: Path):
    result = migrate(script, "--in-place", "--select", "IMP001")
    assert result.exit_code == 0, result.stderr
    assert "import torch_npu" in script.read_text()
    assert not script.with_name("train_npu.py").exists()


def test_out_and_in_place_exclude_each_other(script: Path, tmp_path: Path):
    result = migrate(script, "-o", tmp_path / "x.py", "--in-place")
    assert result.exit_code == 2 and "exclude" in result.stderr


def test_report_dir(script: Path, tmp_path: Path):
    reports = tmp_path / "reports"
    result = migrate(script, "--report-dir", reports, "--select", "IMP001")
    assert result.exit_code == 0, result.stderr
    report = (reports / "report.md").read_text()
    assert "| file | status |" in report
    patch = (reports / "diff.patch").read_text()
    assert patch.startswith("--- a/") and patch.endswith("\n")


def test_report_lines_name_path_line_and_code(script: Path, tmp_path: Path):
    reports = tmp_path / "reports"
    migrate(script, "--report-dir", reports, "--select", "IMP001")
    report = (reports / "report.md").read_text()
    # the message quotes code in backticks: the finding's code span is fenced by two (it was cut at the first)
    assert f"- `` {script}:2:1: INFO IMP001: added `import torch_npu` and" in report
    assert "Findings: " in report and "| changed |" in report


def test_jobs_2_gives_the_same_results_as_jobs_1(project: Path, tmp_path: Path):
    one, two = tmp_path / "one", tmp_path / "two"
    first = migrate(project, "-o", one, "--jobs", "1", "--report-dir", tmp_path / "r1")
    second = migrate(project, "-o", two, "--jobs", "2", "--report-dir", tmp_path / "r2")
    assert first.exit_code == second.exit_code == 0, first.stderr + second.stderr
    assert files_under(one) == files_under(two)
    findings = [(tmp_path / r / "findings.csv").read_text() for r in ("r1", "r2")]
    assert findings[0] == findings[1]


def test_migrating_the_output_again_changes_nothing(script: Path):
    assert migrate(script).exit_code == 0
    ported = script.with_name("train_npu.py")
    again = migrate(ported, "--check")
    assert again.exit_code == 0, again.stdout
    rerun = migrate(ported)
    assert rerun.exit_code == 2 and "is a port migrate wrote" in rerun.stderr  # tests/test_user_files.py
    assert not script.with_name("train_npu_npu.py").exists(), "an already ported file is not copied again"


def test_folder_run_skips_outputs_of_earlier_single_file_runs(project: Path, tmp_path: Path):
    assert migrate(project / "train.py", "--select", "IMP001").exit_code == 0
    assert (project / "train_npu.py").exists() and (project / "train_npu_report").is_dir()
    out = tmp_path / "mirror"
    result = migrate(project, "-o", out, "--select", "IMP001")
    assert result.exit_code == 0, result.stderr
    assert "train_npu.py" not in files_under(out)
    assert not any(name.startswith("train_npu_report") for name in files_under(out))


def test_rerunning_a_folder_does_not_port_its_own_output(project: Path):
    assert migrate(project, "--select", "IMP001").exit_code == 0
    assert migrate(project, "--select", "IMP001").exit_code == 0
    assert not (project.parent / "proj_npu_npu").exists()
    assert not (project / "proj_npu").exists()


# What a question about migrate itself may load: never the report writers' pandas, and the rules (libcst) only to
# list them.
HEAVY = {"pandas", "numpy", "libcst", "torch"}


@pytest.mark.parametrize(
    ("option", "allowed"), [("--version", set()), ("--help", set()), ("--list-rules", {"libcst"})]
)
def test_questions_about_migrate_load_nothing_heavy(option, allowed):
    code = (
        f"import sys; sys.argv = ['migrate', {option!r}]\n"
        "from migrate.__main__ import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(*sorted({{name.split('.')[0] for name in sys.modules}} & set({sorted(HEAVY)!r})), file=sys.stderr)"
    )
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)

    assert set(run.stderr.splitlines()[-1].split()) <= allowed
