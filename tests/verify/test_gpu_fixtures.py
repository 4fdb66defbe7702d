"""`verify compare` on run directories recorded with a real GPU (shared/fixtures/gpu-runs): the reference on an
NVIDIA H100, the port on the emulated NPU. The only data where the two sides ran on different hardware (other
kernels, accumulation orders, TF32), so the verdicts here are the ones a CPU pair cannot test. Each pair's right
verdict, first line, is in the fixtures' README."""

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from fixture_pairs import compared, copied
from verify.cli import app
from verify.record.schema import SCHEMA_VERSION

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "gpu-runs"

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no GPU fixtures at {FIXTURES}")


def test_a_faithful_bf16_port_passes_although_every_op_carries_the_gpus_noise(tmp_path):
    """The fp32 layer norms and the gradient clipping after bf16 matmuls differ by more than the fp32 tolerance: they
    carry the noise of their bf16 inputs, which differ from GPU to NPU, and are judged against it."""
    exit_code, summary = compared(FIXTURES, "nanogpt-bf16-faithful", tmp_path)
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert 0 < summary["loss"]["max_rel_diff"] < 0.001


def test_a_changed_activation_is_named_first(tmp_path):
    """Written before the op records had a `source` column (schema 1): their lines read as unknown, so the first
    line names the module where the op ran instead of the lines that made it."""
    manifest = json.loads((FIXTURES / "mnist-fp32ref-gelu" / "actual" / "manifest.json").read_text())
    assert manifest["schema_version"] == 1
    exit_code, summary = compared(FIXTURES, "mnist-fp32ref-gelu", tmp_path)
    assert exit_code == 1
    assert summary["reason"].startswith(
        "FAIL: the port computes aten.gelu where the original computes aten.relu (Net forward, step 0)")
    ops = pd.read_parquet(tmp_path / "out" / "ops.parquet")
    assert ops["ref_source"].isna().all() and ops["actual_source"].isna().all()


def test_a_changed_learning_rate_is_named_first(tmp_path):
    exit_code, summary = compared(FIXTURES, "mnist-fp32ref-lr", tmp_path)
    assert exit_code == 1
    assert summary["reason"].startswith("FAIL: hyperparameter differs: lr ")


def test_a_run_directory_of_an_unknown_schema_version_is_refused_on_one_line(tmp_path):
    folder = copied(FIXTURES, "mnist-fp32ref-lr", tmp_path)
    manifest = folder / "actual" / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"schema_version": 99}))
    result = CliRunner().invoke(app, ["compare", str(folder / "ref"), str(folder / "actual")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"schema_version 99 is not one this npu-port reads (1 to {SCHEMA_VERSION})" in result.stderr.replace("\n", " ")

