"""One writer per folder (issue 22): claim() is atomic across processes, and default names never collide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verify.record.run_folders import WRITER_LOCK, FolderInUse, claim, default_pair_dir, default_run_dir, release

# Claims `folder` at the same moment as the other processes (they wait for the start file), holds it a moment, and
# prints whether it won; exits as `verify` would on FolderInUse.
CLAIMANT = """
import sys, time
from pathlib import Path
from verify.record.run_folders import FolderInUse, claim
folder, start = Path(sys.argv[1]), Path(sys.argv[2])
while not start.exists():
    time.sleep(0.001)
try:
    claim(folder)
except FolderInUse as error:
    print("refused:", error)
    sys.exit(2)
(folder / "manifest.json").write_text("{}")
time.sleep(0.2)
print("claimed")
"""


def test_of_writers_started_at_once_exactly_one_claims_the_folder(tmp_path):
    for trial in range(3):
        folder, start = tmp_path / f"out{trial}", tmp_path / f"start{trial}"
        claimants = [subprocess.Popen([sys.executable, "-c", CLAIMANT, str(folder), str(start)], cwd=tmp_path,
                                      stdout=subprocess.PIPE, text=True) for _ in range(4)]
        start.touch()
        outputs = [(child.communicate(timeout=60)[0], child.returncode) for child in claimants]
        assert sorted(code for _, code in outputs) == [0, 2, 2, 2], outputs
        assert all("refused:" in text and str(folder) in text for text, code in outputs if code)
        assert not (folder / WRITER_LOCK).exists()  # released when the winner exited


def test_a_second_writer_in_the_same_process_is_refused_until_the_first_releases(tmp_path):
    folder = claim(tmp_path / "run")
    with pytest.raises(FolderInUse, match="being written by another verify"):
        claim(folder)
    release(folder)
    assert list(folder.iterdir()) == []
    claim(folder)  # empty and unclaimed again
    (folder / "manifest.json").write_text("{}")
    release(folder)
    with pytest.raises(FolderInUse, match="not an empty folder"):
        claim(folder)
    assert not (folder / WRITER_LOCK).exists()  # a refused claim leaves no lock behind


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(FolderInUse, match="not a folder"):
        claim(tmp_path / "run")


def test_default_names_are_unique_within_one_second():
    script = Path("/x/train.py")
    runs = {default_run_dir(script, "cpu") for _ in range(50)}
    pairs = {default_pair_dir(script) for _ in range(50)}
    assert len(runs) == 50 and len(pairs) == 50
    assert all(path.name.startswith("train-cpu-") for path in runs)


def test_every_claim_ends_with_its_process(tmp_path):
    code = f"from verify.record.run_folders import claim; claim(__import__('pathlib').Path({str(tmp_path / 'run')!r}))"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
    assert list((tmp_path / "run").iterdir()) == []
