"""Each run in a view of its own of the folders it works in, the folder verify was started in and the script's
(verify/launch/working_folder.py, verify/capture/private_files.py): what was there before is there for every run,
what a run writes only it sees, whether the runs go at once (a pair) or one after the other (`verify run`, twice);
and the script runs where `python SCRIPT ARGS` would, its relative paths leading from the folder verify was started
in."""

from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import route
from verify.launch import working_folder

RESUMES = Path(__file__).resolve().parent / "scripts" / "resumes.py"


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port_text: str | None = None) -> Path:
    """A project folder with the resuming script, its port and a log of the user's where the script appends its own;
    verify is started in it, as its user would."""
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    shutil.copy(RESUMES, project / "train.py")
    (project / "train_npu.py").write_text(port_text or RESUMES.read_text())
    (project / "out" / "train.log").write_text("the user's own log\n")
    monkeypatch.chdir(project)
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
def test_a_script_that_resumes_from_its_checkpoint_passes_its_faithful_port_three_times_of_three(tmp_path, monkeypatch):
    """Regression (issue 43): the reference and calibration started after the port's first step, in its folder, and
    resumed from the port's checkpoint; the faithful port FAILed 3 times of 3. Three pairs one after the other in the
    same folder (inside it: verify-out/), each PASS, no run resumed, and the user's folder is as it was."""
    project = _project(tmp_path, monkeypatch)
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
def test_a_port_with_another_learning_rate_fails_naming_it_not_a_resumed_run(tmp_path, monkeypatch):
    project = _project(tmp_path, monkeypatch, RESUMES.read_text().replace('default=0.05', 'default=0.051'))
    code, summary = _pair(project, tmp_path / "out")
    assert (code, summary["verdict"]) == (1, "FAIL")
    assert "lr" in summary["reason"], summary["reason"]


@pytest.mark.slow
def test_runs_one_after_the_other_do_not_see_each_other(tmp_path, monkeypatch):
    """`verify run` twice on a script that resumes: the second starts from step 0 as the first did, and writes
    nothing into the script's folder; a path into the original folder (Path(__file__).resolve()) lands in the view."""
    project = _project(tmp_path, monkeypatch)
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
    view = working_folder.make([project], tmp_path / "run" / working_folder.FOLDER)
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
    view = working_folder.make([project], tmp_path / "run" / working_folder.FOLDER)
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
    view = working_folder.make([project], tmp_path / "run" / working_folder.FOLDER)
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
    view = working_folder.make([project], tmp_path / "run" / working_folder.FOLDER)
    files = PrivateFiles({**view.record(), "left_out": ["out"]})
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


TRAIN_ON_A_FILE = """import os
import sys

import torch

from utils import make_model  # beside the script: sys.path[0]

values = [float(value) for value in open(sys.argv[1]).read().split()]
inputs = torch.tensor(values).reshape(-1, 2)
torch.manual_seed(0)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    optimizer.zero_grad()
    model(inputs).pow(2).mean().backward()
    optimizer.step()
    with open("ran_in.txt", "w") as ran_in:  # relative: the working folder's
        ran_in.write(f"{os.getcwd()} {os.environ['PWD']} {os.path.dirname(__file__)}")
"""


