"""Every user file arrives (issue 22): a folder's port keeps every file, a port never replaces a file of the user's
(it refuses before writing anything), names that are not UTF-8 are ported and reported with escapes, and the
reports' modes follow the umask. Each case on real files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.cli import app

IMP001 = ("--select", "IMP001")  # the one rule that always acts on `import torch`: fast and predictable
TORCH = b"import torch\n"


def migrate(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def write(path: Path, data: bytes = TORCH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_folder_port_keeps_the_users_own_name_npu_file(tmp_path):
    write(tmp_path / "src" / "layers.py")
    user = write(tmp_path / "src" / "layers_npu.py", b"import torch\nfrom layers import *\n")
    write(tmp_path / "src" / "model.py", b"import torch\nimport layers_npu\n")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 0, result.stderr
    assert sorted(path.name for path in (tmp_path / "src_npu").iterdir()) == ["layers.py", "layers_npu.py", "model.py"]
    assert (tmp_path / "src_npu" / "layers_npu.py").read_bytes().endswith(b"from layers import *\n")
    assert user.read_bytes() == b"import torch\nfrom layers import *\n"  # the original untouched


def test_a_folder_port_leaves_out_an_earlier_runs_port_and_its_report(tmp_path):
    write(tmp_path / "src" / "train.py")
    assert migrate(tmp_path / "src" / "train.py", *IMP001).exit_code == 0  # train_npu.py, train_npu_report/
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 0, result.stderr
    assert sorted(path.name for path in (tmp_path / "src_npu").iterdir()) == ["train.py"]


def test_a_port_never_replaces_a_users_file_and_says_how_to_name_it_otherwise(tmp_path):
    write(tmp_path / "train.py")
    user = write(tmp_path / "train_npu.py", b"# mine\n")
    result = migrate(tmp_path / "train.py", *IMP001)
    assert result.exit_code == 2
    assert result.stderr.replace("\n", "") == (
        f"error: {user} already exists and is not an earlier port of {tmp_path / 'train.py'} (no train_npu_report/ "
        "beside it): nothing was written; name the port otherwise with --suffix or -o")
    assert user.read_bytes() == b"# mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["train.py",
                                                                                                "train_npu.py"]
    assert migrate(tmp_path / "train.py", "--suffix", "_ascend", *IMP001).exit_code == 0
    assert (tmp_path / "train_ascend.py").exists() and (tmp_path / "train_ascend_report" / "report.md").exists()
    assert migrate(tmp_path / "train.py", "-o", tmp_path / "elsewhere.py", *IMP001).exit_code == 0
    assert user.read_bytes() == b"# mine\n"


def test_a_folder_port_refuses_a_users_folder_of_its_name_before_writing(tmp_path):
    write(tmp_path / "src" / "a.py")
    user = write(tmp_path / "src_npu" / "notes.txt", b"mine")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 2 and "src_npu already exists and is not an earlier port" in result.stderr
    assert [path.name for path in user.parent.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "src_npu_report").exists()


@pytest.mark.parametrize("report_dir", [False, True])
def test_an_earlier_port_is_ported_over_again(tmp_path, report_dir):
    write(tmp_path / "train.py")
    options = ("--report-dir", tmp_path / "reports") if report_dir else ()
    assert migrate(tmp_path / "train.py", *IMP001, *options).exit_code == 0
    second = migrate(tmp_path / "train.py", *IMP001, *options)
    assert second.exit_code == 0, second.stderr


@pytest.mark.parametrize("suffix", ["", "a/b", "."])
def test_a_suffix_that_names_no_file_is_refused(tmp_path, suffix):
    write(tmp_path / "train.py")
    result = migrate(tmp_path / "train.py", "--suffix", suffix)
    assert result.exit_code == 2 and "--suffix" in result.stderr


def test_a_name_that_is_not_utf8_is_ported_and_reported_with_escapes(tmp_path):
    source = tmp_path / os.fsdecode(b"src")
    write(source / os.fsdecode(b"y\xff.py"), b"import torch\n\nif __name__ == '__main__':\n    pass\n")  # an entry
    done = subprocess.run([sys.executable, "-m", "migrate", "src", *IMP001], cwd=tmp_path, capture_output=True,
                          env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0, done.stderr
    assert os.listdir(os.fsencode(tmp_path / "src_npu")) == [b"y\xff.py"]
    report = (tmp_path / "src_npu_report" / "report.md").read_text(encoding="utf-8")
    assert "| `src/y\\xff.py` | changed |" in report
    assert b'--- "a/src/y\\377.py"\n' in (tmp_path / "src_npu_report" / "diff.patch").read_bytes()  # as git quotes it
    diff = subprocess.run([sys.executable, "-m", "migrate", "src", "--diff", *IMP001], cwd=tmp_path,
                          capture_output=True, env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])})
    assert diff.returncode == 1 and b'--- "a/src/y\\377.py"\n' in diff.stdout, diff.stderr


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_reports_have_the_mode_the_umask_gives_new_files(tmp_path, umask):
    write(tmp_path / "train.py")
    previous = os.umask(umask)
    try:
        assert migrate(tmp_path / "train.py", *IMP001).exit_code == 0
    finally:
        os.umask(previous)
    modes = {stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "train_npu_report").iterdir()}
    assert modes == {0o666 & ~umask}
