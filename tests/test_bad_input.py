"""Bad input gets a clear `path:line:col` error and exit code 2, and nothing is lost: each case on a real file."""

import os
from pathlib import Path

import libcst as cst
import pytest
from typer.testing import CliRunner

from migrate.cli import app
from migrate.files import plan, run_jobs
from migrate.types import FileStatus
from rules import rule_by_code
from rules import PortRule, Settings, Unchanged

runner = CliRunner()
IMP001 = ("--select", "IMP001")  # the one rule that always acts on `import torch`: fast and predictable
TORCH = b"import torch\n"
INSERTED = b"import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n"


def migrate(*args: object):
    return runner.invoke(app, [str(arg) for arg in args])


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_syntax_error_is_reported_and_the_other_files_are_still_ported(tmp_path: Path):
    entry_point = b'if __name__ == "__main__":\n    pass\n'
    write(tmp_path / "src" / "good.py", TORCH + entry_point)
    broken = write(tmp_path / "src" / "broken.py", b"import torch\n\ndef f(:\n    pass\n")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 2
    assert f"{broken}:3:7: syntax error: invalid syntax" in result.stderr
    out = tmp_path / "src_npu"
    assert (out / "good.py").read_bytes() == TORCH + INSERTED + entry_point
    # Every file of the folder arrives: the one that does not parse as it is, and the report says so (issue 22).
    assert (out / "broken.py").read_bytes() == broken.read_bytes()
    report = (tmp_path / "src_npu_report" / "report.md").read_text()
    assert f"| `{broken}` | error, copied unchanged | `{out / 'broken.py'}` |" in report
    assert broken.read_bytes() == b"import torch\n\ndef f(:\n    pass\n"


def test_python_2_code_is_named_as_such(tmp_path: Path):
    script = write(tmp_path / "old.py", b'import torch\nprint "x"\n')
    result = migrate(script, *IMP001)
    assert result.exit_code == 2
    assert f"{script}:2:" in result.stderr and "Python 2" in result.stderr
    assert not (tmp_path / "old_npu.py").exists()


def test_latin1_without_a_coding_cookie_is_a_clear_error(tmp_path: Path):
    script = write(tmp_path / "train.py", TORCH + "# café\n".encode("latin-1"))
    result = migrate(script, *IMP001)
    assert result.exit_code == 2
    assert f"{script}:2:1: not valid utf-8" in result.stderr and "declare the encoding" in result.stderr
    assert not (tmp_path / "train_npu.py").exists()


def test_latin1_with_a_coding_cookie_is_ported_in_latin1(tmp_path: Path):
    source = "# -*- coding: latin-1 -*-\nimport torch\n# café\n".encode("latin-1")
    script = write(tmp_path / "train.py", source)
    result = migrate(script, *IMP001)
    assert result.exit_code == 0, result.stderr
    ported = (tmp_path / "train_npu.py").read_bytes()
    assert ported == "# -*- coding: latin-1 -*-\nimport torch\n".encode("latin-1") + INSERTED + "# café\n".encode(
        "latin-1"
    )


def test_binary_file_is_refused(tmp_path: Path):
    script = write(tmp_path / "blob.py", b"import torch\n\x00\x01\x02")
    result = migrate(script, *IMP001)
    assert result.exit_code == 2
    assert f"{script}:1:1: binary file" in result.stderr


def test_empty_file_is_nothing_to_do(tmp_path: Path):
    script = write(tmp_path / "empty.py", b"")
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "empty_npu.py").read_bytes() == b""
    assert migrate(script, "--check").exit_code == 0


def test_crlf_tabs_and_bom_are_kept_byte_for_byte(tmp_path: Path):
    source = b'\xef\xbb\xbf"""Doc."""\r\nimport torch\r\nif True:\r\n\tx = 1  # tab\r\n'
    script = write(tmp_path / "train.py", source)
    result = migrate(script, *IMP001)
    assert result.exit_code == 0, result.stderr
    ported = (tmp_path / "train_npu.py").read_bytes()
    assert ported == source.replace(b"import torch\r\n", b"import torch\r\n" + INSERTED.replace(b"\n", b"\r\n"))


