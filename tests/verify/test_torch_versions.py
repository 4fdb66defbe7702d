"""The torch verify runs on is the range pyproject.toml allows, its lower end the one .ci/run installs, and verify
refuses an older torch on one line with exit 2 before any run starts (checked by hand on torch 2.3.1: the capture and
the emulations need torch 2.4's device-typed autocast state)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from verify import devices

ROOT = Path(__file__).resolve().parents[2]


def test_the_lowest_torch_is_pyprojects_lower_bound_and_the_one_ci_installs():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    bound = next(re.fullmatch(r"torch>=(\d+)\.(\d+)", entry) for entry in dependencies if entry.startswith("torch"))
    lowest_job = re.search(r'^\s*prepare lowest "torch==(\d+)\.(\d+)\.\d+"', (ROOT / ".ci" / "run").read_text(),
                           re.MULTILINE)  # the venv of the lowest end
    assert tuple(map(int, bound.groups())) == tuple(map(int, lowest_job.groups())) == devices.LOWEST_TORCH


@pytest.mark.parametrize("version", ["2.4.0", "2.4.1+cu121", "2.9.0", "2.10.0", "2.14.1", "3.0.0"])
def test_the_torch_of_the_range_is_run(version):
    assert devices.unsupported_torch(version) == ""


@pytest.mark.parametrize("version", ["2.1.0+cu121", "2.3.1", "1.13.1"])
def test_an_older_torch_is_named_with_the_one_to_install(version):
    assert devices.unsupported_torch(version) == (
        f"torch {version} is older than the torch 2.4 verify runs on: install torch>=2.4 (on an Ascend machine, with "
        "the torch_npu made for it)")


def test_verify_refuses_an_older_torch_on_one_line_before_it_runs_anything(tmp_path):
    """An environment whose installed torch is 2.3.1 as importlib.metadata reads it (the parent never imports torch)."""
    installed = tmp_path / "torch-2.3.1.dist-info"
    installed.mkdir()
    (installed / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.3.1\n")
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    done = subprocess.run([sys.executable, "-m", "verify", "run", str(script), "--steps", "1"], cwd=tmp_path,
                          capture_output=True, text=True, check=False,
                          env=os.environ | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: torch 2.3.1 is older than the torch 2.4 verify runs on: install torch>=2.4 "
                                   "(on an Ascend machine, with the torch_npu made for it)")
    assert not (tmp_path / "verify-out").exists()
