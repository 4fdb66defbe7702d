"""Planning and writing files: what is read, where it goes, and that a failed write leaves nothing behind."""

from pathlib import Path

import pytest

from migrate.diff import unified_diff
from migrate.files import PlanError, plan, write_atomic
from rules import Settings


def tree(root: Path, *names: str) -> Path:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import torch\n")
    return root


def planned(jobs) -> dict[str, tuple[str, bool]]:
    return {str(job.source.name): (job.target.name, job.port) for job in jobs}


def test_a_folder_is_mirrored_and_earlier_outputs_are_left_out(tmp_path: Path):
    root = tree(tmp_path / "proj", "train.py", "train_npu.py", "solo_npu.py", "notes.txt", "train_npu_report/report.md")
    jobs = plan([root], Settings())
    assert planned(jobs) == {
        "notes.txt": ("notes.txt", False),
        "solo_npu.py": ("solo_npu.py", True),  # no solo.py beside it: a user's file, not our output
        "train.py": ("train.py", True),
    }
    assert all(job.target.parent == tmp_path / "proj_npu" for job in jobs)


def test_in_place_folder_copies_nothing(tmp_path: Path):
    root = tree(tmp_path / "proj", "a.py", "data.csv")
    jobs = plan([root], Settings(), in_place=True)
    assert [(job.source, job.target) for job in jobs] == [(root / "a.py", root / "a.py")]


def test_an_output_folder_inside_the_input_is_not_read_back(tmp_path: Path):
    root = tree(tmp_path / "proj", "a.py", "out/a.py")
    jobs = plan([root], Settings(), out=root / "out")
    assert [job.source for job in jobs] == [root / "a.py"]


def test_output_over_input_is_refused(tmp_path: Path):
    script = tree(tmp_path, "train.py") / "train.py"
    with pytest.raises(PlanError, match="overwrite the input"):
        plan([script], Settings(), out=script)


def test_check_mode_plans_targets_but_writes_none(tmp_path: Path):
    script = tree(tmp_path, "train.py") / "train.py"
    (job,) = plan([script], Settings(), write=False)
    assert job.target == tmp_path / "train_npu.py" and not job.write


def test_a_failed_atomic_write_leaves_neither_file_nor_temporary(tmp_path: Path):
    target = tmp_path / "out.py"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.py"]


def test_write_atomic_keeps_the_mode_of_the_original(tmp_path: Path):
    original = tmp_path / "run.py"
    original.write_bytes(b"")
    original.chmod(0o755)
    write_atomic(tmp_path / "run_npu.py", b"x = 1\n", like=original)
    assert (tmp_path / "run_npu.py").stat().st_mode & 0o777 == 0o755


def test_diff_names_both_files_and_keeps_crlf():
    diff = unified_diff("a\r\nb", "a\r\nc", "train.py", "train_npu.py")
    assert diff.startswith("--- a/train.py\n+++ b/train_npu.py\n")
    assert "-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n" in diff
    assert unified_diff("same", "same", "x.py", "y.py") == ""