def test_a_symlink_loop_in_a_folder_does_not_hang(tmp_path: Path):
    write(tmp_path / "src" / "train.py", TORCH)
    os.symlink(tmp_path / "src", tmp_path / "src" / "loop")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "src_npu" / "train.py").exists()


def test_a_dangling_symlink_in_a_folder_is_left_out(tmp_path: Path):
    write(tmp_path / "src" / "train.py", TORCH)
    os.symlink(tmp_path / "missing.py", tmp_path / "src" / "gone.py")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "src_npu").iterdir()) == ["train.py"]


def test_a_dangling_symlink_on_the_command_line_is_a_usage_error(tmp_path: Path):
    os.symlink(tmp_path / "missing.py", tmp_path / "gone.py")
    result = migrate(tmp_path / "gone.py")
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_an_output_folder_that_cannot_be_created_is_a_clear_error(tmp_path: Path):
    script = write(tmp_path / "train.py", TORCH)
    blocker = write(tmp_path / "blocker", b"a file, not a folder")
    result = migrate(script, "-o", blocker / "train_npu.py", *IMP001)
    assert result.exit_code == 2
    assert str(blocker) in result.stderr
    assert script.read_bytes() == TORCH


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_a_clear_error(tmp_path: Path):
    script = write(tmp_path / "train.py", TORCH)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = migrate(script, "-o", locked / "train_npu.py", "--report-dir", tmp_path / "reports", *IMP001)
    assert result.exit_code == 2 and "Permission denied" in result.stderr
    assert script.read_bytes() == TORCH


def test_output_equal_to_the_input_is_refused(tmp_path: Path):
    script = write(tmp_path / "train.py", TORCH)
    result = migrate(script, "-o", script)
    assert result.exit_code == 2 and "--in-place" in result.stderr
    assert script.read_bytes() == TORCH
    folder = tmp_path
    assert migrate(folder, "-o", folder).exit_code == 2


def test_a_huge_file_completes(tmp_path: Path):
    body = "".join(f"def step_{i}(x):\n    return torch.relu(x) + {i}\n\n\n" for i in range(5000))
    script = write(tmp_path / "huge.py", b"import torch\n\n\n" + body.encode())
    assert script.read_text().count("\n") > 20_000
    result = migrate(script, "--diff", *IMP001)  # --diff: the engine's cost alone, no checklist facts
    assert result.exit_code == 1, result.stderr
    assert "+import torch_npu\n" in result.stdout


class RaisesOnPurpose(PortRule):
    """A rule with a bug: it raises on files that define `explode`.

    ## What it does
    Nothing useful. ## Why
    To prove that one file's internal error does not stop the run. ## Safety
    Safe.
    """

    CODE = "TST901"
    EXAMPLES = (Unchanged("x = 1\n"),)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "explode":
            raise RuntimeError("boom")


@pytest.mark.parametrize("workers", [1, 2])
def test_an_internal_error_in_one_file_spares_the_others(tmp_path: Path, workers: int):
    write(tmp_path / "src" / "a.py", TORCH)
    write(tmp_path / "src" / "b.py", b"def explode():\n    pass\n")
    write(tmp_path / "src" / "c.py", TORCH)
    jobs = plan([tmp_path / "src"], Settings())
    results = run_jobs(jobs, [rule_by_code("IMP001"), RaisesOnPurpose], workers=workers)
    statuses = {Path(r.source).name: r.status for r in results}
    assert statuses == {"a.py": FileStatus.UNCHANGED, "b.py": FileStatus.ERROR, "c.py": FileStatus.UNCHANGED}
    error = next(r.error for r in results if r.status is FileStatus.ERROR)
    assert "b.py:1:1: internal error: RuntimeError: boom" in error
    assert (tmp_path / "src_npu" / "b.py").read_bytes() == b"def explode():\n    pass\n"  # copied unchanged
    assert (tmp_path / "src_npu" / "c.py").exists()
