"""Each run in a view of its own of the script's folder (verify/launch/working_folder.py, verify/capture/
private_files.py): what was there before is there for every run, what a run writes only it sees, whether the runs go
at once (a pair) or one after the other (`verify run`, twice)."""

from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verify.cli import app
from verify.launch import working_folder

RESUMES = Path(__file__).resolve().parent / "scripts" / "resumes.py"


def _project(tmp_path: Path, port_text: str | None = None) -> Path:
    """A project folder with the resuming script, its port and a log of the user's where the script appends its own."""
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    shutil.copy(RESUMES, project / "train.py")
    (project / "train_npu.py").write_text(port_text or RESUMES.read_text())
    (project / "out" / "train.log").write_text("the user's own log\n")
    return project


def _listing(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and "verify-out" not in path.parts}


def _pair(project: Path, out: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["pair", str(project / "train.py"), str(project / "train_npu.py"), "-n", "5",
                                      "-q", "-o", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    return result.exit_code, summary


@pytest.mark.slow
def test_a_script_that_resumes_from_its_checkpoint_passes_its_faithful_port_three_times_of_three(tmp_path):
    """Regression (issue 43): the reference and calibration started after the port's first step, in its folder, and
    resumed from the port's checkpoint; the faithful port FAILed 3 times of 3. Three pairs one after the other in the
    same folder (inside it: verify-out/), each PASS, no run resumed, and the user's folder is as it was."""
    project = _project(tmp_path)
    before = _listing(project)
    for number in range(3):
        out = project / "verify-out" / f"pair-{number}"
        code, summary = _pair(project, out)
        assert (code, summary["verdict"]) == (0, "PASS"), summary["reason"]
        for side in ("ref", "actual", "calibration"):
            assert "resumed" not in (out / side / "output.log").read_text()
            manifest = json.loads((out / side / "manifest.json").read_text())["working_folder"]
            assert manifest["written"] == ["out/ckpt.pt", "out/train.log", "seen_steps.txt"]
            assert manifest["originals_changed"] == []
            files = out / side / working_folder.FOLDER
            assert sorted(path.relative_to(files).as_posix() for path in files.rglob("*")) == [
                "out", "out/ckpt.pt", "out/train.log", "seen_steps.txt"]  # the links are gone, what it wrote stays
            log = (files / "out" / "train.log").read_text().splitlines()
            # appended to a copy of the user's file; the fifth step ends the run at its optimizer step, before its line
            assert log[0] == "the user's own log" and len(log) == 5
    assert _listing(project) == before


@pytest.mark.slow
def test_a_port_with_another_learning_rate_fails_naming_it_not_a_resumed_run(tmp_path):
    project = _project(tmp_path, RESUMES.read_text().replace('default=0.05', 'default=0.051'))
    code, summary = _pair(project, tmp_path / "out")
    assert (code, summary["verdict"]) == (1, "FAIL")
    assert "lr" in summary["reason"], summary["reason"]


@pytest.mark.slow
def test_runs_one_after_the_other_do_not_see_each_other(tmp_path):
    """`verify run` twice on a script that resumes: the second starts from step 0 as the first did, and writes
    nothing into the script's folder; a path into the original folder (Path(__file__).resolve()) lands in the view."""
    project = _project(tmp_path)
    before = _listing(project)
    for name in ("first", "second"):
        result = CliRunner().invoke(app, ["run", str(project / "train.py"), "-n", "3", "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert "resumed" not in (tmp_path / name / "output.log").read_text()
        seen = (tmp_path / name / working_folder.FOLDER / "seen_steps.txt").read_text().split()
        assert seen == ["0", "1"]  # the third step ends the run at its optimizer step
    assert _listing(project) == before


def test_the_view_links_the_data_copies_the_code_and_leaves_verifys_folders_out(tmp_path):
    project = tmp_path / "project"
    (project / "data" / "train").mkdir(parents=True)
    (project / "data" / "train" / "0.bin").write_bytes(b"\0" * 10)
    (project / "model.py").write_text("import torch\n")
    (project / "latest").symlink_to("data")  # a link of the user's, relative: kept as it is
    (project / "verify-out" / "old").mkdir(parents=True)
    (project / ".git").mkdir()
    view = working_folder.make(project, tmp_path / "run" / working_folder.FOLDER)
    files = view.view
    assert (files / "data" / "train" / "0.bin").is_symlink() and not (files / "model.py").is_symlink()
    assert os.readlink(files / "latest") == "data" and (files / ".git").is_symlink()
    assert not (files / "verify-out").exists() and view.left_out == ["verify-out"] and view.shared == [".git"]
    (files / "data" / "train" / "new.bin").write_bytes(b"1")
    (files / "__pycache__").mkdir()
    (files / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"")  # Python's, not the run's output
    settled = working_folder.settle(view)
    after = tmp_path / "run" / working_folder.FOLDER
    assert settled == {"view": str(after), "written": ["data/train/new.bin"], "written_count": 1,
                       "originals_changed": [], "written_outside": []}
    assert sorted(path.relative_to(after).as_posix() for path in after.rglob("*")) == [
        "data", "data/train", "data/train/new.bin"]
    assert sorted(os.listdir(tmp_path / "run")) == [working_folder.FOLDER]  # nothing of the folders above is left


def test_relative_paths_above_the_script_folder_lead_where_they_lead_from_it(tmp_path):
    """Regression: pytorch/examples' MNIST scripts read `../data`, Lightning's examples `../../../Datasets`; from a
    view at RUNDIR/files, `..` was the run folder, and every such script downloaded its data again (or, offline,
    failed). The folders above the view link to what the folders above the script's folder hold; what the run makes
    up there is its own, kept at RUNDIR/outside."""
    project = tmp_path / "a" / "b" / "examples" / "mnist"
    project.mkdir(parents=True)
    (tmp_path / "a" / "b" / "examples" / "data").mkdir()
    (tmp_path / "a" / "b" / "examples" / "data" / "train.bin").write_bytes(b"mnist")
    (tmp_path / "a" / "Datasets").mkdir()
    view = working_folder.make(project, tmp_path / "run" / working_folder.FOLDER)
    assert (view.view / ".." / "data" / "train.bin").read_bytes() == b"mnist"
    assert (view.view / ".." / ".." / ".." / "Datasets").is_dir()
    (view.view / ".." / "new.txt").write_text("written above")
    settled = working_folder.settle(view)
    assert settled["written_outside"] == ["b/examples/new.txt"]
    assert (tmp_path / "run" / working_folder.OUTSIDE / "b" / "examples" / "new.txt").read_text() == "written above"
    assert not (tmp_path / "a" / "b" / "examples" / "new.txt").exists()
    assert (tmp_path / "a" / "b" / "examples" / "data" / "train.bin").read_bytes() == b"mnist"  # links only removed


def test_an_original_changed_behind_the_views_back_is_named(tmp_path):
    """What native code writes in place through a link (not through Python's open) reaches the original file: the
    run names it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "weights.bin").write_bytes(b"old")
    view = working_folder.make(project, tmp_path / "run" / working_folder.FOLDER)
    with open(os.path.realpath(view.view / "weights.bin"), "r+b") as file:  # as a native writer would: in place
        file.write(b"new!")
    assert working_folder.settle(view)["originals_changed"] == ["weights.bin"]


def test_a_write_through_python_makes_the_linked_file_the_runs_own_and_leaves_the_original(tmp_path):
    """Inside the child (verify/capture/private_files.py): appending keeps the file's text in a copy, writing
    replaces the link, torch.save replaces it whole; a path into the original folder, or through `..` into it, is
    opened in the view; verify's own folders (left out of the view) are written where they are."""
    import torch

    from verify.capture.private_files import PrivateFiles, kept_private

    project = tmp_path / "project"
    (project / "logs").mkdir(parents=True)
    (project / "logs" / "train.log").write_text("kept\n")
    (project / "ckpt.pt").write_bytes(b"the user's checkpoint")
    (project / "out").mkdir()  # a pair's output folder inside the project: verify's, left out of the view
    view = working_folder.make(project, tmp_path / "run" / working_folder.FOLDER)
    files = PrivateFiles(str(view.root), str(view.view), ["out"])
    python_open = builtins.open
    with kept_private(files):
        with open(view.view / "logs" / "train.log", "a") as log:
            log.write("appended\n")
        with open(project / "ckpt.pt", "wb") as checkpoint:  # the original's path: opened in the view
            checkpoint.write(b"the run's")
        torch.save(torch.ones(2), str(project / "logs" / ".." / "weights.pt"))
        with open(project / "out" / "verify.json", "w") as own:
            own.write("{}")
    assert (project / "logs" / "train.log").read_text() == "kept\n"
    assert (project / "ckpt.pt").read_bytes() == b"the user's checkpoint" and not (project / "weights.pt").exists()
    assert (view.view / "logs" / "train.log").read_text() == "kept\nappended\n"
    assert (view.view / "ckpt.pt").read_bytes() == b"the run's" and (project / "out" / "verify.json").exists()
    assert torch.equal(torch.load(view.view / "weights.pt"), torch.ones(2))
    assert builtins.open is python_open  # restored
    assert working_folder.settle(view)["written"] == ["ckpt.pt", "logs/train.log", "weights.pt"]
