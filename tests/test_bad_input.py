"""Bad input gets a clear `path:line:col` error and exit code 2, and nothing is lost: each case on a real file."""

import ast
import os
from pathlib import Path

import libcst as cst
import pytest
from typer.testing import CliRunner

from migrate.cli import app
from migrate.files import plan, run_jobs
from migrate.parsing import MAX_SOURCE_BYTES
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


def test_a_file_past_the_size_limit_is_named_before_it_is_read_and_the_others_are_ported(tmp_path: Path):
    """Issue 43: a 50 MB file ended in a Rust out-of-memory abort (exit 134) that took the whole run with it."""
    entry_point = b'if __name__ == "__main__":\n    pass\n'
    write(tmp_path / "src" / "good.py", TORCH + entry_point)
    big = write(tmp_path / "src" / "weights.py", TORCH + b"W = [" + b"0.1, " * (MAX_SOURCE_BYTES // 5) + b"]\n")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 2
    assert f"error: {big}:1:1: 2.0 MiB is past migrate's limit of 2 MiB a file: libcst's parser" in result.stderr
    assert (tmp_path / "src_npu" / "good.py").read_bytes() == TORCH + INSERTED + entry_point
    assert (tmp_path / "src_npu" / "weights.py").read_bytes() == big.read_bytes()  # copied unchanged


@pytest.mark.parametrize("shape, limit, message", [
    ("strings", "MAX_ADJACENT_STRINGS", ":3:1: 3001 adjacent string literals: libcst's parser takes at most 3000"),
    ("and", "MAX_BOOLEAN_CHAIN", ":2:7: 3001 chained `and`/`or` operators: libcst's parser takes at most 3000"),
])
def test_valid_python_past_libcsts_limits_is_named_as_libcsts_never_a_syntax_error(tmp_path, shape, limit, message):
    """Issue 43: a valid 90 KB script of 6,000 adjacent string literals was 'a syntax error'; 8,000 chained `and`s
    overflow libcst's native stack (SIGSEGV, the whole run gone). Python reads both."""
    from migrate import parsing

    count = getattr(parsing, limit) + 1
    body = {"strings": "TEXT = (\n" + "".join(f"    'part {i} '\n" for i in range(count)) + ")\n",
            "and": "OK = (" + " and ".join(["True"] * (count + 1)) + ")\n"}[shape]
    script = write(tmp_path / "long.py", TORCH + body.encode())
    ast.parse(script.read_text())  # valid Python
    other = write(tmp_path / "other.py", TORCH)
    result = migrate(script, other, *IMP001)
    assert result.exit_code == 2
    assert f"error: {script}{message}" in result.stderr.replace("\n", "")
    assert "syntax error:" not in result.stderr
    assert (tmp_path / "other_npu.py").exists() and not (tmp_path / "long_npu.py").exists()


@pytest.mark.parametrize("body", ["TEXT = (\n" + "    'part'\n" * 600 + ")\n", "OK = " + " and ".join(["x"] * 600)])
def test_a_chain_deeper_than_libcsts_tree_walk_is_named_so_never_a_bug(tmp_path, body):
    """600 adjacent strings parse, but libcst's tree is walked in Python: the RecursionError was 'internal error
    (please report this bug)'."""
    script = write(tmp_path / "deep.py", TORCH + body.encode() + b"\n")
    result = migrate(script, write(tmp_path / "other.py", TORCH), *IMP001)
    assert result.exit_code == 2 and (tmp_path / "other_npu.py").exists()
    assert f"error: {script}:1:1: nested deeper than libcst's tree walk can follow (Python's recursion limit" in (
        result.stderr.replace("\n", ""))
    assert "internal error" not in result.stderr and "syntax error:" not in result.stderr


def test_what_pythons_parser_refuses_is_a_syntax_error_before_libcst_reads_it(tmp_path: Path):
    """2,000 nested brackets overflowed libcst's stack (SIGSEGV); Python refuses 200."""
    script = write(tmp_path / "deep.py", TORCH + b"x = " + b"[" * 2000 + b"]" * 2000 + b"\n")
    other = write(tmp_path / "other.py", TORCH)
    result = migrate(script, other, *IMP001)
    assert result.exit_code == 2
    assert f"{script}:2:" in result.stderr and "syntax error: too many nested parentheses" in result.stderr
    assert (tmp_path / "other_npu.py").exists()
