"""`verify compare` on pairs recorded on an NVIDIA H200 by this version (fixtures/h200-runs, its README): the reference
on the GPU, the port on the emulated NPU and the reference's calibration run on the CPU. Faithful ports of public
scripts pass; a changed activation fails naming it."""

import json
from pathlib import Path

import pandas as pd

from fixture_pairs import compared
from verify.compare import tolerances

H200_RUNS = Path(__file__).resolve().parent / "fixtures" / "h200-runs"


def compare_h200(tmp_path: Path, pair: str) -> tuple[int, dict, pd.DataFrame]:
    exit_code, summary = compared(H200_RUNS, pair, tmp_path)
    return exit_code, summary, pd.read_parquet(tmp_path / "out" / "ops.parquet")


def test_a_faithful_mnist_port_passes_against_its_h200_reference(tmp_path):
    """Regression: its batches, the same bits on both sides, differed by up to 2e-6 in their L2 norms (a GPU's tree of
    float32 sums against the CPU's 4096 in turn), which the data tolerance of 1e-6 read as other data; its
    calibration run computes on the CPU, as the port does, and measures the CPU kernels' differences from the GPU's."""
    manifest = json.loads((H200_RUNS / "mnist-faithful" / "calibration" / "manifest.json").read_text())
    assert (manifest["device"], manifest["emulated_on"]) == ("emulated-cuda", "cpu")
    exit_code, summary, ops = compare_h200(tmp_path, "mnist-faithful")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    batches = ops.loc[ops["ref_op"] == "input"]
    assert (batches["stats_error"] > 1e-6).any() and batches["passed"].all()


def test_a_gelu_in_the_mnist_port_fails_naming_it_against_its_h200_reference(tmp_path):
    exit_code, summary, _ = compare_h200(tmp_path, "mnist-gelu")
    assert exit_code == 1 and summary["reason"].startswith(
        "FAIL: the port computes aten.gelu where the original computes aten.relu"), summary["reason"]


def test_a_discriminators_batch_made_by_its_generator_is_judged_as_computed(tmp_path):
    """Regression: dcgan's discriminator reads the generator's output as its second batch; judged as data read from
    files (tolerance 1e-6), the GPU's and the CPU's generators' 3.5e-5 apart read as other data."""
    exit_code, summary, ops = compare_h200(tmp_path, "dcgan-faithful")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    made = ops.loc[(ops["ref_op"] == "input") & (ops["module"] == "Discriminator") & (ops["ref_call_index"] == 1)]
    assert len(made) and (made["tolerance"] >= tolerances.op_tolerance("float16").stats_rtol).all()


def test_the_references_noise_grows_with_the_steps_and_never_widens_an_earlier_one(tmp_path):
    """Regression (issue 45): the loss envelope was the largest over the run at every step, and an op's the same op's
    at any step, so dcgan's chaotic step 2 (its loss 0.6% from its calibration's) widened step 0, where the reference
    differs from itself by 0.016%: a port's own divergence at step 0 hid within ten times a later step's noise."""
    _, _, ops = compare_h200(tmp_path, "dcgan-faithful")
    losses = pd.read_csv(tmp_path / "out" / "losses.csv")
    by_step = losses.groupby("step")["envelope"].max()
    assert by_step.is_monotonic_increasing and by_step[0] < 0.0002 < 0.006 < by_step.iloc[-1]
    judged = ops.loc[ops["passed"].notna()]
    same_op = ["phase", "module", "ref_op", "ref_call_index", "io"]
    first, last = (judged.loc[judged["step"] == step].set_index(same_op)["envelope"].groupby(level=same_op).max()
                   for step in (judged["step"].min(), judged["step"].max()))
    assert (first < last.reindex(first.index)).any()