@pytest.fixture
def parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A training script in sub/, beside the module it imports, and its data in data/x.txt, both relative to the
    folder verify is started in (fast_neural_style's `python neural_style/neural_style.py --style-image images/...`
    from its folder, the examples of transformers and accelerate from the repository's root)."""
    (tmp_path / "parent" / "sub").mkdir(parents=True)
    (tmp_path / "parent" / "data").mkdir()
    (tmp_path / "parent" / "data" / "x.txt").write_text("1 2 3 4 5 6 7 8")
    (tmp_path / "parent" / "sub" / "utils.py").write_text("import torch\n\n\ndef make_model():\n"
                                                            "    return torch.nn.Linear(2, 1)\n")
    for name in ("train.py", "train_npu.py"):
        (tmp_path / "parent" / "sub" / name).write_text(TRAIN_ON_A_FILE)
    monkeypatch.chdir(tmp_path / "parent")
    return tmp_path / "parent"


def _ran_in(run_dir: Path, written: str = "ran_in.txt") -> tuple[Path, str, str]:
    """Where the run's script ran, relative to RUNDIR/.above (where its view was as it ran), its $PWD and the folder
    of its __file__, as `written` (RUNDIR/files/...) says."""
    cwd, pwd, script_folder = (run_dir / working_folder.FOLDER / written).read_text().split()
    return Path(cwd).relative_to(run_dir / working_folder.ABOVE), pwd, script_folder


@pytest.mark.slow
def test_each_side_runs_in_the_folder_verify_was_started_in(parent: Path, tmp_path: Path):
    """Regression: each side ran in the script's folder, so `verify sub/train.py sub/train_npu.py -- data/x.txt`, as
    `python sub/train.py data/x.txt` runs, ended with "both sides stopped before their first step: FileNotFoundError:
    'data/x.txt'" (exit 2). Each side now runs in its view of the folder verify was started in, the script's folder
    first on its search path."""
    argv = ["sub/train.py", "sub/train_npu.py", "-n", "2", "-q", "-o", str(tmp_path / "out"), "--", "data/x.txt"]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["verdict"] == "PASS"
    for side in ("ref", "actual", "calibration"):
        manifest = json.loads((tmp_path / "out" / side / "manifest.json").read_text())
        assert manifest["cwd"] == str(parent) and manifest["working_folder"]["root"] == str(parent)
        cwd, pwd, script_folder = _ran_in(tmp_path / "out" / side)
        assert cwd.name == "parent" and pwd == str(tmp_path / "out" / side / working_folder.ABOVE / cwd)
        assert script_folder == os.path.join(pwd, "sub")
        assert manifest["working_folder"]["written"] == ["ran_in.txt"]
    assert not (parent / "ran_in.txt").exists()


@pytest.mark.slow
def test_verify_run_runs_where_it_was_started_too(parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`verify run` from the data's folder, the script above it: its relative paths lead from there."""
    monkeypatch.chdir(parent / "data")
    result = CliRunner().invoke(app, ["run", "../sub/train.py", "-n", "2", "-o", str(tmp_path / "run"), "--",
                                      "x.txt"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["cwd"] == str(parent / "data") and manifest["working_folder"]["root"] == str(parent)
    cwd, pwd, script_folder = _ran_in(tmp_path / "run", "data/ran_in.txt")
    assert cwd.parts[-2:] == ("parent", "data") and script_folder == os.path.join(os.path.dirname(pwd), "sub")
    assert manifest["working_folder"]["written"] == ["data/ran_in.txt"]


def test_a_script_outside_the_working_folder_gets_a_view_of_the_folder_holding_both(tmp_path):
    """`verify ../other/train.py` from work/: the view's root holds both folders, each mirrored whole; the folders on
    the way to them are made and what else they hold is linked, shared, as the folders above the view link theirs."""
    (tmp_path / "home" / "work" / "data").mkdir(parents=True)
    (tmp_path / "home" / "other" / "sub").mkdir(parents=True)
    (tmp_path / "home" / "work" / "data" / "x.txt").write_text("data")
    (tmp_path / "home" / "other" / "train.py").write_text("import torch\n")
    (tmp_path / "home" / "other" / "sub" / "ckpt.pt").write_bytes(b"old")
    (tmp_path / "home" / "notes").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("the user's")
    view = working_folder.make([tmp_path / "home" / "other", tmp_path / "home" / "work"],
                               tmp_path / "run" / working_folder.FOLDER)
    assert view.root == tmp_path / "home" and view.view.name == "home"
    files = view.view
    assert not (files / "other" / "train.py").is_symlink() and (files / "other" / "sub" / "ckpt.pt").is_symlink()
    assert (files / "work" / "data" / "x.txt").is_symlink() and not (files / "work" / "data").is_symlink()
    assert (files / "notes").is_symlink() and (files / "notes.txt").is_symlink() and view.shared == ["notes"]
    from verify.capture.private_files import PrivateFiles

    private = PrivateFiles(view.record())  # absolute paths: into the view in the mirrored folders, else the user's
    assert private.seen(str(tmp_path / "home" / "work" / "data" / "x.txt")) == str(files / "work" / "data" / "x.txt")
    assert private.seen(str(tmp_path / "home" / "notes.txt")) == str(tmp_path / "home" / "notes.txt")
    (files / "work" / "ran_in.txt").write_text("written")
    settled = working_folder.settle(view)
    assert (settled["written"], settled["originals_changed"]) == (["work/ran_in.txt"], [])
    assert not (tmp_path / "home" / "work" / "ran_in.txt").exists()


def test_past_the_most_entries_the_working_folders_are_linked_and_never_the_scripts(tmp_path, monkeypatch):
    """A working folder that is a repository with its data (a home folder): the script's folder is walked first,
    whole; the rest of the working folder past MAX_ENTRIES is linked, a folder not yet walked whole as it is."""
    monkeypatch.setattr(working_folder, "MAX_ENTRIES", 7)
    for shard in range(3):
        (tmp_path / "repo" / "data" / f"shard{shard}").mkdir(parents=True)
        for number in range(3):
            (tmp_path / "repo" / "data" / f"shard{shard}" / f"{number}.jpg").write_bytes(b"x")
    (tmp_path / "repo" / "examples" / "vision" / "models").mkdir(parents=True)
    (tmp_path / "repo" / "examples" / "vision" / "train.py").write_text("import torch\n")
    (tmp_path / "repo" / "examples" / "vision" / "models" / "net.py").write_text("import torch\n")
    view = working_folder.make([tmp_path / "repo" / "examples" / "vision", tmp_path / "repo"],
                               tmp_path / "run" / working_folder.FOLDER)
    vision = view.view / "examples" / "vision"
    assert not (vision / "models").is_symlink() and not (vision / "models" / "net.py").is_symlink()
    assert (view.view / "data").is_dir() and not (view.view / "data").is_symlink()
    assert sorted(view.shared) == ["data/shard0", "data/shard1", "data/shard2"]
    working_folder.settle(view)
