"""Runs going at once share the files their scripts write (verify/capture/whole_saves.py; verify/pair/sides.py
`SideRunner.run_together`, led by the port): the port prepares the data before the others start, and torch.save writes
whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from verify.capture.whole_saves import saved_whole
from verify.cli import app

SCRIPT = Path(__file__).resolve().parent / "scripts" / "prepared_data.py"


def test_a_save_replaces_its_file_whole_through_a_link_and_counts(tmp_path):
    target = tmp_path / "model.pt"
    target.write_bytes(b"former")
    link = tmp_path / "latest.pt"
    link.symlink_to(target)
    inode = target.stat().st_ino
    counts: dict = {}
    with saved_whole(counts):
        torch.save(torch.ones(3), link)
        torch.save(torch.ones(3), str(tmp_path / "plain.pt"))
    assert link.is_symlink() and target.stat().st_ino != inode  # a new file renamed onto the link's target
    assert torch.equal(torch.load(link), torch.ones(3)) and counts["saves_made_whole"] == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["latest.pt", "model.pt", "plain.pt"]
    assert torch.save is not None and torch.save.__name__ == "save"  # restored after


def test_what_cannot_be_saved_whole_is_saved_as_the_script_asked(tmp_path):
    counts: dict = {}
    with saved_whole(counts):
        torch.save(torch.ones(1), os.devnull)  # not a regular file: a rename would replace it
        with open(tmp_path / "own.pt", "wb") as file:
            torch.save(torch.ones(1), file)
        with pytest.raises(RuntimeError, match="missing"):  # the script's own error, naming its own file
            torch.save(torch.ones(1), tmp_path / "missing" / "model.pt")
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)
    assert torch.equal(torch.load(tmp_path / "own.pt"), torch.ones(1)) and counts == {}
    assert [path.name for path in tmp_path.iterdir()] == ["own.pt"]


@pytest.mark.slow
def test_a_dataset_is_downloaded_once_by_the_port_and_checkpoints_read_whole(tmp_path):
    """Regression: the runs of a pair start at once, and three runs downloading one file each truncate what another
    reads. The port's run prepares the data; the reference and calibration runs start after its first step. The
    folder lies outside both scripts' folders, where every run sees it (a data folder of the user's, `../data`): in
    their own folders each run has its own view (test_working_folder.py)."""
    port = tmp_path / "port" / "prepared_data_npu.py"
    port.parent.mkdir()
    port.write_text(SCRIPT.read_text())
    result = CliRunner().invoke(app, ["pair", str(SCRIPT), str(port), "-n", "6", "-q", "-o", str(tmp_path / "out"),
                                      "--", "--folder", str(tmp_path / "shared" / "data")])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (result.exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    said = {side: (tmp_path / "out" / side / "output.log").read_text() for side in ("actual", "ref", "calibration")}
    assert "data downloaded" in said["actual"] and all("data found" in said[side] for side in ("ref", "calibration"))
    manifest = json.loads((tmp_path / "out" / "ref" / "manifest.json").read_text())
    assert manifest["extra"]["saves_made_whole"] >= 5  # the run ends with its sixth step, before its save
